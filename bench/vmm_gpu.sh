#!/bin/bash
# On the GPU machine: issue 18's scorecard, every figure in one command (docs/benchmarks.md,
# "Issue 18's scorecard on the H200").
#  replay: REPS rounds, interleaved: PyTorch's default allocator and expandable_segments
#     (tools/torch_replay.py's extension, one process per allocator per round, every trace in
#     it, torch.cuda.empty_cache() between traces; every op on one stream), then
#     `gpumem replay --backend cuda` in three modes on traces/*.csv.gz: plain segments (the
#     default), VMM pages (--segments vmm), and VMM with the PyTorch backend's settings
#     (vmm-backend: cache off, mapped-first placement, the unmapping thread); then each
#     gpumem mode once on the sim (sim vs GPU reserved/live);
#  budget: the smallest budgets: bench/torch_min_budget.py for both PyTorch allocators, and
#     `gpumem replay --min-budget --backend cuda` in the three modes, on every trace.
# PARTS (default "replay budget") picks the parts, MODES (default "plain vmm vmm-backend")
# the gpumem modes. Every figure is one line in OUT/vmm_gpu.log;
# bench/vmm_gpu_summary.py takes the medians.
# usage: [PARTS=...] bench/vmm_gpu.sh BUILD_DIR OUT [REPS]   (BUILD_DIR holds tools/gpumem/gpumem)
set -u
BUILD=${1:?usage: bench/vmm_gpu.sh BUILD_DIR OUT [REPS]}
OUT=${2:?usage: bench/vmm_gpu.sh BUILD_DIR OUT [REPS]}
REPS=${3:-3}
PARTS=${PARTS:-replay budget}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GM=$BUILD/tools/gpumem/gpumem
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gm_torch_ext} PYTHONUNBUFFERED=1
mkdir -p "$OUT/traces"
LOG=$OUT/vmm_gpu.log
exec > >(tee -a "$LOG") 2>&1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRACES=("$ROOT"/traces/*.csv.gz)
read -r -a MODES <<<"${MODES:-plain vmm vmm-backend}"
mode_args() { # MODE -> the gpumem replay options of that mode
    case $1 in
    plain) echo --segments plain ;;
    vmm) echo --segments vmm ;;
    vmm-backend) echo --segments vmm --set cache_disable=1 --set vmm_mapped_first=1 \
        --set vmm_unmap_thread=1 ;;
    esac
}
torch_round() { # CONF REP
    PYTORCH_CUDA_ALLOC_CONF=$1 timeout 240 python3 - "$1" "$2" "${TRACES[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "tools"))
import torch, torch_replay
torch.cuda.init(); torch.zeros(1, device="cuda")
e = torch_replay.ext()
conf, rep = sys.argv[1] or "default", sys.argv[2]
for path in sys.argv[3:]:
    kinds, ids, sizes, nid, peak = torch_replay.load(path)
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    t = e.replay(torch.tensor(kinds, dtype=torch.int8), torch.tensor(ids), torch.tensor(sizes), nid)
    res = torch.cuda.max_memory_reserved() - base
    print("torch[%s] #%s %s reserved/live %.4f ns/op %.1f device_allocs %s" % (
        conf.split(":")[0], rep, os.path.basename(path), res / peak, t / len(kinds),
        torch.cuda.memory_stats().get("num_device_alloc")))
PY
}
gpumem_once() { # LABEL REP TRACE ARGS...
    label=$1 rep=$2 t=$3
    shift 3
    "$GM" replay --no-progress --json "$@" "$t" | python3 -c 'import json, sys
d = json.load(sys.stdin)
mem = d["memory_calls"]
print("gpumem[%s] #%s %s reserved/live %.4f ns/op %.1f device %.2f ms memory-calls %d per-1000-ops %.2f" % (
    sys.argv[1], sys.argv[2], d["trace"].split("/")[-1], d["reserved_over_live"], d["ns_per_op"],
    d["timed_device_time_ns"] / 1e6, mem, 1000.0 * mem / max(1, d["ops"])))' "$label" "$rep"
}
export ROOT
if [[ " $PARTS " == *" replay "* ]]; then
    for rep in $(seq "$REPS"); do
        torch_round "" "$rep"
        torch_round "expandable_segments:True" "$rep"
        for t in "${TRACES[@]}"; do
            for m in "${MODES[@]}"; do
                # shellcheck disable=SC2046 # the mode's options are words
                gpumem_once "$m" "$rep" "$t" --backend cuda $(mode_args "$m")
            done
        done
    done
    for t in "${TRACES[@]}"; do
        for m in "${MODES[@]}"; do
            # shellcheck disable=SC2046
            gpumem_once "sim-$m" 1 "$t" $(mode_args "$m")
        done
    done
fi
if [[ " $PARTS " == *" budget "* ]]; then
    for conf in "" "expandable_segments:True"; do
        PYTORCH_CUDA_ALLOC_CONF=$conf timeout 240 python3 "$ROOT/bench/torch_min_budget.py" "${TRACES[@]}" |
            sed "s/^/min-budget torch[${conf:-default}] /"
    done
    for t in "${TRACES[@]}"; do
        for m in "${MODES[@]}"; do
            # shellcheck disable=SC2046
            "$GM" replay --no-progress --json --min-budget --backend cuda $(mode_args "$m") "$t" |
                python3 -c 'import json, sys
d = json.load(sys.stdin)
print("min-budget gpumem[%s] %s %.4f (%d bytes, peak live %d, %d replays)" % (sys.argv[1],
      d["trace"].split("/")[-1], d["min_budget_ratio"], d["min_budget_bytes"], d["peak_live_bytes"],
      d["min_budget_replays"]))' "$m"
        done
    done
fi
echo "done: $(date -u '+%H:%M:%S UTC')"
