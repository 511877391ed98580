#!/usr/bin/env bash
# Progress lines of the long commands on the bundled model (and a small
# random-weight one), with LAMINA_PROGRESS_AFTER=0 so that they start at once:
#   - on a pipe, nothing of them (no \r, no progress text) from quantize,
#     mkmodel, perplexity, bench and run, and the outputs are the same bytes
#     as with --progress minus the progress lines;
#   - with --progress on a pipe: quantize draws "converting i/n tensors" with
#     increasing i ending at n, the input MiB and an ETA, under its per-tensor
#     lines (all still there); perplexity draws "chunk i/n" with the running
#     ppl, whose last value is the final estimate; mkmodel "generating i/n
#     layers" ending at n; bench its repetitions; run and bench the model
#     loading share;
#   - on a terminal (under script) without --progress, quantize and mkmodel
#     draw their lines too.
. "$(dirname "$0")/testenv.sh"
export LAMINA_PROGRESS_AFTER=0

# progress lines of a captured stderr, one per drawing (\r\e[K ... up to the next \r or \n)
lines() { tr '\r' '\n' <"$1" | sed 's/^\x1b\[K//' | grep -a "$2"; }
# the stderr without the progress drawings (each from \r\e[K "CMD: WHAT" up to the next \r or \n)
plain() { perl -pe 's/\r\e\[K[a-z ]+: (converting|generating|chunk|loading)[^\r\n]*//g; s/\r\e\[K//g' "$1"; }

"$L" run -m "$M" -p "Once upon a time" -n 120 --temp 0 2>/dev/null >"$T/story.txt"
for i in 1 2 3 4 5 6; do cat "$T/story.txt"; done >"$T/text.txt"

# 1. on a pipe, nothing
"$L" quantize "$M" "$T/q1.gguf" Q8_0 >"$T/out" 2>"$T/q_pipe"
"$L" mkmodel -o "$T/m1.gguf" --layers 3 --embd 64 --heads 2 --kv-heads 1 --ff 128 --vocab 256 --ctx 64 2>"$T/m_pipe"
"$L" perplexity -m "$M" -f "$T/text.txt" -c 64 >"$T/ppl_pipe.out" 2>"$T/ppl_pipe"
"$L" bench -m "$M" -p 16 -n 4 -r 2 --no-bw >/dev/null 2>"$T/b_pipe"
"$L" run -m "$M" -p "Once upon a time" -n 4 --temp 0 >/dev/null 2>"$T/r_pipe"
cat "$T/q_pipe" "$T/m_pipe" "$T/ppl_pipe" "$T/b_pipe" "$T/r_pipe" >"$T/all_pipe"
! grep -q $'\r' "$T/all_pipe" && ! grep -Eq "converting|generating|repetitions|loading the model|ETA" "$T/all_pipe" &&
    ok nothing_on_a_pipe || bad nothing_on_a_pipe "$(cat -A "$T/all_pipe" | head)"
grep -q "mkmodel: wrote" "$T/m_pipe" && ok mkmodel_pipe_output || bad mkmodel_pipe_output "$(cat "$T/m_pipe")"

# 2. --progress on a pipe
"$L" quantize "$M" "$T/q2.gguf" Q8_0 --progress >/dev/null 2>"$T/q_prog"; rc=$?
n=$(grep -c '^\[ *[0-9]*/ *[0-9]*\]' "$T/q_pipe")
seq=$(lines "$T/q_prog" '^quantize: converting' | sed -E 's/^quantize: converting ([0-9]+)\/([0-9]+).*/\1 \2/')
last=$(echo "$seq" | tail -n 1)
inc=$(echo "$seq" | awk 'NR > 1 && $1 <= prev { bad = 1 } { prev = $1 } END { print bad ? "no" : "yes" }')
[ $rc -eq 0 ] && [ "$n" -gt 10 ] && [ "$last" == "$n $n" ] && [ "$inc" == yes ] &&
    ok quantize_progress_counts || bad quantize_progress_counts "rc=$rc n=$n last='$last' increasing=$inc" "$(echo "$seq" | head -3)"
