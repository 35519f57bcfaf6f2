#!/bin/sh
# The library's layers run one way (docs/architecture.md, "Layers and files"): each source file
# calls only files of a lower layer. Read from the static library's symbol tables (nm), so a
# call through a hook the pool installs (a function pointer) is not a call, and inlined code is
# counted where it is compiled. A file not in the table fails too: a new file takes its place.
# usage: tests/docs/layers.sh LIBGPUMEM.a [NM]
set -eu
LIB=${1:?usage: layers.sh LIBGPUMEM.a [NM]}
NM=${2:-nm}
# file layer: higher calls lower, never the same or a higher one
RANKS='
summary 31
pool 30
stats 29
defrag 28
sleep 28
alloc 27
share 26
oom 25
arena 24
tcache 23
retire 22
cache 21
release 20
growth 19
strategy 18
tlsf 17
buddy 17
slab 17
fixed 17
segment 16
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
"$NM" -A --format=posix "$LIB" | awk -v ranks="$RANKS" -v only="$ONLY" '
BEGIN {
    n = split(ranks, lines, "\n")
    for (i = 1; i <= n; i++)
        if (split(lines[i], f, " ") == 2)
            rank[f[1]] = f[2] + 0
    n = split(only, lines, "\n")
    for (i = 1; i <= n; i++) {
        m = split(lines[i], f, " ")
        for (j = 2; j <= m; j++)
            callers[f[1]] = callers[f[1]] " " f[j] " "
    }
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
}'
