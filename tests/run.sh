#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and the end-to-end scripts
# (tests/e2e_*.sh, tests/e2e_*.py), from the repository root, and adds up
# their "N passed, N failed" lines. Exits non-zero when anything failed.
# LAMINA_TEST_C_ONLY=1 runs the test programs only, LAMINA_TESTS="test_a
# test_b" only those; LAMINA_E2E="e2e_a.sh e2e_b.py" only those end-to-end
# scripts (and no model download; `make check`); LAMINA_TEST_WRAP is a
# command the test programs run under (`make test-arm`: qemu-aarch64).
# LAMINA_TEST_JOBS=N runs up to N tests at once (each one's report is
# printed in the order they started once all have ended): the test programs,
# then the end-to-end scripts, in one queue, except the scripts in E2E_ALONE,
# which run one at a time after it, with nothing beside them. The programs
# start in LAMINA_TESTS's
# order when it is set (an entry NAME:VAR=VALUE runs NAME again with VAR=VALUE
# in its environment; a name not built counts as a failure; "none" runs
# none, for the end-to-end scripts alone), else those
# named in LAMINA_TEST_FIRST first (the slowest, so that the last to end is
# not one started late), then the rest in name order. Before any test, the
# models the end-to-end scripts read are installed (tests/testenv.py
# install), so that no script skips a check for want of a model that a later
# one installs. The last lines: each part's seconds, then "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# (a test program that runs the command line runs it under the same wrapper)
export LAMINA_BIN="${LAMINA_TEST_WRAP:+$LAMINA_TEST_WRAP }$BUILD/lamina"
# A test's output is captured into a log; what it writes to descriptor 3
# (LAMINA_INSTALL_FD) reaches this script's stderr at once: pip's progress
# while the end-to-end tests install their PyPI packages on a first run.
exec 3>&2
export LAMINA_INSTALL_FD=3
passed=0 failed=0 skipped=0
run_one() {
    local name=$1; shift
    local log
    log=$(mktemp)
    local t0=$SECONDS TIMEFORMAT='%U %S'
    { time "$@" >"$log" 2>&1; } 2>"$log.cpu"
    local rc=$?
    # CPU seconds (user + system) beside the wall time: on a loaded machine
    # the wall time says little, the CPU time still compares runs
    local cpu
    cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$log.cpu" 2>/dev/null)
    local line p f s
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
        f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
        s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p')
    else
        p=0 f=1 s=0
    fi
    [ -z "$s" ] && s=0
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" -ne 0 ]; then
        echo "== $name: $p passed, $f failed (exit $rc, $((SECONDS - t0))s, cpu ${cpu:-?}s)"
        grep -v '^PASS ' "$log" | tail -n 60
    else
        echo "== $name: $p passed, 0 failed${s:+, $s skipped} ($((SECONDS - t0))s, cpu ${cpu:-?}s)"
        grep -E '^(SKIP|NOTE)' "$log" || true
    fi
    rm -f "$log" "$log.cpu"
}
# run_one in the background: its report to $results/K.out, its counts to
# $results/K.cnt (missing if it died: counted as a failure), K its index
jobs_max=${LAMINA_TEST_JOBS:-1}
results=$(mktemp -d)
names=()
run_bg() {
    local k=${#names[@]}
    names+=("$1")
    (
        passed=0 failed=0 skipped=0
        run_one "$@" >"$results/$k.out"
        echo "$passed $failed $skipped" >"$results/$k.cnt"
    ) &
}
want_e2e() { [ -z "${LAMINA_E2E:-}" ] || case " $LAMINA_E2E " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# The scripts that run alone time how a server treats clients against each
# other or how fast it ends (fairness, hostile clients, draining, deadlines
# under pressure, an MPI server's ranks on SIGTERM), which a neighbour's
# load would blur. (e2e_mpi.sh beside e2e_gemma3.py: 98 s and 41 s, against
# 94 s and 29 s alone, the same results.)
E2E_ALONE="e2e_mpi_server.py e2e_mpi_ep_server.py e2e_fair.py e2e_abuse.py e2e_router.py e2e_shutdown.py
           e2e_pressure.py"
e2e_pooled=() e2e_alone=()
t_dl=$SECONDS
if [ -z "${LAMINA_TEST_C_ONLY:-}" ]; then
    if [ -z "${LAMINA_E2E:-}" ]; then
        echo "== installing the models the end-to-end tests read (first run only)"
        python3 tests/testenv.py install 2>&1 | grep -E '^(NOTE|SKIP)'
    fi
    for t in tests/e2e_*.sh tests/e2e_*.py; do
        [ -f "$t" ] || continue
        want_e2e "$(basename "$t")" || continue
        case " $(echo $E2E_ALONE) " in
        *" $(basename "$t") "*) e2e_alone+=("$t") ;;
        *) e2e_pooled+=("$t") ;;
        esac
    done
