#!/usr/bin/env bash
# End-to-end checks of the lamina command line on the bundled model:
# the demo's greedy story, seeded sampling, llama2.c import, tokenize (also
# on the vocabulary-only files of tests/data/vocab), run --chat, where run
# stops (context, -n), perplexity, info, the --kv-type parser, the exit
# codes of bad invocations, run --grammar, the trained-context limit (--ctx-extend) of every
# command with -c, quantize's fallback warnings and summary, and progress
# lines on a terminal (under script) but not on a pipe.
. "$(dirname "$0")/testenv.sh"

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
# run --chat --no-think: Qwen3's empty reasoning block after the prompt; a template without
# the switch renders as without the flag, with a note
"$L" run -m "$M" -p "Hi" --chat --chat-template qwen3 --no-think -n 1 --temp 0 --show-ids >/dev/null 2>"$T/err"; rc=$?
want=$(printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' |
    "$L" tokenize -m "$M" --ids --bos)
[ $rc -eq 0 ] && grep -qx "prompt ids: $want" "$T/err" && ok run_chat_no_think ||
    bad run_chat_no_think "rc=$rc" "want $want" "$(cat "$T/err")"
"$L" run -m "$M" -p "Hi" --chat --chat-template chatml --no-think -n 1 --temp 0 --show-ids >/dev/null 2>"$T/err"; rc=$?
want=$(printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n' | "$L" tokenize -m "$M" --ids --bos)
[ $rc -eq 0 ] && grep -qx "prompt ids: $want" "$T/err" && grep -q "no thinking switch; --no-think ignored" "$T/err" &&
    ok run_chat_no_think_ignored || bad run_chat_no_think_ignored "rc=$rc" "want $want" "$(cat "$T/err")"

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
grep -Eq "^kernels: +(avx2|avxvnni|avx512|avx512vnni|avx512bf16|scalar)$" "$T/info" && LAMINA_NO_SIMD=1 "$L" info -m "$M" 2>&1 | grep -Eq "^kernels: +scalar$" &&
    ok info_kernels || bad info_kernels "$(grep kernels "$T/info")"
# LAMINA_CPU forces a variant (scalar always runs); a name this CPU cannot run
# is capped at one it can, with a note; an unknown name gets a note too
LAMINA_CPU=scalar "$L" info -m "$M" 2>"$T/cpu_err" | grep -Eq "^kernels: +scalar$" && [ ! -s "$T/cpu_err" ] &&
    LAMINA_CPU=avx9 "$L" info -m "$M" 2>&1 | grep -q "LAMINA_CPU=avx9: no such variant" &&
    { LAMINA_CPU=avx512vnni "$L" info -m "$M" 2>&1 | grep -Eq "^kernels: +avx512vnni$" ||
      LAMINA_CPU=avx512vnni "$L" info -m "$M" 2>&1 | grep -q "LAMINA_CPU=avx512vnni: this CPU does not run it"; } &&
    ok info_lamina_cpu || bad info_lamina_cpu "$(LAMINA_CPU=avx512vnni "$L" info -m "$M" 2>&1 | grep -i kernels)"
# the BF16 variant by name: itself, or capped with the note
{ LAMINA_CPU=avx512bf16 "$L" info -m "$M" 2>&1 | grep -Eq "^kernels: +avx512bf16$" ||
  LAMINA_CPU=avx512bf16 "$L" info -m "$M" 2>&1 | grep -q "LAMINA_CPU=avx512bf16: this CPU does not run it"; } &&
    ok info_lamina_cpu_bf16 || bad info_lamina_cpu_bf16 "$(LAMINA_CPU=avx512bf16 "$L" info -m "$M" 2>&1 | grep -i kernels)"

# run --grammar: the text after the prompt is a whole string of the grammar (it ends
# the text), greedy and sampled; a bad grammar fails naming its line and column
printf 'root ::= " Once" (" " [a-z]+){3,8} "."\n' >"$T/words.gbnf"
for s in "--temp 0" "--temp 1 --seed 3"; do
    out=$("$L" run -m "$M" -p "Hello" -n 60 $s --grammar "$T/words.gbnf" 2>"$T/err")
    [[ "$out" =~ ^Hello\ Once(\ [a-z]+){3,8}\.$ ]] && ok "run_grammar $s" || bad "run_grammar $s" "got: $out" "$(cat "$T/err")"
done
printf 'root ::= "a"\nb ::= [x\n' >"$T/bad.gbnf"
"$L" run -m "$M" -p "Hello" -n 5 --grammar "$T/bad.gbnf" >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "grammar: line 2, column 9: unexpected end of line" "$T/err" && ok run_grammar_error ||
    bad run_grammar_error "rc=$rc" "$(cat "$T/err")"

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
# a usage error is the error and one line pointing to --help, not the whole usage
for c in run serve bench quantize route; do
    "$L" $c --bogus-flag >/dev/null 2>"$T/err"; rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 2 ] && grep -q "^lamina $c: unknown argument '--bogus-flag'$" "$T/err" &&
        grep -qx "Try 'lamina $c --help'." "$T/err" && ok "usage_error_short_$c" || bad "usage_error_short_$c" "rc=$rc" "$(cat "$T/err")"
