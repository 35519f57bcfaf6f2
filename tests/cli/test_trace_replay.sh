#!/bin/sh
# Tracing a live program, end to end: tests/test_trace.c checks the trace file's format and
# records a two-thread, two-stream workload with trace=workload.csv.gz; then `gpumem replay`
# reads that recording and must see the same operations and the same peak live bytes as the
# pool that served the program.
# usage: test_trace_replay.sh TEST_TRACE_BINARY GPUMEM_BINARY
set -u
T=$(mktemp -d /tmp/gpumem_trace_replay.XXXXXX)
trap 'rm -rf "$T"' EXIT
"$1" "$T" >"$T/out" || { cat "$T/out"; exit 1; }
tail -1 "$T/out"
set -- "$1" "$2" $(grep '^peak_live_bytes' "$T/out")
peak=$4
ops=$6
[ -n "$peak" ] && [ -n "$ops" ] || { echo "FAILED: test_trace printed no figures" >&2; exit 1; }
"$2" replay --json --no-progress "$T/workload.csv.gz" >"$T/replay.json" 2>"$T/err" ||
    { echo "FAILED: gpumem replay of the recording" >&2; cat "$T/err" >&2; exit 1; }
python3 - "$T/replay.json" "$peak" "$ops" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
peak, ops = int(sys.argv[2]), int(sys.argv[3])
assert d["peak_live_bytes"] == peak, (d["peak_live_bytes"], peak)
assert d["ops"] == ops, (d["ops"], ops)
assert sum(d["bad_input"].values()) == 0 and d["streams"] == 2, d["bad_input"]
print("replayed the recording: %d ops, peak live %d bytes, as recorded" % (ops, peak))
PY