fi
t_start=$SECONDS
entries=()
if [ -n "${LAMINA_TESTS:-}" ]; then
    for e in $LAMINA_TESTS; do [ "$e" = none ] || entries+=("$e"); done
else
    for n in ${LAMINA_TEST_FIRST:-}; do [ -x "$BUILD/tests/$n" ] && entries+=("$n"); done
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        case "$t" in *.d) continue ;; esac
        case " ${LAMINA_TEST_FIRST:-} " in *" $(basename "$t") "*) continue ;; esac
        entries+=("$(basename "$t")")
    done
fi
for e in "${entries[@]}"; do
    n=${e%%:*} setenv=()
    [ "$n" != "$e" ] && setenv=(env "${e#*:}")
    label="$n${setenv[1]:+ (${setenv[1]})}"
    if [ ! -x "$BUILD/tests/$n" ]; then
        echo "== $label: not built ($BUILD/tests/$n)"
        failed=$((failed + 1))
        continue
    fi
    if [ "$jobs_max" -gt 1 ]; then
        while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
        run_bg "$label" "${setenv[@]}" ${LAMINA_TEST_WRAP:-} "$BUILD/tests/$n"
    else
        run_one "$label" "${setenv[@]}" ${LAMINA_TEST_WRAP:-} "$BUILD/tests/$n"
    fi
done
e2e_cmd() { case "$1" in *.sh) echo bash ;; *) echo python3 ;; esac; }
for t in "${e2e_pooled[@]}"; do
    if [ "$jobs_max" -gt 1 ]; then
        while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
        run_bg "$(basename "$t")" "$(e2e_cmd "$t")" "$t"
    else
        run_one "$(basename "$t")" "$(e2e_cmd "$t")" "$t"
    fi
done
wait
for k in "${!names[@]}"; do
    cat "$results/$k.out" 2>/dev/null
    if read -r p f s <"$results/$k.cnt" 2>/dev/null; then
        passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    else
        echo "== ${names[$k]}: no result (the runner died)"
        failed=$((failed + 1))
    fi
done
rm -rf "$results"
if [ -n "${LAMINA_TEST_C_ONLY:-}" ]; then
    echo
    echo "$passed passed, $failed failed${skipped:+, $skipped skipped}" | sed 's/, 0 skipped$//'
    [ "$failed" -eq 0 ]
    exit
fi
t_c=$SECONDS
run_one check_layers python3 scripts/check_layers.py
if [ -z "${LAMINA_ASAN:-}" ]; then
    run_one check_docs env BUILD="$BUILD" python3 scripts/check_docs.py
    run_one check_format make -s --no-print-directory check-format
fi
t_e2e=$SECONDS
for t in "${e2e_alone[@]}"; do
    run_one "$(basename "$t")" "$(e2e_cmd "$t")" "$t"
done
echo
echo "time: model install $((t_start - t_dl)) s, test programs and end-to-end scripts $((t_c - t_start)) s, end-to-end alone $((SECONDS - t_e2e)) s"
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
