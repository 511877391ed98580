#!/usr/bin/env bash
# End-to-end checks of the memory budget (--mem) on the bundled stories260K:
#   - lamina kv --mem: the split adds up (weights + workspace + KV + unused =
#     the budget, unused below one block) and the pool's sequences follow it;
#     a budget below one full-context sequence exits 1 naming the parts;
#     --mem with --kv-mem is a usage error (exit 2);
#   - lamina run --mem: a budget that fits runs and prints the split; one that
#     does not exits 1 with the message, never a crash;
#   - lamina serve --mem: the start-up line shows the split, /metrics has the
#     memory gauges, they add up within the budget and agree with the pool's
#     block count (lamina_kv_blocks_total x block bytes = lamina_memory_kv_bytes);
#     too small a budget stops the server with exit 1;
#   - the default budget (LAMINA_MEM_AVAILABLE replaces the memory available):
#     plenty leaves the pool as it was without a budget; too little is refused;
#   - a draft model (--draft-model, the bundled model as its own draft) is in
#     the budget: kv --mem's split adds up with the draft's line, too small a
#     budget names the draft's parts, --draft-model without --mem is a usage
#     error; serve --mem --draft-model prints the draft's line and /metrics
#     has its gauges, every part within the budget.
. "$(dirname "$0")/testenv.sh"
SPID=
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
to() { timeout 60 nice "$@"; }
num() { grep -m1 "$1" "$2" | sed "s/.*$1 *//; s/ bytes.*//"; }

# 1. kv --mem: 2 MiB, 4 sequences of 128
to "$L" kv -m "$M" --mem 2M --seqs 4 -c 128 -t 2 >"$T/kv.out" 2>&1
rc=$?
w=$(num "weights:" "$T/kv.out"); s=$(num "workspace:" "$T/kv.out"); k=$(num "KV pool:" "$T/kv.out")
u=$(num "unused:" "$T/kv.out")
blk=$(grep -m1 "^block:" "$T/kv.out" | sed 's/.*= //; s/ bytes.*//')
pool=$(grep -m1 "^pool:" "$T/kv.out" | sed 's/.*tokens = //; s/ bytes.*//')
if [ $rc -eq 0 ] && [ $((w + s + k + u)) -eq $((2 * 1048576)) ] && [ "$u" -lt "$blk" ] && [ "$pool" -eq "$k" ]; then
    ok kv_mem_split
else bad kv_mem_split "rc $rc w $w s $s k $k u $u block $blk pool $pool" "$(cat "$T/kv.out")"; fi
to "$L" kv -m "$M" --mem 1200K -c 128 -t 2 >"$T/kv2.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "too small: weights .* + workspace .* one sequence of 128 positions needs" "$T/kv2.out"; then
    ok kv_mem_too_small
else bad kv_mem_too_small "rc $rc" "$(cat "$T/kv2.out")"; fi
to "$L" kv -m "$M" --mem 2M --kv-mem 1M >"$T/kv3.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "not both" "$T/kv3.out"; then ok kv_mem_and_kv_mem; else bad kv_mem_and_kv_mem "rc $rc" "$(cat "$T/kv3.out")"; fi

# 2. run --mem
to "$L" run -m "$M" -p "Once upon a time" -n 8 --temp 0 --mem 4M -t 2 >"$T/run.out" 2>"$T/run.err"
rc=$?
if [ $rc -eq 0 ] && grep -q "lamina run: memory budget 4.00 MiB\|lamina run: memory budget 4.0 MiB" "$T/run.err" &&
    grep -q "KV pool F16: 128 tokens, 1 sequence of 128" "$T/run.err" && [ -s "$T/run.out" ]; then
    ok run_mem
else bad run_mem "rc $rc" "$(cat "$T/run.err")"; fi
to "$L" run -m "$M" -p "Once upon a time" -n 8 --mem 1M -t 2 >"$T/run2.out" 2>"$T/run2.err"
rc=$?
if [ $rc -eq 1 ] && grep -q "too small" "$T/run2.err"; then ok run_mem_too_small; else bad run_mem_too_small "rc $rc" "$(cat "$T/run2.err")"; fi

# 3. serve --mem: start-up lines and /metrics
"$L" serve -m "$M" --port 0 --mem 6M --max-seqs 8 -t 2 2>"$T/serve.err" &
SPID=$!
port=
for _ in $(seq 1 300); do
    port=$(grep -m1 "listening on" "$T/serve.err" 2>/dev/null | sed 's/.*://')
    [ -n "$port" ] && grep -q "KV pool" "$T/serve.err" && break
    sleep 0.1
done
curl -s "http://127.0.0.1:$port/metrics" >"$T/metrics" 2>/dev/null
g() { grep -m1 "^$1 " "$T/metrics" | awk '{ printf "%d", $2 }'; }
B=$(g lamina_memory_budget_bytes); W=$(g lamina_memory_weights_bytes); S=$(g lamina_memory_workspace_bytes)
K=$(g lamina_memory_kv_bytes); NB=$(g lamina_kv_blocks_total); MT=$(g lamina_kv_max_tokens); MS=$(g lamina_kv_max_seqs)
# stories260K F16: 640 bytes per token, blocks of 16 tokens
if [ -n "$B" ] && [ "$B" -eq $((6 * 1048576)) ] && [ $((W + S + K)) -le "$B" ] && [ $((B - W - S - K)) -lt 10240 ] &&
    [ "$K" -eq $((NB * 10240)) ] && [ "$MT" -eq $((NB * 16)) ] && [ "$MS" -eq $((NB / 8)) ] &&
    grep -q "lamina serve: memory budget 6.00 MiB\|lamina serve: memory budget 6.0 MiB" "$T/serve.err" &&
    grep -q "lamina serve: KV pool F16: $MT tokens, $MS sequences of 128 at once" "$T/serve.err"; then
    ok serve_metrics_memory
