#!/bin/bash
# On the GPU machine: the defragmentation checks and targets of issue 7 (docs/defrag.md,
# docs/benchmarks.md), all in one run.
#   1. test_gpu_defrag: every block's checksum after every compaction step, other streams
#      ordered by events, VMM stitching, A/B/C through the out-of-memory ladder;
#   2. bench_defrag: compaction copy bandwidth against plain cuMemcpyDtoDAsync measured in the
#      same run (target ratio >= 0.80), and the stream time one step at the default budgets
#      adds (target <= 200 us);
#   3. trace replays with VMM segments and defragmentation (reserved/live, target <= 1.02).
# usage: bench/gpu_defrag.sh BUILD_DIR
set -u
BUILD=${1:?usage: bench/gpu_defrag.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== test_gpu_defrag"
"$BUILD/tests/test_gpu_defrag" | grep -v '^  ok'
echo "== bench_defrag"
"$BUILD/bench/bench_defrag"
echo "== replays: --segments vmm --defrag on --movable 0.5 / 1.0 (cuda)"
for t in "$ROOT"/traces/*.csv.gz; do
    for movable in 0.5 1.0; do
        "$BUILD/tools/gpumem/gpumem" replay --backend cuda --segments vmm --defrag on \
            --movable $movable --no-progress --json "$t" |
            python3 -c 'import json, sys
d = json.load(sys.stdin)
f = d.get("defrag", {})
print("gpumem[vmm defrag movable %s] %s reserved/live %.4f ns/op %.1f steps %s moved %s bytes"
      % (sys.argv[1], d["trace"], d["reserved_over_live"], d["ns_per_op"], f.get("steps"),
         f.get("bytes_moved")))' $movable
    done
done
