#!/usr/bin/env python3
"""gpumem's PyTorch backend beside PyTorch's allocators on a GPU (docs/benchmarks.md).

    python3 integrations/torch/gpu_bench_backend.py [--reps 2] [--steps 14] [--warmup 4]
        [--workloads gpt2,dyn,side] [--allocators default,expandable,gpumem[,gpumem-vmm]]
        [--fraction 0.03] [--no-maxbatch] [--pin CPUS] [--json OUT]

Three allocators -- PyTorch's default, PyTorch with expandable_segments:True, and gpumem
(gpumem.torch.enable(): the backend's defaults, gpumem.torch.DEFAULT_CONF; GPUMEM_CONFS below
names other settings for --allocators, e.g. gpumem-plain = the library's own defaults) -- on
three workloads, each run in its own process, interleaved (rep r: every workload, each under
every allocator, the allocators' order rotated by r so that none always runs first):

  gpt2     GPT-2 small training (gpt2_train of tools/torch_record_traces.py, as
           gpu_train_check.py trains it: AdamW, bf16 autocast, batch 2-16 x sequence 64-1024),
           deterministic settings, losses compared bit for bit
  dyn      dynamic shapes: a 6-layer transformer encoder (d=768), batch 4-64 x sequence 16-512
           drawn per step, training (the BERT fine-tuning shape of issue 17)
  side     a side stream: a conv net trained on batches that a side stream copies from pinned
           host memory and hands over with record_stream (the ResNet prefetch loop)

Per run: median step time after the warm-up, peak reserved (max_memory_reserved) and peak live
(max_memory_allocated); for gpumem also its device calls by kind and `gm_call_ms_timed`, the
device-call time on the allocating threads within the timed steps (host time the launching
thread spent in the driver for gpumem; each step ends in a synchronization, so the GPU waits
through such calls made before its work is queued); per workload and allocator the median of
the runs' medians, the ratio to PyTorch's default, and the paired ratio: per repetition, the sum
of the step times after the warm-up over PyTorch default's in the same repetition (the same
shapes), and its median over the repetitions (`paired_vs_default`, the figure
docs/benchmarks.md gives). --pin CPUS (e.g. 2-9 or 2,4,6) runs every worker on those CPUs only
(os.sched_setaffinity), so that no run is faster or slower for landing on another core. Then
the largest batch of `dyn` at its longest sequence that trains under
set_per_process_memory_fraction(--fraction), by binary search, per allocator.
The last line is a JSON summary.
"""

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ALLOCATORS = ["default", "expandable", "gpumem"]
# gpumem's settings per allocator name (GPUMEM_CONF syntax, applied after the backend's
# DEFAULT_CONF); None = the backend's defaults. LIB puts the library's own defaults back.
LIB = "segments=plain,cache_disable=0,vmm_mapped_first=0,vmm_unmap_thread=0,vmm_plan=0"
GPUMEM_CONFS = {"gpumem": None, "gpumem-plain": LIB,
                "gpumem-vmm": LIB + ",segments=vmm", "gpumem-vmm1": LIB + ",segments=vmm,vmm_run_pages=1",
                # VMM that never unmaps on the hot path (pages are created and mapped as the pool
                # grows, idle ones moved only at the reserve limit), without the size cache
                "gpumem-vmm-grow": LIB + ",segments=vmm,release=on_oom,cache_disable=1",
                # VMM placing blocks on mapped pages first, without the size cache
                "gpumem-vmm-mf": LIB + ",segments=vmm,cache_disable=1,vmm_mapped_first=1",
                # the same, with the old mappings of moved pages unmapped by a helper thread: the
                # backend's defaults on a device with VMM
                "gpumem-vmm-mft": "segments=vmm,cache_disable=1,vmm_mapped_first=1,vmm_unmap_thread=1"}
WORKLOADS = ["gpt2", "dyn", "side"]


