#!/usr/bin/env python3
"""The corpus report: every trace of traces/corpus/ (and the bundled traces/ and traces/live/)
replayed on the simulated H200 with one configuration, beside PyTorch's allocators as measured
when the trace was recorded (the sidecar NAME.json), per split, with the worst and median of
each column (traces/corpus/README.md says how the traces were made).

    bench/corpus.py [--gpumem PATH] [--as library|backend] [--set KEY=VALUE]... [--min-budget]
                    [--jobs N] [--json FILE] [--summary] [TRACE...]

Splits: the corpus's traces are ranked by the SHA-256 of their names; the first half is `tune`
(defaults are chosen on it), the second `test` (reported, never tuned on). traces/heldout/ is
`heldout`: programs written after the defaults were fixed, never tuned on (its README says
when). traces/*.csv.gz and traces/live/ are `bundled`: earlier defaults were tuned on them.

Columns:
  r/l        gpumem's peak reserved / peak live (the replay's)
  torch      PyTorch default's, from the sidecar (max_memory_reserved / max_memory_allocated)
  expand     PyTorch with expandable_segments:True, from the sidecar
  live       gpumem's PyTorch backend in the same program, from the sidecar when it was recorded
             with MODES=default,expandable,gpumem ("-" otherwise)
  calls      memory calls (create, map, unmap, release, cuMemAlloc, cuMemFree) in the whole replay
  after/1k   memory calls after the first quarter of the ops, per 1,000 of those ops (the
             steady state's; target <= 0.1)
  floor      the fewest memory calls per 1,000 ops after the first quarter that any pool which
             grows when the program asks (it does not know the future) needs to hold the r/l
             target (1.03, 1.06 with several streams) wherever the trace might end
             (growth_bound.py's online_floor; one call a step plain, two VMM). Above 0.1 the
             after/1k target cannot be met without knowing the program's peak in advance; the
             misses column then says "after>0.1(floor>0.1)"
  bound      the fewest calls bench/growth_bound.py's model (perfect packing, growth only when
             live passes reserved) needs for the same reserved/live at every one of its scales
             of the trace (1x to 2x), at one call per growth step for plain segments and two
             (create, map) for VMM; "-" when no point of its grid reaches it
  x bound    calls / bound (target <= 2)
  ns/op      host time per gm_alloc/gm_free on this machine (simulated device)
  budget     with --min-budget: the smallest reserve_limit that runs without OOM / peak live

--as library (the default) replays with the library's defaults; --as backend with the PyTorch
backend's settings on a device with VMM (python/gpumem/torch/__init__.py's DEFAULT_CONF, read
from the file, without its unmapping thread so that figures repeat). --set adds settings.
--summary prints only the per-split worst/median lines (make run uses it).
"""
import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import growth_bound as gb  # noqa: E402  (bench/, beside this file)
MIB = 1 << 20
GRAN = 2 * MIB
MULTI_STREAM_LIMIT, SINGLE_STREAM_LIMIT = 1.06, 1.03


def backend_conf():
    """The PyTorch backend's DEFAULT_CONF as --set words, its unmapping thread left out."""
    src = open(os.path.join(ROOT, "python", "gpumem", "torch", "__init__.py")).read()
    conf = re.search(r'^DEFAULT_CONF = "([^"]*)"', src, re.M).group(1)
    words = [w for w in conf.split(",") if w and not w.startswith("vmm_unmap_thread")]
    return [w.replace("segments=auto", "segments=vmm") for w in words]


def name_of(path):
    return os.path.basename(path).split(".")[0]


def splits(paths):
    """{path: split}: corpus traces ranked by the SHA-256 of the name, first half tune;
    traces/heldout/'s are `heldout`; the rest `bundled`."""
    corpus = sorted((p for p in paths if os.sep + "corpus" + os.sep in p),
                    key=lambda p: hashlib.sha256(name_of(p).encode()).hexdigest())
    out = {p: "heldout" if os.sep + "heldout" + os.sep in p else "bundled" for p in paths}
    for i, p in enumerate(corpus):
        out[p] = "tune" if i < (len(corpus) + 1) // 2 else "test"
    return out


