#!/usr/bin/env bash
# Expert parallelism over MPI (--ep N, src/model/ep.c): mkmodel's MoE presets
# (qwen3moe-small, qwen2moe-small with its shared expert, mixtral-small,
# deepseek2-small with its dense first layer and shared experts; F16, 8
# experts each) under mpirun --oversubscribe with 2 ranks (--ep 2) and 4
# (--ep 4 on qwen3moe and deepseek2, --ep 2 --pp 2 on qwen2moe) against the
# single process of the default build:
#   - the first perplexity chunk's logits (64 positions) equal bit for bit
#     (tolerance 0: each home rank sums its rows' expert results in the
#     single process's ascending-expert order, ep.h) and so the perplexity;
#   - 16 greedy tokens identical (on 2 ranks);
#   - qwen35moe-small (the hybrid: recurrent layers, experts, a shared
#     expert) and gpt-oss-small (router and expert biases, MXFP4 experts)
#     under --ep 2: their logits bit for bit too;
#   - lamina bench --ep reports the expert all-to-all, rows per expert and
#     the imbalance;
#   - --ep 2 --tp 2 on 4 ranks (qwen3moe): logits equal --tp 2's bit for
#     bit and one process's within --tp's 0.15, greedy tokens; --ep 2 --tp 2
#     --pp 2 on 8 (qwen2moe): logits equal --tp 2 --pp 2's, the same way;
#   - the balanced placement (mixtral): bench --ep writes the routing counts
#     and predicts the balanced imbalance, which bench then measures under
#     --ep-place balanced (no more than the contiguous one's), logits bit for
#     bit; a bad --ep-place, balanced without counts, counts of another shape;
#   - refusals: --ep on a dense model (by name), --ep against the job's ranks
#     (and with --tp), more ranks than experts, a draft model and --spec mtp
#     under --ep; lamina kv --ep prints each rank's experts (rank r of 4
#     holds 2 of 8) and weight bytes, and with --tp says so;
#   - a rank killed mid-run ends the whole job with an error, never a hang.
# Skips the MPI parts, saying so, when the MPI binary or mpirun is absent.
. "$(dirname "$0")/testenv.sh"
skip=0
LM=$(dirname "$L")/mpi/lamina
TXT=tests/data/mpi_text.txt
VOC=tests/data/vocab/ggml-vocab-llama-spm.gguf
skipped() { echo "SKIP $1"; skip=$((skip + 1)); }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0

# 1. refusals and the placement, without the runtime
"$L" kv -m "$M" --ep 2 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "\-\-ep places experts on ranks, and 'llama' (llama) is a dense model" "$T/err" &&
    ok ep_dense_refused || bad ep_dense_refused "rc $rc" "$(cat "$T/err")"
for p in qwen3moe qwen2moe mixtral deepseek2 qwen35moe gpt-oss; do
    "$L" mkmodel --preset $p-small --type F16 --vocab-from "$VOC" -o "$T/$p.gguf" -t 2 >/dev/null 2>"$T/err" ||
        bad "mkmodel_$p" "$(tail -3 "$T/err")"
done
"$L" kv -m "$T/qwen3moe.gguf" --ep 9 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "8 experts do not place on 9 ranks" "$T/err" && ok ep_too_many_ranks ||
    bad ep_too_many_ranks "rc $rc" "$(cat "$T/err")"
"$L" kv -m "$T/qwen3moe.gguf" --ep 2 --tp 2 -c 128 >"$T/kv" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && grep -q "split by --tp inside each expert rank's tensor group" "$T/kv" &&
    grep -Eq "^ +1 +4-7 " "$T/kv" && ok kv_ep_with_tp || bad kv_ep_with_tp "rc $rc" "$(tail -5 "$T/kv")" "$(cat "$T/err")"
"$L" kv -m "$T/qwen2moe.gguf" --ep 4 -c 128 >"$T/kv" 2>&1
awk '/^  rank  experts/ {t = 1; next} t && NF == 6 {n++; if ($2 != 2 * ($1) "-" 2 * ($1) + 1) b++; e[$3]++}
     END {exit !(n == 4 && !b && length(e) == 1)}' "$T/kv" && grep -q "the shared expert" "$T/kv" && ok kv_ep_placement ||
    bad kv_ep_placement "$(tail -7 "$T/kv")"
