#!/usr/bin/env python3
"""bench/corpus.py's split rule and bench/growth_bound.py's online floor, on small traces made
here: the split is a fixed hash rule (half tune, half test, bundled traces apart); the floor is
0 when the peak falls in the first quarter and follows log(peak / high so far) / log(target)
when live climbs after it; corpus.py marks a steady-state miss the floor makes unavoidable;
corpus_steps.py's summary of step times over interleaved rounds and calls per step;
corpus_max_batch.py's summary; corpus_loop.py's loop traces and offline plan.
usage: test_corpus_tools.py SOURCE_DIR"""
import glob
import json
import math
import os
import sys
import tempfile

SRC = sys.argv[1]
sys.path.insert(0, os.path.join(SRC, "bench"))
import corpus  # noqa: E402
import growth_bound  # noqa: E402

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAILED:", what)


def trace(ops):
    """A trace file of (action, id, MiB) on one stream."""
    fd, path = tempfile.mkstemp(suffix=".csv")
    with os.fdopen(fd, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for act, i, mib in ops:
            f.write("0,0.0,%s,0x%x,%d,0x0\n" % (act, 0x1000 + i, mib << 20))
    return path


# The split: corpus traces by the SHA-256 of the name, the first half (rounded up) tune.
paths = ["/x/traces/corpus/%s.csv.gz" % n for n in ("a", "b", "c", "d", "e")] + \
    ["/x/traces/gpt2_train.csv.gz", "/x/traces/live/side.csv.gz"]
s = corpus.splits(paths)
check(sum(v == "tune" for v in s.values()) == 3, "3 of 5 corpus traces in tune: %s" % s)
check(sum(v == "test" for v in s.values()) == 2, "2 of 5 in test")
check(s[paths[5]] == "bundled" and s[paths[6]] == "bundled", "traces/ and live/ are bundled")
check(corpus.splits(list(reversed(paths))) == s, "the split does not depend on the order")
held = ["/x/traces/heldout/%s.csv.gz" % n for n in ("p", "q")]
s2 = corpus.splits(paths + held)
check(all(s2[p] == "heldout" for p in held), "traces/heldout/ is its own split: %s" % s2)
check(all(s2[p] == s[p] for p in paths), "held-out traces do not move the corpus's halves")

# Held-out workloads are not corpus workloads: their names are apart, and the scripts that list
# the corpus (its WORKLOADS tuple, parsed without torch) do not list them.
def names_in(path, var):
    import ast
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == var:
            return {e.id for e in node.value.generators[0].iter.elts}
    return set()


tools = os.path.join(SRC, "tools")
corpus_names = names_in(os.path.join(tools, "corpus_workloads.py"), "WORKLOADS")
held_names = names_in(os.path.join(tools, "heldout_workloads.py"), "HELD_OUT")
check(len(corpus_names) >= 24 and len(held_names) >= 8, "%d corpus, %d held-out workloads" % (
    len(corpus_names), len(held_names)))
check(not corpus_names & held_names, "no workload is both: %s" % (corpus_names & held_names))
check(not held_names & {corpus.name_of(p) for p in glob.glob(
    os.path.join(SRC, "traces", "corpus", "*.csv.gz"))}, "no held-out trace in traces/corpus")

# Every workload has a batch that corpus_max_batch.py's scale reaches: its function, or a
# helper of its module it calls, draws through _batch / _scaled or reads BATCH_SCALE (a
# workload without one runs the same program at every scale, and its search says nothing).
def unscaled(path, var):
    import ast
    tree = ast.parse(open(path).read())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    scaled = {"_batch", "_scaled", "BATCH_SCALE"}

    def reaches(name, seen):
        seen.add(name)
        for x in ast.walk(funcs[name]):
            ident = x.id if isinstance(x, ast.Name) else x.attr if isinstance(
                x, ast.Attribute) else None
            if ident in scaled or (ident in funcs and ident not in seen and
                                   reaches(ident, seen)):
                return True
        return False
    names = names_in(path, var)
    return sorted(n for n in names if n not in funcs or not reaches(n, set()))


for path, var in (("corpus_workloads.py", "WORKLOADS"), ("heldout_workloads.py", "HELD_OUT")):
    left = unscaled(os.path.join(tools, path), var)
    check(not left, "%s: workloads with no batch the scale reaches: %s" % (path, left))

# The floor: peak in the first quarter -> no step is needed after it.
flat = trace([("allocate", i, 8) for i in range(40)] +
             [("free", i, 8) for i in range(40)] + [("allocate", 100 + i, 1) for i in range(80)])
steps, after = growth_bound.online_floor(flat, 1.03)
check(steps == 0 and after == 120, "flat: %d steps after %d ops" % (steps, after))

# Live climbs from 100 to 300 MiB after the first quarter: about log(300 / 103) / log(1.03) - 1
# steps (each reaches at most 1.03 x the high it is taken at; a high passes reserved by up to
# 1 MiB, so a step may go a little further, and there are a few fewer).
ramp = trace([("allocate", i, 1) for i in range(100)] + [("free", i, 1) for i in range(100)] +
             [("allocate", 200 + i, 1) for i in range(300)] +
             [("free", 200 + i, 1) for i in range(300)])
steps, after = growth_bound.online_floor(ramp, 1.03)
lo = math.log(300 / 103) / math.log(1.03) - 1
check(0.9 * lo <= steps <= lo + 2, "ramp: %d steps, want about %.1f" % (steps, lo))
check(after == 600, "ramp: %d ops after the first quarter, want 600" % after)
steps6, _ = growth_bound.online_floor(ramp, 1.06)
check(steps6 < steps, "a looser target needs fewer steps (%d, %d)" % (steps6, steps))

# corpus.py's misses: a steady-state miss the floor makes unavoidable says so.
row = dict(streams=1, rl=1.01, expand=None, after_1k=5.0, floor_1k=0.5, x_bound=1.0, oom=0)
check("after>0.1(floor>0.1)" in corpus.target_misses(row), corpus.target_misses(row))
row["floor_1k"] = 0.0
check("after>0.1" in corpus.target_misses(row), corpus.target_misses(row))
check("after>0.1(floor>0.1)" not in corpus.target_misses(row), "no floor, no note")

# The sidecar: each allocator's peak reserved / peak live, gpumem's backend among them when
# the recording ran it (the `live` column); none without a sidecar.
side = flat[:-len(".csv")] + ".json"
with open(side, "w") as f:
    f.write('{"runs": {"default": {"peak_reserved": 300, "peak_live": 200}, '
            '"expandable": {"peak_reserved": 220, "peak_live": 200}, '
            '"gpumem": {"peak_reserved": 202, "peak_live": 200}}}')
sc = corpus.sidecar(flat)
check(sc == {"default": 1.5, "expandable": 1.1, "gpumem": 1.01}, "sidecar: %s" % sc)
check(corpus.sidecar(ramp) == {}, "no sidecar, no figures")
check(any(k == "live" for _, k, _ in corpus.COLS), "the table has gpumem's live column")
os.remove(side)

# corpus_steps.py's summary: per workload and mode the median over rounds of the rounds' median
# steps, over default's; the spread is the rounds' lowest and highest over default's median;
# reserved/allocated the worst round's; default first, expandable next.
import corpus_steps  # noqa: E402
rows = [dict(w="net", mode=m, median_ms=ms, r_l=rl) for m, ms, rl in (
    ("gpumem", 11.0, 1.02), ("default", 10.0, 2.0), ("gpumem", 9.0, 1.04),
    ("default", 12.0, 2.0), ("expandable", 10.5, 1.1), ("default", 8.0, 2.0),
    ("gpumem", 10.0, 1.03))] + [dict(w="alone", mode="gpumem", median_ms=1.0, r_l=1.0)]
lines = corpus_steps.summarize(rows)
net = [ln.split() for ln in lines if ln.startswith("net")]
check([r[1] for r in net] == ["default", "expandable", "gpumem"], "order: %s" % net)
check(net[0][2:5] == ["3", "10.000", "1.000"] and net[0][5] == "0.800-1.200", "default: %s" % net[0])
check(net[2][2:5] == ["3", "10.000", "1.000"] and net[2][5] == "0.900-1.100" and
      net[2][6:8] == ["-", "-"] and net[2][8] == "1.040", "gpumem: %s" % net[2])

# With rounds recorded, each mode's round over default's in the same round: the median and the
# spread of those pairs (rounds 0-2: 11/10, 9/12, 10/8; a round without default is left out).
for r, rnd in zip(rows, (0, 0, 1, 1, 2, 2, 2)):
    r["round"] = rnd
rows.append(dict(w="net", mode="gpumem", median_ms=50.0, r_l=1.0, round=7))
paired = {ln.split()[1]: ln.split() for ln in corpus_steps.summarize(rows)
          if ln.startswith("net")}
check(paired["gpumem"][6:8] == ["1.100", "0.750-1.250"], "paired: %s" % paired["gpumem"])
check(paired["default"][6:8] == ["1.000", "1.000-1.000"], "default paired: %s" % paired["default"])
check(net[1][3:5] == ["10.500", "1.050"], "expandable: %s" % net[1])
alone = [ln.split() for ln in lines if ln.startswith("alone")][0]
check(alone[4] == "-" and alone[5] == "-", "no default, no ratio: %s" % alone)

# gpumem's device calls per timed step: the median round's, "-" for allocators without them.
calls_rows = [dict(w="c", mode="default", median_ms=5.0, r_l=2.0, steps=10),
              dict(w="c", mode="gpumem", median_ms=5.0, r_l=1.0, steps=10,
                   timed_calls={"map": 20, "unmap": 20}),
              dict(w="c", mode="gpumem", median_ms=5.0, r_l=1.0, steps=10, timed_calls={}),
              dict(w="c", mode="gpumem", median_ms=5.0, r_l=1.0, steps=10,
                   timed_calls={"map": 3})]
cl = {ln.split()[1]: ln.split() for ln in corpus_steps.summarize(calls_rows)
      if ln.startswith("c ")}
check(cl["gpumem"][-2] == "0.30" and cl["default"][-2] == "-", "calls/step: %s" % cl)
check(cl["gpumem"][-1] == "-", "no call time recorded, none shown: %s" % cl)

# The host's time in a step: the median over rounds of each round's host_ms, "-" without it.
for r, h in zip(calls_rows, (4.0, 4.5, 6.0, 5.5)):
    r["host_ms"] = h
calls_rows.append(dict(w="c", mode="default", median_ms=5.0, r_l=2.0, steps=10))
hm = {ln.split()[1]: ln.split() for ln in corpus_steps.summarize(calls_rows)
      if ln.startswith("c ")}
check(hm["gpumem"][-3] == "5.500" and hm["default"][-3] == "4.000", "host ms: %s" % hm)
check(net[2][-3] == "-", "no host time recorded, none shown: %s" % net[2])

# The host's ms in device calls per timed step: the median round's, summed over kinds.
for r, ns in zip(calls_rows[1:4], ({"map": 3e6, "unmap": 1e6}, {}, {"map": 2e6})):
    r["timed_call_ns"] = ns
cm = {ln.split()[1]: ln.split() for ln in corpus_steps.summarize(calls_rows)
      if ln.startswith("c ")}
check(cm["gpumem"][-1] == "0.200" and cm["default"][-1] == "-", "call ms: %s" % cm)

# corpus_max_batch.py's summary: each allocator's largest scale, gpumem's over expandable's.
import corpus_max_batch  # noqa: E402
mb = corpus_max_batch.summarize([dict(w="m", mode="default", scale=1.0),
                                 dict(w="m", mode="expandable", scale=1.25),
                                 dict(w="m", mode="gpumem", scale=1.5),
                                 dict(w="n", mode="gpumem", scale=2.0)])
m = [ln.split() for ln in mb if ln.startswith("m ")][0]
check(m[1:] == ["1.000", "1.250", "1.500", "1.200"], "max batch: %s" % m)
n = [ln.split() for ln in mb if ln.startswith("n ")][0]
check(n[1:] == ["-", "-", "2.000", "-"], "max batch without expandable: %s" % n)
# Its limit comes from the workload's sidecar: traces/corpus/ or, held out, traces/heldout/.
for name, folder in (("tiny_cnn_train", "corpus"), ("gnn_train", "heldout")):
    side = os.path.join(os.path.dirname(tools), "traces", folder, name + ".json")
    want = json.load(open(side))["runs"]["default"]["peak_live"]
    check(corpus_max_batch.peak_live(name) == want, "%s's limit from traces/%s/" % (name, folder))
# Its search: the largest passing scale to 1/64 of itself, above 1 and below; none below 1/16;
# at most 16.
for limit, want in ((2.7, 2.6875), (0.3, 0.296875), (0.01, 0.0), (100.0, 16.0)):
    got = corpus_max_batch.bisect(lambda x: x <= limit)
    check(got == want and (got == 0.0 or got == 16.0 or limit - got <= got / 64),
          "largest scale under %g: %g, want %g" % (limit, got, want))

# corpus_loop.py: a trace of a lasting allocation and four iterations, the third of which
# swaps the lasting allocation for another (it keeps a block past its end), becomes the prefix,
# iterations drawn from the three that free all they allocate, and the tail; a trace whose
# iterations all keep something gives none.
import corpus_loop  # noqa: E402
import gzip  # noqa: E402
import csv as csvmod  # noqa: E402


def gz_trace(ops):
    fd, path = tempfile.mkstemp(suffix=".csv.gz")
    os.close(fd)
    with gzip.open(path, "wt") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for act, i, mib in ops:
            f.write("0,0.0,%s,0x%x,%d,0x0\n" % (act, 0x1000 + i, mib << 20))
    return path


it = lambda k, mib: [("allocate", 10 * k, mib), ("allocate", 10 * k + 1, 1),  # noqa: E731
                     ("free", 10 * k + 1, 1), ("free", 10 * k, mib)]
src = gz_trace([("allocate", 0, 4)] + it(1, 2) + it(2, 3) + [("allocate", 30, 7), ("free", 0, 4)] +
               it(4, 5) + [("free", 30, 7)])
dst = src + ".loop.csv.gz"
check(corpus_loop.loop_trace(src, dst, 50, 1), "the loop trace is made")
with gzip.open(dst, "rt") as f:
    out = list(csvmod.DictReader(f))
big = [int(r["Size"]) >> 20 for r in out if r["Action"] == "allocate" and int(r["Size"]) > 1 << 20]
check(out[0]["Pointer"] == "0x1000" and big[0] == 4, "the prefix: the lasting allocation")
check(len(out) == 1 + 50 * 4 + 1 and set(big[1:]) == {2, 3, 5},
      "50 iterations of the three kept: %d ops, sizes %s" % (len(out), sorted(set(big[1:]))))
live, twice = set(), False
for r in out[1:-1]:
    if r["Action"] == "allocate":
        twice |= r["Pointer"] in live
        live.add(r["Pointer"])
    else:
        live.discard(r["Pointer"])
check(not twice and not live, "each drawn iteration frees what it allocates")
check(out[-1]["Action"] == "free" and out[-1]["Pointer"] == "0x101e", "the tail: %s" % out[-1])
# --same: the iteration of the highest peak (5 MiB + 1 MiB), and only it, 50 times over.
rows_src = corpus_loop.read_rows(src)
marks, its = corpus_loop.same_cut(corpus_loop.iterations(rows_src))
check(len(its) == 1 and corpus_loop.peak_live(its[0]) == 6 << 20,
      "same_cut keeps the highest peak: %s" % [corpus_loop.peak_live(i) for i in its])
check(corpus_loop.loop_trace(src, dst, 50, 1, rows_src, (marks, its)) == 50, "50 repeats")
with gzip.open(dst, "rt") as f:
    same = [int(r["Size"]) >> 20 for r in csvmod.DictReader(f)
            if r["Action"] == "allocate" and int(r["Size"]) > 1 << 20]
check(same[0] == 4 and set(same[1:]) == {5} and len(same) == 51, "repeated: %s" % same[:6])
check(corpus_loop.same_cut(([0], [])) == ([0], []), "no iterations, none kept")
keep = gz_trace([("allocate", 0, 4)] + [("allocate", 50 + k, 1) for k in range(40)])
check(not corpus_loop.loop_trace(keep, dst, 50, 1), "no self-contained iteration, no loop")
for p in (src, dst, keep):
    os.remove(p)

# plan_footprint: a, b, c of 1 MiB live, a and c freed, d of 2 MiB while b lives: allocating in
# order puts b between two 1 MiB holes (first fit needs 5 MiB); planned, d goes first and a, c
# around b: 3 MiB, the peak. plan_ratio of the loop above: each iteration's big block and its
# 1 MiB block nested, planned at their peak, over the lasting 4 MiB: 1.0, three sizes.
row = lambda act, i, mib: {"Action": act, "Pointer": "0x%x" % i,  # noqa: E731
                           "Size": str(mib << 20)}
seq = [row("allocate", 1, 1), row("allocate", 2, 1), row("allocate", 3, 1), row("free", 1, 1),
       row("free", 3, 1), row("allocate", 4, 2), row("free", 4, 2), row("free", 2, 1)]
check(corpus_loop.plan_footprint(seq) == (3 << 20, 3 << 20),
      "planned: 3 MiB for a 3 MiB peak, %s" % (corpus_loop.plan_footprint(seq),))
loop_rows = [row(a, i, m) for a, i, m in [("allocate", 0, 4)] + it(1, 2) + it(2, 3) + it(4, 5)]
check(corpus_loop.plan_ratio(loop_rows) == (1.0, 3),
      "the loop's plan: %s" % (corpus_loop.plan_ratio(loop_rows),))
check(corpus_loop.plan_ratio([row("allocate", 0, 4)] * 3) is None, "no iterations, no plan")
check(corpus_loop.plan_ratio(loop_rows, 1) == (None, 3), "iterations over the limit: no plan")

for p in (flat, ramp):
    os.remove(p)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
