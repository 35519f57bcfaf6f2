#!/usr/bin/env python3
"""Step times of corpus workloads (tools/corpus_workloads.py) under one allocator, timed with CUDA
events step by step after a warm-up: one process per allocator, since PyTorch's allocator is
chosen once per process. bench/corpus_steps.sh runs the allocators in interleaved rounds on the
GPU machine and prints the summary (--summary) with the spread between rounds.

    bench/corpus_steps.py MODE WORKLOAD:STEPS[,WORKLOAD:STEPS...] [--warmup N]
    bench/corpus_steps.py --summary FILE.jsonl

MODE: default (PyTorch's allocator), expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
set here before torch is imported), gpumem (gpumem.torch.enable() with $GPUMEM_CONF; the mode is
labelled gpumem[CONF] when GPUMEM_CONF is set). Prints one JSON line per workload: the median,
10th and 90th percentile step in ms, the sum of the timed steps, the host's wall time, and peak
reserved / peak allocated (torch.cuda.max_memory_reserved / max_memory_allocated).

The summary: per workload and mode, the median over rounds of the rounds' median steps, that
median over default's, the spread (the rounds' lowest and highest median step over default's
median), and reserved/allocated (the worst round's).
"""
import json
import os
import statistics
import sys
import time


def measure(mode, specs, warmup):
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    label = mode
    if mode == "gpumem":
        import gpumem.torch as gmt
        gmt.enable()
        if os.environ.get("GPUMEM_CONF"):
            label = "gpumem[%s]" % os.environ["GPUMEM_CONF"]
    elif mode not in ("default", "expandable"):
        sys.exit("corpus_steps.py: unknown mode %r (default, expandable or gpumem)" % mode)
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import corpus_workloads as cw
    dev = torch.device("cuda")
    for spec in specs.split(","):
        name, n = spec.split(":")
        n = int(n)
        if name not in cw.WORKLOADS or n < 10:
            sys.exit("corpus_steps.py: %r: a workload of tools/corpus_workloads.py and at least "
                     "10 steps" % spec)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step, _ = cw.WORKLOADS[name](dev)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        t0 = time.perf_counter()
        for i in range(warmup + n):
            if i >= warmup:
                ev[i - warmup][0].record()
            step(i)
            if i >= warmup:
                ev[i - warmup][1].record()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        ms = sorted(a.elapsed_time(b) for a, b in ev)
        print(json.dumps({
            "mode": label, "w": name, "steps": n, "median_ms": ms[n // 2],
            "p10_ms": ms[n // 10], "p90_ms": ms[9 * n // 10], "sum_ms": sum(ms), "wall_s": wall,
            "r_l": torch.cuda.max_memory_reserved() / max(1, torch.cuda.max_memory_allocated())}),
            flush=True)
        del step


def summarize(rows):
    """Lines of the summary of measure()'s rows (several rounds of several modes)."""
    by = {}
    for r in rows:
        by.setdefault(r["w"], {}).setdefault(r["mode"], []).append(r)
    out = ["workload             mode                          rounds  median ms  x default  "
           "spread (rounds)  reserved/alloc"]
    for w in sorted(by):
        base = by[w].get("default")
        ref = statistics.median(r["median_ms"] for r in base) if base else None
        modes = sorted(by[w], key=lambda m: (m != "default", m != "expandable", m))
        for m in modes:
            rs = by[w][m]
            meds = [r["median_ms"] for r in rs]
            med = statistics.median(meds)
            rel = "%9.3f" % (med / ref) if ref else "        -"
            spread = ("%.3f-%.3f" % (min(meds) / ref, max(meds) / ref)) if ref else "-"
            out.append("%-20s %-29s %6d %10.3f %s  %15s  %15.3f" % (
                w, m[:29], len(rs), med, rel, spread, max(r["r_l"] for r in rs)))
    return out


def main(argv):
    if len(argv) == 3 and argv[1] == "--summary":
        with open(argv[2]) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
        print("\n".join(summarize(rows)))
        return 0
    args = argv[1:]
    warmup = 20
    if "--warmup" in args:
        i = args.index("--warmup")
        warmup = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    measure(args[0], args[1], warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
