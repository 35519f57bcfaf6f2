#!/bin/sh
# The library's layers run one way (docs/architecture.md, "Layers and files"): each source file
# calls only files of a lower layer. Read from the static library's symbol tables (nm), so a
# call through a hook the pool installs (a function pointer) is not a call, and inlined code is
# counted where it is compiled. A file not in the table fails too: a new file takes its place.
# What nm cannot see is read from the sources (src/): a file includes only headers of its own
# or a lower layer (HEADERS places the headers not named after their file), a private header
# only its files (PRIVATE), and the pool's parts (FIELDS) are touched only by their owner and
# the files listed beside it.
# usage: tests/docs/layers.sh LIBGPUMEM.a [NM]
set -eu
LIB=${1:?usage: layers.sh LIBGPUMEM.a [NM]}
NM=${2:-nm}
SRC=$(cd "$(dirname "$0")/../../src" && pwd)
# file layer: higher calls lower, never the same or a higher one
RANKS='
summary 34
pool 33
stats 32
defrag 31
sleep 31
alloc 30
share 29
oom 28
arena 27
tcache 26
retire 25
cache 24
release 23
growth 22
plan 22.5
strategy 21
tlsf 20
buddy 20
slab 20
fixed 20
segment 19
segment_census 19
segment_vmm 18
segment_alias 17
unmapper 15
blocks 14
events 14
counters 13
config 12
config_resolve 12
tracing 12
tag 12
error 11
json 6
debug 6
lock 6
cuda 9
cuda_mem 8.6
cuda_host 8.6
cuda_ipc 8.6
cuda_driver 8.3
sim 9
sim_vmm 8.6
sim_host 8.6
sim_model 8.3
backend 8
cost 7
'
# file: the only files that may call it (the simulator's cost model is the simulator's; the
# pool's policies ask the backend for estimates: backend_estimate_ns)
ONLY='
cost sim sim_model sim_vmm sim_host backend
'
# The tables' readers, for both checks: "key value" lines into arr[key] = value (a number with
# `numeric`), "key word..." lines into arr[key] = " word  word ... ".
READ_TABLES='
function read_pairs(text, arr, numeric,    n, i, f, lines) {
    n = split(text, lines, "\n")
    for (i = 1; i <= n; i++)
        if (split(lines[i], f, " ") == 2)
            arr[f[1]] = numeric ? f[2] + 0 : f[2]
}
function read_lists(text, arr,    n, i, j, m, f, lines) {
    n = split(text, lines, "\n")
    for (i = 1; i <= n; i++) {
        m = split(lines[i], f, " ")
        for (j = 2; j <= m; j++)
            arr[f[1]] = arr[f[1]] " " f[j] " "
    }
}'
"$NM" -A --format=posix "$LIB" | awk -v ranks="$RANKS" -v only="$ONLY" "$READ_TABLES"'
BEGIN {
    read_pairs(ranks, rank, 1)
    read_lists(only, callers)
}
{
    # posix format: "lib.a[file.c.o]: symbol TYPE [value size]"
    obj = $1
    sub(/^.*\[/, "", obj)
    sub(/\]:$/, "", obj)
    sub(/\.c\.o$/, "", obj)
    sub(/\.o$/, "", obj)
    sym = $2
    type = $3
    seen[obj] = 1
    if (type == "U")
        uses[obj, sym] = 1
    else if (type ~ /^[TDBRVWG]$/)
        owner[sym] = obj
}
END {
    bad = 0
    for (o in seen)
        if (!(o in rank)) {
            printf "layers: %s is in no layer: give it one in tests/docs/layers.sh and docs/architecture.md\n", o
            bad = 1
        }
    for (k in uses) {
        split(k, p, SUBSEP)
        from = p[1]
        sym = p[2]
        if (!(sym in owner))
            continue
        to = owner[sym]
        if (to == from || !(from in rank) || !(to in rank))
            continue
        if ((to in callers) && index(callers[to], " " from " ") == 0) {
            who = callers[to]
            gsub(/  +/, " ", who)
            printf "layers: %s calls %s of %s, which only%smay call\n", from, sym, to, who
            bad = 1
        }
        if (rank[to] >= rank[from]) {
            printf "layers: %s (layer %d) calls %s of %s (layer %d): calls run one way, down\n", from, rank[from], sym, to, rank[to]
            bad = 1
        }
    }
    if (bad)
        exit 1
    print "layers: every call runs down"
}' || failed=1

