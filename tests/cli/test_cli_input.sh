#!/bin/sh
# The command line's handling of awkward input and its output details: gzip that yields no data
# or is followed by bytes that are not gzip, a Time that is not a number, a file name that is not
# UTF-8, --html into a folder that does not exist, `replay -` (standard input), `compare
# --strategy / --segments`, a line over 2 MiB, null streams in the snapshot, the JSON schema
# version, --version in --help.
# usage: test_cli_input.sh GPUMEM_BINARY SOURCE_DIR
. "$(dirname "$0")/cli_lib.sh" # $GPUMEM, $SRC, $T and the checks
H='Thread,Time,Action,Pointer,Size,Stream'
good="$T/good.csv"
printf '%s\n1,0.1,allocate,0x1000,4096,0x0\n1,0.2,allocate,0x2000,8192,0x0\n1,0.3,free,0x1000,4096,0x0\n1,0.4,free,0x2000,8192,0x0\n' "$H" >"$good"

# --- gzip that yields no data: an error, not an all-zero report --------------------------------
printf '\037\213\010\000garbage that is not deflate data' >"$T/corrupt.csv.gz"
run 1 replay "$T/corrupt.csv.gz"; has "$T/err" "no trace data"; lacks "$T/out" "ops"
head -c 12 "$SRC/traces/resnet_train.csv.gz" >"$T/stub.csv.gz"
run 1 replay --json "$T/stub.csv.gz"; has "$T/err" "no trace data"
printf '%s\n' "$H" | gzip >"$T/header_only.csv.gz"
run 1 replay "$T/header_only.csv.gz"; has "$T/err" "no allocations to replay"
run 1 compare "$T/header_only.csv.gz"; has "$T/err" "no allocations to replay"

# --- gzip followed by bytes that are not gzip: counted, fatal under --strict --------------------
gzip -c "$good" >"$T/tail.csv.gz"
printf 'junk' >>"$T/tail.csv.gz"
run 0 replay --json "$T/tail.csv.gz"
json "$T/out" "d['bad_input']['truncated_gzip'] == 1 and d['ops'] == 4"
has "$T/err" "tail.csv.gz:6: the gzip data is followed by 4 bytes that are not gzip"
run 1 replay --strict "$T/tail.csv.gz"; has "$T/err" "followed by 4 bytes that are not gzip"

# --- Time must be a number ---------------------------------------------------------------------
printf '%s\n1,0.1,allocate,0x1000,64,0x0\n1,soon,allocate,0x2000,64,0x0\n1,0.3,free,0x1000,64,0x0\n' \
    "$H" >"$T/time.csv"
run 0 replay --json "$T/time.csv"
json "$T/out" "d['bad_input']['malformed_lines'] == 1 and d['ops'] == 2"
has "$T/err" "time.csv:3: malformed line: time is not a number"
run 1 replay --strict "$T/time.csv"; has "$T/err" "time.csv:3:"
printf '%s\n1,1e-6,allocate,0x1000,64,0x0\n1,inf,free,0x1000,64,0x0\n' "$H" >"$T/inf.csv"
run 0 replay --json "$T/inf.csv"; json "$T/out" "d['bad_input']['malformed_lines'] == 1"

# --- a file name that is not UTF-8 still gives valid JSON --------------------------------------
latin1="$T/$(printf 'caf\351.csv')"
cp "$good" "$latin1"
run 0 replay --json "$latin1"
json "$T/out" "d['trace'].endswith('caf\\ufffd.csv') and d['ops'] == 4"
utf8="$T/$(printf 'caf\303\251.csv')"
cp "$good" "$utf8"
run 0 replay --json "$utf8"; json "$T/out" "d['trace'].endswith('caf\\u00e9.csv')"
run 0 compare --json "$latin1"; json "$T/out" "all(r['trace'].endswith('caf\\ufffd.csv') for r in d)"

# --- --html into a folder that does not exist fails before reading or replaying -----------------
run 1 replay --html "$T/no/such/dir/r.html" "$T/missing.csv"
has "$T/err" "cannot write there"; lacks "$T/err" "missing.csv"

