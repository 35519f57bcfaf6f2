#!/usr/bin/env python3
"""GPU checks of gpumem's PyTorch allocator backend (docs/torch.md, issue 17).

    python3 integrations/torch/gpu_check_backend.py [--only NAME,...] [--conf SETTINGS] [--json OUT]

--conf runs every check under these gpumem settings (GPUMEM_CONF syntax, e.g.
"segments=vmm,release=on_oom,cache_disable=1"), before the settings a check sets itself.

Each check runs in its own process (this script with --worker NAME), because the allocator is
chosen once per process. Without a CUDA device or without gpumem.torch._C it says so and
exits 0 (skipped). The last line is a JSON summary; the exit status is 0 when every check
passed.

  stats         memory_allocated == sum of the live tensors' sizes (multiples of 512), the
                memory_stats keys, peaks and their reset, memory_summary, empty_cache (reserved
                back to 0, mem_get_info's free grows), cacheInfo
  stream        record_stream: a producer on a side stream, a long consumer kernel on the main
                stream, the tensor freed, the side stream allocating and writing again; the
                consumer must read the producer's values (5 iterations)
  stream_off    the same with GPUMEM_TORCH_NO_RECORD_STREAM=1: it must FAIL (shows that the
                check can fail, and that gm_record_stream is what makes it pass)
  two_streams   allocations and frees interleaved on two streams, values checked
  graph         torch.cuda.graph capture + replay with allocations during capture (a private
                pool per graph), replays == eager; the pool is gone after the graph is
  compile       torch.compile(mode="reduce-overhead") == eager, inference and training
  oom           torch.OutOfMemoryError ("CUDA out of memory." + gpumem's diagnosis), observers
                called, num_ooms, context usable, a halve-the-batch loop converges
  fraction      set_per_process_memory_fraction bounds what can be reserved
  snapshot      _record_memory_history + memory_snapshot: segments tile, live blocks with
                Python frames, alloc/free trace entries; _dump_snapshot readable by PyTorch's
                _memory_viz
  devices       a free on another current device (needs 2 GPUs, else skipped)
  ipc           sharing a CUDA tensor with another process fails with a clear error
  summary       gpumem.torch.summary() (gm_pool_summary): its live-blocks row equals PyTorch's
                allocation count, its allocations row grows by one per tensor
  trace         enable(conf="trace=FILE.csv.gz"), a few training steps, trace_stop(): the file
                holds every allocation and free the pool served (its counts equal gm's
                alloc_count and free_count), and gpumem.replay() of it on the simulated H200
                reaches the run's peak live bytes
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHECKS = ["stats", "stream", "stream_off", "two_streams", "graph", "compile", "oom", "fraction",
          "snapshot", "devices", "ipc", "summary", "trace"]
MiB = 1 << 20
GiB = 1 << 30


class Skip(Exception):
    pass


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def enable(conf=None):
    try:  # installed (pip install --no-build-isolation .)
        import gpumem.torch as gmt
    except ImportError:  # built in place under python/
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch as gmt
    # --conf BASE: settings every check runs under, before the check's own
    base = os.environ.get("GM_CHECK_CONF", "")
    gmt.enable(",".join(c for c in (base, conf or "") if c))
    return gmt


# ----------------------------------------------------------------------------------------------

def w_stats():
    gmt = enable()
    import torch
    check(torch.cuda.memory.get_allocator_backend() is not None, "backend")
    sizes = [512, 4096, 1 << 20, 3 * MiB + 512, 64 * MiB, 512 * MiB + 1024]
    ts = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
    total = sum(sizes)
    check(torch.cuda.memory_allocated() == total,
          "memory_allocated %d != sum of sizes %d" % (torch.cuda.memory_allocated(), total))
    st = torch.cuda.memory_stats()
    for k in ["allocated_bytes.all.current", "allocated_bytes.all.peak",
              "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
              "allocated_bytes.small_pool.current", "allocated_bytes.large_pool.current",
              "reserved_bytes.all.current", "active_bytes.all.current",
              "inactive_split_bytes.all.current", "requested_bytes.all.current",
              "allocation.all.current", "active.all.current", "segment.all.current",
              "num_alloc_retries", "num_ooms"]:
        check(k in st, "memory_stats lacks " + k)
    check(st["allocation.all.current"] == len(sizes), "allocation count")
    check(st["requested_bytes.all.current"] == total, "requested")
    check(st["allocated_bytes.small_pool.current"] == 512 + 4096 + MiB, "small pool bytes")
    g = gmt.stats()
    check(g["live_bytes"] == total, "gm live %d != %d" % (g["live_bytes"], total))
    check(torch.cuda.memory_reserved() == g["reserved_bytes"], "reserved != gm reserved")
    check(torch.cuda.memory_reserved() >= total, "reserved < allocated")
    peak = torch.cuda.max_memory_allocated()
    check(peak == total, "peak %d != %d" % (peak, total))
    del ts[-1]
    check(torch.cuda.memory_allocated() == total - sizes[-1], "after free")
    check(torch.cuda.max_memory_allocated() == total, "peak kept")
    torch.cuda.reset_peak_memory_stats()
    check(torch.cuda.max_memory_allocated() == total - sizes[-1], "peak reset")
    summary = torch.cuda.memory_summary()
    check("Allocated memory" in summary, "memory_summary")
    # a real computation's tensors
    a = torch.randn(1000, 1000, device="cuda")
    b = a @ a
    live = sum(t.untyped_storage().nbytes() for t in ts) + a.untyped_storage().nbytes() + \
        b.untyped_storage().nbytes()
    rounded = sum((n + 511) // 512 * 512 for n in
                  [t.untyped_storage().nbytes() for t in ts] + [4000000, 4000000])
    alloc = torch.cuda.memory_allocated()
    # cuBLAS may hold a workspace from the allocator; it is a live block too
    check(alloc >= rounded, "allocated %d < live tensors %d" % (alloc, rounded))
    del a, b, ts
    torch.cuda.synchronize()
    free0, total_dev = torch.cuda.mem_get_info()
    res0 = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    free1, _ = torch.cuda.mem_get_info()
    res1 = torch.cuda.memory_reserved()
    check(res1 <= torch.cuda.memory_allocated() + 64 * MiB,
          "empty_cache left %d reserved with %d allocated" % (res1, torch.cuda.memory_allocated()))
    check(free1 >= free0 + (res0 - res1) - 64 * MiB, "mem_get_info did not grow: %d -> %d" % (free0, free1))
    return {"reserved_before_empty_cache": res0, "reserved_after": res1, "free_before": free0,
            "free_after": free1, "device_total": total_dev}


def _stream_case(iters=5):
    import torch
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    n = 64 * MiB // 4
    bad = 0
    reused = 0
    for _ in range(iters):
        with torch.cuda.stream(side):
            x = torch.full((n,), 1.0, device="cuda")      # produced on the side stream
        main.wait_stream(side)
        torch.cuda._sleep(200_000_000)                    # a long kernel on main first
        y = x * 1.0                                        # then main reads x
        x.record_stream(main)
        xp = x.data_ptr()
        del x                                              # freed (allocated on side)
        with torch.cuda.stream(side):
            z = torch.full((n,), 2.0, device="cuda")       # side allocates and writes again
            reused += z.data_ptr() == xp
        torch.cuda.synchronize()
        bad += int((y != 1.0).sum().item())
        del y, z
    return bad, reused


def w_stream():
    enable()
    bad, reused = _stream_case()
    check(bad == 0, "%d wrong elements: a block was reused while the main stream read it" % bad)
    return {"wrong_elements": bad, "address_reused": reused}


def w_stream_off():
    os.environ["GPUMEM_TORCH_NO_RECORD_STREAM"] = "1"
    enable()
    bad, reused = _stream_case()
    # This worker passes when the case FAILS: without record_stream the block is reused early.
    check(bad > 0, "no wrong element without record_stream: the stream check cannot fail")
    return {"wrong_elements_without_record_stream": bad, "address_reused": reused}


def w_two_streams():
    enable()
    import torch
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    keep = []
    for i in range(200):
        s = s1 if i % 2 else s2
        with torch.cuda.stream(s):
            t = torch.full((1000 + 37 * i,), float(i), device="cuda")
            keep.append((t, float(i), s))
        if len(keep) > 20:
            t, v, s = keep.pop(0)
            with torch.cuda.stream(s):
                check(bool((t == v).all()), "value on stream")
            del t
    torch.cuda.synchronize()
    for t, v, s in keep:
        check(bool((t == v).all()), "value")
    return {}


def w_graph():
    gmt = enable()
    import torch
    import torch._C as C
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).cuda()
    static_in = torch.randn(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_allocated()
    with torch.cuda.graph(g):
        h = model[0](static_in)          # allocations during capture
        h = model[1](h)
        tmp = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")  # allocated and freed
        del tmp
        static_out = model[2](h)
        del h
    info = C._cuda_getCheckpointState  # noqa: F841 (present)
    dbg = gmt._ext().debug_info(0)
    check(dbg["private_pools_made"] >= 1, "no private pool during capture: %r" % dbg)
    check(dbg["deferred_frees"] == 0, "frees left deferred after capture: %r" % dbg)
    maxdiff = 0.0
    for _ in range(5):
        static_in.copy_(torch.randn(64, 512, device="cuda"))
        g.replay()
        with torch.no_grad():
            ref = model(static_in)
        maxdiff = max(maxdiff, float((static_out - ref).detach().abs().max()))
    check(maxdiff < 1e-4, "replay differs from eager by %g" % maxdiff)
    del g, static_out
    import gc
    gc.collect()
    torch.cuda.synchronize()
    # cuBLAS keeps a workspace per (handle, stream); the capture stream's came from the graph's
    # pool during capture (as with PyTorch's allocator). Clear it, as cudagraph trees do.
    torch._C._cuda_clearCublasWorkspaces()
    dbg2 = gmt._ext().debug_info(0)
    check(dbg2["private_pools"] == 0, "private pool left after the graph was freed: %r" % dbg2)
    check(torch.cuda.memory_allocated() <= before + 64 * 2048 * 4, "graph memory not returned")
    return {"max_abs_diff": maxdiff, "during": dbg, "after": dbg2}


def w_compile():
    enable()
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)).cuda()
    x = torch.randn(32, 256, device="cuda")
    with torch.no_grad():
        ref = model(x)
        cm = torch.compile(model, mode="reduce-overhead")
        outs = []
        for _ in range(5):
            torch.compiler.cudagraph_mark_step_begin()
            outs.append(cm(x).clone())
    for o in outs:
        torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-4)
    # training: forward + backward through CUDA-graph trees
    model2 = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(),
                                 torch.nn.Linear(512, 1)).cuda()
    import copy
    eager = copy.deepcopy(model2)
    cm2 = torch.compile(model2, mode="reduce-overhead")
    for i in range(5):
        xi = torch.randn(16, 256, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        l1 = cm2(xi).sum()
        l1.backward()
        l2 = eager(xi).sum()
        l2.backward()
        torch.testing.assert_close(l1, l2, rtol=1e-4, atol=1e-4)
        for p1, p2 in zip(model2.parameters(), eager.parameters()):
            torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-3, atol=1e-4)
            p1.grad = None
            p2.grad = None
    return {"inference_max_abs_diff": max(float((o - ref).abs().max()) for o in outs)}


def w_oom():
    gmt = enable("reserve_limit=2GiB")
    import torch
    calls = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: calls.append(a))
    keep = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
        raise AssertionError("no OutOfMemoryError for 4 GiB under a 2 GiB limit")
    except torch.OutOfMemoryError as e:
        msg = str(e)
    check(msg.startswith("CUDA out of memory."), "message: " + msg[:200])
    check("reserve limit" in msg and "largest free block" in msg, "no gpumem diagnosis: " + msg)
    check(len(calls) == 1, "observers called %d times" % len(calls))
    check(torch.cuda.memory_stats()["num_ooms"] == 1, "num_ooms")
    # the context is healthy
    a = torch.ones(1 << 20, device="cuda")
    check(float(a.sum()) == float(1 << 20), "kernel after OOM")
    check(bool((keep == keep).all()), "old tensor after OOM")
    # a device-capacity OOM too (no limit involved): 1 TiB
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
        raise AssertionError("1 TiB allocated?")
    except torch.OutOfMemoryError as e:
        check(str(e).startswith("CUDA out of memory."), "capacity OOM message")
    # a halve-the-batch loop, as batch-size finders run it: each step needs ~batch * 4 MiB live
    model = torch.nn.Linear(1024, 1024).cuda()
    batch, tries = 65536, 0
    while True:
        tries += 1
        try:
            x = torch.randn(batch, 1024, device="cuda")
            acts = [model(x) for _ in range(4)]
            loss = sum(a.sum() for a in acts)
            loss.backward()
            del x, acts, loss
            break
        except torch.OutOfMemoryError:
            batch //= 2
            check(batch >= 1, "halving never converged")
    check(tries >= 2, "the loop never ran out of memory: the check proves nothing")
    check(float(torch.ones(10, device="cuda").sum()) == 10.0, "context after the loop")
    return {"message": msg, "observer_args": [list(map(int, c)) for c in calls],
            "halving_batch": batch, "halving_tries": tries,
            "num_ooms": torch.cuda.memory_stats()["num_ooms"],
            "retries": torch.cuda.memory_stats()["num_alloc_retries"]}


def w_fraction():
    enable()
    import torch
    free, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(0.05)
    check(abs(torch.cuda.get_per_process_memory_fraction() - 0.05) < 1e-9
          if hasattr(torch.cuda, "get_per_process_memory_fraction") else True, "get fraction")
    cap = int(total * 0.05)
    a = torch.empty(cap // 2, dtype=torch.uint8, device="cuda")
    try:
        b = torch.empty(cap, dtype=torch.uint8, device="cuda")
        raise AssertionError("allocated past the fraction")
    except torch.OutOfMemoryError as e:
        check("reserve limit" in str(e), "fraction OOM message: " + str(e)[:300])
    check(torch.cuda.memory_reserved() <= cap, "reserved above the fraction")
    torch.cuda.set_per_process_memory_fraction(1.0)
    b = torch.empty(cap, dtype=torch.uint8, device="cuda")
    del a, b
    return {"cap": cap}


def w_snapshot():
    enable()
    import pickle
    import torch
    torch.cuda.memory._record_memory_history(max_entries=100000)

    def make_tensor_here():
        return torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")

    keep = make_tensor_here()
    tmp = torch.randn(1000, device="cuda")
    del tmp
    snap = torch.cuda.memory._snapshot()
    segs = snap["segments"]
    check(len(segs) >= 1, "no segments")
    for s in segs:
        check(sum(b["size"] for b in s["blocks"]) == s["total_size"], "blocks do not tile a segment")
    found = None
    for s in segs:
        addr = s["address"]
        for b in s["blocks"]:
            if addr == keep.data_ptr():
                found = b
            addr += b["size"]
    check(found is not None and found["state"] == "active_allocated", "live block not found")
    names = [f.get("name") for f in found.get("frames", [])]
    check("make_tensor_here" in names, "no Python frame of the allocation: %r" % names[:8])
    tr = snap["device_traces"][0]
    acts = [e["action"] for e in tr]
    check("alloc" in acts and "free_requested" in acts and "free_completed" in acts,
          "trace actions %r" % sorted(set(acts)))
    check(any(e["action"] == "alloc" and e["addr"] == keep.data_ptr() and e["frames"] for e in tr),
          "alloc entry with frames")
    path = "/tmp/gpumem_snapshot.pickle"
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        data = pickle.load(f)
    from torch.cuda import _memory_viz
    html = _memory_viz.trace_plot(data)
    check(len(html) > 1000, "trace_plot")
    seg_html = _memory_viz.segment_plot(data)
    check(len(seg_html) > 1000, "segment_plot")
    out = os.environ.get("GM_OUT")
    if out:
        import shutil
        shutil.copy(path, os.path.join(out, "gpumem_snapshot.pickle"))
        with open(os.path.join(out, "gpumem_trace_plot.html"), "w") as f:
            f.write(html)
    return {"segments": len(segs), "trace_entries": len(tr)}


def w_devices():
    enable()
    import torch
    if torch.cuda.device_count() < 2:
        raise Skip("one GPU")
    with torch.cuda.device(1):
        t = torch.ones(1 << 20, device="cuda:1")
    with torch.cuda.device(0):
        u = t.to("cuda:0")
        del t  # freed while device 0 is current
        check(float(u.sum()) == float(1 << 20), "copy")
    return {}


def w_ipc():
    enable()
    import torch
    t = torch.ones(10, device="cuda")
    try:
        t.untyped_storage()._share_cuda_()
        raise AssertionError("shared")
    except RuntimeError as e:
        check("gpumem" in str(e) and "not supported" in str(e), "message: " + str(e)[:200])
        return {"message": str(e).splitlines()[0]}


def w_summary():
    import re
    gmt = enable()
    import torch

    def row(text, name):
        m = re.search(r"\| %s +\| +(\d+) \|" % re.escape(name), text)
        check(m is not None, "summary has no %r row:\n%s" % (name, text))
        return int(m.group(1))
    keep = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (1, 3, 20)]
    text = gmt.summary()
    live = row(text, "live blocks")
    check(live == torch.cuda.memory_stats()["allocation.all.current"],
          "summary live blocks %d != PyTorch's %d" % (live, torch.cuda.memory_stats()["allocation.all.current"]))
    allocs = row(text, "allocations")
    keep.append(torch.empty(5 * MiB, dtype=torch.uint8, device="cuda"))
    check(row(gmt.summary(), "allocations") == allocs + 1, "allocations row did not grow by one")
    check("reserved" in text and "fragmentation rate" in text, "summary rows")
    return {"summary_lines": len(text.splitlines())}


def w_trace():
    path = "/tmp/gpumem_check_trace.csv.gz"
    if os.path.exists(path):
        os.remove(path)
    gmt = enable("trace=" + path)
    import torch
    m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for bs in (64, 256, 32, 512, 128):
        loss = m(torch.randn(bs, 512, device="cuda")).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    st = gmt.stats()
    gmt.trace_stop()
    import gpumem
    t = gpumem.read_trace(path)
    allocs = sum(1 for k in t["kind"] if k == 0)
    frees = len(t["kind"]) - allocs
    check(allocs == st["alloc_count"], "trace allocations %d != gm alloc_count %d" % (allocs, st["alloc_count"]))
    check(frees == st["free_count"], "trace frees %d != gm free_count %d" % (frees, st["free_count"]))
    r = gpumem.replay(path)
    check(r["peak_live_bytes"] == st["peak_live_bytes"],
          "replayed peak live %d != the run's %d" % (r["peak_live_bytes"], st["peak_live_bytes"]))
    after = torch.empty(1 << 20, device="cuda")  # not traced any more
    del after
    check(len(gpumem.read_trace(path)["kind"]) == len(t["kind"]), "traced after trace_stop")
    out = os.environ.get("GM_OUT")
    if out:
        import shutil
        shutil.copy(path, os.path.join(out, "torch_check_trace.csv.gz"))
    return {"allocations": allocs, "frees": frees, "peak_live": st["peak_live_bytes"],
            "replay_reserved_over_live": r["reserved_over_live"]}


WORKERS = {n: globals()["w_" + n] for n in CHECKS}


def worker(name):
    try:
        extra = WORKERS[name]()
        res = {"check": name, "ok": True, **(extra or {})}
    except Skip as e:
        res = {"check": name, "ok": True, "skipped": str(e)}
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        res = {"check": name, "ok": False, "error": "%s: %s" % (type(e).__name__, e)}
    print("RESULT " + json.dumps(res, default=str))
    sys.stdout.flush()
    os._exit(0)


def main():
    args = sys.argv[1:]
    if args[:1] == ["--worker"]:
        worker(args[1])
        return
    only = CHECKS
    if "--only" in args:
        only = args[args.index("--only") + 1].split(",")
    if "--conf" in args:  # the workers read it from the environment
        os.environ["GM_CHECK_CONF"] = args[args.index("--conf") + 1]
    try:
        import torch
        if not torch.cuda.is_available():
            print(json.dumps({"skipped": "no CUDA device"}))
            return 0
    except ImportError:
        print(json.dumps({"skipped": "no torch"}))
        return 0
    results = []
    for name in only:
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--worker", name], capture_output=True,
                           text=True, timeout=600)
        res = None
        for line in p.stdout.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
        if res is None:
            res = {"check": name, "ok": False, "error": "worker died (rc %d): %s" % (
                p.returncode, (p.stderr or "")[-2000:])}
        res["seconds"] = round(time.time() - t0, 1)
        if not res["ok"]:
            sys.stderr.write(p.stderr[-4000:])
        print(("PASS " if res["ok"] else "FAIL ") + json.dumps(res, default=str))
        sys.stdout.flush()
        results.append(res)
    ok = all(r["ok"] for r in results)
    summary = {"passed": sum(r["ok"] for r in results), "failed": [r["check"] for r in results
                                                                   if not r["ok"]],
               "conf": os.environ.get("GM_CHECK_CONF", "")}
    print(json.dumps(summary))
    if "--json" in args:
        with open(args[args.index("--json") + 1], "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
