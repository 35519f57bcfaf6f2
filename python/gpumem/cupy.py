"""gpumem as CuPy's device allocator (docs/python.md).

    import cupy, gpumem.cupy
    gpumem.cupy.enable("segments=vmm")      # GPUMEM_CONF-style settings; None reads $GPUMEM_CONF
    x = cupy.random.rand(4096, 4096)         # served by gpumem
    print(gpumem.cupy.summary())

CuPy calls the package's C functions (python/gpumem/_cupy.c) through
cupy.cuda.memory.CFunctionAllocator: no Python runs per allocation. Each allocation and free is
made on CuPy's current stream (read through CuPy's own C API); out of memory raises
cupy.cuda.memory.OutOfMemoryError with gpumem's diagnosis as a note. One pool per device, made
when the device first allocates.
"""

import ctypes
import os

import gpumem

__all__ = ["enable", "disable", "enabled", "stats", "summary", "snapshot", "trim", "trace_stop",
           "sleep", "sleep_prepare", "wake", "tag"]

_state = {"allocator": None, "handle": None, "previous": None, "conf": None}


def _pylib():
    """The package's shared object through PyDLL: the GIL stays held (the functions below use
    the Python C API)."""
    lib = ctypes.PyDLL(gpumem.library_path())
    vp = ctypes.c_void_p
    lib.gmpy_cupy_new.restype, lib.gmpy_cupy_new.argtypes = vp, [ctypes.c_char_p, vp,
                                                                 ctypes.py_object]
    lib.gmpy_cupy_pool.restype, lib.gmpy_cupy_pool.argtypes = vp, [vp, ctypes.c_int]
    lib.gmpy_cupy_existing_pool.restype = vp
    lib.gmpy_cupy_existing_pool.argtypes = [vp, ctypes.c_int]
    lib.gmpy_cupy_failed_frees.restype, lib.gmpy_cupy_failed_frees.argtypes = ctypes.c_uint64, [vp]
    lib.gmpy_cupy_destroy.restype, lib.gmpy_cupy_destroy.argtypes = None, [vp]
    lib.gmpy_cupy_trace_stop.restype, lib.gmpy_cupy_trace_stop.argtypes = None, [vp]
    return lib


def _current_stream_fn():
    """The address of CuPy's C function get_current_stream_ptr (exported as a capsule by its
    Cython stream module), or None: every call then uses the default stream."""
    import importlib
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    for module in ("cupy_backends.cuda.stream", "cupy.cuda.stream"):
        try:
            capi = importlib.import_module(module).__pyx_capi__
        except (ImportError, AttributeError):
            continue
        cap = capi.get("get_current_stream_ptr")
        name = get_name(cap) if cap is not None else None
        if name and name.replace(b" ", b"").startswith(b"intptr_t(void)"):  # no arguments
            return get_ptr(cap, name)
    return None


def _cupy():
    """The cupy module, or ModuleNotFoundError saying that gpumem.cupy needs it."""
    try:
        import cupy
    except ImportError as e:
        raise ModuleNotFoundError("gpumem.cupy needs CuPy (e.g. pip install cupy-cuda13x), which "
                                  "could not be imported (%s)" % e, name="cupy") from e
    return cupy


def enable(conf=None):
    """Make gpumem CuPy's allocator (cupy.cuda.set_allocator) for this process. ``conf``: pool
    settings ("segments=vmm,reserve_limit=60GiB"); None reads $GPUMEM_CONF. A bad setting raises
    ValueError when the first device opens its pool (at once for the current device). Without
    CuPy: ModuleNotFoundError saying so."""
    if conf is None:
        conf = os.environ.get("GPUMEM_CONF", "")
    gpumem._str(conf, "conf", "gpumem.cupy.enable")  # settings text, before CuPy is needed
    cupy = _cupy()
    from cupy.cuda import memory
    if _state["allocator"] is not None:
        if conf == _state["conf"]:
            return
        raise gpumem.GpumemError("invalid argument", "gpumem.cupy is already enabled with %r"
                                 % _state["conf"])
    lib = _pylib()
    stream_fn = _current_stream_fn()
    handle = lib.gmpy_cupy_new(conf.encode(), stream_fn, memory.OutOfMemoryError)
    if not handle:
        raise MemoryError("gpumem.cupy: no host memory")
    try:
        lib.gmpy_cupy_pool(handle, cupy.cuda.runtime.getDevice())  # settings errors now
    except Exception:
        lib.gmpy_cupy_destroy(handle)
        raise
    cdll = ctypes.CDLL(gpumem.library_path())
    malloc = ctypes.cast(cdll.gmpy_cupy_malloc, ctypes.c_void_p).value
    free = ctypes.cast(cdll.gmpy_cupy_free, ctypes.c_void_p).value
    allocator = memory.CFunctionAllocator(handle, malloc, free, _state)
    _state.update(allocator=allocator, handle=handle, conf=conf, lib=lib,
                  stream_aware=stream_fn is not None, previous=cupy.cuda.get_allocator())
    cupy.cuda.set_allocator(allocator.malloc)
    if any(item.split("=", 1)[0].strip() == "trace" for item in conf.split(",")):
        import atexit
        atexit.register(trace_stop)  # the pools live until the process ends: complete the file


