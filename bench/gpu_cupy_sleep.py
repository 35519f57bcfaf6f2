"""On the GPU machine: gpumem.cupy.sleep / wake on a real device (docs/sleep.md). An array
allocated under the tag "weights" keeps its contents and address across the sleep, a second
array's contents are discarded, the device memory comes back (cudaMemGetInfo), an allocation
while asleep is refused with "the pool is asleep". One JSON line; exit 1 if a check fails.

    python3 bench/gpu_cupy_sleep.py
"""
import json, time, gpumem, gpumem.cupy as gc
gc.enable("segments=vmm")
import cupy as cp
with gc.tag("weights"):
    w = cp.arange(1 << 24, dtype=cp.float32)
kv = cp.ones(1 << 26, dtype=cp.float32)
ref = cp.asnumpy(w)
addr = w.data.ptr
free0 = cp.cuda.runtime.memGetInfo()[0]
t0 = time.perf_counter(); gc.sleep(offload=["weights"]); t1 = time.perf_counter()
free1 = cp.cuda.runtime.memGetInfo()[0]
st = gc.stats()
try:
    cp.zeros(10); refused = False
except Exception as e:  # CuPy re-raises its allocator's failure as RuntimeError
    refused = "asleep" in str(e)
t2 = time.perf_counter(); gc.wake(); t3 = time.perf_counter()
ok = bool((cp.asnumpy(w) == ref).all()) and w.data.ptr == addr
print(json.dumps(dict(cupy_sleep_ok=ok, refused_while_asleep=refused, given_back=free1 - free0,
      reserved_asleep=st["reserved_bytes"], sleep_ms=(t1-t0)*1e3, wake_ms=(t3-t2)*1e3)))
raise SystemExit(0 if ok and refused else 1)
