#!/bin/sh
# Replay speed: wall time of `gpumem replay` of traces/gpt2_generate.csv.gz (820k ops) on the
# simulated device, best of 3 runs, parse + replay + report together, and the tool's own host
# ns/op (gm_alloc/gm_free only). Target (issue 3): <= 2 s. A benchmark, not a test.
# usage: bench/replay_speed.sh [BUILD_DIR]   (default: build)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
GPUMEM=$BUILD/tools/gpumem/gpumem
TRACE=$ROOT/traces/gpt2_generate.csv.gz
[ -x "$GPUMEM" ] || { echo "replay_speed.sh: $GPUMEM not built" >&2; exit 1; }

echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "gpumem:  $("$GPUMEM" --version), $GPUMEM"
echo "trace:   $TRACE"
best=
for run in 1 2 3; do
    start=$(date +%s.%N)
    out=$("$GPUMEM" replay --no-progress --json "$TRACE")
    end=$(date +%s.%N)
    wall=$(awk "BEGIN { printf \"%.3f\", $end - $start }")
    nsop=$(printf '%s' "$out" | sed -n 's/^  "ns_per_op": \([0-9.e+]*\).*/\1/p')
    echo "run $run: wall $wall s, host $nsop ns/op in gm_alloc/gm_free"
    if [ -z "$best" ] || awk "BEGIN { exit !($wall < $best) }"; then best=$wall; fi
done
echo "best of 3: $best s (target <= 2 s)"
