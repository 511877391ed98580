#!/usr/bin/env bash
# End-to-end checks that lamina never loses the user's data (base/safefile.h):
#   - quantize refuses an output that is its input (the same path, a hard
#     link, a symbolic link), and the input stays byte-identical;
#   - quantize, mkmodel and convert refuse /dev/null, /dev/full, a FIFO and a
#     directory as output (all still there, of the same kind, afterwards), and
#     a destination folder that cannot hold a file (a path under a regular
#     file, which fails even for root) before any work;
#   - a write that fails half-way (LAMINA_WRITE_FAIL_AFTER=n, and a full
#     64 KiB tmpfs where mount is allowed) leaves an existing output
#     byte-identical with the same inode, and no temporary file behind;
#   - a successful write replaces the output and leaves no temporary file;
#   - an interrupted write (SIGINT) leaves no temporary file; nor does one
#     ended by SIGPIPE, SIGUSR1 or SIGXFSZ (ulimit -f); a writer killed with
#     SIGKILL leaves its temporary file, and the next write of that output
#     removes it;
#   - every other writer refuses its inputs as output: perplexity's
#     --save-logits and --logits-out onto the model, a symbolic link to it,
#     or the text; route --trace onto the served model; trace --svg onto
#     the trace it reads;
#   - inputs that are directories or FIFOs (model, -f files, a chat template
#     file, tokenize's standard input) are a clear error and exit 1, never a hang (every
#     command runs under a timeout).
# These do not rely on permissions, so they hold when run as root.
. "$(dirname "$0")/testenv.sh"
skip=0
MNT=
cleanup() {
    [ -n "$MNT" ] && umount "$MNT" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
to() { timeout 60 "$@"; }
# entries of a folder whose name marks a temporary file
tmps() { find "$1" -maxdepth 1 -name '.*.tmp-*' | wc -l; }

cp "$M" "$T/m.gguf"
ln "$T/m.gguf" "$T/hard.gguf"
ln -s m.gguf "$T/sym.gguf"

# 1. output = input, a hard link, a symbolic link: refused, input intact
for out in m.gguf hard.gguf sym.gguf; do
    to "$L" quantize "$T/m.gguf" "$T/$out" Q8_0 >/dev/null 2>"$T/err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "is the input" "$T/err" && cmp -s "$M" "$T/m.gguf" && [ "$(tmps "$T")" -eq 0 ] &&
        ! grep -q '^\[' "$T/err"; then
        ok "quantize_refuses_input_as_output_$out"
    else
        bad "quantize_refuses_input_as_output_$out" "rc $rc" "$(cat "$T/err")"
    fi
done
[ -L "$T/sym.gguf" ] && [ "$(stat -c %h "$T/m.gguf")" -eq 2 ] && ok links_untouched || bad links_untouched

# 2. non-regular outputs refused, and still what they were
mkfifo "$T/fifo"
mkdir "$T/dir"
touch "$T/dir/keep"
check_kind() { # path, stat %F before the run
    [ "$(stat -c %F "$1" 2>/dev/null)" == "$2" ]
}
for out in /dev/null /dev/full "$T/fifo" "$T/dir"; do
    [ -e "$out" ] || continue
    kind=$(stat -c %F "$out")
    name=$(basename "$out")
    for c in quantize mkmodel convert; do
        case $c in
        quantize) to "$L" quantize "$T/m.gguf" "$out" Q8_0 >/dev/null 2>"$T/err" ;;
        mkmodel) to "$L" mkmodel --layers 1 --embd 64 --heads 2 --ff 128 --vocab 64 -o "$out" >/dev/null 2>"$T/err" ;;
        convert) to "$L" convert --llama2c models/stories260K.bin --tokenizer models/tok512.bin -o "$out" \
            >/dev/null 2>"$T/err" ;;
        esac
        rc=$?
        if [ $rc -eq 1 ] && grep -q "not a regular file" "$T/err" && check_kind "$out" "$kind" &&
            ! grep -q '^\[\|mkmodel: layer' "$T/err"; then
            ok "${c}_refuses_output_$name"
        else
            bad "${c}_refuses_output_$name" "rc $rc, now $(stat -c %F "$out" 2>&1)" "$(cat "$T/err")"
        fi
    done
done
[ -f "$T/dir/keep" ] && ok dir_output_untouched || bad dir_output_untouched

# 3. a folder that cannot hold a file: refused before any work
touch "$T/plain"
to "$L" quantize "$T/m.gguf" "$T/plain/out.gguf" Q8_0 >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && ! grep -q '^\[' "$T/err" && grep -q "plain/out.gguf" "$T/err" &&
    ok quantize_bad_folder_before_work || bad quantize_bad_folder_before_work "rc $rc" "$(cat "$T/err")"
