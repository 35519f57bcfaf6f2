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
10th and 90th percentile step in ms, the sum of the timed steps, the host's wall time, the
median host time of a timed step (host_ms: the Python call that launches its work, which a
host-bound step's GPU time follows and a GPU-bound step's does not), and peak
reserved / peak allocated (torch.cuda.max_memory_reserved / max_memory_allocated), and for gpumem
the backend's device calls made during the timed steps, by kind (timed_calls), and the host time
they took, by kind, in ns (timed_call_ns).

The summary: per workload and mode, the median over rounds of the rounds' median steps, that
median over default's, the spread (the rounds' lowest and highest median step over default's
median), reserved/allocated (the worst round's), the median over rounds of host_ms ("-" for
rows without it), gpumem's device calls per timed step (the median round's) and the host's ms
in those calls per timed step (call ms, the median round's).
"""
import json
import os
import statistics
import sys
import time


def use_allocator(mode, tool="corpus_steps.py"):
    """Make `mode` this process's allocator before torch is imported: (label, gpumem.torch or
    None). default: PyTorch's; expandable: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
    gpumem: gpumem.torch.enable() with $GPUMEM_CONF (labelled gpumem[CONF] when it is set)."""
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    label, gmt = mode, None
    if mode == "gpumem":
        import gpumem.torch as gmt
        gmt.enable()
        if os.environ.get("GPUMEM_CONF"):
            label = "gpumem[%s]" % os.environ["GPUMEM_CONF"]
    elif mode not in ("default", "expandable"):
        sys.exit("%s: unknown mode %r (default, expandable or gpumem)" % (tool, mode))
    return label, gmt


def measure(mode, specs, warmup):
    label, gmt = use_allocator(mode)
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import corpus_workloads as cw
    dev = torch.device("cuda")
    for spec in specs.split(","):
        name, n = spec.split(":")
        n = int(n)
        if cw.workload(name) is None or n < 10:
            sys.exit("corpus_steps.py: %r: a workload of tools/corpus_workloads.py or "
                     "tools/heldout_workloads.py and at least 10 steps" % spec)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step, _ = cw.workload(name)(dev)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        t0 = time.perf_counter()
        calls0 = ns0 = None
        host = []  # the host's time in each timed step (its launches and allocations)
        for i in range(warmup + n):
            if i == warmup and gmt:
                st = gmt.stats()
                calls0, ns0 = st.get("device_calls", {}), st.get("device_call_ns", {})
            if i >= warmup:
                ev[i - warmup][0].record()
            h0 = time.perf_counter()
            step(i)
            if i >= warmup:
                host.append(time.perf_counter() - h0)
                ev[i - warmup][1].record()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        ms = sorted(a.elapsed_time(b) for a, b in ev)
        timed = timed_ns = None
        if gmt:
            st = gmt.stats()
            calls1, ns1 = st.get("device_calls", {}), st.get("device_call_ns", {})
            timed = {k: v - calls0.get(k, 0) for k, v in calls1.items() if v - calls0.get(k, 0)}
            timed_ns = {k: v - ns0.get(k, 0) for k, v in ns1.items() if v - ns0.get(k, 0)}
        print(json.dumps({
            "mode": label, "w": name, "steps": n, "median_ms": ms[n // 2],
            "p10_ms": ms[n // 10], "p90_ms": ms[9 * n // 10], "sum_ms": sum(ms), "wall_s": wall,
            "host_ms": sorted(host)[n // 2] * 1e3,
            "r_l": torch.cuda.max_memory_reserved() / max(1, torch.cuda.max_memory_allocated()),
            "timed_calls": timed, "timed_call_ns": timed_ns,
            "round": int(os.environ.get("GM_STEPS_ROUND", "-1"))}),
            flush=True)
        del step


def per_step(rs, key, fmt, div=1):
    """The median round's sum over kinds of rows' dict `key` per timed step, over div, as fmt;
    "-" when no row has it (allocators without the backend's counters)."""
    v = sorted(sum(r[key].values()) / r["steps"] / div for r in rs if r.get(key) is not None)
    return fmt % v[len(v) // 2] if v else "-"


def summarize(rows):
    """Lines of the summary of measure()'s rows (several rounds of several modes)."""
    by = {}
    for r in rows:
        by.setdefault(r["w"], {}).setdefault(r["mode"], []).append(r)
    out = ["workload             mode                          rounds  median ms  x default  "
           "spread (rounds)  paired  spread (paired)  reserved/alloc  host ms  calls/step  "
           "call ms"]
    for w in sorted(by):
        base = by[w].get("default")
        ref = statistics.median(r["median_ms"] for r in base) if base else None
        base_of = {r["round"]: r["median_ms"] for r in base or [] if r.get("round", -1) >= 0}
        modes = sorted(by[w], key=lambda m: (m != "default", m != "expandable", m))
        for m in modes:
            rs = by[w][m]
            meds = [r["median_ms"] for r in rs]
            med = statistics.median(meds)
            rel = "%9.3f" % (med / ref) if ref else "        -"
            spread = ("%.3f-%.3f" % (min(meds) / ref, max(meds) / ref)) if ref else "-"
            # each round's median over default's in the same round: the two ran back to back
            pairs = sorted(r["median_ms"] / base_of[r["round"]] for r in rs
                           if r.get("round", -1) in base_of)
            paired = "%.3f" % statistics.median(pairs) if pairs else "-"
            pspread = "%.3f-%.3f" % (pairs[0], pairs[-1]) if pairs else "-"
            hosts = [r["host_ms"] for r in rs if r.get("host_ms") is not None]
            out.append("%-20s %-29s %6d %10.3f %s  %15s  %6s  %15s  %14.3f  %7s  %10s  %7s" % (
                w, m[:29], len(rs), med, rel, spread, paired, pspread,
                max(r["r_l"] for r in rs), "%.3f" % statistics.median(hosts) if hosts else "-",
                per_step(rs, "timed_calls", "%.2f"), per_step(rs, "timed_call_ns", "%.3f", 1e6)))
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
