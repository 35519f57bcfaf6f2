#!/bin/sh
# The Python package end to end, as a user gets it: `pip install --no-build-isolation` of the
# checkout into a fresh target folder (its own build folder too), then the unittest suite
# against that install, on the simulated backend (no GPU needed).
# usage: run_tests.sh SOURCE_DIR GPUMEM_BINARY
set -u
SRC=$1
GPUMEM=$2
T=$(mktemp -d /tmp/gpumem_python_test.XXXXXX)
trap 'rm -rf "$T"' EXIT
for m in pip setuptools wheel; do
    if ! python3 -c "import $m" 2>/dev/null; then
        echo "FAILED: python3 lacks $m (tools/install_deps.sh test installs it)" >&2
        exit 1
    fi
done
if ! GPUMEM_BUILD_BASE="$T/build" python3 -m pip install --no-build-isolation --no-deps \
    --no-cache-dir --disable-pip-version-check --target "$T/site" "$SRC" >"$T/pip.log" 2>&1; then
    echo "FAILED: pip install of the checkout" >&2
    tail -30 "$T/pip.log" >&2
    exit 1
fi
cd "$T" && PYTHONPATH="$T/site" GPUMEM_CLI="$GPUMEM" GPUMEM_SRC="$SRC" \
    python3 "$SRC/tests/python/test_package.py" -v 2>&1