to "$L" mkmodel --layers 1 --embd 64 --heads 2 --ff 128 --vocab 64 -o "$T/plain/out.gguf" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && ! grep -q 'mkmodel: layer' "$T/err" &&
    ok mkmodel_bad_folder_before_work || bad mkmodel_bad_folder_before_work "rc $rc" "$(cat "$T/err")"
to "$L" convert --llama2c models/stories260K.bin --tokenizer models/tok512.bin -o "$T/nofolder/out.gguf" \
    >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && [ ! -e "$T/nofolder" ] && ok convert_bad_folder || bad convert_bad_folder "rc $rc" "$(cat "$T/err")"

# 4. a write that fails half-way: the existing output is untouched (same bytes, same inode)
printf 'an older file the user cares about\n' >"$T/old"
for c in quantize mkmodel convert; do
    for n in 0 7 40; do
        cp "$T/old" "$T/out.gguf"
        ino=$(stat -c %i "$T/out.gguf")
        case $c in
        quantize) LAMINA_WRITE_FAIL_AFTER=$n to "$L" quantize "$T/m.gguf" "$T/out.gguf" Q8_0 >/dev/null 2>"$T/err" ;;
        mkmodel) LAMINA_WRITE_FAIL_AFTER=$n to "$L" mkmodel --layers 1 --embd 64 --heads 2 --ff 128 --vocab 64 \
            -o "$T/out.gguf" >/dev/null 2>"$T/err" ;;
        convert) LAMINA_WRITE_FAIL_AFTER=$n to "$L" convert --llama2c models/stories260K.bin \
            --tokenizer models/tok512.bin -o "$T/out.gguf" >/dev/null 2>"$T/err" ;;
        esac
        rc=$?
        if [ $rc -eq 1 ] && grep -q "No space left" "$T/err" && cmp -s "$T/old" "$T/out.gguf" &&
            [ "$(stat -c %i "$T/out.gguf")" == "$ino" ] && [ "$(tmps "$T")" -eq 0 ]; then
            ok "${c}_failed_write_$n"
        else
            bad "${c}_failed_write_$n" "rc $rc" "$(cat "$T/err")" "$(ls -A "$T")"
        fi
    done
done

# 5. the same writes unfailed replace the output and leave nothing behind
to "$L" quantize "$T/m.gguf" "$T/out.gguf" Q8_0 >/dev/null 2>"$T/err" && "$L" info -m "$T/out.gguf" >/dev/null 2>&1 &&
    [ "$(tmps "$T")" -eq 0 ] && ! cmp -s "$T/old" "$T/out.gguf" && ok quantize_replaces_output ||
    bad quantize_replaces_output "$(cat "$T/err")"
cp "$T/out.gguf" "$T/q8.gguf"
to "$L" quantize "$T/m.gguf" "$T/sym.out" Q8_0 >/dev/null 2>&1 && cmp -s "$T/sym.out" "$T/q8.gguf" &&
    ok quantize_deterministic || bad quantize_deterministic

# 6. a full filesystem (a 64 KiB tmpfs; the Q8_0 model is about 370 KiB)
mkdir "$T/full"
if mount -t tmpfs -o size=64k tmpfs "$T/full" 2>/dev/null; then
    MNT="$T/full"
    cp "$T/old" "$T/full/out.gguf"
    ino=$(stat -c %i "$T/full/out.gguf")
    to "$L" quantize "$T/m.gguf" "$T/full/out.gguf" Q8_0 >/dev/null 2>"$T/err"
    rc=$?
    if [ $rc -eq 1 ] && cmp -s "$T/old" "$T/full/out.gguf" && [ "$(stat -c %i "$T/full/out.gguf")" == "$ino" ] &&
        [ "$(tmps "$T/full")" -eq 0 ] && [ "$(ls -A "$T/full" | wc -l)" -eq 1 ]; then
        ok quantize_full_filesystem
    else
        bad quantize_full_filesystem "rc $rc" "$(cat "$T/err")" "$(ls -A "$T/full")"
    fi
    umount "$T/full" && MNT=
else
    echo "SKIP quantize_full_filesystem (mount of a tmpfs refused)"
    skip=$((skip + 1))
fi