# --ep-place: a bad value, balanced without counts, counts of another shape (by the loader)
"$L" kv -m "$T/qwen3moe.gguf" --ep 2 --ep-place random >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "\-\-ep-place is contiguous or balanced, not 'random'" "$T/err" && ok ep_place_bad ||
    bad ep_place_bad "rc $rc" "$(cat "$T/err")"
"$L" kv -m "$T/qwen3moe.gguf" --ep 2 --ep-place balanced >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "\-\-ep-place balanced places experts by routing counts: \-\-ep-counts FILE" "$T/err" &&
    ok ep_place_needs_counts || bad ep_place_needs_counts "rc $rc" "$(cat "$T/err")"
printf 'lamina-ep-counts 1 2 8\n0 1 2 3 4 5 6 7 8\n1 0 0 0 0 0 0 0 9\n' >"$T/c2"
"$L" kv -m "$T/qwen3moe.gguf" --ep 2 --ep-place balanced --ep-counts "$T/c2" >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "routing counts of 2 layers x 8 experts for a model of 4 x 8" "$T/err" && ok ep_counts_shape ||
    bad ep_counts_shape "rc $rc" "$(cat "$T/err")"
"$L" run -m "$T/qwen3moe.gguf" -p hi --ep 2 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "\-\-ep needs the MPI build" "$T/err" && ok ep_without_mpi || bad ep_without_mpi "rc $rc" "$(cat "$T/err")"

if [ ! -x "$LM" ] || ! command -v mpirun >/dev/null; then
    skipped "mpi: no $LM or no mpirun (make mpi; scripts/deps.sh installs Open MPI)"
    echo "$pass passed, $fail failed, $skip skipped"
    [ $fail -eq 0 ]
    exit
fi
mpi() { local np=$1; shift; timeout 120 mpirun --oversubscribe -np "$np" "$LM" "$@"; }

# 2. the job's ranks must be --ep's (x --pp's)
mpi 2 run -m "$T/qwen3moe.gguf" -p hi -n 2 --ep 4 >/dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "\-\-ep 4 wants 4 ranks, this job has 2" "$T/err" && ok ep_rank_count ||
    bad ep_rank_count "rc $rc" "$(cat "$T/err")"

# 3. logits bit for bit, perplexity and greedy tokens against one process
ppl() { grep -o 'PPL = [0-9.]*' "$1" | awk '{print $3}'; }
ids() { grep "generated ids" "$1"; }
# compare NAME MODEL NP FLAGS...
compare() {
    local name=$1 model=$2 np=$3
    shift 3
    [ -f "$T/$name.l1" ] || "$L" perplexity -m "$model" -f "$TXT" -c 64 --chunks 1 -t 1 --logits-out "$T/$name.l1" \
        >"$T/$name.p1" 2>/dev/null
    mpi "$np" perplexity -m "$model" -f "$TXT" -c 64 --chunks 1 -t 1 --logits-out "$T/$name.l2" "$@" >"$T/p2" 2>"$T/e2"
    if [ -s "$T/$name.l1" ] && cmp -s "$T/$name.l1" "$T/$name.l2" && [ "$(ppl "$T/$name.p1")" == "$(ppl "$T/p2")" ]; then
        ok "${name}_logits_$np"
    else bad "${name}_logits_$np" "$(ppl "$T/$name.p1") $(ppl "$T/p2")" "$(tail -3 "$T/e2")"; fi
    [ "${GREEDY:-1}" = 1 ] || return 0
    [ -f "$T/$name.s1" ] || "$L" run -m "$model" -p "Once upon a time" -n 16 --temp 0 --ignore-eos -t 1 --show-ids \
        >/dev/null 2>"$T/$name.s1"
    mpi "$np" run -m "$model" -p "Once upon a time" -n 16 --temp 0 --ignore-eos -t 1 --show-ids "$@" >/dev/null 2>"$T/s2"
    if [ -n "$(ids "$T/$name.s1")" ] && [ "$(ids "$T/$name.s1")" == "$(ids "$T/s2" | head -1)" ] &&
        [ "$(ids "$T/s2" | sort -u | wc -l)" -eq 1 ]; then ok "${name}_greedy_$np"
    else bad "${name}_greedy_$np" "$(ids "$T/$name.s1")" "$(ids "$T/s2")" "$(tail -3 "$T/s2")"; fi
}
for p in qwen3moe qwen2moe mixtral deepseek2; do compare $p "$T/$p.gguf" 2 --ep 2; done
# on 4 ranks the logits only (each rank holds 2 experts; under --pp each stage's 2 ranks split them)
GREEDY=0 compare qwen3moe "$T/qwen3moe.gguf" 4 --ep 4
GREEDY=0 compare deepseek2 "$T/deepseek2.gguf" 4 --ep 4
GREEDY=0 compare qwen2moe "$T/qwen2moe.gguf" 4 --ep 2 --pp 2
# a hybrid (gated-DeltaNet layers with their state, experts and a shared expert): the logits
GREEDY=0 compare qwen35moe "$T/qwen35moe.gguf" 2 --ep 2
# gpt-oss: the router's and the experts' biases, MXFP4 experts, the clamped SwiGLU
GREEDY=0 compare gpt-oss "$T/gpt-oss.gguf" 2 --ep 2

