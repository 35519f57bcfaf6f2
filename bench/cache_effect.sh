#!/bin/sh
# Reserved/live of the three shared traces with the cache (and thread caches) on and off, plain
# and VMM segments, on the simulated H200 (issue 5: the cache may cost at most 1 %; DESIGN.md's
# own cap alone, for comparison). Prints a Markdown table for docs/benchmarks.md.
# usage: bench/cache_effect.sh [BUILD_DIR]   (default: build)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
GPUMEM=$BUILD/tools/gpumem/gpumem
[ -x "$GPUMEM" ] || { echo "cache_effect.sh: $GPUMEM not built" >&2; exit 1; }
figure() { # TRACE ARGS... -> reserved/live
    t=$1; shift
    "$GPUMEM" replay --no-progress --json "$@" "$t" |
        python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["reserved_over_live"])'
}
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo
echo "| trace | plain, cache on | plain, off | plain, design cap only | VMM, cache on | VMM, off | worst change |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for t in "$ROOT"/traces/*.csv.gz; do
    on=$(figure "$t"); off=$(figure "$t" --set cache_disable=1)
    design=$(figure "$t" --set cache_cap_live_ratio=1000)
    von=$(figure "$t" --segments vmm); voff=$(figure "$t" --segments vmm --set cache_disable=1)
    worst=$(python3 -c "print('%+.2f %%' % (100 * max($on / $off - 1, $von / $voff - 1)))")
    echo "| $(basename "$t" .csv.gz) | $on | $off | $design | $von | $voff | $worst |"
done
