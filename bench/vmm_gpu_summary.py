#!/usr/bin/env python3
"""Issue 18's scorecard from bench/vmm_gpu.sh's log: one markdown table per measure, the
allocators as rows and the traces as columns.

usage: bench/vmm_gpu_summary.py OUT/vmm_gpu.log

The measures: reserved/live (median over the rounds); ns/op over PyTorch default's in the
same round (median over rounds: the issue's "<= 1/4"), with gpumem's median ns/op; memory
calls per 1,000 operations (gpumem: reserve, create, map, unmap, release); the smallest
budget / peak live; and gpumem's reserved/live on the sim beside the GPU's (the issue's
"within 1 %").
"""
import collections, json, re, statistics, sys

LINE = re.compile(r"^(torch|gpumem)\[([^\]]+)\] #(\d+) (\S+) reserved/live ([\d.]+) ns/op ([\d.]+)"
                  r"(?:.* per-1000-ops ([\d.]+))?")
GM_BUDGET = re.compile(r"^min-budget gpumem\[([^\]]+)\] (\S+) ([\d.]+)")
TORCH_BUDGET = re.compile(r"^min-budget torch\[([^\]]+)\] (\{.*\})")


def load(path):
    runs = collections.defaultdict(list)  # (allocator, trace) -> [(round, r/l, ns, calls)]
    budget = {}
    for line in open(path):
        m = LINE.match(line)
        if m:
            kind, name, rep, trace, rl, ns, calls = m.groups()
            name = ("PyTorch " if kind == "torch" else "gpumem ") + name
            runs[(name, trace)].append((int(rep), float(rl), float(ns),
                                        float(calls) if calls else None))
            continue
        m = GM_BUDGET.match(line)
        if m:
            budget[("gpumem " + m.group(1), m.group(2))] = float(m.group(3))
            continue
        m = TORCH_BUDGET.match(line)
        if m:
            d = json.loads(m.group(2))
            budget[("PyTorch " + m.group(1).split(":")[0], d["trace"])] = d["min_budget_ratio"]
    return runs, budget


def table(title, names, traces, cell):
    rows = [(n, [cell(n, t) for t in traces]) for n in names]
    rows = [(n, cs) for n, cs in rows if any(cs)]
    if not rows:
        return
    print("\n%s\n" % title)
    print("| allocator | " + " | ".join(t.split(".")[0] for t in traces) + " |")
    print("| --- |" + " ---: |" * len(traces))
    for n, cs in rows:
        print("| %s | %s |" % (n, " | ".join(cs)))


def main():
    runs, budget = load(sys.argv[1])
    traces = sorted({t for _, t in runs} | {t for _, t in budget})
    names = sorted({n for n, _ in runs} | {n for n, _ in budget},
                   key=lambda n: (not n.startswith("PyTorch"), n))
    gpu = [n for n in names if "sim-" not in n]
    med = lambda xs, f: f % statistics.median(xs) if xs else ""

    def ratio(n, t):
        base = {r: ns for r, _, ns, _ in runs.get(("PyTorch default", t), [])}
        rs = runs.get((n, t), [])
        q = [ns / base[r] for r, _, ns, _ in rs if r in base]
        return "%s (%s)" % (med(q, "%.3f"), med([ns for _, _, ns, _ in rs], "%.0f")) if q else ""

    table("reserved / live (median of the rounds)", gpu, traces,
          lambda n, t: med([rl for _, rl, _, _ in runs.get((n, t), [])], "%.4f"))
    table("ns/op x PyTorch default's in the same round, median (ns/op, median)", gpu, traces,
          ratio)
    table("memory calls per 1,000 operations", gpu, traces,
          lambda n, t: med([c for *_, c in runs.get((n, t), []) if c is not None], "%.2f"))
    table("smallest budget / peak live", gpu, traces,
          lambda n, t: "%.4f" % budget[(n, t)] if (n, t) in budget else "")
    sims = sorted({n for n, _ in runs if "sim-" in n})
    table("reserved / live, sim (GPU in brackets)", sims, traces, lambda n, t: (
        "%s (%s)" % (med([rl for _, rl, _, _ in runs[(n, t)]], "%.4f"),
                     med([rl for _, rl, _, _ in runs.get((n.replace("sim-", ""), t), [])],
                         "%.4f")) if (n, t) in runs else ""))


if __name__ == "__main__":
    main()