# 7. inputs that are directories or FIFOs: exit 1 with a clear message, no hang
expect_input_error() { # name, pattern, command...
    local name=$1 pat=$2
    shift 2
    timeout 20 "$@" >"$T/out" 2>"$T/err" </dev/null
    local rc=$?
    if [ $rc -eq 1 ] && grep -qi "$pat" "$T/err"; then ok "$name"; else bad "$name" "rc $rc" "$(cat "$T/err")"; fi
}
expect_input_error run_f_dir "directory" "$L" run -m "$M" -f "$T/dir" -n 2
expect_input_error run_f_fifo "FIFO" "$L" run -m "$M" -f "$T/fifo" -n 2
expect_input_error perplexity_f_dir "directory" "$L" perplexity -m "$M" -f "$T/dir"
expect_input_error perplexity_f_fifo "FIFO" "$L" perplexity -m "$M" -f "$T/fifo"
expect_input_error run_model_dir "directory" "$L" run -m "$T/dir" -p hi -n 2
expect_input_error run_model_fifo "regular file" "$L" run -m "$T/fifo" -p hi -n 2
expect_input_error run_chat_template_dir "directory" "$L" run -m "$M" -p hi -n 2 --chat --chat-template "$T/dir"
expect_input_error tokenize_model_dir "directory" "$L" tokenize -m "$T/dir"
expect_input_error quantize_input_dir "directory" "$L" quantize "$T/dir" "$T/x.gguf" Q8_0
expect_input_error quantize_input_fifo "regular file" "$L" quantize "$T/fifo" "$T/x.gguf" Q8_0
expect_input_error convert_input_fifo "regular file" "$L" convert --llama2c "$T/fifo" --tokenizer models/tok512.bin -o "$T/x.gguf"
[ ! -e "$T/x.gguf" ] && [ "$(tmps "$T")" -eq 0 ] && ok bad_inputs_write_nothing || bad bad_inputs_write_nothing "$(ls -A "$T")"
timeout 20 "$L" tokenize -m "$M" <"$T/dir" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && grep -q "standard input is a directory" "$T/err" && [ ! -s "$T/out" ] &&
    ok tokenize_stdin_dir || bad tokenize_stdin_dir "rc $rc" "$(cat "$T/err")"
# standard input that is a pipe is still read
ids=$(printf 'Once upon a time' | timeout 20 "$L" tokenize -m "$M" --ids)
[[ "$ids" =~ ^[0-9]+( [0-9]+)*$ ]] && ok tokenize_stdin_pipe || bad tokenize_stdin_pipe "$ids"

# 8. an interrupted write (SIGINT while mkmodel generates weights, its temporary file
#    already created) leaves neither the temporary file nor an output
mkdir "$T/int"
# (a background job starts with SIGINT ignored, which lamina keeps, as programs do: undo that here)
env --default-signal=INT "$L" mkmodel --layers 6 --embd 512 --heads 8 --ff 1408 --vocab 32000 --type Q8_0 -t 1 \
    -o "$T/int/big.gguf" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 500); do
    [ "$(tmps "$T/int")" -gt 0 ] && break
    sleep 0.01
done
seen=$(tmps "$T/int")
kill -INT $pid 2>/dev/null
wait $pid
rc=$?
if [ $rc -eq 0 ]; then
    echo "SKIP interrupted_write (mkmodel finished before the signal)"
    skip=$((skip + 1))
elif [ "$seen" -eq 1 ] && [ $rc -eq 130 ] && [ -z "$(ls -A "$T/int")" ]; then
    ok interrupted_write
else
    bad interrupted_write "rc $rc, temporary files seen $seen" "$(ls -A "$T/int")"
fi

# 9. other writers, other inputs: refused, the input untouched, nothing left behind
mkdir "$T/in"
cp "$M" "$T/in/m.gguf"
ln -s m.gguf "$T/in/sym.gguf"
head -c 3000 tests/data/mpi_text.txt >"$T/in/t.txt"
cp "$T/in/m.gguf" "$T/m0"
cp "$T/in/t.txt" "$T/t0"
for flag in --save-logits --logits-out; do
    for out in m.gguf sym.gguf t.txt; do
        to "$L" perplexity -m "$T/in/m.gguf" -f "$T/in/t.txt" -c 64 $flag "$T/in/$out" >/dev/null 2>"$T/err"
        rc=$?
        if [ $rc -eq 1 ] && grep -q "is the input" "$T/err" && cmp -s "$T/m0" "$T/in/m.gguf" &&
            cmp -s "$T/t0" "$T/in/t.txt" && [ "$(tmps "$T/in")" -eq 0 ]; then
            ok "perplexity${flag#-}_refuses_$out"
        else
            bad "perplexity${flag#-}_refuses_$out" "rc $rc" "$(cat "$T/err")"
        fi
    done
