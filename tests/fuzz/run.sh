#!/bin/sh
# Run every libFuzzer harness of BUILD (make fuzz) for SECONDS each, one after the other, from
# the committed seeds (tests/fuzz/corpus/NAME, read-only) plus what earlier runs found
# (BUILD/fuzz-corpus/NAME). A crash, leak or failed check stops with the input saved under
# BUILD/fuzz-artifacts/ and exit status 1.
set -eu
build=$1
seconds=${2:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
status=0
for name in trace api; do
    bin="$build/tests/fuzz/fuzz_$name"
    mkdir -p "$build/fuzz-corpus/$name" "$build/fuzz-artifacts"
    echo "== fuzz_$name for ${seconds}s"
    FUZZ_API_STATS=1 "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=1024 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/${name}-" \
        "$build/fuzz-corpus/$name" "$root/tests/fuzz/corpus/$name" || status=1
done
exit $status
