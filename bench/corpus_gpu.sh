#!/bin/bash
# On the GPU machine: record the corpus (traces/corpus/README.md). Each workload of
# tools/corpus_workloads.py runs in its own process under PyTorch's default allocator (recording
# its trace) and under expandable_segments (and, with MODES containing gpumem, through gpumem's
# backend, which must be installed in the torch interpreter); the figures go to
# OUT_DIR/NAME.json as the trace's sidecar, the trace to OUT_DIR/NAME.csv.gz.
# usage: bench/corpus_gpu.sh OUT_DIR [WORKLOADS] (comma-separated; default: all of the corpus;
#   tools/heldout_workloads.py's names run too, for traces/heldout/)
#   MODES: default,expandable (default) or default,expandable,gpumem
#   PER_RUN_S: a run's time limit (default 240 s); PYTHON: the interpreter with torch;
#   CORPUS_NOTE: a note for the sidecars (e.g. that other workloads ran on the device at once).
set -u
OUT=${1:?usage: bench/corpus_gpu.sh OUT_DIR [WORKLOADS]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
MODES=${MODES:-default,expandable}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
WL=${2:-$("$PY" -c "import sys; sys.path.insert(0, '$ROOT/tools'); import ast
src = open('$ROOT/tools/corpus_workloads.py').read()
import re; m = re.search(r'WORKLOADS = \{f.__name__: f for f in \((.*?)\)\}', src, re.S)
print(','.join(x.strip() for x in m.group(1).split(',') if x.strip()))")}
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
for w in ${WL//,/ }; do
    for m in ${MODES//,/ }; do
        rec=""
        [ "$m" = default ] && rec=--record
        timeout "${PER_RUN_S:-240}" "$PY" "$ROOT/tools/corpus_record.py" "$w" "$OUT" --alloc "$m" \
            $rec >"$OUT/$w.$m.log" 2>&1
        rc=$?
        line=$(grep '^{' "$OUT/$w.$m.log" | tail -1)
        if [ $rc -ne 0 ] || [ -z "$line" ]; then
            echo "FAIL $w $m rc=$rc: $(tail -3 "$OUT/$w.$m.log" | tr '\n' ' ')"
            continue
        fi
        echo "$line" >"$OUT/$w.$m.json.part"
        echo "RUN $line"
    done
    # the sidecar: one object keyed by allocator
    "$PY" - "$OUT" "$w" <<'EOF'
import json, os, sys
out, w = sys.argv[1], sys.argv[2]
side = {"workload": w, "runs": {}}
if os.environ.get("CORPUS_NOTE"):  # how the runs shared the device (step times depend on it)
    side["note"] = os.environ["CORPUS_NOTE"]
for m in ("default", "expandable", "gpumem"):
    p = os.path.join(out, "%s.%s.json.part" % (w, m))
    if os.path.exists(p):
        side["runs"][m] = json.load(open(p))
        os.remove(p)
if side["runs"]:
    json.dump(side, open(os.path.join(out, w + ".json"), "w"), indent=1, sort_keys=True)
EOF
done
ls -la "$OUT" | grep -c csv.gz