def start(allocator):
    pin = os.environ.get("GPU_BENCH_PIN")
    if pin:  # --pin: every worker on the same CPUs
        os.sched_setaffinity(0, parse_cpus(pin))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator in GPUMEM_CONFS:
        try:  # installed (pip install --no-build-isolation .)
            import gpumem.torch
        except ImportError:  # built in place under python/
            sys.path.insert(0, os.path.join(ROOT, "python"))
            import gpumem.torch
        gpumem.torch.enable(GPUMEM_CONFS[allocator])
    import torch
    torch.cuda.init()
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    return torch


def parse_cpus(text):
    """'2-5,8' -> {2, 3, 4, 5, 8}"""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def dyn_model(torch):
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, dropout=0.0)
    m = torch.nn.Sequential(torch.nn.Embedding(30522, 768),
                            torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False),
                            torch.nn.Linear(768, 2)).cuda()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-4)


def dyn_step(torch, m, opt, bs, sl):
    x = torch.randint(0, 30522, (bs, sl), device="cuda")
    y = torch.randint(0, 2, (bs,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(m(x)[:, 0, :].float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def run_workload(torch, name, steps, probe=None):
    """Step times (ms) and losses; with `probe`, also its value after each step (outside the
    timed part)."""
    g = torch.Generator().manual_seed(1)
    times, losses, probes = [], [], []
    if name == "gpt2":
        sys.path.insert(0, HERE)
        from gpu_train_check import gpt2_setup, gpt2_shape, gpt2_step
        m, opt, g = gpt2_setup(torch, "cuda")
        step = lambda: gpt2_step(torch, m, opt, *gpt2_shape(torch, g), "cuda")  # noqa: E731
    elif name == "dyn":
        m, opt = dyn_model(torch)

        def step():
            bs = int(torch.randint(4, 65, (1,), generator=g))
            sl = int(torch.randint(16, 513, (1,), generator=g))
            return dyn_step(torch, m, opt, bs, sl)
    else:
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, padding=1),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(128, 256, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 10)).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        side = torch.cuda.Stream()
        host = [torch.randn(64, 3, 128, 128, generator=g).pin_memory() for _ in range(4)]
        labels = torch.randint(0, 10, (64,), generator=g).cuda()
        state = {"i": 0}

        def step():
            with torch.cuda.stream(side):
                x = host[state["i"] % 4].to("cuda", non_blocking=True)
            state["i"] += 1
            torch.cuda.current_stream().wait_stream(side)
            x.record_stream(torch.cuda.current_stream())
            loss = torch.nn.functional.cross_entropy(m(x), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    torch.cuda.synchronize()
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss.detach().float().item()).hex())
        if probe:
            probes.append(probe())
    return times, losses, probes


def gm_launching_thread_ns():
    """gpumem's device-call time so far on the threads that allocate: every call, less the
    unmaps made by the unmapping thread (their share of the unmap time)."""
    import gpumem.torch
    st = gpumem.torch.stats()
    ns, calls = st["device_call_ns"], st["device_calls"]
    unmaps = max(calls["unmap"], 1)
    return sum(ns.values()) - ns["unmap"] * min(st["vmm_unmaps_async"], unmaps) / unmaps


def worker_run(allocator, name, steps, warmup):
    torch = start(allocator)
    gm = allocator in GPUMEM_CONFS
    times, losses, probes = run_workload(torch, name, steps, gm_launching_thread_ns if gm else None)
    res = {"allocator": allocator, "workload": name, "median_ms": statistics.median(times[warmup:]),
           "sum_ms": sum(times[warmup:]),  # the same shapes for every allocator: the fairer total
           "ms": times, "losses": losses, "peak_reserved": torch.cuda.max_memory_reserved(),
           "peak_live": torch.cuda.max_memory_allocated(),
           "device_allocs": torch.cuda.memory_stats().get("num_device_alloc")}
    if gm:  # gpumem's own count of device calls, by kind
        import gpumem.torch
        st = gpumem.torch.stats()
        # device-call time on the allocating threads within the timed steps after the warm-up
        res["gm_call_ms_timed"] = (probes[-1] - probes[warmup - 1]) / 1e6 if warmup > 0 else probes[-1] / 1e6
        res["gm_device_calls"] = {k: v for k, v in st.items() if "call" in k}
        res["gm_vmm"] = {k: v for k, v in st.items() if k.startswith("vmm_") or k == "segments_vmm"}
    return res