lines "$T/q_prog" '^quantize: converting' | grep -Eq "^quantize: converting [0-9]+/$n tensors \([0-9]+%\), [0-9.]+/[0-9.]+ MiB, ETA [0-9]" &&
    lines "$T/q_prog" '^quantize: converting' | tail -n 1 | grep -Eq "^quantize: converting $n/$n tensors \(100%\), ([0-9.]+)/\1 MiB$" &&
    ok quantize_progress_bytes_eta || bad quantize_progress_bytes_eta "$(lines "$T/q_prog" converting | sed -n '1p;$p')"
diff <(plain "$T/q_prog" | grep -v "in [0-9.]* s$") <(grep -v "in [0-9.]* s$" "$T/q_pipe") >/dev/null &&
    cmp -s "$T/q1.gguf" "$T/q2.gguf" && ok quantize_same_output || bad quantize_same_output "$(diff <(plain "$T/q_prog") "$T/q_pipe" | head)"

"$L" perplexity -m "$M" -f "$T/text.txt" -c 64 --progress >"$T/ppl_prog.out" 2>"$T/ppl_prog"
final=$(grep -o 'PPL = [0-9.]*' "$T/ppl_prog.out" | awk '{print $3}')
lastp=$(lines "$T/ppl_prog" '^perplexity: chunk' | tail -n 1)
chunks=$(grep -o '\[[0-9]*\]' "$T/ppl_pipe.out" | wc -l)
[[ "$lastp" == "perplexity: chunk $chunks/$chunks chunks (100%), ppl $final" ]] && [ -n "$final" ] &&
    ok perplexity_running_ppl || bad perplexity_running_ppl "last: $lastp" "final: $final, $chunks chunks"
cmp -s "$T/ppl_prog.out" "$T/ppl_pipe.out" && ok perplexity_same_stdout || bad perplexity_same_stdout "$(diff "$T/ppl_prog.out" "$T/ppl_pipe.out" | head -4)"

"$L" mkmodel -o "$T/m2.gguf" --layers 3 --embd 64 --heads 2 --kv-heads 1 --ff 128 --vocab 256 --ctx 64 --progress 2>"$T/m_prog"
lines "$T/m_prog" '^mkmodel: generating' | tail -n 1 | grep -Eq '^mkmodel: generating 3/3 layers \(100%\), [0-9.]+ MiB$' &&
    cmp -s "$T/m1.gguf" "$T/m2.gguf" && ok mkmodel_progress || bad mkmodel_progress "$(cat -A "$T/m_prog" | head -5)"

"$L" bench -m "$M" -p 16 -n 4 -r 2 --no-bw --progress >/dev/null 2>"$T/b_prog"
grep -aq "bench: pp16 0/2 repetitions (0%)" "$T/b_prog" && grep -aq "bench: loading the model (" "$T/b_prog" &&
    ok bench_progress || bad bench_progress "$(tr '\r' '\n' <"$T/b_prog" | head -8)"
"$L" run -m "$M" -p "Once upon a time" -n 4 --temp 0 --progress >"$T/r_prog.out" 2>"$T/r_prog"
grep -aq $'\r\e\\[Krun: loading the model (0%)' "$T/r_prog" && ok load_progress || bad load_progress "$(cat -A "$T/r_prog" | head -5)"

# 3. a terminal draws without --progress
if command -v script >/dev/null 2>&1; then
    script -qec "$L quantize $M $T/q3.gguf Q8_0" /dev/null >"$T/tty" 2>&1 </dev/null
    grep -aq "quantize: converting $n/$n tensors (100%)" "$T/tty" && ok quantize_tty || bad quantize_tty "$(tr '\r' '\n' <"$T/tty" | tail -5)"
    script -qec "$L mkmodel -o $T/m3.gguf --layers 3 --embd 64 --heads 2 --kv-heads 1 --ff 128 --vocab 256 --ctx 64" /dev/null >"$T/tty" 2>&1 </dev/null
    grep -aq "mkmodel: generating 1/3 layers" "$T/tty" && ok mkmodel_tty || bad mkmodel_tty "$(tr '\r' '\n' <"$T/tty" | tail -5)"
else
    echo "SKIP terminal checks (no script command)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