done
to "$L" route --spawn 1 -m "$T/in/m.gguf" --trace "$T/in/m.gguf" --port 0 >/dev/null 2>"$T/err"
rc=$?
[ $rc -ne 0 ] && grep -q "is the input" "$T/err" && cmp -s "$T/m0" "$T/in/m.gguf" && [ "$(tmps "$T/in")" -eq 0 ] &&
    ok route_trace_refuses_model || bad route_trace_refuses_model "rc $rc" "$(cat "$T/err")"
printf '%s\n' '{"kind":"start","policy":0,"max_inflight":4,"max_queue":8,"replicas":["http://a"]}' \
    '{"kind":"sample","t":0.1,"queue":0,"replicas":[{"inflight":1,"running":1,"waiting":0}]}' \
    '{"kind":"req","id":1,"replica":0,"attempts":1,"stream":false,"status":200,"error":0,"arrive":0.0,"admit":0.01,"send":0.02,"engine_admit":0.03,"first":0.1,"done":0.2}' \
    '{"kind":"sample","t":0.3,"queue":0,"replicas":[{"inflight":0,"running":0,"waiting":0}]}' >"$T/in/tr.jsonl"
cp "$T/in/tr.jsonl" "$T/tr0"
to "$L" trace "$T/in/tr.jsonl" --svg "$T/in/tr.jsonl" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && grep -q "is the input" "$T/err" && cmp -s "$T/tr0" "$T/in/tr.jsonl" && [ "$(tmps "$T/in")" -eq 0 ] &&
    ok trace_svg_refuses_trace || bad trace_svg_refuses_trace "rc $rc" "$(cat "$T/err")"
to "$L" trace "$T/in/tr.jsonl" --svg "$T/in/tr.svg" >/dev/null 2>"$T/err" && grep -q "<svg" "$T/in/tr.svg" &&
    ok trace_svg_written || bad trace_svg_written "$(cat "$T/err")"

# 10. writes ended by other signals leave no temporary file; SIGKILL's is removed by the next write
BIG=(mkmodel --layers 6 --embd 512 --heads 8 --ff 1408 --vocab 32000 --type Q8_0 -t 1 -o)
wait_temp() {
    for _ in $(seq 500); do
        [ "$(tmps "$1")" -gt 0 ] && return 0
        sleep 0.01
    done
    return 1
}
for sig in PIPE USR1 KILL; do
    rm -rf "$T/sig" && mkdir "$T/sig"
    "$L" "${BIG[@]}" "$T/sig/big.gguf" >/dev/null 2>&1 &
    pid=$!
    wait_temp "$T/sig"
    seen=$(tmps "$T/sig")
    kill -$sig $pid 2>/dev/null
    wait $pid
    rc=$?
    want=$((128 + $(kill -l $sig)))
    left=$(tmps "$T/sig")
    if [ $rc -eq 0 ]; then
        echo "SKIP signal_$sig (mkmodel finished before the signal)"
        skip=$((skip + 1))
    elif [ $sig != KILL ] && [ "$seen" -eq 1 ] && [ $rc -eq $want ] && [ -z "$(ls -A "$T/sig")" ]; then
        ok "signal_${sig}_leaves_nothing"
    elif [ $sig == KILL ] && [ "$seen" -eq 1 ] && [ $rc -eq $want ] && [ "$left" -eq 1 ]; then
        to "$L" mkmodel --layers 1 --embd 64 --heads 2 --ff 128 --vocab 64 -o "$T/sig/big.gguf" >/dev/null 2>&1
        [ $? -eq 0 ] && [ "$(tmps "$T/sig")" -eq 0 ] && [ "$(ls -A "$T/sig")" == big.gguf ] &&
            ok signal_KILL_temp_removed_by_next_write || bad signal_KILL_temp_removed_by_next_write "$(ls -A "$T/sig")"
    else
        bad "signal_$sig" "rc $rc (want $want), temporary files seen $seen, left $left" "$(ls -A "$T/sig")"
    fi
done
rm -rf "$T/sig" && mkdir "$T/sig"
(
    ulimit -f 200
    exec "$L" "${BIG[@]}" "$T/sig/big.gguf" >/dev/null 2>&1
) 2>/dev/null
rc=$?
[ $rc -eq $((128 + $(kill -l XFSZ))) ] && [ -z "$(ls -A "$T/sig")" ] && ok file_size_limit_leaves_nothing ||
    bad file_size_limit_leaves_nothing "rc $rc" "$(ls -A "$T/sig")"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