done
"$L" frobnicate >/dev/null 2>"$T/err"
[ "$(wc -l <"$T/err")" -eq 2 ] && grep -qx "Try 'lamina --help'." "$T/err" && ok unknown_command_short ||
    bad unknown_command_short "$(cat "$T/err")"
# lamina --version / lamina version: the release, the commit, the compiler, the kernels
v=$(sed -n 's/^#define LM_VERSION_STRING "\(.*\)"/\1/p' include/lamina.h)
for f in --version version; do
    "$L" $f >"$T/v" 2>&1; rc=$?
    [ $rc -eq 0 ] && grep -qx "lamina $v" "$T/v" && grep -q "^commit:   [0-9a-f]\{7,\}\|^commit:   unknown" "$T/v" &&
        grep -q "^compiler: \(gcc\|clang\) [0-9]" "$T/v" &&
        grep -qx "kernels:  $("$L" info "$M" | sed -n 's/^kernels: *//p' | head -1)" "$T/v" && ok "version_$f" ||
        bad "version_$f" "rc=$rc" "$(cat "$T/v")"
done
LAMINA_NO_SIMD=1 "$L" --version | grep -qx "kernels:  scalar" && ok version_kernels_follow_env || bad version_kernels_follow_env
# lamina info MODEL, without -m
"$L" info "$M" >"$T/i1" 2>&1 && "$L" info -m "$M" >"$T/i2" 2>&1 && cmp -s "$T/i1" "$T/i2" &&
    grep -q "^architecture:  llama" "$T/i1" && ok info_positional || bad info_positional "$(head -3 "$T/i1")"
# prompt longer than the context is a clear error
"$L" run -m "$M" -p "$(head -c 3000 "$T/text.txt")" -n 5 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q context "$T/err" && ok prompt_too_long || bad prompt_too_long "rc=$rc" "$(cat "$T/err")"
# generation that reaches the context end stops with a note
"$L" run -m "$M" -p "Once upon a time" -n 500 --temp 0 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && grep -q "context of 128 tokens is full" "$T/err" && ok context_full_stops || bad context_full_stops "rc=$rc" "$(cat "$T/err")"
grep -q "the model's trained context; -c above it needs --ctx-extend" "$T/err" && ok context_full_names_trained ||
    bad context_full_names_trained "$(cat "$T/err")"
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
# Q4_1 and Q5_1 (x = d*q + m) and MXFP4 likewise; the Q4_1 copy is between Q4_0 and Q5_1 in
# size, the MXFP4 copy (17 bytes per 32 weights) under the Q4_0 one (18)
for q in Q4_1 Q5_1 MXFP4; do
    "$L" quantize "$T/m1.gguf" "$T/m1-$q.gguf" $q 2>"$T/err" && "$L" bench -m "$T/m1-$q.gguf" -p 8 -n 2 -r 1 --no-bw >/dev/null 2>>"$T/err" &&
        [ "$(stat -c %s "$T/m1-$q.gguf")" -lt "$(stat -c %s "$T/m1.gguf")" ] && ok "quantize_cli_$q" || bad "quantize_cli_$q" "$(tail -3 "$T/err")"
