#!/bin/sh
# The gpumem command line end to end: help and usage errors, text / JSON / HTML output, every
# kind of bad trace with and without --strict, info, compare, and the bundled real traces.
# usage: test_cli.sh GPUMEM_BINARY SOURCE_DIR
. "$(dirname "$0")/cli_lib.sh" # $GPUMEM, $SRC, $T and the checks

H='Thread,Time,Action,Pointer,Size,Stream'
good="$T/good.csv"
{
    echo "$H"
    echo "1,0.000001,allocate,0x7f0000000000,1048576,0x0"
    echo "1,0.000002,allocate,0x7f0000200000,4096,0x0"
    echo "1,0.000003,allocate,0x7f0000300000,33554432,0x55aa00"
    echo "1,0.000004,free,0x7f0000200000,4096,0x0"
    echo "1,0.000005,allocate failure,0x0,999,0x0"
    echo "1,0.000006,allocate,0x7f0000400000,8192,0x55aa00"
    echo "1,0.000007,free,0x7f0000000000,1048576,0x0"
    echo "1,0.000008,free,0x7f0000300000,33554432,0x55aa00"
    echo "1,0.000009,free,0x7f0000400000,8192,0x55aa00"
} >"$good"

# --- help and usage errors --------------------------------------------------------------------
run 0 --help;                    has "$T/out" "replay TRACE"
run 0 replay --help;             has "$T/out" "--set KEY=VALUE"; has "$T/out" "sim.capacity"
run 0 help compare;              has "$T/out" "usage: gpumem compare"
run 0 info --help;               has "$T/out" "usage: gpumem info"
run 0 --version;                 has "$T/out" "gpumem "
run 2
run 2 frobnicate;                has "$T/err" "unknown command"
run 2 replay;                    has "$T/err" "no trace given"
run 2 replay --bogus "$good";    has "$T/err" "unknown option --bogus"
run 2 replay --set nope=1 "$good"
has "$T/err" 'unknown key "nope"'; has "$T/err" "initial_reserve"; has "$T/err" "sim.capacity"
run 2 replay --set min_block=lots "$good"; has "$T/err" "bad value"
run 2 replay --backend tpu "$good"; has "$T/err" "not sim or cuda"
run 2 replay --strategy nonesuch "$good"; has "$T/err" "tlsf"
run 2 replay "$good" --html;     has "$T/err" "--html needs a value"
run 2 replay --set min_block=1000 "$good"; has "$T/err" "min_block"
run 2 info extra;                has "$T/err" "unexpected argument"
run 1 replay "$T/missing.csv";   has "$T/err" "missing.csv: cannot open"

# --- text ------------------------------------------------------------------------------------
run 0 replay "$good"
for field in "ops" "peak live" "peak reserved" "reserved / live" "internal frag" "external frag" \
    "frag rate" "worst frag rate" "device calls" "device time" "ns/op" "out of memory" \
    "bad trace input" "recommended pool" "initial_reserve" "1 logged allocate failures"; do
    has "$T/out" "$field"
done

# --- JSON ------------------------------------------------------------------------------------
run 0 replay --json --segments vmm --set min_block=1K --set sim.capacity=64G "$good"
cp "$T/out" "$T/one.json"
json "$T/one.json" "isinstance(d, dict)"
for key in trace ops peak_live_bytes peak_reserved_bytes reserved_over_live ns_per_op \
    device_calls oom_count config internal_frag_bytes external_frag_bytes frag_rate_at_peak \
    worst_frag_rate device_time_ns recommended_initial_reserve bad_input; do
    json "$T/one.json" "'$key' in d"
done
json "$T/one.json" "d['ops'] == 8 and d['peak_live_bytes'] == 1048576 + 33554432 + 8192"
json "$T/one.json" "d['streams'] == 2 and d['logged_allocate_failures'] == 1"
json "$T/one.json" "d['config']['segments'] == 'vmm' and d['config']['min_block'] == 1024"
json "$T/one.json" "d['config']['sim.capacity'] == 64 << 30 and d['config']['backend'] == 'sim'"
json "$T/one.json" "all(k in d['config'] for k in ('strategy','release','reserve_limit',
 'reserve_fraction','initial_reserve','roundup_power2_divisions','small_request_max',
 'small_segment','large_request_min','medium_segment','segment_rounding','vmm_reserve',
 'sim.granularity','sim.host_backed','sim.no_costs'))"
