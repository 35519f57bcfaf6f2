#!/usr/bin/env python3
"""A loop's steady state on the simulated GPU: each corpus trace's iterations replayed in random
order, many times over, so that a policy is judged where a training or serving loop spends its
time (the corpus's traces hold 2-48 iterations; a program runs thousands).

    bench/corpus_loop.py [--gpumem PATH] [--set KEY=VALUE]... [--steps N] [--seed S]
                         [--plan-max N] [--same] [--json FILE]

An iteration is a stretch of the trace between two points where only the program's lasting
allocations are live (the fewest live allocations between its first and last tenth: weights,
optimizer state); kept only when it frees everything it allocates, so that iterations can follow
each other in any order. The loop trace is the trace up to its first such point, then N
iterations (default 150; fewer when that passes 300,000 operations, at least twice the trace's
own) drawn at random (seeded) from the trace's, then the trace's tail. Traces with no such
iterations (a result cache that outlives the step, two streams whose steps overlap) are left
out. Each loop is replayed with the PyTorch backend's settings (bench/corpus.py --as backend)
plus --set; the report gives reserved/live, memory calls per 1,000 operations after the first
quarter and the simulated device time of every call (the H200 cost model, growth included) per
iteration, in ms, per trace and split, with the worst and median of each split. Beside them,
`plan`: what an allocator that knew each of the trace's iterations in advance and never moved a
page would need (plan_footprint: each iteration laid out offline, greedy by size, above the
lasting allocations; the most over the iterations, over the most live), and `distinct`: how many
of the trace's iterations differ in their sizes or order (`-`: an iteration holds more than
--plan-max allocations; the planner is quadratic). Where plan passes the reserved/live bound,
even the layout such a planner finds with the whole iteration known holds more than the bound
unless pages move: steady-state memory calls are then the price of the bound, not a policy's
miss.

--same repeats one iteration of each trace (the one of the highest peak live) instead of
drawing them: a loop whose shapes never change, the case where an allocator that learns the
program has everything to learn (`plan` is then that iteration's, `distinct` 1).
"""
import argparse
import csv
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
import corpus  # noqa: E402  (bench/, beside this file)

MAX_OPS = 300000
PLAN_MAX = 40000  # allocations an iteration may hold for the plan column (--plan-max)


