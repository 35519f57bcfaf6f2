#!/bin/bash
# On the GPU machine: issue 34's checks in one call (docs/sleep.md). Installs the package into
# the Python that has torch; builds torch_memory_saver (the anchor) from its source when
# TMS_SRC names a checkout of it (the GPU machine has no network: carry it there); then the
# RL-like check beside it (integrations/torch/gpu_sleep_check.py, every mode; gpumem's once more
# with its host buffer pinned ahead, --prepare), CuPy's sleep and
# wake (bench/gpu_cupy_sleep.py) and the backend's graph and memory-tool checks
# (gpu_check_backend.py), and the library's own sleep and wake against the copy bandwidth
# (bench/bench_sleep, built in OUT_DIR/build). Logs and JSON in OUT_DIR; a summary on stdout.
# usage: bench/gpu_sleep.sh OUT_DIR
#   PYTHON: the interpreter with torch (default python3); TMS_SRC: torch_memory_saver's source;
#   TMS_CUDA_MAJOR: the CUDA major it is built for (default: torch's).
set -u
OUT=${1:?usage: bench/gpu_sleep.sh OUT_DIR}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__)"
(cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1) ||
    { echo "pip install failed: $OUT/pip.log"; exit 1; }
if [ -n "${TMS_SRC:-}" ]; then
    major=${TMS_CUDA_MAJOR:-$("$PY" -c "import torch; print(torch.version.cuda.split('.')[0])")}
    (cd "$TMS_SRC" && TMS_CUDA_MAJOR=$major "$PY" -m pip install --no-build-isolation --no-deps . \
        >"$OUT/tms_pip.log" 2>&1) && echo "torch_memory_saver: built (CUDA $major)" ||
        echo "torch_memory_saver: build failed ($OUT/tms_pip.log); its modes are skipped"
fi
"$PY" "$ROOT/integrations/torch/gpu_sleep_check.py" >"$OUT/sleep.json" 2>"$OUT/sleep.log"
echo "sleep check: rc=$? $(tail -c 600 "$OUT/sleep.json")"
# The same gpumem run with its host buffer pinned ahead (gpumem.torch.sleep_prepare): the first
# sleep then only copies; prepare_s is the pinning moved out of it.
CUBLAS_WORKSPACE_CONFIG=:4096:8 "$PY" "$ROOT/integrations/torch/gpu_sleep_check.py" --mode gpumem \
    --prepare >"$OUT/sleep_prepare.out" 2>"$OUT/sleep_prepare.log"
echo "sleep check, prepared: rc=$? $(grep '^RESULT' "$OUT/sleep_prepare.out" | "$PY" -c '
import json, sys
d = json.loads(sys.stdin.read()[7:])
print({k: d.get(k) for k in ("prepare_s", "sleep_s", "wake_s", "sleep2_s", "wake2_s",
                             "budget_first_s", "ideal_copy_s")},
      "first cycle within budget:", d["sleep_s"] + d["wake_s"] <= d["budget_first_s"])' 2>&1)"
"$PY" "$ROOT/bench/gpu_cupy_sleep.py" >"$OUT/cupy_sleep.log" 2>&1
echo "cupy sleep: rc=$? $(tail -2 "$OUT/cupy_sleep.log" | tr '\n' ' ')"
"$PY" "$ROOT/integrations/torch/gpu_check_backend.py" --json "$OUT/check.json" >"$OUT/check.log" 2>&1
echo "backend checks: rc=$? $(tail -2 "$OUT/check.log" | tr '\n' ' ')"
(cmake -S "$ROOT" -B "$OUT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "$OUT/build" -j "$(nproc)" --target bench_sleep) >"$OUT/build.log" 2>&1 &&
    "$OUT/build/bench/bench_sleep" --pin 1 >"$OUT/bench_sleep.txt" 2>&1
echo "bench_sleep: rc=$? (OUT_DIR/bench_sleep.txt)"
grep -E "^  (nosave|save only|pin)" "$OUT/bench_sleep.txt"