json "$T/one.json" "'mem_alloc' in d['device_calls'] or 'va_reserve' in d['device_calls']"
json "$T/one.json" "d['reserved_over_live'] >= 1 and d['ns_per_op'] > 0"
# ns/op comes from a timed pass of its own; it makes the calls the sampled pass makes, so the
# cost model charges both the same device time
json "$T/one.json" "d['timed_device_time_ns'] == d['device_time_ns'] > 0"
json "$T/one.json" "d['host_ns'] > 0 and abs(d['ns_per_op'] - d['host_ns'] / d['ops']) <= 1e-4 * d['ns_per_op']"
run 0 replay --json "$good" "$good"
json "$T/out" "isinstance(d, list) and len(d) == 2"

# --- HTML (rendering is checked in a browser by test_html_browser.sh) ---------------------------
run 0 replay --html "$T/r.html" "$good"
has "$T/r.html" "<svg"; has "$T/r.html" 'class="series live"'; has "$T/r.html" "snapshot-0"
if grep -Eq '<(script|link|img|iframe)[^>]*(src|href)=|@import|url\(' "$T/r.html"; then
    bad "HTML report loads something external"
else ok; fi
run 1 replay --html "$T/no/such/dir/r.html" "$good"; has "$T/err" "cannot write"

# --- bad traces: each kind, counted without --strict, fatal with it ---------------------------
bad_case() { # bad_case NAME JSON-KEY LINE FILE [EXIT: 3 for out-of-memory failures]
    run "${5:-0}" replay --json "$4"
    json "$T/out" "d['bad_input']['$2'] == 1"
    has "$T/err" "$(basename "$4"):$3:"
    run 1 replay --strict "$4"
    has "$T/err" "$(basename "$4"):$3:"; has "$T/err" "--strict"
}
printf '%s\n1,0,allocate,0x1000,64,0x0\n1,0,allocate,0x2000\n1,0,free,0x1000,64,0x0\n' "$H" \
    >"$T/malformed.csv"
bad_case malformed malformed_lines 3 "$T/malformed.csv"
printf '%s\n1,0,allocate,0x1000,64,0x0\n1,0,free,0x9000,64,0x0\n' "$H" >"$T/unknown.csv"
bad_case unknown unknown_frees 3 "$T/unknown.csv"
printf '%s\n1,0,allocate,0x1000,64,0x0\n1,0,allocate,0x1000,128,0x0\n' "$H" >"$T/double.csv"
bad_case double double_allocates 3 "$T/double.csv"
# 1 TiB cannot be had on the default simulated H200 (141 GiB).
printf '%s\n1,0,allocate,0x1000,64,0x0\n1,0,allocate,0x2000,1099511627776,0x0\n1,0,free,0x2000,1099511627776,0x0\n' \
    "$H" >"$T/huge.csv"
bad_case huge unsatisfiable_allocates 3 "$T/huge.csv" 3
run 0 replay --json --allow-oom "$T/huge.csv"
json "$T/out" "d['oom_count'] == 1 and d['frees_skipped'] == 1 and d['first_oom_line'] == 3"
# Truncated gzip: cut a real trace's compressed bytes.
head -c 60000 "$SRC/traces/resnet_train.csv.gz" >"$T/cut.csv.gz"
run 0 replay --json "$T/cut.csv.gz"
json "$T/out" "d['bad_input']['truncated_gzip'] == 1 and d['ops'] > 1000"
has "$T/err" "truncated"
run 1 replay --strict "$T/cut.csv.gz"; has "$T/err" "cut.csv.gz:"; has "$T/err" "truncated"
printf 'hello,world\n' >"$T/nottrace.csv"
run 1 replay "$T/nottrace.csv"; has "$T/err" "nottrace.csv:1: not an RMM trace"

