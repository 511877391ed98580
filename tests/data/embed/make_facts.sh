#!/usr/bin/env bash
# Regenerates llama.cpp's embeddings in tests/data/embed/ (README.md there
# says what they are; tests/e2e_embed.py compares lamina with them).
#   LLAMA=/path/to/llama.cpp/build/bin (default /work/llama.cpp/build/bin)
# Run from the repository root after building build/lamina.
set -euo pipefail
cd "$(dirname "$0")/../../.."
LLAMA=${LLAMA:-/work/llama.cpp/build/bin}
D=tests/data/embed
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
build/lamina mkmodel --preset qwen3-embedding-small --type F16 --vocab-from tests/data/vocab/ggml-vocab-gpt-2.gguf \
    -o "$T/qwen3-embedding-small-F16.gguf" >/dev/null 2>&1
sha256sum "$T/qwen3-embedding-small-F16.gguf" | cut -d' ' -f1 >"$D/qwen3-embedding-small-F16.sha256"
run() { # MODEL POOLING OUT: llama-embedding's OpenAI-style JSON, normalized (L2)
    "$LLAMA/llama-embedding" -m "$1" -f "$D/inputs.txt" --pooling "$2" --embd-normalize 2 \
        --embd-output-format json -c 512 -b 512 -ub 512 -t 2 2>"$T/log" >"$3"
    echo "$(basename "$3" .json) $(grep -o 'n_tokens = [0-9]*' "$T/log" | tail -n 1 | cut -d' ' -f3)"
}
{
    run "$T/qwen3-embedding-small-F16.gguf" last "$D/qwen3-embedding-small-F16.json"
    run models/stories260K.gguf mean "$D/stories260K-mean.json"
} >"$D/n_tokens.txt" # the tokens of all inputs, as llama.cpp counted them
