#!/bin/sh
# A replay in which allocations failed with out-of-memory is not a result: its headline
# (reserved / live) counts only the allocations that succeeded. The text, JSON and HTML reports
# flag it, and replay exits 3, unless --allow-oom asks for 0 (the report is printed either way);
# a clean replay says it is complete; --strict still stops at the first failure (exit 1);
# compare, whose rows may run out of memory, still exits 0; --min-budget, whose bisection runs
# out of memory on purpose, still exits 0.
# usage: test_cli_oom.sh GPUMEM_BINARY SOURCE_DIR
. "$(dirname "$0")/cli_lib.sh" # $GPUMEM, $SRC, $T and the checks

H='Thread,Time,Action,Pointer,Size,Stream'
# 4 GiB live, then a 4 GiB block more: under a 6 GiB cap the second fails.
oom="$T/oom.csv"
printf '%s\n1,0,allocate,0x1000,4294967296,0x0\n1,0,allocate,0x2000,4294967296,0x0\n1,0,free,0x2000,4294967296,0x0\n1,0,free,0x1000,4294967296,0x0\n' \
    "$H" >"$oom"
cap="--set reserve_limit=6G"

# shellcheck disable=SC2086 # $cap is two words
run 3 replay $cap "$oom"
has "$T/out" "INCOMPLETE"; has "$T/out" "1 allocation failed"
has "$T/err" "1 allocation failed"; has "$T/err" "--allow-oom"
grep 'reserved / live' "$T/out" >"$T/headline"
has "$T/headline" "INCOMPLETE"
run 0 replay --allow-oom $cap "$oom"
grep 'reserved / live' "$T/out" >"$T/headline"
has "$T/headline" "INCOMPLETE"
run 3 replay --json $cap "$oom"
json "$T/out" "d['complete'] is False and d['oom_count'] == 1"
run 0 replay --json --allow-oom $cap "$oom"
json "$T/out" "d['complete'] is False and d['oom_count'] == 1"
run 3 replay --html "$T/r.html" $cap "$oom"
has "$T/r.html" "INCOMPLETE"; has "$T/r.html" "1 allocation failed"
# several traces: one with failures makes the run exit 3, and only its report is flagged
ok_trace="$T/ok.csv"
printf '%s\n1,0,allocate,0x1000,4096,0x0\n1,0,free,0x1000,4096,0x0\n' "$H" >"$ok_trace"
run 3 replay --json $cap "$ok_trace" "$oom"
json "$T/out" "[r['complete'] for r in d] == [True, False]"
run 0 replay $cap "$ok_trace"
lacks "$T/out" "INCOMPLETE"
run 0 replay --html "$T/ok.html" "$ok_trace"
lacks "$T/ok.html" "INCOMPLETE"
# --strict: the first failure is fatal, as before
run 1 replay --strict $cap "$oom"; has "$T/err" "--strict"
# --min-budget's bisection runs out of memory on purpose: the replay itself is clean
run 0 replay --json --min-budget "$oom"
json "$T/out" "d['complete'] is True and d['min_budget_bytes'] >= 8 << 30"
# compare: rows with failures are shown and not marked; the command succeeds
run 0 compare --json $cap "$oom"
json "$T/out" "all(r['oom_count'] == 1 and r['complete'] is False for r in d if 'error' not in r)"
# the option is replay's
run 0 replay --help; has "$T/out" "--allow-oom"
run 2 info --allow-oom

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