# --- info --------------------------------------------------------------------------------------
run 0 info;                      has "$T/out" "capacity"; has "$T/out" "VMM"; has "$T/out" "driver"
run 0 info --json --set sim.capacity=16G --set sim.granularity=4M
json "$T/out" "d['total_bytes'] == 16 << 30 and d['vmm_granularity'] == 4 << 20"
json "$T/out" "d['backend'] == 'sim' and 'driver_version' in d and 'free_bytes' in d"
# Several devices: info lists each, --device picks one, replay runs on the one it names.
run 0 info --set sim.devices=3;  has "$T/out" "device 2 of 3"; has "$T/out" "ordinal          1"
run 0 info --json --set sim.devices=3 --device 2
json "$T/out" "d['ordinal'] == 2 and [x['ordinal'] for x in d['devices']] == [2]"
run 0 info --json --set sim.devices=2
json "$T/out" "[x['ordinal'] for x in d['devices']] == [0, 1]"
run 1 info --device 1;           has "$T/err" "no sim device 1: the simulated machine has 1 device"
run 2 info --device x;           has "$T/err" "--device"
run 2 info --device 64;          has "$T/err" "0..63"
run 0 replay --json --set sim.devices=2 --device 1 "$good"
json "$T/out" "d['device_ordinal'] == 1"
"$GPUMEM" info --backend cuda >"$T/out" 2>"$T/err"
case $? in
0) has "$T/out" "cuda" ;;
1) has "$T/err" "cannot open the cuda backend" ;;
*) bad "info --backend cuda: unexpected exit code" ;;
esac

# --- compare -----------------------------------------------------------------------------------
run 0 compare "$good"
has "$T/out" "design doc"; has "$T/out" "vmm"; has "$T/out" "plain"; has "$T/out" "release="
if grep -q '^\*' "$T/out"; then ok; else bad "compare marks"; fi
run 0 compare --json "$good"
json "$T/out" "isinstance(d, list) and len(d) >= 4"
json "$T/out" "sum(r['best_reserved_over_live'] for r in d) == 1 and sum(r['fastest'] for r in d) <= 1"
json "$T/out" "len(set(r['label'] for r in d)) == len(d)"
json "$T/out" "any(r['config']['min_block'] == 262144 for r in d)"
json "$T/out" "[r['config']['segments'] for r in d if r['config']['growth'] == 'exact'] == ['plain']"

# --- a bundled real trace ---------------------------------------------------------------------
run 0 replay --json "$SRC/traces/resnet_train.csv.gz"
json "$T/out" "d['ops'] == 26265 and d['oom_count'] == 0 and sum(d['bad_input'].values()) == 0"
json "$T/out" "d['peak_live_bytes'] > 7 << 30 and d['peak_reserved_bytes'] >= d['peak_live_bytes']"