def iterations(rows):
    """(marks, iterations) of a trace's rows: the indices where only its lasting allocations are
    live, and the stretches between two of them that free everything they allocate."""
    live, counts = set(), []
    for r in rows:
        (live.add if r["Action"] == "allocate" else live.discard)(r["Pointer"])
        counts.append(len(live))
    base = min(counts[len(counts) // 10:len(counts) - len(counts) // 10])
    marks = [i for i, n in enumerate(counts) if i >= len(counts) // 40 and n == base]
    iters = []
    for a, b in zip(marks, marks[1:]):
        seg, held = rows[a + 1:b + 1], set()
        for r in seg:
            (held.add if r["Action"] == "allocate" else held.discard)(r["Pointer"])
        if seg and not held:
            iters.append(seg)
    return marks, iters


def plan_footprint(seg, align=512):
    """(footprint, peak live) in bytes of one iteration laid out offline, knowing every request
    and free in advance, in one stretch of addresses that never changes: greedy by size (the
    largest block first, each at the lowest offset that no block live at the same time
    overlaps), the heuristic static memory planners use. What an allocator that never remaps
    pages could at best hope for on this iteration."""
    start, blocks = {}, []
    for i, r in enumerate(seg):
        if r["Action"] == "allocate":
            start[r["Pointer"]] = (i, -(-int(r["Size"]) // align) * align)
        elif r["Pointer"] in start:
            s, size = start.pop(r["Pointer"])
            blocks.append((s, i, size))
    blocks += [(s, len(seg), size) for s, size in start.values()]
    live = peak = 0
    for _, d in sorted([(s, z) for s, _, z in blocks] + [(e, -z) for _, e, z in blocks]):
        live += d
        peak = max(peak, live)
    placed, foot = [], 0
    for s, e, size in sorted(blocks, key=lambda b: -b[2]):
        off = 0
        for lo, hi in sorted((o, o + z) for s2, e2, z, o in placed if s2 < e and s < e2):
            if off + size <= lo:
                break
            off = max(off, hi)
        placed.append((s, e, size, off))
        foot = max(foot, off + size)
    return foot, peak


def read_rows(path):
    with gzip.open(path, "rt") as f:
        return list(csv.DictReader(f))


def plan_ratio(rows, max_allocs=PLAN_MAX, cut=None):
    """A trace's loop as an offline planner lays it out: (max over its iterations of lasting +
    footprint) / (max of lasting + peak live), and how many of its iterations differ (sizes and
    order); None without self-contained iterations, or (None, distinct) when an iteration holds
    more than max_allocs allocations (0: no limit; the planner is quadratic). cut: the rows'
    iterations() when the caller has them."""
    marks, iters = cut or iterations(rows)
    if not iters:
        return None
    distinct = len({tuple((r["Action"], r["Size"]) for r in seg) for seg in iters})
    most = max(sum(r["Action"] == "allocate" for r in seg) for seg in iters)
    if max_allocs and most > max_allocs:
        return None, distinct
    lasting = {}
    for r in rows[:marks[0] + 1]:
        if r["Action"] == "allocate":
            lasting[r["Pointer"]] = int(r["Size"])
        else:
            lasting.pop(r["Pointer"], None)
    base = sum(lasting.values())
    plans = [plan_footprint(seg) for seg in iters]
    return (base + max(f for f, _ in plans)) / (base + max(p for _, p in plans)), distinct


def peak_live(seg):
    """The most bytes live at once within an iteration (its own allocations)."""
    sizes, live, peak = {}, 0, 0
    for r in seg:
        if r["Action"] == "allocate":
            sizes[r["Pointer"]] = int(r["Size"])
            live += sizes[r["Pointer"]]
            peak = max(peak, live)
        else:
            live -= sizes.pop(r["Pointer"], 0)
    return peak


def same_cut(cut):
    """iterations()' result with only the iteration of the highest peak live: the one a loop
    that repeats exactly (--same) runs again and again."""
    marks, iters = cut
    return marks, [max(iters, key=peak_live)] if iters else []


def loop_trace(src, dst, steps, seed, rows=None, cut=None):
    """Writes the loop trace of src to dst: the number of iterations drawn, 0 (nothing written)
    when src has no self-contained iterations. rows, cut: src's rows and their iterations() when
    the caller has them (same_cut's: one iteration, repeated)."""
    rows = rows or read_rows(src)
    marks, iters = cut or iterations(rows)
    if not iters:
        return 0
    mean = sum(map(len, iters)) / len(iters)
    n = max(2 * len(iters), min(steps, int(MAX_OPS // mean)))
    rng = random.Random(seed)
    out = rows[:marks[0] + 1] + [r for _ in range(n) for r in rng.choice(iters)] + \
        rows[marks[-1] + 1:]
    with gzip.open(dst, "wt", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for i, r in enumerate(out):
            w.writerow(dict(r, Time="%.6f" % (i * 1e-5)))
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build", "tools", "gpumem", "gpumem"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plan-max", type=int, default=PLAN_MAX, metavar="N",
                    help="plan only traces whose iterations hold at most N allocations "
                         "(0: all; t5_generate's take minutes)")
    ap.add_argument("--same", action="store_true",
                    help="repeat one iteration (the trace's of the highest peak) exactly, as a "
                         "loop whose shapes never change does")
    ap.add_argument("--json")
    a = ap.parse_args()
    paths = sorted(os.path.join(ROOT, "traces", "corpus", f)
                   for f in os.listdir(os.path.join(ROOT, "traces", "corpus"))
                   if f.endswith(".csv.gz"))
    split = corpus.splits(paths)
    sets = corpus.backend_conf() + a.set
    tmp = tempfile.mkdtemp(prefix="gpumem-loop-")

    def one(p):
        dst = os.path.join(tmp, os.path.basename(p))
        rows = read_rows(p)
        cut = iterations(rows)
        if a.same:
            cut = same_cut(cut)
        iters = loop_trace(p, dst, a.steps, a.seed, rows, cut)
        if not iters:
            return None
        d = corpus.replay(a.gpumem, dst, sets, False)
        os.unlink(dst)
        ops = d["ops"]
        plan, distinct = plan_ratio(rows, a.plan_max, cut)
        return dict(trace=corpus.name_of(p), split=split[p], ops=ops,
                    rl=d["reserved_over_live"], calls=d["memory_calls"],
                    after_1k=d["memory_calls_after_quarter"] * 1000.0 / (ops - ops // 4),
                    dev_ms=d["device_time_ns"] / 1e6 / iters, plan=plan, distinct=distinct)

    with ThreadPoolExecutor(2) as ex:
        rows = [r for r in ex.map(one, paths) if r]
    os.rmdir(tmp)
    print("loops of %s (%d steps, seed %d) replayed on the simulated H200 as backend with %s" % (
        "one iteration of each corpus trace, repeated" if a.same else "the corpus's iterations",
        a.steps, a.seed, ",".join(sets)))
    print("%-22s %-5s %8s %7s %7s %9s %8s %7s %8s" % (
        "trace", "split", "ops", "r/l", "calls", "after/1k", "dev ms", "plan", "distinct"))
    for sp in ("tune", "test"):
        rs = [r for r in rows if r["split"] == sp]
        for r in rs:
            print("%-22s %-5s %8d %7.4f %7d %9.2f %8.3f %7s %8d" % (
                r["trace"], sp, r["ops"], r["rl"], r["calls"], r["after_1k"], r["dev_ms"],
                "-" if r["plan"] is None else "%.4f" % r["plan"], r["distinct"]))
        for what, f in (("worst", max), ("median", statistics.median)):
            plans = [r["plan"] for r in rs if r["plan"] is not None]
            print("%-22s %-5s %8s %7.4f %7d %9.2f %8.3f %7s" % (
                "%s (%d)" % (what, len(rs)), sp, "", f(r["rl"] for r in rs),
                f(r["calls"] for r in rs), f(r["after_1k"] for r in rs),
                f(r["dev_ms"] for r in rs), "%.4f" % f(plans) if plans else "-"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
