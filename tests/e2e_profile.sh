#!/usr/bin/env bash
# `lamina bench --profile` on the bundled model, decode and prefill, two
# threads: one line per op with its share of the time, ms per token and the
# dispatch gap inside it (a gap never above the op's time), the "(other)"
# line, and the summary of dispatch gaps, pool runs per token and the
# workers' wake-up; the ops' shares and (other) add up to 100% (within the
# rounding of the printed figures); without --profile, none of it. And the
# tg floor of a plain run: each tg row's from the read probes beside it.
. "$(dirname "$0")/testenv.sh"

"$L" bench -m "$M" -p 32 -n 8 -r 2 -t 2 --no-bw --profile >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '^  profile of ' "$T/out")" -eq 2 ] && ok profile_runs || bad profile_runs "rc=$rc" "$(head -5 "$T/err")"

# per test: 11 op lines (forward.h's slots, linear attention among them) "name  P%  X ms/token  gap G ms", G <= X
ops=$(grep -E '^    [a-z/+ ]+ +[0-9.]+%  +[0-9.]+ ms/token  gap +[0-9.]+ ms$' "$T/out")
n_ops=$(echo "$ops" | grep -c .)
gap_ok=$(echo "$ops" | awk '{ t = $(NF-4); g = $(NF-1); if (g > t + 0.0005) bad = 1 } END { print bad ? "no" : "yes" }')
[ "$n_ops" -eq 22 ] && [ "$gap_ok" == yes ] && ok profile_op_lines || bad profile_op_lines "ops=$n_ops gap<=time: $gap_ok" "$(head -20 "$T/out")"
for op in "q/k/v matmul" "ffn gate+up matmul" "ffn down matmul" "lm head"; do
    [ "$(grep -c "^    $op " "$T/out")" -eq 2 ] || { bad "profile_op_$op" "$(cat "$T/out")"; continue; }
done

# shares add up to 100% per test (ops + other), within the printed rounding
sums=$(awk '/^  profile of /{ if (n) print s; s = 0; n = 1 } /^    .* +[0-9.]+%/ && !/dispatch gaps/{ for (i = 1; i <= NF; i++) if ($i ~ /%$/) { s += $i; break } } END { print s }' "$T/out")
sum_ok=$(echo "$sums" | awk '{ if ($1 < 99 || $1 > 101) bad = 1 } END { print (NR == 2 && !bad) ? "yes" : "no" }')
[ "$sum_ok" == yes ] && ok profile_shares_sum || bad profile_shares_sum "$sums"

summ=$(grep -E '^    dispatch gaps [0-9.]+% of the time \([0-9.]+ ms/token\), [0-9.]+ pool runs/token, workers. wake-up [0-9.]+ us/run$' "$T/out" | wc -l)
[ "$summ" -eq 2 ] && ok profile_dispatch_summary || bad profile_dispatch_summary "$(grep dispatch "$T/out")"

"$L" bench -m "$M" -p 0 -n 4 -r 1 -t 2 --no-bw >"$T/plain" 2>/dev/null
! grep -q "profile of\|dispatch gaps" "$T/plain" && grep -q "tg4" "$T/plain" && ok no_profile_without_flag ||
    bad no_profile_without_flag "$(cat "$T/plain")"

# the tg floor: the read bandwidth of the probes beside the test (read_gbs)
# over the weights and KV bytes a token reads, a probe per tg row, none for pp
"$L" bench -m "$M" -p 8 -n 4 -r 1 -t 2 -d 0,32 -o json >"$T/bw.json" 2>/dev/null
floor=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
w, tg = d["weight_bytes_per_token"], [t for t in d["tests"] if t["test"].startswith("tg")]
pp = [t for t in d["tests"] if t["test"].startswith("pp")]
ok = len(tg) == 2 and len(pp) == 2 and all("read_gbs" not in t for t in pp)
for t in tg:
    want = t["read_gbs"] * 1e9 / (w + t["kv_bytes_per_token"])
    ok = ok and t["read_gbs"] > 0 and abs(t["floor_tokens_per_s"] / want - 1) < 1e-3 and \
        abs(t["fraction_of_floor"] - t["tokens_per_s"] / t["floor_tokens_per_s"]) < 1e-3
print("yes" if ok else "no")' "$T/bw.json" 2>&1)
[ "$floor" == yes ] && ok bench_floor_from_adjacent_probe || bad bench_floor_from_adjacent_probe "$floor" "$(cat "$T/bw.json")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