# header: the file whose layer it has, where that is not the file of its name; "any": the shared
# types and the leaf helpers, which every file may include (and which include only the bottom
# layer's headers)
HEADERS='
types.h any
backend.h any
gpumem.h any
gpumem_sim.h any
hashmap.h any
list.h any
streammap.h any
hostmem.h debug
strategy.h tlsf
segment.h segment_alias
segment_parts.h segment_alias
'
# header: the only files that may include it
PRIVATE='
segment_parts.h segment segment_vmm segment_alias segment_census
sim_model.h sim sim_vmm sim_host sim_model
cuda_driver.h cuda cuda_mem cuda_host cuda_ipc cuda_driver
'
# The pool's parts (gm_pool in types.h; `pool->NAME`): the part, its owner, and the other files
# that touch it ("*": every file: every layer counts). A header counts as the file of its name.
FIELDS='
ev events pool retire
counters *
tc tcache alloc pool sleep stats
seg segment segment_vmm segment_alias segment_census arena oom pool sleep stats unmapper
defrag defrag stats
share share sleep
err error oom pool sleep stats
sleep sleep alloc defrag oom pool share stats
cache cache pool sleep summary
unmap unmapper segment_alias segment_vmm stats
heaps arena types pool defrag sleep
heap_count arena types defrag oom sleep
'
find "$SRC" -name '*.[ch]' | sort | xargs awk -v ranks="$RANKS" -v headers="$HEADERS" \
    -v private="$PRIVATE" -v fields="$FIELDS" "$READ_TABLES"'
function base(path) {
    sub(/^.*\//, "", path)
    return path
}
function stem(name) {
    sub(/\.[ch]$/, "", name)
    return name
}
# the layer of a file or header: its rank, -1 for "any", "" when it has none
function layer_of(name,    m) {
    if (name in hdr)
        m = hdr[name]
    else
        m = stem(name)
    if (m == "any")
        return -1
    return (m in rank) ? rank[m] : ""
}
BEGIN {
    read_pairs(ranks, rank, 1)
    read_pairs(headers, hdr, 0)
    read_lists(private, priv)
    read_lists(fields, who)
    bad = 0
}
FNR == 1 {
    file = base(FILENAME)
    me = layer_of(file)
    if (me == "") {
        printf "layers: %s is in no layer: give it one in tests/docs/layers.sh (RANKS, or HEADERS for a header)\n", file
        bad = 1
    }
    mod = stem(file)
    incomment = 0
}
/^#include "/ {
    h = $2
    gsub(/"/, "", h)
    h = base(h)
    lh = layer_of(h)
    if (lh == "") {
        printf "layers: %s includes %s, which is in no layer (RANKS, or HEADERS)\n", file, h
        bad = 1
    } else if (me != "" && lh >= 0 && lh > (me < 0 ? rank["lock"] : me)) {
        printf "layers: %s (layer %d) includes %s (layer %d): a file includes only its own or a lower layer\n", file, me, h, lh
        bad = 1
    }
    if ((h in priv) && index(priv[h], " " mod " ") == 0) {
        names = priv[h]
        gsub(/  +/, " ", names)
        printf "layers: %s includes %s, which only%smay include\n", file, h, names
        bad = 1
    }
}
{
    line = $0
    # comments are not accesses: drop /* ... */ on the line and the lines inside one
    if (incomment) {
        if (index(line, "*/") == 0)
            next
        sub(/^.*\*\//, "", line)
        incomment = 0
    }
    gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", line)
    if (match(line, /\/\*/)) {
        line = substr(line, 1, RSTART - 1)
        incomment = 1
    }
    for (fl in who) {
        if (who[fl] == " * " || index(who[fl], " " mod " "))
            continue
        if (match(line, "(^|[^A-Za-z0-9_])pool\\)?->" fl "([^A-Za-z0-9_]|$)")) {
            names = who[fl]
            gsub(/  +/, " ", names)
            printf "layers: %s:%d touches pool->%s, which only%smay touch (tests/docs/layers.sh, FIELDS)\n", file, FNR, fl, names
            bad = 1
        }
    }
}
END {
    if (bad)
        exit 1
    print "layers: every include runs down, every part of the pool is touched by its own"
}' || failed=1
exit "${failed:-0}"