def worker_maxbatch(allocator, fraction):
    torch = start(allocator)
    torch.cuda.set_per_process_memory_fraction(fraction)
    m, opt = dyn_model(torch)

    def fits(bs):
        try:
            for _ in range(2):
                dyn_step(torch, m, opt, bs, 512)
            torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            return False
        finally:
            torch.cuda.empty_cache()
    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 8192:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {"allocator": allocator, "fraction": fraction, "max_batch": lo}


def main():
    a = sys.argv[1:]
    if "-h" in a or "--help" in a:
        print(__doc__.strip())
        return
    if a[:1] == ["--worker"]:
        if a[1] == "maxbatch":
            res = worker_maxbatch(a[2], float(a[3]))
        else:
            res = worker_run(a[1], a[2], int(a[3]), int(a[4]))
        print("RESULT " + json.dumps(res))
        sys.stdout.flush()
        os._exit(0)

    def opt(name, default):
        return type(default)(a[a.index(name) + 1]) if name in a else default
    reps, steps, warmup, fraction = opt("--reps", 2), opt("--steps", 14), opt("--warmup", 4), opt("--fraction", 0.03)
    workloads = opt("--workloads", ",".join(WORKLOADS)).split(",")
    if "--pin" in a:
        pin = opt("--pin", "")
        parse_cpus(pin)  # a bad list fails here, not in every worker
        os.environ["GPU_BENCH_PIN"] = pin
    allocators = opt("--allocators", ",".join(ALLOCATORS)).split(",")
    runs = []

    def sub(args):
        p = subprocess.run([sys.executable, __file__, "--worker"] + args, capture_output=True, text=True,
                           timeout=900)
        for line in p.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        sys.stderr.write(p.stderr[-3000:])
        return {"error": "worker failed", "args": args}
    for r in range(reps):
        for w in workloads:
            for i in range(len(allocators)):  # rotated: no allocator always runs first
                al = allocators[(i + r) % len(allocators)]
                res = sub([al, w, str(steps), str(warmup)])
                res["rep"] = r
                runs.append(res)
                print("RUN " + json.dumps({k: v for k, v in res.items() if k not in ("ms", "losses")}))
                sys.stdout.flush()
    summary = {}
    for w in workloads:
        rows = {}
        for al in allocators:
            rs = [x for x in runs if x.get("workload") == w and x.get("allocator") == al and "median_ms" in x]
            if not rs:
                continue
            rows[al] = {"median_ms": statistics.median(x["median_ms"] for x in rs),
                        "peak_reserved": max(x["peak_reserved"] for x in rs),
                        "peak_live": max(x["peak_live"] for x in rs),
                        "losses": rs[0]["losses"]}
            rows[al]["reserved_over_live"] = rows[al]["peak_reserved"] / max(rows[al]["peak_live"], 1)
        base = rows.get("default")
        sums = {(x["allocator"], x["rep"]): x["sum_ms"] for x in runs
                if x.get("workload") == w and "sum_ms" in x}
        for al, row in rows.items():
            if base and "losses" in base:
                row["time_vs_default"] = row["median_ms"] / base["median_ms"]
                row["losses_identical_to_default"] = row["losses"] == base["losses"]
            paired = [sums[(al, r)] / sums[("default", r)] for r in range(reps)
                      if (al, r) in sums and ("default", r) in sums]
            if paired:
                row["paired_vs_default"] = statistics.median(paired)
                row["paired_per_rep"] = [round(x, 4) for x in paired]
        for row in rows.values():
            row.pop("losses", None)
        summary[w] = rows
    if "--no-maxbatch" not in a:
        summary["max_batch_dyn_seq512"] = {al: sub(["maxbatch", al, str(fraction)]) for al in allocators}
    print(json.dumps(summary, indent=1))
    if "--json" in a:
        with open(a[a.index("--json") + 1], "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