def bound_steps(path, target):
    """bench/growth_bound.py's answer: the fewest growth steps of its model (perfect packing,
    growth only when live passes reserved) that keep reserved/live <= target at every one of its
    scales of the trace, over its grid of growth fractions and floors; None if none does."""
    _, highs = gb.records(path)
    if not highs:
        return 0
    best = None
    for f in gb.FRACTIONS:
        for floor in gb.FLOORS:
            most = 0
            for c in gb.SCALES:
                steps, reserved = gb.grow(highs, c, f, floor)
                if reserved > target * highs[-1] * c:
                    break
                most = max(most, steps)
            else:
                if best is None or most < best:
                    best = most
    return best


def replay(gpumem, path, sets, min_budget):
    args = [gpumem, "replay", "--json", "--no-progress", "--allow-oom", path]
    for s in sets:
        args += ["--set", s]
    if min_budget:
        args.append("--min-budget")
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s: gpumem replay failed (%d): %s" % (path, p.returncode,
                                                                   p.stderr.strip()[-300:]))
    d = json.loads(p.stdout)
    return d[0] if isinstance(d, list) else d


def sidecar(path):
    side = re.sub(r"\.csv(\.gz)?$", ".json", path)
    if not os.path.exists(side):
        return {}
    runs = json.load(open(side)).get("runs", {})
    return {k: v["peak_reserved"] / v["peak_live"] for k, v in runs.items() if v.get("peak_live")}


def row_of(path, split, d):
    side = sidecar(path)
    ops = d["ops"]
    after_ops = ops - ops // 4
    calls = d["memory_calls"]
    per_step = 2 if d.get("segments_vmm") else 1
    steps = bound_steps(path, d["reserved_over_live"])
    bound = steps * per_step if steps is not None else None
    budget = d.get("min_budget_ratio")
    limit = MULTI_STREAM_LIMIT if d.get("streams", 1) > 1 else SINGLE_STREAM_LIMIT
    floor_steps, _ = gb.online_floor(path, limit)
    return dict(trace=name_of(path), split=split, streams=d.get("streams", 1),
                peak_live=d["peak_live_bytes"], rl=d["reserved_over_live"],
                torch=side.get("default"), expand=side.get("expandable"), live=side.get("gpumem"),
                calls=calls,
                after_1k=1000.0 * d["memory_calls_after_quarter"] / max(after_ops, 1),
                floor_1k=1000.0 * floor_steps * per_step / max(after_ops, 1),
                bound=bound, x_bound=(calls / bound if bound else None),
                ns_op=d["ns_per_op"], budget=budget, oom=d["oom_count"])


def fmt(v, spec):
    return ("%" + spec) % v if v is not None else "%*s" % (int(re.match(r"\d+", spec).group()),
                                                            "-")


COLS = (("r/l", "rl", "6.3f"), ("torch", "torch", "6.3f"), ("expand", "expand", "6.3f"),
        ("live", "live", "6.3f"),
        ("calls", "calls", "6d"), ("after/1k", "after_1k", "8.2f"), ("floor", "floor_1k", "6.2f"),
        ("bound", "bound", "5d"),
        ("x bound", "x_bound", "7.1f"), ("ns/op", "ns_op", "6.0f"), ("budget", "budget", "6.3f"))


def target_misses(r):
    """Which of the corpus targets a row misses (the replay's; issue text in traces/corpus)."""
    limit = MULTI_STREAM_LIMIT if r["streams"] > 1 else SINGLE_STREAM_LIMIT
    miss = []
    if r["rl"] > limit:
        miss.append("r/l>%.2f" % limit)
    if r["expand"] is not None and r["rl"] >= r["expand"]:
        miss.append("r/l>=expand")
    if r["after_1k"] > 0.1:
        miss.append("after>0.1" + ("(floor>0.1)" if r["floor_1k"] > 0.1 else ""))
    if r["x_bound"] is not None and r["x_bound"] > 2:
        miss.append("calls>2xbound")
    if r["oom"]:
        miss.append("OOM")
    return miss