# --ep 2 --tp 2 (4 ranks: two tensor groups of 2, experts split by rank and sliced by tensor rank):
# logits equal --tp 2's to the bit (the same partial sums, reduced in the same order, ep.h) and
# one process's within e2e_mpi.sh's --tp tolerance for the MoE presets (0.15); 16 greedy tokens
# equal one process's. qwen2moe (its shared expert split by --tp) on 8 ranks, --ep 2 --tp 2
# --pp 2, against --tp 2 --pp 2 (each stage's 4 ranks, world rank (stage x 2 + ep) x 2 + tp)
maxdiff() { python3 - "$1" "$2" <<'PY'
import array, sys
a = array.array('f'); a.frombytes(open(sys.argv[1], 'rb').read())
b = array.array('f'); b.frombytes(open(sys.argv[2], 'rb').read())
print(max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) and len(a) > 0 else 'mismatch')
PY
}
for p in qwen3moe qwen2moe; do
    np=4 pp=""
    [ $p == qwen2moe ] && np=8 pp="--pp 2"
    mpi $((np / 2)) perplexity -m "$T/$p.gguf" -f "$TXT" -c 64 --chunks 1 -t 1 --logits-out "$T/$p.ltp" --tp 2 $pp \
        >/dev/null 2>&1
    mpi $np perplexity -m "$T/$p.gguf" -f "$TXT" -c 64 --chunks 1 -t 1 --logits-out "$T/$p.lept" --ep 2 --tp 2 $pp \
        >/dev/null 2>"$T/e2"
    d=$(maxdiff "$T/$p.l1" "$T/$p.lept" 2>&1)
    if [ -s "$T/$p.ltp" ] && cmp -s "$T/$p.ltp" "$T/$p.lept" &&
        awk -v d="$d" 'BEGIN { exit !(d + 0 == d && d <= 0.15) }'; then
        ok "${p}_ep2_tp2${pp:+_pp2}_logits (as --tp 2${pp:+ --pp 2}'s; one process's within $d)"
    else bad "${p}_ep2_tp2${pp:+_pp2}_logits" "max diff to one process $d" "$(tail -3 "$T/e2")"; fi
done
mpi 4 run -m "$T/qwen3moe.gguf" -p "Once upon a time" -n 16 --temp 0 --ignore-eos -t 1 --show-ids --ep 2 --tp 2 \
    >/dev/null 2>"$T/s2"
if [ -n "$(ids "$T/qwen3moe.s1")" ] && [ "$(ids "$T/qwen3moe.s1")" == "$(ids "$T/s2" | head -1)" ]; then
    ok qwen3moe_ep2_tp2_greedy
else bad qwen3moe_ep2_tp2_greedy "$(ids "$T/qwen3moe.s1")" "$(ids "$T/s2")" "$(tail -3 "$T/s2")"; fi
mpi 2 run -m "$T/qwen3moe.gguf" -p hi -n 2 --ep 2 --tp 2 >/dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "\-\-ep 2 with \-\-tp (ep x tp) wants 4 ranks, this job has 2" "$T/err" && ok ep_tp_rank_count ||
    bad ep_tp_rank_count "rc $rc" "$(cat "$T/err")"

# 4. bench --ep: the exchange against compute, rows per expert, imbalance
mpi 2 bench -m "$T/qwen3moe.gguf" -p 32 -n 4 -r 1 -t 1 --ep 2 >/dev/null 2>"$T/b"
grep -q "expert all-to-all" "$T/b" && grep -q "rank 1 layer 3 rows per expert: e4:" "$T/b" &&
    grep -q "ep layer 3 rows per rank: [0-9]* [0-9]*, imbalance [0-9.]*" "$T/b" && ok bench_ep || bad bench_ep "$(tail -12 "$T/b")"

