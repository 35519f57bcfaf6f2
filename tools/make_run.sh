#!/bin/sh
# `make run` (after a quiet build: Makefile): replay the six bundled traces (traces/*.csv.gz)
# on the simulated H200 with the default configuration (plain segments), with VMM pages, and
# with the PyTorch backend's VMM placement; print reserved/live beside PyTorch's (measured on
# an H200: docs/anchors.md; copied below as data), what each mode's memory costs in device
# calls and their time on the H200 cost model, gpumem's host time on this machine on its own,
# each table with a legend line, and write an HTML report per trace (default configuration)
# under BUILD_DIR/reports/; then the corpus report's summary (bench/corpus.py --summary: every
# trace of traces/, traces/live/, traces/corpus/ and traces/heldout/ per split, as the library
# and as the PyTorch backend).
# Needs what the build needs (sh, awk, python3 and the gpumem binary), no browser.
# usage: tools/make_run.sh BUILD_DIR
set -eu
BUILD=${1:?usage: tools/make_run.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPUMEM=$BUILD/tools/gpumem/gpumem
[ -x "$GPUMEM" ] || { echo "make_run.sh: $GPUMEM not built" >&2; exit 1; }
mkdir -p "$BUILD/reports"

# trace, then PyTorch's reserved/live on the H200: default, expandable_segments, cudaMallocAsync.
# The first three are torch_replay.py's replays of the traces; the last three (dyn_encoder,
# side_prefetch, comm_overlap; the two last on two streams) were measured in the recording runs
# themselves (docs/anchors.md); cudaMallocAsync was not run there. README.md's PyTorch figures
# are other runs: live workloads through the PyTorch backend (docs/torch.md, "Enable").
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

# Modes: plain (the default), vmm (--segments vmm), backend (gpumem.torch's placement on a
# device with VMM, its unmapping thread left out so that the figures repeat run to run).
VMM_ARGS="--segments vmm"
BACKEND_ARGS="--segments vmm --set cache_disable=1 --set vmm_mapped_first=1 --set vmm_plan=1"

echo "reserved / live = peak reserved / peak live (lower is better; 1.000 wastes nothing)"
printf '%-14s %-27s | %-46s\n' "" "gpumem on the sim" "PyTorch on an H200 (docs/anchors.md)"
printf '%-14s %6s %4s %6s %8s | %-10s %-20s %-15s\n' trace plain OOM vmm backend default \
    expandable_segments cudaMallocAsync
TIMES="" CALLS="" OOMS=0
for name in $(echo "$ANCHORS" | awk '{print $1}'); do
    # shellcheck disable=SC2046 # three words: the trace's anchors
    set -- $(echo "$ANCHORS" | awk -v n="$name" '$1 == n {print $2, $3, $4}')
    json="$BUILD/reports/$name.json"
    "$GPUMEM" replay --no-progress --allow-oom --json --html "$BUILD/reports/$name.html" \
        "$ROOT/traces/$name.csv.gz" >"$json" 2>"$BUILD/reports/$name.log" ||
        { cat "$BUILD/reports/$name.log" >&2; exit 1; }
    for mode in vmm backend; do
        if [ $mode = vmm ]; then args=$VMM_ARGS; else args=$BACKEND_ARGS; fi
        # shellcheck disable=SC2086 # the mode's options are words
        "$GPUMEM" replay --no-progress --allow-oom --json $args "$ROOT/traces/$name.csv.gz" \
            >"$BUILD/reports/$name.$mode.json" 2>"$BUILD/reports/$name.log" ||
            { cat "$BUILD/reports/$name.log" >&2; exit 1; }
    done
    oom=$(($(member "$json" oom_count) + $(member "$BUILD/reports/$name.vmm.json" oom_count) +
        $(member "$BUILD/reports/$name.backend.json" oom_count)))
    OOMS=$((OOMS + oom))
    printf '%-14s %6.3f %4s %6.3f %8.3f | %-10s %-20s %-15s\n' "$name" \
        "$(member "$json" reserved_over_live)" "$oom" \
        "$(member "$BUILD/reports/$name.vmm.json" reserved_over_live)" \
        "$(member "$BUILD/reports/$name.backend.json" reserved_over_live)" "$1" "$2" "$3"
    row=$(printf '%-14s' "$name")
    for f in "$json" "$BUILD/reports/$name.vmm.json" "$BUILD/reports/$name.backend.json"; do
        row="$row$(awk -v c="$(member "$f" memory_calls)" -v o="$(member "$f" ops)" \
            -v t="$(member "$f" device_time_ns)" \
            'BEGIN { printf " %8.2f %7.1f ms", 1000 * c / o, t / 1e6 }')"
    done
    CALLS="$CALLS$row
"
    TIMES="$TIMES$(printf '%-14s %8.1f ns/op  (%.1f-%.1f over %s timed passes)' "$name" \
        "$(member "$json" ns_per_op)" "$(member "$json" ns_per_op_min)" \
        "$(member "$json" ns_per_op_max)" "$(member "$json" timed_passes)")
"
done
echo "legend: plain = the defaults, vmm = --segments vmm, backend = vmm + cache_disable=1" \
    "vmm_mapped_first=1 vmm_plan=1 (the PyTorch backend's placement); OOM = allocations failed in the three"
[ "$OOMS" -eq 0 ] ||
    echo "WARNING: $OOMS allocations failed: those rows count only the rest (reports/*.json)"
echo
echo "what the memory costs, per mode"
printf '%-14s %19s %20s %20s\n' "" plain vmm backend
printf '%-14s %8s %10s %8s %10s %8s %10s\n' trace calls/1k device calls/1k device calls/1k device
printf '%s' "$CALLS"
echo "legend: calls/1k = device calls that reserve, create, map, unmap or release memory per" \
    "1,000 operations; device = their time on the simulated H200's cost model"
echo
echo "gpumem host time on this machine"
printf '%s' "$TIMES"
echo "legend: ns/op = median host time per gm_alloc/gm_free over the timed passes" \
    "(fastest-slowest pass in brackets), simulated device"
echo
echo "PyTorch's figures: torch_replay.py's replays of the first three traces on an H200, the"
echo "recording runs themselves for the last three. README.md's PyTorch figures come from other"
echo "runs: live workloads through the PyTorch backend beside PyTorch's allocators (docs/torch.md)."
echo "The host times are not comparable with PyTorch's: they come from this CPU with no device"
echo "calls in them. Speed is compared only in the same run on a GPU (bench/gpu_replay.sh,"
echo "bench/vmm_gpu.sh; docs/benchmarks.md has the H200 figures: VMM's calls make its replays"
echo "1.0-6.6x PyTorch default's time where plain segments take 0.11-0.21x)."
echo "HTML reports: $BUILD/reports/*.html"
echo
echo "the corpus (bench/corpus.py; issue targets per trace without --summary)"
for as in library backend; do
    python3 "$ROOT/bench/corpus.py" --gpumem "$GPUMEM" --as $as --summary --jobs 2
done