def print_table(rows, summary_only):
    head = "%-22s %-7s %3s %8s " % ("trace", "split", "st", "live GB") + " ".join(
        "%*s" % (int(re.match(r"\d+", spec).group()), h) for h, _, spec in COLS)
    print(head + ("" if summary_only else "  misses"))
    for split in ("tune", "test", "heldout", "bundled"):
        rs = [r for r in rows if r["split"] == split]
        if not rs:
            continue
        if not summary_only:
            for r in rs:
                print("%-22s %-7s %3d %8.2f " % (r["trace"][:22], split, r["streams"],
                                                 r["peak_live"] / 1e9) +
                      " ".join(fmt(r[k], spec) for _, k, spec in COLS) + "  " +
                      ",".join(target_misses(r)))
        for what, fn in (("worst", max), ("median", statistics.median)):
            vals = []
            for _, k, spec in COLS:
                xs = [r[k] for r in rs if r[k] is not None]
                v = fn(xs) if xs else None
                if v is not None and spec.endswith("d"):
                    v = int(round(v))
                vals.append(fmt(v, spec))
            print("%-22s %-7s %3s %8s " % ("%s (%d trace%s)" % (what, len(rs), "s" if len(rs) > 1 else ""), split, "", "") +
                  " ".join(vals) + ("  %d miss a target" % sum(1 for r in rs if target_misses(r))
                                    if what == "worst" else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build", "tools", "gpumem", "gpumem"))
    ap.add_argument("--as", dest="as_", choices=("library", "backend"), default="library")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--min-budget", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--summary", action="store_true", help="only the worst/median lines")
    a = ap.parse_args(argv)
    paths = a.traces or sorted(glob.glob(os.path.join(ROOT, "traces", "corpus", "*.csv.gz"))) + \
        sorted(glob.glob(os.path.join(ROOT, "traces", "heldout", "*.csv.gz"))) + \
        sorted(glob.glob(os.path.join(ROOT, "traces", "*.csv.gz"))) + \
        sorted(glob.glob(os.path.join(ROOT, "traces", "live", "*.csv.gz")))
    if not os.access(a.gpumem, os.X_OK):
        sys.exit("corpus.py: %s is not built (make build)" % a.gpumem)
    sets = (backend_conf() if a.as_ == "backend" else []) + a.set
    split = splits(paths)
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        results = list(ex.map(lambda p: replay(a.gpumem, p, sets, a.min_budget), paths))
    rows = [row_of(p, split[p], d) for p, d in zip(paths, results)]
    print("corpus: %d traces replayed on the simulated H200 as %s%s" % (
        len(rows), a.as_, (" with " + ",".join(sets)) if sets else " (its defaults)"))
    print_table(rows, a.summary)
    if a.summary:
        print("legend: per split, the worst and median of each column (bench/corpus.py without "
              "--summary shows every trace and the targets it misses); r/l = peak reserved / "
              "peak live; torch, expand = PyTorch default's and expandable_segments' from the "
              "recording, live = gpumem's backend there; calls = memory calls; after/1k = per "
              "1,000 ops after the first quarter; floor = the fewest there for any pool growing on demand; bound = "
              "calls a perfect-packing pool needs for the same r/l")
    else:
        print("legend: r/l = peak reserved / peak live (torch, expand, live: PyTorch default, "
              "expandable_segments and gpumem's backend from the recording, same program); "
              "calls = memory calls; after/1k = memory calls per 1,000 ops after the first quarter; floor = the fewest "
              "any pool growing on demand needs there to hold the r/l target wherever the "
              "trace might end (growth_bound.py's online_floor; above 0.1 the after/1k target "
              "cannot be met without knowing the future); bound = fewest "
              "calls a perfect-packing pool that only grows needs for the same r/l; budget = "
              "smallest reserve_limit / peak live (--min-budget); misses = targets missed "
              "(r/l <= 1.03 single-stream, 1.06 multi-stream, below expandable; after/1k <= "
              "0.1; calls <= 2 x bound)")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
