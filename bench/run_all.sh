#!/bin/sh
# `make bench`: every benchmark on the simulated device, on this machine. Record what matters in
# docs/benchmarks.md with the date and machine printed here. (bench/strategies.sh regenerates
# docs/strategies.md; run it when a strategy changes.)
# usage: bench/run_all.sh BUILD_DIR
set -eu
BUILD=${1:?usage: bench/run_all.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "== replay speed (target: gpt2_generate <= 2 s)"
"$ROOT/bench/replay_speed.sh" "$BUILD"
echo "== cached pair latency and thread scaling (targets: <= 60 ns; 2 threads >= 1.6x)"
"$BUILD/bench/bench_threads" --threads 1,2
echo "== per-strategy pair latency, cache off"
"$BUILD/bench/bench_strategies"
