#!/bin/sh
# `make run`'s report (tools/make_run.sh): a row per bundled trace in each table, each mode's
# figures the same as `gpumem replay --json` gives for that mode, a legend under each table that
# says what its columns mean, an HTML report per trace, and the corpus summaries.
# usage: test_make_run.sh GPUMEM_BINARY SOURCE_DIR
. "$(dirname "$0")/cli_lib.sh" # $GPUMEM, $SRC, $T and the checks

# make_run.sh takes a build folder: one whose tools/gpumem/gpumem is the binary under test.
mkdir -p "$T/build/tools/gpumem"
ln -s "$(cd "$(dirname "$GPUMEM")" && pwd)/$(basename "$GPUMEM")" "$T/build/tools/gpumem/gpumem"
if sh "$SRC/tools/make_run.sh" "$T/build" >"$T/report" 2>"$T/report.err"; then ok; else
    bad "make_run.sh failed"
    head -5 "$T/report.err" >&2
fi

set -- "$SRC"/traces/*.csv.gz
if [ $# -eq 6 ]; then ok; else bad "$# bundled traces, want 6"; fi
for f in "$SRC"/traces/*.csv.gz; do
    name=$(basename "$f" .csv.gz)
    rows=$(grep -c "^$name " "$T/report")
    # one row in the reserved/live table, one in the calls table, one in the host times
    if [ "$rows" -eq 3 ]; then ok; else bad "$name: $rows rows, want 3"; fi
    if [ -s "$T/build/reports/$name.html" ]; then ok; else bad "$name: no HTML report"; fi
done

# A legend under each of the three tables and each corpus summary, naming its columns.
if [ "$(grep -c '^legend: ' "$T/report")" -eq 5 ]; then ok; else bad "not 5 legend lines"; fi
grep '^legend: ' "$T/report" >"$T/legends"
for column in "plain =" "vmm =" "backend =" "OOM =" "calls/1k =" "device =" "ns/op ="; do
    has "$T/legends" "$column"
done
# Each legend follows its table: the line after the last trace row of the table.
for n in 1 2 3; do
    prev=$(grep -B1 '^legend: ' "$T/report" | grep -v '^legend: ' | grep -v '^--' | sed -n "${n}p")
    case $prev in
    comm_overlap\ *) ok ;;
    *) bad "legend $n does not follow its table's last row: \"$prev\"" ;;
    esac
done

# One trace's row against the replay's own JSON, mode by mode: reserved/live to 3 decimals,
# memory calls per 1,000 operations to 2, the simulated device time to 0.1 ms.
name=side_prefetch
i=0
for args in "" "--segments vmm" "--segments vmm --set cache_disable=1 --set vmm_mapped_first=1 --set vmm_plan=1"; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # the mode's options are words
    run 0 replay --json --no-progress $args "$SRC/traces/$name.csv.gz"
    want=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
c = sum(d["device_calls"][k] for k in ("mem_alloc", "mem_free", "va_reserve", "va_release",
                                       "phys_create", "phys_release", "map", "unmap"))
assert d["memory_calls"] == c, (d["memory_calls"], c)  # the report sums those kinds
print("%.3f %.2f %.1f" % (d["reserved_over_live"], 1000 * c / d["ops"], d["device_time_ns"] / 1e6))' \
        "$T/out")
    ooms=$((${ooms:-0} + $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["oom_count"])' "$T/out")))
    # reserved/live: columns 2 (plain), 4 (vmm), 5 (backend) of the first table's row
    got_rl=$(awk -v n="$name" -v i="$i" '$1 == n && $6 == "|" { print (i == 1 ? $2 : i == 2 ? $4 : $5); exit }' "$T/report")
    # calls and time: the second table's row (the one with "ms")
    got_calls=$(awk -v n="$name" -v i="$i" '$1 == n && / ms/ { print $(3 * i - 1), $(3 * i); exit }' "$T/report")
    if [ "$got_rl $got_calls" = "$want" ]; then ok; else
        bad "$name mode $i: report \"$got_rl $got_calls\", replay \"$want\""
    fi
done

# OOM: the failed allocations of the three replays
got_oom=$(awk -v n="$name" '$1 == n && $6 == "|" { print $3; exit }' "$T/report")
if [ "$got_oom" = "$ooms" ]; then ok; else bad "$name: OOM column \"$got_oom\", replays $ooms"; fi

# The corpus summaries (bench/corpus.py --summary), as the library and as the PyTorch backend:
# every trace counted, and the bundled split's worst reserved/live as library that of the
# replays themselves.
total=$(ls "$SRC"/traces/*.csv.gz "$SRC"/traces/live/*.csv.gz "$SRC"/traces/corpus/*.csv.gz \
    "$SRC"/traces/heldout/*.csv.gz | wc -l)
heldout=$(ls "$SRC"/traces/heldout/*.csv.gz | wc -l)
bundled=$(ls "$SRC"/traces/*.csv.gz "$SRC"/traces/live/*.csv.gz | wc -l)
for as in library backend; do
    if grep -q "^corpus: $total traces replayed on the simulated H200 as $as" "$T/report"; then ok
    else bad "no corpus summary as $as over $total traces"; fi
done
if [ "$(grep -c "^median ($bundled traces) *bundled " "$T/report")" -eq 2 ]; then ok; else
    bad "not two bundled medians over $bundled traces"
fi
if [ "$(grep -c "^median ($heldout traces) *heldout " "$T/report")" -eq 2 ]; then ok; else
    bad "not two held-out medians over $heldout traces"
fi
worst=0
for f in "$SRC"/traces/*.csv.gz "$SRC"/traces/live/*.csv.gz; do
    run 0 replay --json --no-progress "$f"
    worst=$(python3 -c 'import json, sys
print("%.3f" % max(float(sys.argv[2]), json.load(open(sys.argv[1]))["reserved_over_live"]))' \
        "$T/out" "$worst")
done
got=$(awk '/^worst \(/ && $4 == "bundled" { print $5; exit }' "$T/report")
if [ "$got" = "$worst" ]; then ok; else bad "corpus: bundled worst r/l \"$got\", replays $worst"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
