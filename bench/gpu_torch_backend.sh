#!/bin/bash
# On the GPU machine: issue 17's figures for gpumem's PyTorch backend beside PyTorch's default
# allocator and expandable_segments (docs/benchmarks.md, "Session 14"; docs/torch.md). Installs
# the package into the Python that has torch, runs the 13 checks of gpu_check_backend.py, then
# gpu_bench_backend.py: REPS interleaved repetitions (allocators' order rotated), 40 steps of
# which the first 4 are warm-up, every worker pinned to the same CPUs; its summary gives
# `paired_vs_default` (step time x PyTorch default's, median over repetitions) and reserved/live
# per workload, then the largest batch under set_per_process_memory_fraction(0.03).
# usage: bench/gpu_torch_backend.sh OUT_DIR [REPS] [WORKLOADS]
#   REPS defaults to 4, WORKLOADS to gpt2,dyn,side (on an H200: about 3 minutes to install and
#   check, then about 13 s per run and the largest-batch search).
#   PYTHON: the interpreter with torch (default python3; `pip` may be another one).
#   GPU_BENCH_CPUS: the CPUs every worker runs on (default 2-9).
#   GPU_BENCH_ALLOCATORS: default default,expandable,gpumem.
set -u
OUT=${1:?usage: bench/gpu_torch_backend.sh OUT_DIR [REPS] [WORKLOADS]}
REPS=${2:-4}
WL=${3:-gpt2,dyn,side}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__)"
(cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1) ||
    { echo "pip install failed: $OUT/pip.log"; exit 1; }
"$PY" "$ROOT/integrations/torch/gpu_check_backend.py" --json "$OUT/check.json" >"$OUT/check.log" 2>&1
echo "checks: rc=$? ($OUT/check.log)"
"$PY" "$ROOT/integrations/torch/gpu_bench_backend.py" --reps "$REPS" --steps 40 --warmup 4 \
    --workloads "$WL" --allocators "${GPU_BENCH_ALLOCATORS:-default,expandable,gpumem}" \
    --pin "${GPU_BENCH_CPUS:-2-9}" --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
rc=$?
grep -v '^RUN ' "$OUT/bench.log" | tail -80
echo "bench: rc=$rc ($OUT/bench.log, per run: the RUN lines)"
exit $rc