# balanced placement: bench --ep writes the prompt test's counts and predicts the balanced
# placement's imbalance; placed by them, bench measures that imbalance (the same tokens), no
# more than the contiguous one's, and the logits stay one process's bit for bit
bimb() { grep -o "ep imbalance over [0-9]* MoE layers: [0-9.]* ($1 placement), balanced from these counts [0-9.]*" "$2"; }
mpi 2 bench -m "$T/mixtral.gguf" -p 64 -n 0 -r 1 -t 1 --no-bw --ep 2 --ep-counts-out "$T/counts" >/dev/null 2>"$T/b1"
mpi 2 bench -m "$T/mixtral.gguf" -p 64 -n 0 -r 1 -t 1 --no-bw --ep 2 --ep-place balanced --ep-counts "$T/counts" \
    >/dev/null 2>"$T/b2"
before=$(bimb contiguous "$T/b1" | awk '{print $7}') predicted=$(bimb contiguous "$T/b1" | awk '{print $NF}')
after=$(bimb balanced "$T/b2" | awk '{print $7}')
if [ -n "$before" ] && [ -n "$after" ] && [ "$after" == "$predicted" ] &&
    awk -v a="$after" -v b="$before" 'BEGIN { exit !(a <= b) }'; then ok "bench_ep_balanced (imbalance $before -> $after)"
else bad bench_ep_balanced "before $before predicted $predicted after $after" "$(tail -4 "$T/b1")" "$(tail -4 "$T/b2")"; fi
mpi 2 perplexity -m "$T/mixtral.gguf" -f "$TXT" -c 64 --chunks 1 -t 1 --logits-out "$T/lbal" --ep 2 \
    --ep-place balanced --ep-counts "$T/counts" >/dev/null 2>"$T/e2"
cmp -s "$T/mixtral.l1" "$T/lbal" && ok mixtral_balanced_logits || bad mixtral_balanced_logits "$(tail -3 "$T/e2")"

# refusals of speculation under --ep: a draft model, and a qwen35moe file's MTP head (--spec mtp)
mpi 2 run -m "$T/qwen3moe.gguf" -p hi -n 2 --ep 2 --draft-model "$T/qwen3moe.gguf" >/dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "\-\-draft-model does not run under tensor, pipeline or expert parallelism" "$T/err" &&
    ok ep_draft_refused || bad ep_draft_refused "rc $rc" "$(cat "$T/err")"
if "$L" mkmodel --preset qwen35moe-small --type F16 --mtp 1 --vocab-from "$VOC" -o "$T/mtp.gguf" -t 2 >/dev/null 2>"$T/err"
then
    mpi 2 run -m "$T/mtp.gguf" -p hi -n 2 --ep 2 --spec mtp >/dev/null 2>"$T/err"; rc=$?
    [ $rc -ne 0 ] && grep -q "next-token prediction does not run under tensor, pipeline or expert parallelism" "$T/err" &&
        ok ep_spec_mtp_refused || bad ep_spec_mtp_refused "rc $rc" "$(cat "$T/err")"
else bad mkmodel_qwen35moe_mtp "$(tail -3 "$T/err")"; fi

# 5. a rank that dies mid-run (inside the exchanges): the job ends with an error, within the timeout
timeout 120 mpirun --oversubscribe -np 2 "$LM" run -m "$T/qwen3moe.gguf" -p "Once" -n 1000 --ignore-eos --temp 0 \
    -t 1 --ep 2 >/dev/null 2>"$T/die" &
job=$! victim=""
for _ in $(seq 1 600); do
    for p in $(pgrep -P "$(pgrep -P $job | head -1)" 2>/dev/null) $(pgrep -P $job 2>/dev/null); do
        if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$p; fi
    done
    [ -n "$victim" ] && [ "$(awk '{print $14}' /proc/$victim/stat 2>/dev/null || echo 0)" -gt 100 ] && break
    sleep 0.1
done
if [ -n "$victim" ]; then
    kill -9 "$victim"
    wait $job; rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qi "signal 9\|killed\|exited" "$T/die"; then ok ep_rank_death_ends_job
    else bad ep_rank_death_ends_job "exit $rc (124: timed out)" "$(tail -8 "$T/die")"; fi
else
    kill $job 2>/dev/null; wait $job
    bad ep_rank_death_ends_job "rank 1 never found" "$(tail -5 "$T/die")"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
