#!/bin/sh
# `make run`: replay the six bundled traces (traces/*.csv.gz) on the simulated H200 with the
# default configuration, print gpumem's reserved/live beside PyTorch's (measured on an H200:
# docs/anchors.md; copied below as data), gpumem's host time on this machine on its own, and
# write an HTML report per trace under BUILD_DIR/reports/.
# Needs only what the build needs (sh, awk and the gpumem binary): no Python, no browser.
# usage: tools/make_run.sh BUILD_DIR
set -eu
BUILD=${1:?usage: tools/make_run.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPUMEM=$BUILD/tools/gpumem/gpumem
[ -x "$GPUMEM" ] || { echo "make_run.sh: $GPUMEM not built" >&2; exit 1; }
mkdir -p "$BUILD/reports"

# trace, then PyTorch's reserved/live on the H200: default, expandable_segments, cudaMallocAsync.
# The last three (dyn_encoder, side_prefetch, comm_overlap; the two last on two streams) were
# measured in the recording runs themselves (docs/anchors.md); cudaMallocAsync was not run there.
ANCHORS='gpt2_train 1.088 1.079 1.016
resnet_train 1.616 1.004 1.010
gpt2_generate 1.265 1.118 1.289
dyn_encoder 1.414 1.058 -
side_prefetch 1.380 1.131 -
comm_overlap 1.398 1.111 -'

# A top-level member of gpumem's --json report (two-space indentation), or "-" when absent.
member() { # member JSON_FILE KEY
    awk -v k="\"$2\":" '$1 == k && /^  "/ { v = $2; sub(/,$/, "", v); print v; found = 1; exit }
        END { if (!found) print "-" }' "$1"
}

echo "reserved / live: peak reserved / peak live (lower is better; 1.000 wastes nothing)"
printf '%-14s %8s %5s | %-46s\n' "" gpumem OOM "PyTorch on an H200 (docs/anchors.md)"
printf '%-14s %8s %5s | %-10s %-18s %-16s\n' trace "(sim)" "" default expandable_segments \
    cudaMallocAsync
TIMES=""
for name in $(echo "$ANCHORS" | awk '{print $1}'); do
    set -- $(echo "$ANCHORS" | awk -v n="$name" '$1 == n {print $2, $3, $4}')
    json="$BUILD/reports/$name.json"
    "$GPUMEM" replay --no-progress --json --html "$BUILD/reports/$name.html" \
        "$ROOT/traces/$name.csv.gz" >"$json" 2>"$BUILD/reports/$name.log" ||
        { cat "$BUILD/reports/$name.log" >&2; exit 1; }
    ratio=$(member "$json" reserved_over_live)
    printf '%-14s %8.3f %5s | %-10s %-18s %-16s\n' "$name" "$ratio" "$(member "$json" oom_count)" \
        "$1" "$2" "$3"
    TIMES="$TIMES$(printf '%-14s %8.1f ns/op  (%.1f-%.1f over %s timed passes)' "$name" \
        "$(member "$json" ns_per_op)" "$(member "$json" ns_per_op_min)" \
        "$(member "$json" ns_per_op_max)" "$(member "$json" timed_passes)")
"
done
echo
echo "gpumem host time on this machine (simulated device: gm_alloc/gm_free only, median):"
printf '%s' "$TIMES"
echo
echo "These host times are not comparable with PyTorch's: they come from this CPU with no device"
echo "calls in them. Speed is compared only in the same run on a GPU (bench/gpu_replay.sh;"
echo "docs/benchmarks.md has the H200 figures)."
echo "HTML reports: $BUILD/reports/*.html"
