#!/bin/bash
# Allocator instructions per operation on the shared traces: callgrind counts what runs inside
# gm_alloc/gm_free (the pool mutex included) in one `bench_replay --repeat 1` pass on the sim
# with no device costs, and divides by the trace's operations. Repeatable to the instruction
# for a given binary, unlike dev's timings (docs/benchmarks.md, "Replay").
# usage: bench/instructions.sh BUILD_DIR [--set KEY=VALUE]...
set -u
BUILD=${1:?usage: bench/instructions.sh BUILD_DIR [--set KEY=VALUE]...}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for t in "$ROOT"/traces/*.csv.gz; do
    ops=$("$BUILD/tools/gpumem/gpumem" replay --no-progress --json "$t" |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["ops"])')
    valgrind --tool=callgrind --callgrind-out-file="$OUT" --toggle-collect=gm_alloc \
        --toggle-collect=gm_free "$BUILD/bench/bench_replay" --repeat 1 "$@" "$t" > /dev/null 2>&1
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$OUT")
    echo "$(basename "$t" .csv.gz) instructions/op $((total / ops))"
done
