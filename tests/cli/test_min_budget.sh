#!/bin/sh
# gpumem replay --min-budget: the smallest reserve_limit found runs the trace with no
# out-of-memory, one 2 MiB step less does not (or would be below peak live), the figure is
# reported as a multiple of peak live in the text and JSON reports, and only replay takes it.
# usage: test_min_budget.sh GPUMEM_BINARY SOURCE_DIR
. "$(dirname "$0")/cli_lib.sh" # $GPUMEM, $SRC, $T and the checks

# A trace whose peak live (12 MiB) is reached after a free left a hole the next block does not
# fit: an allocator needs more than peak live unless it can reuse the hole.
tr="$T/hole.csv"
{
    echo 'Thread,Time,Action,Pointer,Size,Stream'
    echo "1,0.000001,allocate,0x1000,4194304,0x0"
    echo "1,0.000002,allocate,0x2000,4194304,0x0"
    echo "1,0.000003,free,0x1000,4194304,0x0"
    echo "1,0.000004,allocate,0x3000,8388608,0x0"
    echo "1,0.000005,free,0x2000,4194304,0x0"
    echo "1,0.000006,free,0x3000,8388608,0x0"
} >"$tr"

# check TRACE ARGS...: the budget found runs, 2 MiB less fails (or is below peak live).
check() {
    trace=$1
    shift
    run 0 replay --json --min-budget "$@" "$trace"
    cp "$T/out" "$T/budget.json"
    json "$T/budget.json" "d['min_budget_bytes'] >= d['peak_live_bytes'] > 0"
    json "$T/budget.json" "abs(d['min_budget_ratio'] - d['min_budget_bytes'] / d['peak_live_bytes']) < 1e-4"
    json "$T/budget.json" "d['min_budget_replays'] >= 1 and d['oom_count'] == 0"
    json "$T/budget.json" "d['min_budget_bytes'] <= d['peak_reserved_bytes']"
    min=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['min_budget_bytes'])" "$T/budget.json")
    live=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_live_bytes'])" "$T/budget.json")
    run 0 replay --json --set reserve_limit="$min" "$@" "$trace"
    json "$T/out" "d['oom_count'] == 0"
    less=$((min - 2097152))
    if [ "$less" -ge "$live" ]; then
        run 3 replay --json --set reserve_limit="$less" "$@" "$trace"
        json "$T/out" "d['oom_count'] > 0 and d['complete'] is False"
    fi
}

check "$tr" --segments plain
check "$tr" --segments vmm
check "$SRC/traces/resnet_train.csv.gz" --segments plain
check "$SRC/traces/resnet_train.csv.gz" --segments vmm

# The text report's row; without the option neither row nor keys.
run 0 replay --min-budget --segments plain "$tr"
has "$T/out" "smallest budget"; has "$T/out" "x peak live"
run 0 replay --json "$tr"
json "$T/out" "'min_budget_bytes' not in d"
run 0 replay "$tr"
lacks "$T/out" "smallest budget"
# compare does not take it.
run 2 compare --min-budget "$tr"; has "$T/err" "unknown option --min-budget"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
