#!/bin/bash
# On the GPU machine: step times of corpus workloads under several allocators in interleaved
# rounds (round k starts at the k-th mode), CUDA events per step after a warm-up, one process
# per allocator and round (bench/corpus_steps.py); the summary with the spread between rounds.
# Installs the package into the Python that has torch first (gpumem modes need it).
# usage: bench/corpus_steps.sh OUT_DIR [WORKLOAD:STEPS,...]
#   MODES: default,expandable,gpumem (default); a mode gpumem=CONF runs gpumem with GPUMEM_CONF
#   set to CONF (commas inside CONF as ';'); ROUNDS: 3; PER_RUN_S: 120; PYTHON: python3;
#   NO_INSTALL=1: the package is installed already.
set -u
OUT=${1:?usage: bench/corpus_steps.sh OUT_DIR [WORKLOAD:STEPS,...]}
WL=${2:-tiny_cnn_train:300,dyn_mlp_infer:600,lstm_train:200}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
IFS=, read -r -a modes <<<"${MODES:-default,expandable,gpumem}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
[ -n "${NO_INSTALL:-}" ] ||
    (cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1) ||
    { echo "pip install failed: $OUT/pip.log"; exit 1; }
n=${#modes[@]}
for ((r = 0; r < ROUNDS; r++)); do
    for ((k = 0; k < n; k++)); do
        m=${modes[(r + k) % n]}
        conf=""
        case $m in gpumem=*) conf=${m#gpumem=}; conf=${conf//;/,}; m=gpumem ;; esac
        GPUMEM_CONF=$conf timeout "${PER_RUN_S:-120}" "$PY" "$ROOT/bench/corpus_steps.py" "$m" "$WL" \
            >>"$OUT/steps.jsonl" 2>>"$OUT/steps.err" || echo "round $r, $m${conf:+ [$conf]}: rc=$?"
    done
    echo "round $r done"
done
"$PY" "$ROOT/bench/corpus_steps.py" --summary "$OUT/steps.jsonl"