def trace_stop():
    """Stop tracing (the ``trace=FILE`` setting) and complete the trace files: every allocation
    and free so far is written, a ".gz" file is finished. enable() registers it to run at exit;
    call it earlier to replay the file while the program runs. Device 0 writes FILE, device
    d > 0 "FILE.devD" before its ".csv[.gz]" ending."""
    if _state["handle"] is not None:
        _state["lib"].gmpy_cupy_trace_stop(_state["handle"])


def enabled():
    return _state["allocator"] is not None


def disable():
    """Give CuPy its previous allocator back. gpumem's pools stay (arrays still alive keep
    their memory); they are released at exit."""
    if _state["allocator"] is None:
        return
    _cupy().cuda.set_allocator(_state["previous"])
    _state["allocator"] = None


def _pool(device, what):
    """The pool of ``device``: None (the current device), an int or a cupy.cuda.Device."""
    if device is not None and type(device).__name__ == "Device" and hasattr(device, "id"):
        device = device.id  # cupy.cuda.Device
    if device is not None:
        device = gpumem._int(device, "device", what, 0, gpumem._INT_MAX,
                             " (a CUDA device ordinal, a cupy.cuda.Device) or None")
    if _state["handle"] is None:
        raise gpumem.GpumemError("invalid argument", "%s: gpumem.cupy is not enabled" % what)
    if device is None:
        device = _cupy().cuda.runtime.getDevice()
    p = _state["lib"].gmpy_cupy_existing_pool(_state["handle"], device)
    if not p:
        raise gpumem.GpumemError("invalid argument", "%s: device %d has no gpumem pool yet"
                                 % (what, device))
    return p


def stats(device=None):
    """gm_pool_stats of the device's pool (default: the current device), as a dict; also
    ``stream_aware`` (CuPy's current stream is passed on) and ``failed_frees``."""
    d = gpumem._stats(_pool(device, "gpumem.cupy.stats"))
    d["stream_aware"] = _state["stream_aware"]
    d["failed_frees"] = _state["lib"].gmpy_cupy_failed_frees(_state["handle"])
    return d


def summary(device=None):
    """gm_pool_summary of the device's pool, as text."""
    return gpumem._summary(_pool(device, "gpumem.cupy.summary"))


def snapshot(device=None):
    return gpumem._snapshot(_pool(device, "gpumem.cupy.snapshot"))


def trim(keep=0, device=None):
    """gm_trim: give free memory back until at most ``keep`` bytes stay reserved."""
    keep = gpumem._int(keep, "keep", "gpumem.cupy.trim", 0, (1 << 64) - 1, " bytes")
    p = _pool(device, "gpumem.cupy.trim")
    gpumem._check(gpumem._lib.gm_trim(p, keep), p)


tag = gpumem.tag  # the package's library serves CuPy: its per-thread tag names CuPy's blocks


def sleep(offload=True, device=None):
    """gm_pool_sleep on the device's pool (default: the current device): every CuPy array keeps
    its address, its device memory goes back to the driver until wake(). ``offload`` as for
    gpumem.Pool.sleep (True: keep every array's contents in pinned host memory; False: discard
    them; tag names: keep those tags' arrays). Needs VMM segments (enable("segments=vmm") or
    "segments=auto"). Meanwhile CuPy cannot allocate on that device (AsleepError)."""
    text = gpumem._offload_tags(offload, "gpumem.cupy.sleep").encode()
    p = _pool(device, "gpumem.cupy.sleep")
    gpumem._check(gpumem._lib.gm_pool_sleep(p, text), p)


def sleep_prepare(offload=True, device=None):
    """gm_pool_sleep_prepare on the device's pool: pin now the host memory that sleep(offload)
    would pin, so that the sleep only copies (gpumem.Pool.sleep_prepare)."""
    text = gpumem._offload_tags(offload, "gpumem.cupy.sleep_prepare").encode()
    p = _pool(device, "gpumem.cupy.sleep_prepare")
    gpumem._check(gpumem._lib.gm_pool_sleep_prepare(p, text), p)


def wake(device=None):
    """gm_pool_wake on the device's pool: pages mapped again at the same addresses, kept
    contents copied back."""
    p = _pool(device, "gpumem.cupy.wake")
    gpumem._check(gpumem._lib.gm_pool_wake(p), p)