done
[ "$(stat -c %s "$T/m1q4.gguf")" -lt "$(stat -c %s "$T/m1-Q4_1.gguf")" ] && [ "$(stat -c %s "$T/m1-Q4_1.gguf")" -lt "$(stat -c %s "$T/m1-Q5_1.gguf")" ] &&
    [ "$(stat -c %s "$T/m1-MXFP4.gguf")" -lt "$(stat -c %s "$T/m1q4.gguf")" ] &&
    ok quantize_cli_sizes || bad quantize_cli_sizes "$(ls -l "$T"/m1*.gguf)"
"$L" quantize "$T/m1.gguf" "$T/x.gguf" Q3_K >/dev/null 2>&1; [ $? -eq 2 ] && ok quantize_bad_type || bad quantize_bad_type
# one KV type parser: every --kv-type rejects an unknown type with the same message, exit 2
for c in run perplexity kv bench serve; do
    "$L" $c -m "$M" --kv-type Q4_0 >/dev/null 2>"$T/err"; rc=$?
    [ $rc -eq 2 ] && grep -q "KV type 'Q4_0' is not one of F32, F16, Q8_0" "$T/err" && ok "kv_type_bad_$c" ||
        bad "kv_type_bad_$c" "rc=$rc" "$(head -3 "$T/err")"
done
# 10. kv: the plan printed agrees with the formula
"$L" kv -m "$M" -c 128 --seqs 4 >"$T/kv" 2>&1 && grep -q "640 bytes" "$T/kv" && ok kv_plan || bad kv_plan "$(cat "$T/kv")"


# 11. the trained context (128 tokens for the bundled model): -c above it is refused (exit 1,
#     naming the trained context and --ctx-extend) by every command that takes it, and accepted
#     with --ctx-extend and a warning; defaults stay within it
refused() { [ "$1" -eq 1 ] && grep -q "above the model's trained context of 128 tokens; pass --ctx-extend" "$T/err"; }
warned() { grep -q "warning: .* is past the model's trained context of 128 tokens (--ctx-extend)" "$T/err"; }
"$L" run -m "$M" -p "Once upon a time" -n 4 -c 16777216 >/dev/null 2>"$T/err"; rc=$?
refused $rc && grep -q -- "-c 16777216" "$T/err" && ok ctx_run_refused || bad ctx_run_refused "rc=$rc" "$(cat "$T/err")"
"$L" run -m "$M" -p "Once upon a time" -n 4 -c 256 --ctx-extend --temp 0 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && warned && ok ctx_run_extend || bad ctx_run_extend "rc=$rc" "$(cat "$T/err")"
"$L" run -m "$M" -p "Once upon a time" -n 4 -c 128 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && ! grep -q "trained context" "$T/err" && ok ctx_run_at_limit || bad ctx_run_at_limit "rc=$rc" "$(cat "$T/err")"
"$L" perplexity -m "$M" -f "$T/text.txt" -c 256 >/dev/null 2>"$T/err"; rc=$?
refused $rc && ok ctx_perplexity_refused || bad ctx_perplexity_refused "rc=$rc" "$(cat "$T/err")"
"$L" perplexity -m "$M" -f "$T/text.txt" -c 256 --ctx-extend >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && warned && grep -q "chunks of 256" "$T/err" && grep -q "PPL = " "$T/out" && ok ctx_perplexity_extend ||
    bad ctx_perplexity_extend "rc=$rc" "$(cat "$T/err")"
# perplexity's default chunk is 512 tokens, or the trained context when smaller
"$L" perplexity -m "$M" -f "$T/text.txt" >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && grep -q "chunks of 128, scoring" "$T/err" && ! grep -q "trained context" "$T/err" &&
    grep -q "PPL = " "$T/out" && ok perplexity_default_ctx || bad perplexity_default_ctx "rc=$rc" "$(cat "$T/err")"