else bad serve_metrics_memory "port $port B $B W $W S $S K $K blocks $NB tokens $MT seqs $MS" "$(cat "$T/serve.err")" \
    "$(grep -i "memory\|kv_max" "$T/metrics")"; fi
kill "$SPID" 2>/dev/null
wait "$SPID" 2>/dev/null
SPID=
to "$L" serve -m "$M" --port 0 --mem 1M -t 2 >/dev/null 2>"$T/serve2.err"
rc=$?
if [ $rc -eq 1 ] && grep -q "too small" "$T/serve2.err"; then ok serve_mem_too_small; else bad serve_mem_too_small "rc $rc" "$(cat "$T/serve2.err")"; fi

# 4. the default budget: 80% of what is available
to "$L" kv -m "$M" -c 128 --seqs 4 >"$T/plain.out" 2>&1
LAMINA_MEM_AVAILABLE=$((64 << 30)) to "$L" run -m "$M" -p "Once" -n 4 --temp 0 -t 2 >"$T/d1.out" 2>"$T/d1.err"
rc1=$?
LAMINA_MEM_AVAILABLE=1000000 to "$L" run -m "$M" -p "Once" -n 4 --temp 0 -t 2 >"$T/d2.out" 2>"$T/d2.err"
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 1 ] && grep -q "memory budget 781.2 KiB is too small" "$T/d2.err"; then
    ok default_budget
else bad default_budget "rc $rc1 $rc2" "$(cat "$T/d1.err" "$T/d2.err")"; fi

# 5. a draft model in the budget
to "$L" kv -m "$M" --mem 4M --draft-model "$M" --seqs 4 -c 128 -t 2 >"$T/kvd.out" 2>&1
rc=$?
w=$(num "weights:" "$T/kvd.out"); s=$(num "workspace:" "$T/kvd.out"); k=$(num "KV pool:" "$T/kvd.out")
u=$(num "unused:" "$T/kvd.out"); d=$(num "draft model:" "$T/kvd.out")
dk=$(grep -m1 "draft model:" "$T/kvd.out" | sed 's/.*KV pool //; s/ .*//')
blk=$(grep -m1 "^block:" "$T/kvd.out" | sed 's/.*= //; s/ bytes.*//')
if [ $rc -eq 0 ] && [ -n "$d" ] && [ $((w + s + k + d + u)) -eq $((4 * 1048576)) ] && [ "$u" -lt $((2 * blk)) ] &&
    [ "$dk" -gt 0 ] && [ "$dk" -le "$k" ]; then
    ok kv_mem_draft_split
else bad kv_mem_draft_split "rc $rc w $w s $s k $k d $d dk $dk u $u block $blk" "$(cat "$T/kvd.out")"; fi
to "$L" kv -m "$M" --mem 2M --draft-model "$M" -c 128 -t 2 >"$T/kvd2.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "too small: .* the draft model's weights .* in the draft's" "$T/kvd2.out"; then
    ok kv_mem_draft_too_small
else bad kv_mem_draft_too_small "rc $rc" "$(cat "$T/kvd2.out")"; fi
to "$L" kv -m "$M" --draft-model "$M" >"$T/kvd3.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "give --mem" "$T/kvd3.out"; then ok kv_draft_needs_mem; else bad kv_draft_needs_mem "rc $rc" "$(cat "$T/kvd3.out")"; fi
"$L" serve -m "$M" --port 0 --mem 8M --max-seqs 8 -t 2 --draft-model "$M" 2>"$T/served.err" &
SPID=$!
port=
for _ in $(seq 1 300); do
    port=$(grep -m1 "listening on" "$T/served.err" 2>/dev/null | sed 's/.*://')
    [ -n "$port" ] && grep -q "draft model" "$T/served.err" && break
    sleep 0.1
done
curl -s "http://127.0.0.1:$port/metrics" >"$T/metrics" 2>/dev/null
B=$(g lamina_memory_budget_bytes); W=$(g lamina_memory_weights_bytes); S=$(g lamina_memory_workspace_bytes)
K=$(g lamina_memory_kv_bytes); DW=$(g lamina_memory_draft_weights_bytes); DS=$(g lamina_memory_draft_workspace_bytes)
DK=$(g lamina_memory_draft_kv_bytes)
if [ -n "$DK" ] && [ "$B" -eq $((8 * 1048576)) ] && [ "$DW" -eq "$W" ] && [ "$DS" -gt 0 ] && [ "$DK" -gt 0 ] &&
    [ $((W + S + K + DW + DS + DK)) -le "$B" ] && [ $((B - W - S - K - DW - DS - DK)) -lt 20480 ] &&
    grep -q "lamina serve: memory budget 8.0 MiB = .* + draft model .* + unused" "$T/served.err" &&
    grep -q "lamina serve: draft model .* = weights .* + workspace .* + KV" "$T/served.err"; then
    ok serve_metrics_draft_memory
else bad serve_metrics_draft_memory "port $port B $B W $W S $S K $K DW $DW DS $DS DK $DK" "$(cat "$T/served.err")" \
    "$(grep -i "memory" "$T/metrics")"; fi
kill "$SPID" 2>/dev/null
wait "$SPID" 2>/dev/null
SPID=

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