# --- replay - reads standard input, plain or gzip -----------------------------------------------
"$GPUMEM" replay --json - <"$good" >"$T/out" 2>"$T/err" && ok || bad "replay - (plain) failed"
json "$T/out" "d['ops'] == 4 and d['trace'] == '<stdin>'"
gzip -c "$good" | "$GPUMEM" replay --json - >"$T/out" 2>"$T/err" && ok || bad "replay - (gzip) failed"
json "$T/out" "d['ops'] == 4 and d['peak_live_bytes'] == 12288"

# --- compare --strategy (as its help offers) and --segments ------------------------------------
run 0 compare --help; has "$T/out" "--strategy NAME"; has "$T/out" "--segments plain|vmm|auto"
run 0 compare --json --strategy buddy "$good"
json "$T/out" "any(r['config']['strategy'] == 'buddy' and 'release=' in r['label'] for r in d)"
json "$T/out" "all(r['config']['strategy'] == 'buddy' for r in d if 'release=' in r['label'])"
run 0 compare --json --segments vmm "$good"
json "$T/out" "len(d) >= 3 and all(r['config']['segments'] == 'vmm' for r in d)"
run 2 compare --strategy nonesuch "$good"; has "$T/err" "tlsf"

# --- a line over 2 MiB is one malformed line; later line numbers stay right --------------------
{
    echo "$H"
    echo "1,0.1,allocate,0x1000,64,0x0"
    head -c 3145728 /dev/zero | tr '\0' 'x'
    echo
    echo "1,0.2,allocate,0x2000"
    echo "1,0.3,free,0x1000,64,0x0"
} >"$T/long.csv"
run 0 replay --json "$T/long.csv"
json "$T/out" "d['bad_input']['malformed_lines'] == 2 and d['ops'] == 2"
has "$T/err" "long.csv:3: malformed line: longer than 1 MiB"
has "$T/err" "long.csv:4: malformed line: 4 fields"

# --- null streams are 0x0 in the snapshot; the JSON has a schema version; --version is listed ---
run 0 replay --html "$T/r.html" "$good"
has "$T/r.html" '"stream":"0x0"'; lacks "$T/r.html" "(nil)"
run 0 replay --json "$good"; json "$T/out" "d['schema_version'] == 1"
run 0 compare --json "$good"; json "$T/out" "all(r['schema_version'] == 1 for r in d)"
run 0 --help; has "$T/out" "--version"
run 0 replay --summary "$good"; has "$T/out" "pool at peak live (gm_pool_summary)"
has "$T/out" "gpumem pool summary"; has "$T/out" "| live (requested)             |      12.00 KiB |"
run 0 replay --help; has "$T/out" "--summary"

# --- honest numbers: host time is a median with its spread; compare marks "fastest" only beyond
# the spread; following the initial_reserve advice never raises reserved/live or the advice ---
run 0 replay --json "$good"
json "$T/out" "d['timed_passes'] == 5 and d['ns_per_op_min'] <= d['ns_per_op'] <= d['ns_per_op_max']"
json "$T/out" "abs(d['host_ns'] / d['ops'] - d['ns_per_op']) <= 1e-4 * d['ns_per_op']"
run 0 replay "$good"; has "$T/out" "median of 5 timed passes"
run 0 compare --json "$good"
json "$T/out" "all(r['ns_per_op_max'] < o['ns_per_op_min'] for r in d if r['fastest'] for o in d if o is not r and 'error' not in o and o['oom_count'] == 0)"
for seg in plain vmm; do
    reserve=0
    for round in 1 2 3; do
        run 0 replay --json --segments $seg --set initial_reserve=$reserve "$SRC/traces/resnet_train.csv.gz"
        cp "$T/out" "$T/advice_$seg$round.json"
        reserve=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['recommended_initial_reserve'])" "$T/out")
    done
    for round in 2 3; do
        prev=$((round - 1))
        if python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
assert b['reserved_over_live'] <= a['reserved_over_live'], (a['reserved_over_live'], b['reserved_over_live'])
assert b['recommended_initial_reserve'] <= a['recommended_initial_reserve'] or a['recommended_initial_reserve'] == 0, \
    (a['recommended_initial_reserve'], b['recommended_initial_reserve'])
assert b['oom_count'] == 0" "$T/advice_$seg$prev.json" "$T/advice_$seg$round.json"; then ok
        else bad "initial_reserve advice ($seg, round $round) raised reserved/live or itself"; fi
    done
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