"$L" bench -m "$M" -d 100000 -r 1 --no-bw >/dev/null 2>"$T/err"; rc=$?
refused $rc && grep -q -- "-d 100000 + -p 512 = 100512" "$T/err" && ok ctx_bench_depth_refused ||
    bad ctx_bench_depth_refused "rc=$rc" "$(cat "$T/err")"
"$L" bench -m "$M" -p 200 -n 0 -r 1 --no-bw >/dev/null 2>"$T/err"; rc=$?
refused $rc && grep -q -- "-p 200 is above" "$T/err" && ok ctx_bench_p_refused || bad ctx_bench_p_refused "rc=$rc" "$(cat "$T/err")"
"$L" bench -m "$M" -p 200 -n 0 -r 1 --no-bw --ctx-extend >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && warned && grep -q "| pp200 |" "$T/out" && ok ctx_bench_extend || bad ctx_bench_extend "rc=$rc" "$(cat "$T/err")"
# bench's defaults (-p 512, -n 128) shrink to what the trained context leaves after -d
"$L" bench -m "$M" -d 100 -r 1 --no-bw >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && grep -q "| pp28 @ d100 |" "$T/out" && grep -q "| tg28 @ d100 |" "$T/out" && ! grep -q "trained" "$T/err" &&
    ok bench_default_fits_ctx || bad bench_default_fits_ctx "rc=$rc" "$(cat "$T/out" "$T/err")"
"$L" kv -m "$M" -c 4096 >/dev/null 2>"$T/err"; rc=$?
refused $rc && ok ctx_kv_refused || bad ctx_kv_refused "rc=$rc" "$(cat "$T/err")"
"$L" kv -m "$M" -c 4096 --ctx-extend >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && warned && grep -q "1 sequence of 4096 tokens" "$T/out" && ok ctx_kv_extend || bad ctx_kv_extend "rc=$rc" "$(cat "$T/err")"
"$L" bench serve -m "$M" -c 1024 --requests 2 --modes continuous >/dev/null 2>"$T/err"; rc=$?
refused $rc && ok ctx_bench_serve_refused || bad ctx_bench_serve_refused "rc=$rc" "$(cat "$T/err")"
"$L" bench serve -m "$M" -c 256 --ctx-extend --requests 2 --modes continuous -t 1 >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && warned && grep -q "^continuous" "$T/out" && ok ctx_bench_serve_extend || bad ctx_bench_serve_extend "rc=$rc" "$(cat "$T/err")"
"$L" serve -m "$M" --port 0 -t 1 -c 16777216 >/dev/null 2>"$T/err"; rc=$?
refused $rc && ok ctx_serve_refused || bad ctx_serve_refused "rc=$rc" "$(cat "$T/err")"
timeout -s INT 5 "$L" serve -m "$M" --port 0 -t 1 -c 256 --ctx-extend >/dev/null 2>"$T/err"
warned && grep -q "ready in .* (context 256)" "$T/err" && ok ctx_serve_extend || bad ctx_serve_extend "$(cat "$T/err")"

# 12. quantize to Q4_K: the bundled model's rows are 64 wide (172 for ffn_down), so nothing
#     fits Q4_K's 256-element blocks: one warning per fallback with the reason, and a summary
#     whose numbers agree with lamina info of the output
"$L" quantize "$M" "$T/q4k.gguf" Q4_K >/dev/null 2>"$T/err"; rc=$?
"$L" info -m "$T/q4k.gguf" >"$T/qinfo" 2>&1
wb=$(sed -n 's/^weight bytes: *\([0-9]*\) .*/\1/p' "$T/qinfo")
np=$(sed -n 's/^parameters: *\([0-9]*\) .*/\1/p' "$T/qinfo")
bpw=$(awk -v b="$wb" -v n="$np" 'BEGIN{printf "%.2f", 8 * b / n}')
[ $rc -eq 0 ] &&
    grep -qx "quantize: warning: 32 tensors kept as Q8_0 instead of Q4_K: row length 64 is not a multiple of Q4_K's block of 256" "$T/err" &&
    grep -qx "quantize: warning: 5 tensors kept as F16 instead of Q4_K: row length 172 is not a multiple of Q4_K's block of 256" "$T/err" &&
    [ "$(grep -c "quantize: warning" "$T/err")" -eq 2 ] &&
    grep -q "^tensor types: *F32 x11 F16 x5 Q8_0 x32 (48 tensors)" "$T/qinfo" &&
    grep -Eq "^  F32 +11 tensors " "$T/err" && grep -Eq "^  F16 +5 tensors .* 16.00 bits/weight" "$T/err" &&
    grep -Eq "^  Q8_0 +32 tensors .* 8.50 bits/weight" "$T/err" &&
    grep -Eq "^  total +48 tensors +$wb bytes .* $bpw bits/weight, $np weights" "$T/err" &&
    ok quantize_fallback_summary || bad quantize_fallback_summary "rc=$rc wb=$wb np=$np bpw=$bpw" "$(tail -9 "$T/err")" "$(cat "$T/qinfo")"
