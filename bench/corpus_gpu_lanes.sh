#!/bin/bash
# On the GPU machine: the whole corpus (traces/corpus/README.md) within one call of the device
# tool. The workloads of tools/corpus_workloads.py but SOLO run in LANES lanes at once (each lane
# is bench/corpus_gpu.sh over its share, round robin), then SOLO (the largest, about 40 GB
# each) one at a time on the otherwise idle device. Each lane's output goes to OUT/LANE/, its
# log to OUT/LANE.txt; the sidecars say whether other runs shared the device (peaks are the
# program's own either way; step times are not comparable across lanes).
# usage: bench/corpus_gpu_lanes.sh OUT [LANES]
#   SOLO: the workloads run alone (default llama_1b_train,gpt2_medium_ckpt); PYTHON, MODES,
#   PER_RUN_S as for bench/corpus_gpu.sh (MODES=default,expandable,gpumem adds the backend's live
#   figures: bench/corpus.py's `live` column); ONLY=a,b: those workloads alone (a run split over
#   calls of the GPU machine); PACK=FILE: also one archive of OUT's traces, sidecars
#   and logs (the GPU machine returns at most 8 files: write FILE under its $OUT, OUT elsewhere).
set -u
OUT=${1:?usage: bench/corpus_gpu_lanes.sh OUT [LANES]}
LANES=${2:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
SOLO=${SOLO:-llama_1b_train,gpt2_medium_ckpt}
mkdir -p "$OUT"
ALL=$("$PY" -c "import re
src = open('$ROOT/tools/corpus_workloads.py').read()
m = re.search(r'WORKLOADS = \{f.__name__: f for f in \((.*?)\)\}', src, re.S)
print(' '.join(x.strip() for x in m.group(1).split(',') if x.strip()))")
if [ -n "${ONLY:-}" ]; then
    ALL=$(for w in $ALL; do case ",$ONLY," in *",$w,"*) echo "$w" ;; esac; done)
    SOLO=$(for w in ${SOLO//,/ }; do case ",$ONLY," in *",$w,"*) printf '%s,' "$w" ;; esac; done)
    SOLO=${SOLO%,}
fi
i=0
declare -a share
for w in $ALL; do
    case ",$SOLO," in *",$w,"*) continue ;; esac
    share[i % LANES]="${share[i % LANES]:+${share[i % LANES]},}$w"
    i=$((i + 1))
done
for ((l = 0; l < LANES; l++)); do
    [ -n "${share[l]:-}" ] || continue
    CORPUS_NOTE="recorded in $LANES lanes at once on one device" \
        "$ROOT/bench/corpus_gpu.sh" "$OUT/lane$l" "${share[l]}" >"$OUT/lane$l.txt" 2>&1 &
done
wait
[ -z "$SOLO" ] || CORPUS_NOTE="recorded alone on the device" "$ROOT/bench/corpus_gpu.sh" \
    "$OUT/solo" "$SOLO" >"$OUT/solo.txt" 2>&1
cat "$OUT"/lane*.txt "$OUT"/solo.txt 2>/dev/null | grep -E '^(FAIL|date)' || true
echo "traces: $(ls "$OUT"/*/*.csv.gz 2>/dev/null | wc -l)"
if [ -n "${PACK:-}" ]; then
    tar -czf "$PACK" -C "$OUT" . && echo "packed: $PACK ($(du -h "$PACK" | cut -f1))"
fi
