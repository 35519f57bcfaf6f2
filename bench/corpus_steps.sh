#!/bin/bash
# On the GPU machine: step times of corpus workloads under several allocators in interleaved
# rounds (round k starts at the k-th mode), CUDA events per step after a warm-up, one process
# per allocator and round (bench/corpus_steps.py); the summary with the spread between rounds.
# Installs the package into the Python that has torch first (gpumem modes need it).
# usage: bench/corpus_steps.sh OUT_DIR [WORKLOAD:STEPS,...]
#   MODES: default,expandable,gpumem (default); a mode gpumem=CONF runs gpumem with GPUMEM_CONF
#   set to CONF (commas inside CONF as ';'); ROUNDS: the smallest multiple of the modes' count
#   that is at least 3 (each mode first in as many rounds as the others); PER_RUN_S: 120;
#   PYTHON: python3; NO_INSTALL=1: the package is installed already; WARM=0: no untimed run of
#   the first mode before round 0 (the first process on a machine pays its caches and clocks);
#   PIN=CPUS (e.g. 2-9): every process on those CPUs only (taskset), so that no round is faster
#   or slower for the cores its process landed on.
set -u
OUT=${1:?usage: bench/corpus_steps.sh OUT_DIR [WORKLOAD:STEPS,...]}
WL=${2:-tiny_cnn_train:300,dyn_mlp_infer:600,lstm_train:200}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
IFS=, read -r -a modes <<<"${MODES:-default,expandable,gpumem}"
n=${#modes[@]}
ROUNDS=${ROUNDS:-$(( (3 + n - 1) / n * n ))}
(( ROUNDS % n == 0 )) ||
    echo "warning: ROUNDS=$ROUNDS is not a multiple of the $n modes: some mode runs first more often"
mkdir -p "$OUT"
pin=()
if [ -n "${PIN:-}" ]; then
    command -v taskset >/dev/null || { echo "PIN=$PIN: taskset is not installed"; exit 1; }
    pin=(taskset -c "$PIN")
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
[ -n "${NO_INSTALL:-}" ] ||
    (cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1) ||
    { echo "pip install failed: $OUT/pip.log"; exit 1; }
# run_mode MODE ROUND: one process of bench/corpus_steps.py, its JSON line on stdout
run_mode() {
    local m=$1 conf=""
    case $m in gpumem=*) conf=${m#gpumem=}; conf=${conf//;/,}; m=gpumem ;; esac
    GM_STEPS_ROUND=$2 GPUMEM_CONF=$conf timeout "${PER_RUN_S:-120}" "${pin[@]}" "$PY" \
        "$ROOT/bench/corpus_steps.py" "$m" "$WL" 2>>"$OUT/steps.err" ||
        echo "round $2, $m${conf:+ [$conf]}: rc=$?" >&2
}
# untimed and discarded first: the first process on a machine pays the page cache, the
# driver's caches and the GPU's clocks
[ "${WARM:-1}" = 0 ] || run_mode "${modes[0]}" -1 >/dev/null
for ((r = 0; r < ROUNDS; r++)); do
    for ((k = 0; k < n; k++)); do
        run_mode "${modes[(r + k) % n]}" "$r" >>"$OUT/steps.jsonl"
    done
    echo "round $r done"
done
"$PY" "$ROOT/bench/corpus_steps.py" --summary "$OUT/steps.jsonl"
