#!/bin/bash
# A fingerprint of every allocation decision: `gpumem replay --json` on the shared traces in 10
# configurations, every figure but the timings, hashed. A change meant only to make the
# allocator faster must leave it as it was (docs/benchmarks.md, "Replay").
# usage: bench/decisions.sh GPUMEM_BINARY [OUTFILE]
set -u
G=${1:?usage: bench/decisions.sh GPUMEM_BINARY [OUTFILE]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${2:-$(mktemp)}
: > "$OUT"
for cfg in "" "--set cache_disable=1" "--set thread_cache_blocks=4294967295" "--set growth=exact" \
           "--set release=on_oom" "--set release=eager" "--strategy buddy" "--strategy slab" \
           "--segments vmm" "--set cache_match.large=best --set cache_evict.medium=fifo"; do
    for t in "$ROOT"/traces/*.csv.gz; do
        # shellcheck disable=SC2086 # cfg holds several words
        "$G" replay --no-progress --json $cfg "$t" | python3 -c '
import json, sys
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items()
                if "time" not in k and not k.startswith("ns_per_op") and k not in ("host_ns", "trace")}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
print(sys.argv[1], json.dumps(strip(json.load(sys.stdin)), sort_keys=True))' "$cfg" >> "$OUT"
    done
done
md5sum < "$OUT" | cut -d" " -f1
