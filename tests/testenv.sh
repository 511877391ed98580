# tests/testenv.sh - the preamble the end-to-end shell tests share; a test
# sources it first (`. "$(dirname "$0")/testenv.sh"`), the way the Python
# tests import testenv.py. It is not a test itself (tests/run.sh runs
# tests/e2e_*.sh only).
#
# After it: unset variables are errors (set -u), the working directory is
# the repository root, L is the lamina binary (LAMINA_BIN, which tests/run.sh
# sets, else build/lamina), M the bundled model, T a fresh temporary folder
# removed on exit (a test that traps EXIT itself removes "$T" there), and
# ok NAME / bad NAME DETAIL... print a PASS or FAIL line and count it in
# pass and fail; the test ends with `echo "$pass passed, $fail failed"`.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
L=${LAMINA_BIN:-build/lamina}
M=models/stories260K.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; printf '  %s\n' "$@"; fail=$((fail + 1)); }
