#!/usr/bin/env python3
"""The largest batch a corpus workload runs with under a memory limit, for one allocator: what
fits under torch.cuda.set_per_process_memory_fraction, by bisection.

    bench/corpus_max_batch.py MODE WORKLOAD[,WORKLOAD...] [--limit X] [--steps N]
    bench/corpus_max_batch.py --summary FILE.jsonl

MODE as bench/corpus_steps.py's (default, expandable, gpumem; one process per allocator, since
PyTorch's allocator is chosen once per process). The limit is X (default 1.25) times the peak
live bytes PyTorch default's run of the workload recorded (its sidecar traces/corpus/NAME.json,
or traces/heldout/NAME.json), the same for every allocator, set with
torch.cuda.set_per_process_memory_fraction (the CUDA context and this process's state before the
first trial lie outside it). A trial builds the
workload with every batch size it draws scaled by s (tools/corpus_workloads.py, BATCH_SCALE: the
same draws, so the same shapes at s = 1) and runs its first N steps (default 16); it passes when
no allocation fails. The scale doubles from 1 until a trial fails (halves while 1 fails), then is
bisected to 1/64 of the last passing scale; after each trial the workload is dropped and the
cache emptied. Prints one JSON line per workload: the largest passing scale, the limit, the
trials and seconds.

The summary: per workload, each allocator's largest scale and its ratio to expandable_segments'.
"""
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from corpus_steps import use_allocator  # noqa: E402  (bench/, beside this file)


def peak_live(name):
    """PyTorch default's recorded peak live bytes for name: its sidecar in traces/corpus/, or in
    traces/heldout/ for a held-out workload."""
    for folder in ("corpus", "heldout"):
        side = os.path.join(HERE, "..", "traces", folder, name + ".json")
        if os.path.exists(side):
            return json.load(open(side))["runs"]["default"]["peak_live"]
    sys.exit("corpus_max_batch.py: no sidecar for %r in traces/corpus/ or traces/heldout/" % name)


def search(cw, torch, name, dev, limit_x, steps):
    limit = int(limit_x * peak_live(name))
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total)
    trials = []

    def runs(scale):
        cw.BATCH_SCALE = scale
        torch.manual_seed(0)
        ok = True
        try:
            step, n = cw.workload(name)(dev)
            for i in range(min(n, steps)):
                step(i)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            ok = False
        step = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        trials.append((scale, ok))
        return ok

    try:
        return bisect(runs), limit, trials
    finally:
        cw.BATCH_SCALE = 1.0  # the module as found, whatever the search ended with


def bisect(runs):
    """The largest scale that runs (runs(scale) -> bool) to 1/64 of itself: from 1, halved while
    it fails (0.0 below 1/16), else doubled until it fails (up to 16), then bisected."""
    lo, hi = None, None
    s = 1.0
    while lo is None and s >= 1 / 16:  # the largest passing scale below 1, if 1 fails
        if runs(s):
            lo = s
        else:
            hi, s = s, s / 2
    if lo is None:
        return 0.0
    while hi is None and lo < 16:
        if runs(lo * 2):
            lo *= 2
        else:
            hi = lo * 2
    while hi is not None and hi - lo > lo / 64:
        mid = (lo + hi) / 2
        if runs(mid):
            lo = mid
        else:
            hi = mid
    return lo


def measure(mode, names, limit_x, steps):
    label, _ = use_allocator(mode, "corpus_max_batch.py")
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    import corpus_workloads as cw
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    for name in names.split(","):
        if cw.workload(name) is None:
            sys.exit("corpus_max_batch.py: %r is no workload of tools/corpus_workloads.py or "
                     "tools/heldout_workloads.py" % name)
        t0 = time.perf_counter()
        scale, limit, trials = search(cw, torch, name, dev, limit_x, steps)
        print(json.dumps({"mode": label, "w": name, "scale": scale, "limit": limit,
                          "limit_x": limit_x, "steps": steps, "trials": trials,
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


def summarize(rows):
    by = {}
    for r in rows:
        by.setdefault(r["w"], {})[r["mode"]] = r["scale"]
    modes = sorted({m for w in by.values() for m in w},
                   key=lambda m: (m != "default", m != "expandable", m))
    out = ["%-22s" % "workload" + "".join(" %14s" % m[:14] for m in modes) + "  gpumem/expand"]
    for w in sorted(by):
        e, g = by[w].get("expandable"), by[w].get("gpumem")
        out.append("%-22s" % w + "".join(" %14s" % ("%.3f" % by[w][m] if m in by[w] else "-")
                                         for m in modes) +
                   ("  %13.3f" % (g / e) if e and g is not None else "  %13s" % "-"))
    return out


def main(argv):
    if len(argv) == 3 and argv[1] == "--summary":
        with open(argv[2]) as f:
            print("\n".join(summarize([json.loads(l) for l in f if l.startswith("{")])))
        return 0
    args, limit_x, steps = argv[1:], 1.25, 16
    for flag in ("--limit", "--steps"):
        if flag in args:
            i = args.index(flag)
            if flag == "--limit":
                limit_x = float(args[i + 1])
            else:
                steps = int(args[i + 1])
            del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    measure(args[0], args[1], limit_x, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
