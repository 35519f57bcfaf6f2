#!/bin/bash
# On the GPU machine: the replay-speed comparison of the CUDA-backend issue (docs/benchmarks.md,
# "Replay on the H200, beside PyTorch"): for each shared trace, PyTorch's default allocator
# replayed by torch_replay.py, then `gpumem replay --backend cuda` REPS times (ns/op of its
# timed pass, the device time inside it, the calls), then PyTorch again, then gm_alloc/gm_free
# alone on the same machine (`bench_replay` on the sim with no device costs), all in one
# command so that the ratio compares like with like.
# usage: bench/gpu_replay.sh BUILD_DIR TOOLS_DIR [REPS]
#   TOOLS_DIR holds torch_replay.py (../shared/tools; copy it into the working tree, as the
#   device machine does not see ../shared). REPS defaults to 3.
#   GPUMEM_ALT="--set KEY=VALUE ...": also replay gpumem REPS times with these settings
#   (labelled alt), between the default's repetitions and PyTorch's second replay: an A/B of a
#   setting in the same run.
set -u
BUILD=${1:?usage: bench/gpu_replay.sh BUILD_DIR TOOLS_DIR [REPS]}
TOOLS=${2:?usage: bench/gpu_replay.sh BUILD_DIR TOOLS_DIR [REPS]}
REPS=${3:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gm_torch_ext} PYTHONUNBUFFERED=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
torch_once() {
    timeout 200 python3 "$TOOLS/torch_replay.py" replay "$1" | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("torch[default] %s reserved/live %.4f ns/op %.1f" % (d["trace"].split("/")[-1],
      d["max_reserved"] / d["trace_peak_live"], d["ns_per_op"]))'
}
gpumem_once() { # LABEL REP TRACE [ARGS...]
    label=$1 rep=$2 t=$3
    shift 3
    "$BUILD/tools/gpumem/gpumem" replay --backend cuda --no-progress --json "$@" "$t" |
        python3 -c 'import json, sys
d = json.load(sys.stdin)
calls = " ".join("%s=%d" % kv for kv in d["device_calls"].items() if kv[1])
print("gpumem[%s] #%s %s reserved/live %.4f ns/op %.1f device %.2f ms (sampled pass: %.2f) (%s)"
      % (sys.argv[1], sys.argv[2], d["trace"].split("/")[-1], d["reserved_over_live"],
         d["ns_per_op"], d["timed_device_time_ns"] / 1e6, d["device_time_ns"] / 1e6, calls))' \
        "$label" "$rep"
}
for t in "$ROOT"/traces/*.csv.gz; do
    torch_once "$t"
    for rep in $(seq "$REPS"); do
        gpumem_once default "$rep" "$t"
    done
    if [ -n "${GPUMEM_ALT:-}" ]; then
        for rep in $(seq "$REPS"); do
            # shellcheck disable=SC2086 # the settings are words
            gpumem_once alt "$rep" "$t" $GPUMEM_ALT
        done
    fi
    torch_once "$t" # PyTorch again: its figure moves from run to run
    echo "gm_alloc/gm_free alone (bench_replay, sim, no device costs):"
    "$BUILD/bench/bench_replay" --repeat 5 "$t" | tail -1
done
