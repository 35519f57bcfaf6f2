#!/bin/bash
# On the GPU machine: the replay-speed comparison of the CUDA-backend issue (docs/benchmarks.md,
# "Replay on the H200, beside PyTorch"). For each shared trace, REPS rounds, each of them
# PyTorch's default allocator replayed by torch_replay.py (its own process) and then
# `gpumem replay --backend cuda` (ns/op of its timed pass, the device time inside it, the
# calls), interleaved so that a drift of the machine's speed during the run falls on both
# alike; then gm_alloc/gm_free alone on the same machine (`bench_replay` on the sim with no
# device costs).
# After each trace, one line of ratios gpumem default / PyTorch default, from REPS figures of
# each: median / median (the target's test), best / best, and the worst pairing (gpumem's
# slowest against PyTorch's fastest). One process's speed on these machines moves by up to
# ~40 % from one to the next, for PyTorch and gpumem alike (docs/benchmarks.md), hence the
# repetitions.
# usage: bench/gpu_replay.sh BUILD_DIR TOOLS_DIR [REPS]
#   TOOLS_DIR holds torch_replay.py (the repository's tools/). REPS defaults to 5.
#   GPUMEM_ALT="--set KEY=VALUE ...": each round also replays gpumem with these settings
#   (labelled alt): an A/B of a setting in the same run.
#   GPU_REPLAY_TRACES="NAME ...": only these shared traces (default: all three).
#   GPU_REPLAY_CPU=N: run every replay, PyTorch's and gpumem's, pinned to CPU N (taskset), so
#   that both draw the same core.
set -u
BUILD=${1:?usage: bench/gpu_replay.sh BUILD_DIR TOOLS_DIR [REPS]}
TOOLS=${2:?usage: bench/gpu_replay.sh BUILD_DIR TOOLS_DIR [REPS]}
REPS=${3:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gm_torch_ext} PYTHONUNBUFFERED=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PIN=()
if [ -n "${GPU_REPLAY_CPU:-}" ]; then
    PIN=(taskset -c "$GPU_REPLAY_CPU")
    echo "pinned to CPU $GPU_REPLAY_CPU"
fi
FIGS=$(mktemp)
trap 'rm -f "$FIGS"' EXIT
torch_once() { # REP TRACE
    timeout 200 "${PIN[@]}" python3 "$TOOLS/torch_replay.py" replay "$2" | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("torch[default] #%s %s reserved/live %.4f ns/op %.1f" % (sys.argv[1],
      d["trace"].split("/")[-1], d["max_reserved"] / d["trace_peak_live"], d["ns_per_op"]))' \
        "$1" | tee -a "$FIGS"
}
gpumem_once() { # LABEL REP TRACE [ARGS...]
    label=$1 rep=$2 t=$3
    shift 3
    "${PIN[@]}" "$BUILD/tools/gpumem/gpumem" replay --backend cuda --no-progress --json "$@" "$t" |
        python3 -c 'import json, sys
d = json.load(sys.stdin)
calls = " ".join("%s=%d" % kv for kv in d["device_calls"].items() if kv[1])
print("gpumem[%s] #%s %s reserved/live %.4f ns/op %.1f device %.2f ms (sampled pass: %.2f) (%s)"
      % (sys.argv[1], sys.argv[2], d["trace"].split("/")[-1], d["reserved_over_live"],
         d["ns_per_op"], d["timed_device_time_ns"] / 1e6, d["device_time_ns"] / 1e6, calls))' \
        "$label" "$rep" | tee -a "$FIGS"
}
ratios() { # TRACE: the summary line of one trace, from the figures in $FIGS
    python3 -c 'import statistics, sys
ns = {}
for line in open(sys.argv[1]):
    w = line.split()
    ns.setdefault(w[0], []).append(float(w[w.index("ns/op") + 1]))
torch = ns.get("torch[default]")
for label in ("gpumem[default]", "gpumem[alt]"):
    gm = ns.get(label)
    if gm and torch:
        print("ratio %s / torch[default] %s: median %.3f best %.3f worst pairing %.3f"
              % (label, sys.argv[2], statistics.median(gm) / statistics.median(torch),
                 min(gm) / min(torch), max(gm) / min(torch)))' "$FIGS" "$(basename "$1")"
    : > "$FIGS"
}
TRACES=("$ROOT"/traces/*.csv.gz)
if [ -n "${GPU_REPLAY_TRACES:-}" ]; then # e.g. "gpt2_train": only these
    TRACES=()
    for name in $GPU_REPLAY_TRACES; do
        TRACES+=("$ROOT/traces/$name.csv.gz")
    done
fi
for t in "${TRACES[@]}"; do
    for rep in $(seq "$REPS"); do
        torch_once "$rep" "$t"
        gpumem_once default "$rep" "$t"
        if [ -n "${GPUMEM_ALT:-}" ]; then
            # shellcheck disable=SC2086 # the settings are words
            gpumem_once alt "$rep" "$t" $GPUMEM_ALT
        fi
    done
    ratios "$t"
    echo "gm_alloc/gm_free alone (bench_replay, sim, no device costs):"
    "${PIN[@]}" "$BUILD/bench/bench_replay" --repeat 5 "$t" | tail -1
done