# --- movable blocks and defragmentation in time gaps -------------------------------------------
run 0 replay --help; has "$T/out" "--movable FRACTION"; has "$T/out" "--defrag on|off"
run 0 replay --help; has "$T/out" "--defrag-gap SECONDS"; has "$T/out" "defrag_threshold"
run 2 replay --movable 2 "$good";      has "$T/err" "not a number from 0 to 1"
run 2 replay --defrag maybe "$good";   has "$T/err" "not on or off"
run 2 replay --defrag-gap 0 "$good";   has "$T/err" "--defrag-gap"
run 2 compare --movable 1 "$good";     has "$T/err" "unknown option --movable"
run 2 replay --set defrag_threshold=2 "$good"; has "$T/err" "bad value"
run 2 replay --set defrag_step_ns=-5 "$good"; has "$T/err" "bad value"
run 0 replay --json --set defrag_step_ns=20000 --set defrag_copy_bandwidth=2.5e12 "$good"
json "$T/out" "d['config']['defrag_step_ns'] == 20000 and d['config']['defrag_copy_bandwidth'] == 2.5e12"
run 0 replay --json "$good"
json "$T/out" "'defrag' not in d and 'movable' not in d['config'] and d['config']['defrag_threshold'] == 0.3"
run 0 replay --json --movable 0.5 --defrag on "$good"
json "$T/out" "set(d['defrag']) >= {'enabled', 'movable_fraction', 'steps', 'blocks_moved', 'bytes_moved', 'copy_ns'}"
json "$T/out" "d['defrag']['enabled'] is True and d['defrag']['movable_fraction'] == 0.5 and 0 < d['defrag']['movable_allocs'] < 4"
json "$T/out" "d['config']['movable'] == 0.5 and d['config']['defrag'] == 'on' and d['config']['defrag_gap'] == 0.001"
json "$T/out" "d['ops'] == 8 and d['oom_count'] == 0"
run 0 replay --movable 0.5 --defrag on --html "$T/defrag.html" "$good"
has "$T/out" "movable"; has "$T/out" "copy time"; has "$T/defrag.html" "defragmentation"
# The A/B/C pattern, with PyTorch's segment sizing (growth=exact): ten 2 MiB blocks A0 B0 A1 B1
# ... fill a 20 MiB segment, the As are freed (five 2 MiB holes), then after a 10 ms gap an 8 MiB
# C arrives. Without compaction C needs a second segment; with it the Bs move down and C fits in
# the first.
abc="$T/abc.csv"
{
    echo "$H"
    for i in 0 1 2 3 4; do
        echo "1,0.00000$i,allocate,0x10${i}00000,2097152,0x0"
        echo "1,0.00001$i,allocate,0x20${i}00000,2097152,0x0"
    done
    for i in 0 1 2 3 4; do echo "1,0.00002$i,free,0x10${i}00000,2097152,0x0"; done
    echo "1,0.010000,allocate,0x3000000,8388608,0x0"
    echo "1,0.010001,free,0x3000000,8388608,0x0"
    for i in 0 1 2 3 4; do echo "1,0.01001$i,free,0x20${i}00000,2097152,0x0"; done
} >"$abc"
run 0 replay --json --set growth=exact "$abc"; cp "$T/out" "$T/abc_off.json"
run 0 replay --json --set growth=exact --movable 1 --defrag on "$abc"; cp "$T/out" "$T/abc_on.json"
json "$T/abc_on.json" "d['defrag']['steps'] >= 1 and d['defrag']['bytes_moved'] > 0 and d['defrag']['copy_ns'] > 0"
json "$T/abc_on.json" "d['defrag']['movable_allocs'] == 11 and d['oom_count'] == 0"
if python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); \
assert b['peak_reserved_bytes'] <= a['peak_reserved_bytes'], (a['peak_reserved_bytes'], b['peak_reserved_bytes']); \
assert b['peak_reserved_bytes'] < a['peak_reserved_bytes']" "$T/abc_off.json" "$T/abc_on.json"; then ok
else bad "A/B/C: peak reserved with defrag is not below without"; fi
run 0 replay --json --movable 1 --defrag on --defrag-gap 1 "$abc"
json "$T/out" "d['defrag']['calls'] == 0 and d['defrag']['bytes_moved'] == 0"
run 0 replay --json --movable 1 --defrag on --set defrag_threshold=1 "$abc"
json "$T/out" "d['defrag']['calls'] == 1 and d['defrag']['steps'] == 0 and d['config']['defrag_threshold'] == 1"
run 0 replay --json --movable 1 --defrag on --check "$SRC/traces/resnet_train.csv.gz"
json "$T/out" "d['defrag']['bytes_moved'] > 0 and d['oom_count'] == 0 and d['ops'] == 26265"

# --- sim.kernel_ns: work that lags the host --------------------------------------------------
# The side-stream recording with VMM pages (no size cache, mapped first): with work completing
# at once no old mapping's fence is ever pending, so no block is sent above the mapped pages;
# with kernels of 350 us the fences lag as on the H200, blocks go above them, more runs move;
# 0 is the same as no setting; the key is in the JSON config.
live="$SRC/traces/live/side_stream.csv.gz"
vmm="--segments vmm --set cache_disable=1 --set vmm_mapped_first=1"
run 0 replay --json $vmm "$live"; cp "$T/out" "$T/lag_none.json"
run 0 replay --json $vmm --set sim.kernel_ns=0 "$live"; cp "$T/out" "$T/lag_zero.json"
run 0 replay --json $vmm --set sim.kernel_ns=350000 "$live"; cp "$T/out" "$T/lag.json"
json "$T/lag_none.json" "d['vmm_waits_avoided'] == 0 and d['oom_count'] == 0"
json "$T/lag.json" "d['vmm_waits_avoided'] > 0 and d['oom_count'] == 0 and d['config']['sim.kernel_ns'] == 350000"
if python3 -c "import json,sys; a,b,c=(json.load(open(f)) for f in sys.argv[1:4]); \
assert a['device_calls'] == b['device_calls'] and a['peak_reserved_bytes'] == b['peak_reserved_bytes']; \
assert c['device_calls']['map'] > a['device_calls']['map'], (a['device_calls'], c['device_calls'])" \
    "$T/lag_none.json" "$T/lag_zero.json" "$T/lag.json"; then ok
else bad "sim.kernel_ns: 0 differs from unset, or lagging work moved no more runs"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
