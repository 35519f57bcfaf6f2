#!/bin/bash
# On the GPU machine: gpumem's GPU benchmarks in the same command as the anchors they are
# compared with (docs/benchmarks.md): cached pairs and thread scaling beside PyTorch's
# (torch_replay.py pairs), cub's and cudaMallocAsync's (anchor_micro.cu), and trace replays
# beside PyTorch's three allocator settings (torch_replay.py replay).
# usage: bench/gpu_anchors.sh BUILD_DIR [TOOLS_DIR]
#   TOOLS_DIR holds torch_replay.py (default: the repository's tools/); anchor_micro.cu is
#   bench/anchor_micro.cu (docs/anchors.md has the figures it measured).
set -u
BUILD=${1:?usage: bench/gpu_anchors.sh BUILD_DIR [TOOLS_DIR]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=${2:-$ROOT/tools}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gm_torch_ext} PYTHONUNBUFFERED=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== gpumem: cached pairs, threads (cuda)"
"$BUILD/bench/bench_threads" --backend cuda --threads 1,4,16 --pairs 200000
echo "== PyTorch: pairs, threads"
timeout 300 python3 "$TOOLS/torch_replay.py" pairs
echo "== cub, cudaMallocAsync (anchor_micro)"
nvcc -O2 -std=c++17 -arch=sm_90 "$ROOT/bench/anchor_micro.cu" -o /tmp/gm_anchor_micro -lcuda &&
    timeout 240 /tmp/gm_anchor_micro | grep -E "pair|^device|^driver"
echo "== trace replays (ns/op, reserved/live)"
for t in "$ROOT"/traces/*.csv.gz; do
    for conf in "" "expandable_segments:True" "backend:cudaMallocAsync"; do
        PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python3 "$TOOLS/torch_replay.py" replay "$t" |
            python3 -c 'import json, sys
d = json.load(sys.stdin)
print("torch[%s] %s reserved/live %.4f ns/op %.1f" % (d["conf"], d["trace"],
      d["max_reserved"] / d["trace_peak_live"], d["ns_per_op"]))'
    done
    for seg in plain vmm; do
        "$BUILD/tools/gpumem/gpumem" replay --backend cuda --segments $seg --no-progress --json "$t" |
            python3 -c 'import json, sys
d = json.load(sys.stdin)
print("gpumem[%s] %s reserved/live %.4f ns/op %.1f" % (sys.argv[1], d["trace"],
      d["reserved_over_live"], d["ns_per_op"]))' $seg
    done
done
