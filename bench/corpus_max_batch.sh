#!/bin/bash
# On the GPU machine: the largest batch scale of corpus workloads under a memory limit for each
# allocator (bench/corpus_max_batch.py, one process per allocator and workload), then the summary.
# usage: bench/corpus_max_batch.sh OUT_DIR WORKLOAD[,WORKLOAD...]
#   MODES: default,expandable,gpumem (default); LIMIT: 1.25 (x PyTorch default's peak live);
#   STEPS: 16; PER_RUN_S: 300; PYTHON: python3; the package must be installed (gpumem mode).
set -u
OUT=${1:?usage: bench/corpus_max_batch.sh OUT_DIR WORKLOAD[,WORKLOAD...]}
WL=${2:?usage: bench/corpus_max_batch.sh OUT_DIR WORKLOAD[,WORKLOAD...]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
IFS=, read -r -a modes <<<"${MODES:-default,expandable,gpumem}"
IFS=, read -r -a works <<<"$WL"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
for w in "${works[@]}"; do
    for m in "${modes[@]}"; do
        timeout "${PER_RUN_S:-300}" "$PY" "$ROOT/bench/corpus_max_batch.py" "$m" "$w" \
            --limit "${LIMIT:-1.25}" --steps "${STEPS:-16}" \
            >>"$OUT/max_batch.jsonl" 2>>"$OUT/max_batch.err" || echo "$w, $m: rc=$?"
    done
done
"$PY" "$ROOT/bench/corpus_max_batch.py" --summary "$OUT/max_batch.jsonl"
