"""gpumem as CuPy's allocator beside CuPy's own memory pool, on the GPU machine (docs/python.md,
docs/benchmarks.md "CuPy"). Each allocator runs the same workload in a process of its own:

- workload: FFTs (complex64, 2^14 .. 2^24 points) and matmuls (float32, 256 .. 6144 square) at
  sizes drawn from a fixed seed, with their results checksummed (the allocators must agree);
- allocation speed: cupy.cuda.alloc + release of sizes 512 B .. 64 MiB, cached (ns per call,
  CuPy's Python layer included for both: the same path, only the allocator differs);
- memory: peak reserved / peak live over the workload (CuPy pool: total_bytes / used_bytes
  sampled after every step; gpumem: its own peaks);
- gpumem only: a side stream's allocations land in a heap of that stream (stream-aware), and
  out of memory under reserve_limit raises cupy.cuda.memory.OutOfMemoryError with the CUDA
  context still usable afterwards.

usage: python3 bench/gpu_cupy.py            (runs every allocator, prints one JSON line each)
       python3 bench/gpu_cupy.py ALLOCATOR  (one: cupy | gpumem | gpumem-vmm)
"""
import json
import os
import subprocess
import sys
import time

ALLOCATORS = ["cupy", "gpumem", "gpumem-vmm"]


def workload(cp, sample):
    rng = __import__("random").Random(20261203)
    checksum = 0.0
    for step in range(40):
        if step % 2 == 0:
            n = 1 << rng.randint(14, 24)
            x = cp.random.RandomState(step).standard_normal(n, dtype=cp.float32)
            y = cp.fft.fft(x.astype(cp.complex64))
            checksum += float(cp.abs(y[: 1 << 10]).sum())
            del x, y
        else:
            n = rng.choice([256, 512, 1024, 1536, 2048, 3072, 4096, 6144])
            a = cp.random.RandomState(step).standard_normal((n, n), dtype=cp.float32)
            b = (a @ a.T) / n
            checksum += float(b[:16, :16].sum())
            del a, b
        sample()
    cp.cuda.Device().synchronize()
    return checksum


def alloc_speed(cp, pairs=10000):
    sizes = [512 << (i % 18) for i in range(64)]  # 512 B .. 64 MiB
    for s in sizes:  # warm: every size cached once
        cp.cuda.alloc(s)
    t0 = time.perf_counter_ns()
    for i in range(pairs):
        m = cp.cuda.alloc(sizes[i & 63])
        del m
    return (time.perf_counter_ns() - t0) / (2 * pairs)  # an op = one alloc or one free


def run_one(name):
    import cupy as cp
    out = {"allocator": name}
    if name == "cupy":
        from cupy.cuda import memory_hook
        pool = cp.get_default_memory_pool()
        peak = {"reserved": 0}

        class Live(memory_hook.MemoryHook):
            """Live bytes (requested) of CuPy's pool, exactly, and its device allocations."""
            name = "Live"

            def __init__(self):
                self.live = self.peak = self.device_calls = 0
                self.sizes = {}

            def alloc_postprocess(self, **kw):
                self.device_calls += 1

            def malloc_postprocess(self, **kw):
                self.sizes[kw["mem_ptr"]] = kw["size"]
                self.live += kw["size"]
                self.peak = max(self.peak, self.live)

            def free_postprocess(self, **kw):
                self.live -= self.sizes.pop(kw["mem_ptr"], 0)

        def sample():
            peak["reserved"] = max(peak["reserved"], pool.total_bytes())
        hook = Live()
        with hook:  # the hook's Python runs per call: the workload's time is not compared
            t0 = time.perf_counter()
            out["checksum"] = workload(cp, sample)
            out["workload_s"] = time.perf_counter() - t0
        out["peak_reserved"], out["peak_live"] = peak["reserved"], hook.peak
        out["device_calls"] = hook.device_calls
        out["ns_per_op"] = alloc_speed(cp)
    else:
        import gpumem.cupy as gc
        gc.enable("segments=vmm" if name == "gpumem-vmm" else "segments=plain")
        t0 = time.perf_counter()
        out["checksum"] = workload(cp, lambda: None)
        out["workload_s"] = time.perf_counter() - t0
        st = gc.stats()
        out["peak_reserved"], out["peak_live"] = st["peak_reserved_bytes"], st["peak_live_bytes"]
        out["device_calls"] = st["device_calls"]
        out["stream_aware"] = st["stream_aware"]
        out["ns_per_op"] = alloc_speed(cp)
        # A side stream: its allocation goes to a heap of that stream (snapshot segments name it).
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            z = cp.ones(1 << 20, dtype=cp.float32)
            z += 1
            big = cp.empty(777 << 20, dtype=cp.uint8)  # no cached block fits: a new segment
        s.synchronize()
        streams = {seg["stream"] for seg in gc.snapshot()["segments"]}
        out["side_stream_heap"] = hex(s.ptr) in streams
        out["side_stream_value_ok"] = float(z.sum()) == 2.0 * (1 << 20)
        del z, big
        out["failed_frees"] = gc.stats()["failed_frees"]
        out["summary_lines"] = len(gc.summary().splitlines())
    out["reserved_over_live"] = out["peak_reserved"] / out["peak_live"] if out["peak_live"] else 0
    print(json.dumps(out), flush=True)


def oom_check():
    """gpumem under a 1 GiB reserve_limit: a 2 GiB array raises CuPy's OutOfMemoryError, and the
    context still runs kernels after."""
    import cupy as cp
    import gpumem.cupy as gc
    gc.enable("reserve_limit=1GiB")
    out = {"allocator": "gpumem reserve_limit=1GiB"}
    try:
        cp.empty(2 << 30, dtype=cp.uint8)
        out["oom"] = "no exception"
    except cp.cuda.memory.OutOfMemoryError as e:
        out["oom"] = "OutOfMemoryError"
        out["note"] = (getattr(e, "__notes__", None) or [""])[0][:160]
    except Exception as e:  # noqa: BLE001 -- say what came instead
        out["oom"] = "%s: %s" % (type(e).__name__, str(e)[:160])
    x = cp.arange(1 << 20, dtype=cp.float32)
    out["after_oom_ok"] = float(x.sum()) == float((1 << 20) * ((1 << 20) - 1) / 2)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        oom_check() if sys.argv[1] == "oom" else run_one(sys.argv[1])
        sys.exit(0)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    for name in ALLOCATORS + ["oom"]:
        r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True,
                           timeout=60, env=os.environ)
        sys.stdout.write(r.stdout)
        if r.returncode:
            print(json.dumps({"allocator": name, "error": r.stderr[-1500:]}))
