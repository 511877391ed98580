#!/usr/bin/env bash
# Regenerates llama.cpp's embeddings in tests/data/gemma_embedding/ (README.md
# there says what they are; tests/e2e_gemma_embed.py compares lamina with them).
#   LLAMA=/path/to/llama.cpp/build/bin (default /work/llama.cpp/build/bin)
# Run from the repository root after building build/lamina.
set -euo pipefail
cd "$(dirname "$0")/../../.."
LLAMA=${LLAMA:-/work/llama.cpp/build/bin}
D=tests/data/gemma_embedding
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
M="$T/gemma-embedding-small-F16.gguf"
build/lamina mkmodel --preset gemma-embedding-small --type F16 -o "$M" >/dev/null 2>&1
sha256sum "$M" | cut -d' ' -f1 >"$D/gemma-embedding-small-F16.sha256"
"$LLAMA/llama-embedding" -m "$M" -f "$D/inputs.txt" --pooling mean --embd-normalize 2 \
    --embd-output-format json -c 512 -b 512 -ub 512 -t 2 2>"$T/log" >"$D/gemma-embedding-small-F16.json"
# the tokens of all inputs together, as llama.cpp counted them
grep -o 'n_tokens = [0-9]*' "$T/log" | tail -n 1 | cut -d' ' -f3 >"$D/n_tokens.txt"
# each input's own count, BOS included (the longest must pass the window of 16)
while IFS= read -r line; do
    echo $(($("$LLAMA/llama-tokenize" -m "$M" -p "$line" --ids --log-disable 2>/dev/null | tr -cd ',' | wc -c) + 1))
done <"$D/inputs.txt" >"$T/each"
paste -sd' ' "$T/each" >>"$D/n_tokens.txt"
