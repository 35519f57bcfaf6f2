#!/bin/sh
# `make run`: replay the three bundled traces (traces/*.csv.gz) on the simulated H200 with the
# default configuration, print gpumem's figures beside PyTorch's (../shared/ANCHORS.md, measured
# on an H200; copied below as data), and write an HTML report per trace under BUILD_DIR/reports/.
# usage: tools/make_run.sh BUILD_DIR
set -eu
BUILD=${1:?usage: tools/make_run.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPUMEM=$BUILD/tools/gpumem/gpumem
[ -x "$GPUMEM" ] || { echo "make_run.sh: $GPUMEM not built" >&2; exit 1; }
mkdir -p "$BUILD/reports"

# trace, then PyTorch reserved/live and ns/op: default, expandable_segments, cudaMallocAsync.
ANCHORS='gpt2_train 1.088 587 1.079 1737 1.016 2366
resnet_train 1.616 697 1.004 1494 1.010 1504
gpt2_generate 1.265 408 1.118 355 1.289 1001'

printf '%-14s %9s %8s %9s | %-16s %-16s %-16s\n' trace "res/live" "ns/op" "OOM" \
    "torch default" "torch expandable" "torch cudaMallocAsync"
printf '%-14s %9s %8s %9s | %-16s %-16s %-16s\n' "" "gpumem" "gpumem" "" \
    "res/live ns/op" "res/live ns/op" "res/live ns/op"
echo "$ANCHORS" | while read -r name d_r d_ns e_r e_ns a_r a_ns; do
    trace="$ROOT/traces/$name.csv.gz"
    json=$("$GPUMEM" replay --no-progress --json --html "$BUILD/reports/$name.html" "$trace" \
        2>"$BUILD/reports/$name.log") || { cat "$BUILD/reports/$name.log" >&2; exit 1; }
    figures=$(printf '%s' "$json" | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("%.3f %.1f %d" % (d["reserved_over_live"], d["ns_per_op"], d["oom_count"]))')
    set -- $figures
    printf '%-14s %9s %8s %9s | %-6s %9s %-6s %9s %-6s %9s\n' "$name" "$1" "$2" "$3" \
        "$d_r" "$d_ns" "$e_r" "$e_ns" "$a_r" "$a_ns"
done
echo
echo "gpumem: sim backend, default configuration; host ns/op counts gm_alloc/gm_free only (the"
echo "simulated device's time is reported separately). PyTorch: real H200, ../shared/ANCHORS.md;"
echo "compare ns/op only in the same run on a GPU (gpumem replay --backend cuda)."
echo "HTML reports: $BUILD/reports/*.html"