# no fallback, no warning (Q8_0 fits rows of 64 but not 172: one warning)
"$L" quantize "$M" "$T/q8.gguf" F16 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && ! grep -q warning "$T/err" && grep -Eq "^  total +48 tensors " "$T/err" && ok quantize_no_fallback ||
    bad quantize_no_fallback "rc=$rc" "$(tail -5 "$T/err")"

# 13. progress on a terminal: under a pseudo-terminal (script) with LAMINA_PROGRESS_AFTER=0
#     (no delay), run's prefill, perplexity's chunks, bench's depth fill, pp and tg and
#     bench serve's modes draw a line rewritten in place (\r); with stderr not a terminal,
#     nothing of it
if command -v script >/dev/null 2>&1; then
    tty_run() { LAMINA_PROGRESS_AFTER=0 script -qec "$1" /dev/null >"$T/tty" 2>&1 </dev/null; }
    tty_run "$L run -m $M -f $T/story.txt -n 2 --temp 0"
    grep -aq $'\r\e\\[Krun: prompt 0/[0-9]* tokens (0%)' "$T/tty" && ok progress_run_tty || bad progress_run_tty "$(od -c "$T/tty" | head -5)"
    tty_run "$L perplexity -m $M -f $T/text.txt -c 64 >$T/out"
    grep -aq $'\r\e\\[Kperplexity: chunk 0/[0-9]* chunks (0%)' "$T/tty" && ok progress_perplexity_tty ||
        bad progress_perplexity_tty "$(od -c "$T/tty" | head -5)"
    tty_run "$L bench -m $M -d 64 -p 32 -n 8 -r 2 --no-bw >$T/out"
    grep -aq "bench: filling the cache to depth 0/64 tokens" "$T/tty" && grep -aq "bench: pp32 0/2 repetitions" "$T/tty" &&
        grep -aq "bench: tg8 0/16 tokens (0%)" "$T/tty" && ok progress_bench_tty || bad progress_bench_tty "$(tr '\r' '\n' <"$T/tty")"
    tty_run "$L bench serve -m $M --requests 4 --modes continuous -t 1 >$T/out"
    grep -aq "bench serve: continuous [0-9]/4 requests done" "$T/tty" && ok progress_bench_serve_tty ||
        bad progress_bench_serve_tty "$(tr '\r' '\n' <"$T/tty")"
    LAMINA_PROGRESS_AFTER=0 "$L" run -m "$M" -f "$T/story.txt" -n 2 --temp 0 >/dev/null 2>"$T/err"
    LAMINA_PROGRESS_AFTER=0 "$L" bench -m "$M" -d 64 -p 32 -n 8 -r 2 --no-bw >/dev/null 2>>"$T/err"
    LAMINA_PROGRESS_AFTER=0 "$L" perplexity -m "$M" -f "$T/text.txt" -c 64 >/dev/null 2>>"$T/err"
    ! grep -q $'\r' "$T/err" && ! grep -q "repetitions\|chunk 0/" "$T/err" && ok progress_not_on_pipe || bad progress_not_on_pipe "$(cat -A "$T/err" | head)"
else
    echo "SKIP progress (no script command)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
