#!/usr/bin/env bash
# End-to-end checks of the lamina command line on the bundled model:
# the demo's greedy story, seeded sampling, llama2.c import, tokenize (also
# on the vocabulary-only files of tests/data/vocab), run --chat, where run
# stops (context, -n), perplexity, info, the --kv-type parser, and the exit
# codes of bad invocations.
set -u
cd "$(dirname "$0")/.."
L=${LAMINA_BIN:-build/lamina}
M=models/stories260K.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; printf '  %s\n' "$@"; fail=$((fail + 1)); }

# 1. the demo: greedy continuation of "Once upon a time"
want="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
out=$("$L" run -m "$M" -p "Once upon a time" -n 100 --temp 0 2>"$T/err")
if [[ "$out" == "$want"* ]]; then ok demo_greedy; else bad demo_greedy "got: $out" "$(cat "$T/err")"; fi
grep -q "tok/s" "$T/err" && ok stats_line || bad stats_line "$(cat "$T/err")"

# 2. seeded sampling: the same seed twice gives the same text, another seed differs,
#    and seed 42 gives the recorded text
a=$("$L" run -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --seed 42 2>/dev/null)
b=$("$L" run -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --seed 42 2>/dev/null)
c=$("$L" run -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --seed 7 2>/dev/null)
[ "$a" == "$b" ] && ok seed_repeatable || bad seed_repeatable "$a" "$b"
[ "$a" != "$c" ] && ok seed_varies || bad seed_varies "$a"
if [ -f tests/data/seed42.txt ]; then
    [ "$a" == "$(cat tests/data/seed42.txt)" ] && ok seed_golden || bad seed_golden "got: $a" "want: $(cat tests/data/seed42.txt)"
fi

# 3. llama2.c import gives a model with the same greedy output
if "$L" convert --llama2c models/stories260K.bin --tokenizer models/tok512.bin -o "$T/conv.gguf" 2>"$T/err"; then
    out2=$("$L" run -m "$T/conv.gguf" -p "Once upon a time" -n 100 --temp 0 2>/dev/null)
    [ "$out2" == "$out" ] && ok convert_same_output || bad convert_same_output "$out2"
else
    bad convert_same_output "$(cat "$T/err")"
fi

# 4. tokenize: ids of a known text, and pieces
ids=$(printf 'Once upon a time' | "$L" tokenize -m "$M" --ids)
[[ "$ids" =~ ^[0-9]+( [0-9]+)*$ ]] && ok tokenize_ids || bad tokenize_ids "$ids"
pieces=$(printf 'Once upon a time' | "$L" tokenize -m "$M")
[[ "$pieces" == *"▁"* ]] && ok tokenize_pieces || bad tokenize_pieces "$pieces"

# tokenize needs only the tokenizer: vocabulary-only files (no tensors, any architecture
# name) give the ids of their reference vectors (.inp cases, one .out line each)
for v in llama-spm phi-3 gpt-2; do
    f=tests/data/vocab/ggml-vocab-$v.gguf
    python3 - "$f.inp" "$T/case" <<'PY'
import sys
cases = open(sys.argv[1], "rb").read().split(b"\n__ggml_vocab_test__\n")[:-1]
for i, c in enumerate(cases):
    open("%s.%d" % (sys.argv[2], i), "wb").write(c)
PY
    n=0 nbad=0 first=
    while IFS= read -r want; do
        got=$("$L" tokenize -m "$f" --ids --no-parse-special <"$T/case.$n" 2>&1)
        if [ "$(echo $got)" != "$(echo $want)" ]; then nbad=$((nbad + 1)); [ -z "$first" ] && first="case $n: got '$got' want '$want'"; fi
        n=$((n + 1))
    done <"$f.out"
    [ $n -gt 40 ] && [ $nbad -eq 0 ] && ok "tokenize_vocab_only_$v" || bad "tokenize_vocab_only_$v" "$nbad of $n cases differ" "$first"
done
rm -f "$T"/case.*

# run --chat: the prompt is the rendered template, one BOS (the model adds it, so the
# template's leading <s> is dropped); no template is exit 1, a bad --chat-template exit 2
"$L" run -m "$M" -p "Hi" --chat --chat-template llama2 -n 2 --temp 0 --show-ids >/dev/null 2>"$T/err"; rc=$?
want=$(printf '[INST] Hi [/INST]' | "$L" tokenize -m "$M" --ids --bos)
[ $rc -eq 0 ] && grep -qx "prompt ids: $want" "$T/err" && ok run_chat_ids || bad run_chat_ids "rc=$rc" "want $want" "$(cat "$T/err")"
"$L" run -m "$M" -p "Hi" --chat -n 2 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "no chat template (tokenizer.chat_template); pick one with --chat-template" "$T/err" &&
    ok run_chat_no_template || bad run_chat_no_template "rc=$rc" "$(cat "$T/err")"
