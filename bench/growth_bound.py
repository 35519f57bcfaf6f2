#!/usr/bin/env python3
"""How few growth steps a pool that grows when the program asks can take for a given peak
reserved / peak live: issue 18's call target against its memory target, on the traces.

A model, not an allocator: perfect packing (no fragmentation, no streams, no size classes:
reserved only has to cover the live bytes), and a growth step of
    max(need, f x reserved, floor), rounded up to 2 MiB,
whenever the live bytes pass what is reserved. Nothing is ever given back (that would add
calls and could not lower the peak). Every real allocator does no better than this on
memory for the same number of steps, except one that knows the program's peak in advance
(`initial_reserve`, or a rule tuned to one trace's peak).

Each trace is replayed at its own scale (1.00) and at 32 sizes from 1x to 2x of every
allocation (the same program at another batch size): a default must hold at all of them,
and there the peak falls anywhere between two growth steps. Reported per (f, floor): growth
steps and reserved/live at scale 1, and the worst reserved/live and most steps over the
scales. A growth step costs one memory call with plain segments (cudaMalloc) and two with
VMM pages (create, map); issue 18 allows 2 per 1,000 operations.

usage: bench/growth_bound.py [--target 1.02] TRACE.csv.gz...
"""
import argparse, gzip, math, os

MIB = 1 << 20
GRAN = 2 * MIB
FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.375)
FLOORS = (2 * MIB, 64 * MIB)
SCALES = [1 + i / 32 for i in range(32)]


def live_highs(path):
    """Operations, and the new highs of the live bytes as (operation number, bytes): the only
    points where growth can happen (reserved always covers every earlier live figure)."""
    live, cur, high, ops, out = {}, 0, 0, 0, []
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        next(f)
        for line in f:
            _, _, act, ptr, size, _ = line.rstrip().split(",")
            ops += 1
            if act == "allocate":
                size = int(size)
                live[ptr] = size
                cur += size
                if cur > high:
                    high = cur
                    out.append((ops, cur))
            elif ptr in live:
                cur -= live.pop(ptr)
    return ops, out


def records(path):
    """Operations, and the new highs of the live bytes."""
    ops, highs = live_highs(path)
    return ops, [h for _, h in highs]


def online_floor(path, target, part=0.25):
    """The fewest growth steps after the first `part` of a trace's operations that any pool
    growing when the program asks (one that does not know the program's future) needs to hold
    reserved/live <= target wherever the trace might end. Where the first part ends, reserved
    is at most target x the live high so far (the trace could end there); a step can reach at
    most target x the live high it is taken at, so the fewest steps are the greedy ones: grow
    to target x the new high whenever a high passes what is reserved. Returns (steps, the
    operations after the first part)."""
    ops, highs = live_highs(path)
    cut = int(ops * part)  # exact for a quarter: replay stops at ops / 4 too
    reserved = target * max([h for at, h in highs if at <= cut], default=0)
    steps = 0
    for at, h in highs:
        if at > cut and h > reserved:
            reserved = target * h
            steps += 1
    return steps, ops - cut


def grow(highs, scale, f, floor):
    """Growth steps and peak reserved over the scaled live highs."""
    reserved = steps = 0
    for h in highs:
        h = int(h * scale)
        if h <= reserved:
            continue
        step = max(h - reserved, int(f * reserved), floor)
        reserved += -(-step // GRAN) * GRAN
        steps += 1
    return steps, reserved


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=float, default=1.02, help="reserved/live to reach")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    for path in a.traces:
        ops, highs = records(path)
        allowed = 2 * ops // 1000
        name = os.path.basename(path).split(".")[0]
        print("%s: %d ops, peak live %.2f GiB; calls allowed %d (plain: %d growth steps, "
              "VMM: %d)" % (name, ops, highs[-1] / (1 << 30), allowed, allowed, allowed // 2))
        print("  %-6s %-7s %7s %9s | %13s %11s" % ("f", "floor", "steps", "res/live",
                                                   "worst res/live", "most steps"))
        best = {}
        for f in FRACTIONS:
            for floor in FLOORS:
                s1, r1 = grow(highs, 1.0, f, floor)
                runs = [grow(highs, c, f, floor) for c in SCALES]
                worst = max(r / (highs[-1] * c) for c, (_, r) in zip(SCALES, runs))
                most = max(s for s, _ in runs)
                print("  %-6g %4d MiB %7d %9.4f | %13.4f %11d" % (f, floor // MIB, s1,
                                                                 r1 / highs[-1], worst, most))
                for calls_per_step, mode in ((1, "plain"), (2, "VMM")):
                    if worst <= a.target:
                        k = (mode, "calls")
                        best[k] = min(best.get(k, math.inf), most * calls_per_step)
                    if most * calls_per_step <= allowed:
                        k = (mode, "worst")
                        best[k] = min(best.get(k, math.inf), worst)
        for mode in ("plain", "VMM"):
            print("  %s: fewest calls for <= %.3f at every scale: %s (allowed %d); best worst "
                  "reserved/live within the allowed calls: %s" % (
                      mode, a.target, best.get((mode, "calls"), "none in the grid"), allowed,
                      "%.4f" % best[(mode, "worst")] if (mode, "worst") in best else
                      "none in the grid"))


if __name__ == "__main__":
    main()
