#!/bin/bash
# What tracing (the `trace` setting, docs/tracing.md) costs per gm_alloc/gm_free in host time.
# `bench_replay --cpu --versus trace=FILE` replays each trace on two pools in one process, A
# untraced and B traced, in alternating chunks of 4096 calls, timing each chunk by the calling
# thread's CPU time (the writer thread's formatting and compression, and time preempted, are
# left out), and prints the median over chunks of B's time / A's with its quartiles: a load
# that drifts over seconds falls on both alike, which separate runs cannot promise on a shared
# machine. Each round runs every build with a .csv and with a .csv.gz trace; several builds
# (before and after a change) are compared in the same rounds.
# usage: bench/trace_cost.sh ROUNDS BUILD_DIR... [-- TRACE...]   (default: traces/*.csv.gz)
set -u
ROUNDS=${1:?usage: bench/trace_cost.sh ROUNDS BUILD_DIR... [-- TRACE...]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILDS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do BUILDS+=("$1"); shift; done
[ $# -gt 0 ] && shift
TRACES=("$@")
[ ${#TRACES[@]} -eq 0 ] && TRACES=("$ROOT"/traces/*.csv.gz)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "B/A = traced / untraced, the calling thread's CPU time per chunk of 4096 calls:"
echo "median over chunks (quartiles), and each side's ns per call; 5 passes per line"
for r in $(seq "$ROUNDS"); do
    for b in "${BUILDS[@]}"; do
        for f in t.csv t.csv.gz; do
            "$b/bench/bench_replay" --repeat 5 --cpu --versus "trace=$TMP/$f" "${TRACES[@]}" |
                sed -n "s|^versus |round $r  $(basename "$(dirname "$b")")/$(basename "$b")  ${f#t.}  |p" |
                sed "s|trace=$TMP/|trace=|; s|, [0-9]* chunks of 4096||"
        done
    done
done