"$L" run -m "$M" -p "Hi" --chat --chat-template nosuch -n 2 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "neither a template name nor a readable file" "$T/err" && ok run_chat_bad_template ||
    bad run_chat_bad_template "rc=$rc" "$(cat "$T/err")"

# 5. perplexity: the model's own greedy story scores low, the same words in
#    reverse order score much higher
"$L" run -m "$M" -p "Once upon a time" -n 120 --temp 0 2>/dev/null >"$T/story.txt"
for i in 1 2 3 4 5 6; do cat "$T/story.txt"; done >"$T/text.txt"
tr -s ' \n' '\n\n' <"$T/text.txt" | tac | tr '\n' ' ' >"$T/rev.txt"
pp=$("$L" perplexity -m "$M" -f "$T/text.txt" -c 64 2>"$T/err" | grep -o 'PPL = [0-9.]*' | awk '{print $3}')
pr=$("$L" perplexity -m "$M" -f "$T/rev.txt" -c 64 2>>"$T/err" | grep -o 'PPL = [0-9.]*' | awk '{print $3}')
if [ -n "$pp" ] && [ -n "$pr" ] && awk -v p="$pp" -v r="$pr" 'BEGIN{exit !(p > 1 && p < 6 && r > 3 * p)}'; then
    ok perplexity
else
    bad perplexity "ppl=$pp reversed=$pr" "$(cat "$T/err")"
fi

# 6. info
"$L" info -m "$M" >"$T/info" 2>&1 && grep -q "GQA" "$T/info" && grep -q "layers: *5" "$T/info" && ok info || bad info "$(cat "$T/info")"
# the kernel table's ISA; LAMINA_NO_SIMD=1 keeps the scalar reference
grep -Eq "^kernels: +(avx2|scalar)$" "$T/info" && LAMINA_NO_SIMD=1 "$L" info -m "$M" 2>&1 | grep -Eq "^kernels: +scalar$" &&
    ok info_kernels || bad info_kernels "$(grep kernels "$T/info")"

# 7. exit codes: usage errors 2, failures 1, help 0
"$L" run --bogus >/dev/null 2>&1; [ $? -eq 2 ] && ok bad_flag_exit2 || bad bad_flag_exit2
"$L" run -m "$M" -p x -n abc >/dev/null 2>&1; [ $? -eq 2 ] && ok bad_value_exit2 || bad bad_value_exit2
"$L" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] && ok bad_command_exit2 || bad bad_command_exit2
"$L" run -m /nonexistent.gguf -p x >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q nonexistent "$T/err" && ok missing_model_exit1 || bad missing_model_exit1 "rc=$rc" "$(cat "$T/err")"
head -c 100 "$M" >"$T/trunc.gguf"
"$L" info -m "$T/trunc.gguf" >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && [ -s "$T/err" ] && ok truncated_model_exit1 || bad truncated_model_exit1 "rc=$rc" "$(cat "$T/err")"
for c in run tokenize perplexity convert info; do
    "$L" $c --help >"$T/h" 2>&1; rc=$?
    [ $rc -eq 0 ] && grep -q usage "$T/h" && ok "help_$c" || bad "help_$c" "rc=$rc"
done
# prompt longer than the context is a clear error
"$L" run -m "$M" -p "$(head -c 3000 "$T/text.txt")" -n 5 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q context "$T/err" && ok prompt_too_long || bad prompt_too_long "rc=$rc" "$(cat "$T/err")"
# generation that reaches the context end stops with a note
"$L" run -m "$M" -p "Once upon a time" -n 500 --temp 0 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && grep -q "context of 128 tokens is full" "$T/err" && ok context_full_stops || bad context_full_stops "rc=$rc" "$(cat "$T/err")"
# run is one request to the engine: a full context holds every position, and the token
# sampled from the last one ends the text (prompt 5 + 36 = 41 tokens with -c 40); the same
# with -n -1 and --ignore-eos; -n N stops at N first without a note; -n 0 echoes the prompt
n_ids() { sed -n 's/^generated ids://p' "$T/err" | wc -w; }
"$L" run -m "$M" -p "Once upon a time" -n -1 -c 40 --temp 0 --show-ids >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(n_ids)" -eq 36 ] && grep -q "prompt 5 tok" "$T/err" && grep -q "generated 36 tok" "$T/err" &&
    grep -q "context of 40 tokens is full" "$T/err" && ok run_context_full_count || bad run_context_full_count "rc=$rc" "$(cat "$T/err")"
