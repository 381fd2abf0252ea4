#!/bin/sh
# make check-python: the Python package from a clean start.
#   1. a fresh virtual environment in a temporary directory (skipped, exit 0,
#      where `$PYTHON -m venv` is unavailable: Debian's python3-venv);
#   2. `pip wheel . --no-deps` (setuptools and wheel come from PyPI), the C
#      build in the temporary directory too (POOLSHIM_BUILD_DIR);
#   3. the wheel installed; `poolshim --version`, the module's version() and
#      library_path(), `poolshim run -- true` (the bundled library loads into
#      a program), and tests/python against the installed package;
#   4. the temporary directory removed, whatever happened.
set -eu
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
start=$(date +%s)

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "check-python: skipped: $PYTHON not found (Debian: apt-get install python3 python3-venv python3-pip)"
    exit 0
fi
[ -s VERSION ] || { echo "check-python: error: $ROOT/VERSION is missing or empty" >&2; exit 1; }
expected=$(tr -d ' \t\r\n' < VERSION)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/poolshim-check-python.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
if ! "$PYTHON" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    echo "check-python: skipped: '$PYTHON -m venv' is unavailable (Debian: apt-get install python3-venv python3-pip):"
    sed 's/^/    /' "$tmp/venv.log" | head -5
    exit 0
fi
py="$tmp/venv/bin/python"

# A make above us must not pass its variables or jobserver to the wheel's build.
unset MAKEFLAGS MFLAGS MAKELEVEL
export POOLSHIM_BUILD_DIR="$tmp/build" PIP_DISABLE_PIP_VERSION_CHECK=1
echo "check-python: pip wheel . (C build in $POOLSHIM_BUILD_DIR)"
if ! "$py" -m pip wheel . -w "$tmp/wheels" --no-deps -q >"$tmp/wheel.log" 2>&1; then
    cat "$tmp/wheel.log" >&2
    echo "check-python: error: building the wheel failed" >&2
    exit 1
fi
wheel=$(ls "$tmp"/wheels/poolshim-*.whl)
echo "check-python: built $(basename "$wheel")"
"$py" -m pip install -q --no-deps --no-index "$wheel"

fail() { echo "check-python: error: $*" >&2; exit 1; }
out=$("$tmp/venv/bin/poolshim" --version) || fail "poolshim --version failed"
echo "check-python: poolshim --version: $out"
[ "$out" = "poolshim $expected" ] || fail "poolshim --version printed '$out', VERSION says $expected"
out=$(cd "$tmp" && "$py" -c "import poolshim, os; assert os.path.exists(poolshim.library_path()); print(poolshim.version())") \
    || fail "importing the installed module failed"
[ "$out" = "$expected" ] || fail "poolshim.version() is '$out', VERSION says $expected"
(cd "$tmp" && "$tmp/venv/bin/poolshim" run -- true) || fail "poolshim run -- true failed"
(cd "$tmp" && "$py" -m unittest discover -s "$ROOT/tests/python" -t "$ROOT/tests/python") \
    || fail "tests/python failed"
echo "check-python: passed (version $expected, $(($(date +%s) - start)) s)"
