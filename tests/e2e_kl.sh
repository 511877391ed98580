#!/usr/bin/env bash
# End-to-end checks of `lamina perplexity --save-logits / --kl-divergence`
# (format/logits.h) on the bundled stories260K model and the English text of
# tests/data/gemma3/ppl_text.txt:
#   - the model against its own saved logits (same build, same file, same KV
#     type): KL exactly 0 (mean, median, 90%, 99%, max), 100% top-1
#     agreement, Delta ppl 0, and the same PPL line as the reference run;
#   - a Q4_0 copy (lamina quantize) against the F32 reference: mean KL
#     positive, top-1 agreement below 100%, the percentiles ordered
#     (median <= 90% <= 99% <= max), and the reported PPL(base) equal to the
#     reference run's PPL;
#   - refused with exit 1 and a message: another vocabulary size (a random
#     model with the llama SentencePiece vocabulary), another vocabulary of
#     the same size (the file's hash changed), another chunk size (-c),
#     another text (tokens differ), a file cut short, a file that is not one.
. "$(dirname "$0")/testenv.sh"
TXT=tests/data/gemma3/ppl_text.txt
to() { timeout 120 nice "$@"; }
field() { grep -m1 "$1" "$2" | sed 's/.*: *//; s/ .*//'; }

to "$L" perplexity -m "$M" -f "$TXT" -c 128 --chunks 4 -t 2 --save-logits "$T/base.logits" >"$T/ref.out" 2>"$T/ref.err"
rc=$?
# 4 chunks x 63 scored rows x 512 x 4 bytes, 4 x 128 tokens, 64-byte header
want=$((64 + 4 * 4 * 128 + 4 * 4 * 63 * 512))
size=$(stat -c %s "$T/base.logits" 2>/dev/null || echo 0)
if [ $rc -eq 0 ] && [ "$size" -eq $want ]; then ok save_logits; else bad save_logits "rc $rc size $size want $want" "$(cat "$T/ref.err")"; fi

# 1. itself: exactly zero
to "$L" perplexity -m "$M" -f "$TXT" -t 2 --kl-divergence "$T/base.logits" >"$T/self.out" 2>"$T/self.err"
rc=$?
if [ $rc -eq 0 ] && grep -q "Mean    KLD:     0.000000 +/- 0.000000" "$T/self.out" &&
    grep -q "Maximum KLD:     0.000000" "$T/self.out" && grep -q "Same top p: 100.000 +/- 0.000 % (252 tokens)" "$T/self.out" &&
    grep -q "Mean PPL(Q)-PPL(base)         :   0.000000" "$T/self.out" &&
    [ "$(grep Final "$T/self.out")" = "$(grep Final "$T/ref.out")" ]; then
    ok kl_self_zero
else bad kl_self_zero "rc $rc" "$(cat "$T/self.out" "$T/self.err")"; fi

# 2. a Q4_0 copy: positive, below 100% agreement
to "$L" quantize "$M" "$T/q4.gguf" Q4_0 >/dev/null 2>&1
to "$L" perplexity -m "$T/q4.gguf" -f "$TXT" -t 2 --kl-divergence "$T/base.logits" >"$T/q4.out" 2>"$T/q4.err"
rc=$?
kl=$(field "Mean    KLD" "$T/q4.out")
med=$(field "Median  KLD" "$T/q4.out")
p90=$(field "90.0%   KLD" "$T/q4.out")
p99=$(field "99.0%   KLD" "$T/q4.out")
mx=$(field "Maximum KLD" "$T/q4.out")
top=$(grep -m1 "Same top p" "$T/q4.out" | sed 's/Same top p: *//; s/ .*//')
pb=$(field "Mean PPL(base)" "$T/q4.out")
refppl=$(grep Final "$T/ref.out" | sed 's/.*PPL = //; s/ .*//')
if [ $rc -eq 0 ] && awk -v k="$kl" -v t="$top" -v a="$med" -v b="$p90" -v c="$p99" -v d="$mx" -v pb="$pb" -v r="$refppl" \
    'BEGIN { exit !(k > 0 && t < 100 && t > 50 && a <= b && b <= c && c <= d && d > 0 && (pb - r < 0.0001 && r - pb < 0.0001)) }'; then
    ok kl_q4_0_positive
    echo "NOTE stories260K Q4_0 vs F32: mean KLD $kl, top-1 $top%, median $med, max $mx"
else bad kl_q4_0_positive "rc $rc kl $kl top $top med $med p90 $p90 p99 $p99 max $mx ppl(base) $pb ref $refppl" "$(cat "$T/q4.err")"; fi

refused() { # name, expected message part, command...
    local name=$1 msg=$2
    shift 2
    to "$@" >"$T/r.out" 2>"$T/r.err"
    local r=$?
    if [ $r -eq 1 ] && grep -q "$msg" "$T/r.err"; then ok "$name"; else bad "$name" "rc $r" "$(cat "$T/r.err")"; fi
}
# 3. another vocabulary size
to "$L" mkmodel -o "$T/llama.gguf" --layers 1 --embd 64 --heads 2 --kv-heads 2 --ff 128 --ctx 256 \
    --vocab-from tests/data/vocab/ggml-vocab-llama-spm.gguf >/dev/null 2>&1
refused kl_vocab_size "vocabulary of 512 tokens, this model's has 32000" "$L" perplexity -m "$T/llama.gguf" -f "$TXT" --kl-divergence "$T/base.logits"
# 4. the same size, another vocabulary: the hash at offset 32 differs
cp "$T/base.logits" "$T/hash.logits"
printf 'XXXX' | dd of="$T/hash.logits" bs=1 seek=32 conv=notrunc 2>/dev/null
refused kl_vocab_hash "another vocabulary" "$L" perplexity -m "$M" -f "$TXT" --kl-divergence "$T/hash.logits"
# 5. another chunk size
refused kl_ctx "chunks of 128 tokens, this run 64" "$L" perplexity -m "$M" -f "$TXT" -c 64 --kl-divergence "$T/base.logits"
# 6. another text
tail -c 12000 "$TXT" >"$T/other.txt"
refused kl_tokens "in the saved logits (another text" "$L" perplexity -m "$M" -f "$T/other.txt" --kl-divergence "$T/base.logits"
# 7. cut short, and not a logits file at all
head -c 100000 "$T/base.logits" >"$T/short.logits"
refused kl_short "bytes, its header" "$L" perplexity -m "$M" -f "$TXT" --kl-divergence "$T/short.logits"
refused kl_not_logits "not a lamina saved-logits file" "$L" perplexity -m "$M" -f "$TXT" --kl-divergence "$M"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