"$L" run -m "$M" -p "Once upon a time" -n -1 -c 24 --temp 1 --seed 3 --ignore-eos --show-ids >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(n_ids)" -eq 20 ] && grep -q "context of 24 tokens is full" "$T/err" && ok run_context_full_ignore_eos ||
    bad run_context_full_ignore_eos "rc=$rc" "$(cat "$T/err")"
"$L" run -m "$M" -p "Once upon a time" -n 36 -c 40 --temp 0 --show-ids >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(n_ids)" -eq 36 ] && ! grep -q "is full" "$T/err" && ok run_max_tokens_no_note || bad run_max_tokens_no_note "rc=$rc" "$(cat "$T/err")"
out0=$("$L" run -m "$M" -p "Once upon a time" -n 0 2>"$T/err"); rc=$?
[ $rc -eq 0 ] && [ "$out0" == "Once upon a time" ] && grep -q "generated 0 tok" "$T/err" && ok run_n0 || bad run_n0 "rc=$rc" "$out0" "$(cat "$T/err")"

# 8. mkmodel: deterministic from --seed, its header describes the shape asked
mk() { "$L" mkmodel --layers 2 --embd 128 --heads 4 --kv-heads 2 --ff 256 --vocab 300 --ctx 64 --type Q8_0 -t 2 "$@" 2>/dev/null; }
mk --seed 5 -o "$T/m1.gguf" && mk --seed 5 -o "$T/m2.gguf" && mk --seed 6 -o "$T/m3.gguf"
cmp -s "$T/m1.gguf" "$T/m2.gguf" && ! cmp -s "$T/m1.gguf" "$T/m3.gguf" && ok mkmodel_deterministic || bad mkmodel_deterministic
"$L" info -m "$T/m1.gguf" >"$T/info2" 2>&1
grep -q "layers: *2" "$T/info2" && grep -q "embedding: *128" "$T/info2" && grep -q "4 query, 2 key/value" "$T/info2" &&
    grep -q "feed-forward: *256" "$T/info2" && grep -q "vocabulary: *300" "$T/info2" && grep -q "Q8_0" "$T/info2" &&
    ok mkmodel_header || bad mkmodel_header "$(cat "$T/info2")"
# with a real vocabulary, text goes through it
V=tests/data/vocab
mk --seed 1 --vocab-from $V/ggml-vocab-llama-spm.gguf -o "$T/m4.gguf"
"$L" run -m "$T/m4.gguf" -p "Hello" -n 4 --temp 0 >/dev/null 2>"$T/err" && grep -q "vocabulary: *32000" <("$L" info -m "$T/m4.gguf") &&
    ok mkmodel_vocab_from || bad mkmodel_vocab_from "$(cat "$T/err")"
# 9. quantize through the command line: the Q4_0 copy loads, runs and is smaller
"$L" quantize "$T/m1.gguf" "$T/m1q4.gguf" Q4_0 2>"$T/err" && "$L" bench -m "$T/m1q4.gguf" -p 8 -n 2 -r 1 --no-bw >/dev/null 2>&1 &&
    [ "$(stat -c %s "$T/m1q4.gguf")" -lt "$(stat -c %s "$T/m1.gguf")" ] && ok quantize_cli || bad quantize_cli "$(tail -3 "$T/err")"
"$L" quantize "$T/m1.gguf" "$T/x.gguf" Q3_K >/dev/null 2>&1; [ $? -eq 2 ] && ok quantize_bad_type || bad quantize_bad_type
# one KV type parser: every --kv-type rejects an unknown type with the same message, exit 2
for c in run perplexity kv bench serve; do
    "$L" $c -m "$M" --kv-type Q4_0 >/dev/null 2>"$T/err"; rc=$?
    [ $rc -eq 2 ] && grep -q "KV type 'Q4_0' is not one of F32, F16, Q8_0" "$T/err" && ok "kv_type_bad_$c" ||
        bad "kv_type_bad_$c" "rc=$rc" "$(head -3 "$T/err")"
done
# 10. kv: the plan printed agrees with the formula
"$L" kv -m "$M" -c 128 --seqs 4 >"$T/kv" 2>&1 && grep -q "640 bytes" "$T/kv" && ok kv_plan || bad kv_plan "$(cat "$T/kv")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
