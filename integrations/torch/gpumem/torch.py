"""gpumem as PyTorch's CUDA allocator, through ctypes (docs/torch.md).

    import gpumem.torch as gmt
    gmt.enable()                      # before the first CUDA tensor
    ...
    print(gmt.stats()["peak_reserved_bytes"])

``enable()`` loads libgpumem_torch.so (the pluggable-allocator shim) and installs it:

* ``mode="pool"`` (default): a ``torch.cuda.MemPool`` over the shim, made the pool every
  allocation on the device goes to. PyTorch's caching allocator still manages blocks, inside the
  segments gpumem hands it, so gpumem sees segment-sized requests; PyTorch's memory statistics
  keep working, and an allocation gpumem cannot serve raises ``torch.OutOfMemoryError``.
* ``mode="replace"``: ``torch.cuda.memory.change_current_allocator``. gpumem serves every tensor
  directly, but PyTorch's memory statistics raise, and (torch 2.11) a failed allocation is NOT
  an exception: the tensor gets a null pointer and the next kernel on it poisons the CUDA
  context. Use it only where out of memory cannot happen.

``stats()``, ``snapshot()``, ``trim()`` and ``last_error()`` talk to the shim only; they work
without PyTorch (the shim's ``backend=sim`` runs on a simulated GPU).
"""

import ctypes
import json
import os
import warnings

__all__ = ["enable", "disable", "mem_pool", "stats", "snapshot", "trim", "last_error",
           "configure", "library", "library_path", "GpumemError"]

LIBRARY_NAME = "libgpumem_torch.so"
ALLOC_FN = "gm_torch_alloc"
FREE_FN = "gm_torch_free"


class GpumemError(RuntimeError):
    """A call into libgpumem_torch.so failed; the message is the shim's."""


_lib = None
_lib_path = None
_enabled = None  # the Enabled handle of the install in effect
_retired = []    # handles of earlier installs: their pools must outlive their tensors


def library_path(path=None):
    """Where libgpumem_torch.so is: ``path``, else $GPUMEM_TORCH_LIB, else next to this module."""
    candidates = []
    if path:
        candidates.append(("path=", path))
    env = os.environ.get("GPUMEM_TORCH_LIB")
    if env:
        candidates.append(("GPUMEM_TORCH_LIB", env))
    candidates.append(("next to gpumem/torch.py",
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)))
    for _, p in candidates:
        if os.path.isfile(p):
            return os.path.abspath(p)
    tried = "; ".join("%s: %s" % c for c in candidates)
    raise FileNotFoundError(
        "%s not found (tried %s). Build it (cmake --build <build>) and put "
        "<build>/integrations/torch on PYTHONPATH, or set GPUMEM_TORCH_LIB." % (LIBRARY_NAME, tried))


def library(path=None):
    """Load the shim (once) and declare its functions. A later ``path`` must name the same file."""
    global _lib, _lib_path
    p = library_path(path)
    if _lib is not None:
        if path and os.path.realpath(p) != os.path.realpath(_lib_path):
            raise GpumemError("%s is already loaded from %s; cannot load %s too"
                              % (LIBRARY_NAME, _lib_path, p))
        return _lib
    lib = ctypes.CDLL(p)
    lib.gm_torch_alloc.restype = ctypes.c_void_p
    lib.gm_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.gm_torch_free.restype = None
    lib.gm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.gm_torch_configure.restype = ctypes.c_int
    lib.gm_torch_configure.argtypes = [ctypes.c_char_p]
    lib.gm_torch_stats_json.restype = ctypes.c_int
    lib.gm_torch_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.gm_torch_snapshot.restype = ctypes.c_int
    lib.gm_torch_snapshot.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.gm_torch_string_free.restype = None
    lib.gm_torch_string_free.argtypes = [ctypes.c_void_p]
    lib.gm_torch_trim.restype = ctypes.c_int
    lib.gm_torch_trim.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.gm_torch_last_error.restype = ctypes.c_char_p
    lib.gm_torch_last_error.argtypes = [ctypes.c_int]
    lib.gm_torch_config_string.restype = ctypes.c_char_p
    lib.gm_torch_config_string.argtypes = []
    _lib, _lib_path = lib, p
    return lib


def last_error(device=0):
    """The shim's last message for ``device`` ("" if none); device -1: configuration problems."""
    return library().gm_torch_last_error(int(device)).decode("utf-8", "replace")


def configure(conf):
    """Set the configuration (GPUMEM_CONF syntax: "segments=vmm,reserve_limit=8GiB") for the
    pools not yet created. Raises ValueError on a bad entry, GpumemError once a pool exists."""
    lib = library()
    if lib.gm_torch_configure(conf.encode()) != 0:
        msg = last_error(-1)
        if "already exists" in msg:
            raise GpumemError(msg)
        raise ValueError(msg)


def _fail(what, device):
    raise GpumemError("%s(device=%d): %s" % (what, device, last_error(device) or "failed"))


def stats(device=0):
    """gm_stats of the device's pool as a dict (bytes, counts, fragmentation, cache, calls)."""
    lib = library()
    size = 16384
    while True:
        buf = ctypes.create_string_buffer(size)
        n = lib.gm_torch_stats_json(int(device), buf, size)
        if n < 0:
            _fail("stats", device)
        if n < size:
            return json.loads(buf.value.decode())
        size = n + 1


def snapshot(device=0):
    """Every segment and block of the device's pool (docs/api.md's snapshot format) as a dict."""
    lib = library()
    out = ctypes.c_void_p()
    if lib.gm_torch_snapshot(int(device), ctypes.byref(out)) != 0:
        _fail("snapshot", device)
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.gm_torch_string_free(out)


def trim(keep=0, device=0):
    """Give free device memory back until at most ``keep`` bytes stay reserved.

    In pool mode PyTorch holds the segments gpumem gave it, and keeps free ones cached; gpumem
    can only return what PyTorch has handed back, so this first asks PyTorch to empty its
    cache (torch.cuda.empty_cache()) when gpumem is enabled in this process."""
    if _enabled is not None:
        import torch
        torch.cuda.empty_cache()
    if library().gm_torch_trim(int(device), int(keep)) != 0:
        _fail("trim", device)


class Enabled:
    """What ``enable()`` installed: ``mode``, ``device``, ``allocator`` (the
    CUDAPluggableAllocator), ``pool`` (the torch.cuda.MemPool, pool mode), ``routing`` (pool
    mode: "all threads" or "this thread"). ``disable()`` ends pool routing."""

    def __init__(self, mode, device, allocator, pool=None, routing=None, context=None):
        self.mode, self.device, self.allocator = mode, device, allocator
        self.pool, self.routing, self._context = pool, routing, context

    def disable(self):
        disable()

    def __repr__(self):
        return "<gpumem.torch %s mode on cuda:%d%s>" % (
            self.mode, self.device, ", routing " + self.routing if self.routing else "")


def _pluggable(path):
    import torch
    lib = library(path)  # same file as PyTorch will dlopen: one set of pools
    del lib
    return torch.cuda.memory.CUDAPluggableAllocator(_lib_path, ALLOC_FN, FREE_FN)


def mem_pool(conf=None, path=None):
    """A torch.cuda.MemPool whose segments come from gpumem, for scoped use:

        with torch.cuda.use_mem_pool(gpumem.torch.mem_pool()):
            ...   # this thread's allocations on the current device
    """
    import torch
    if conf is not None:
        os.environ["GPUMEM_CONF"] = conf
        configure(conf)
    allocator = _pluggable(path)
    pool = torch.cuda.MemPool(allocator.allocator())
    pool._gpumem_allocator = allocator  # keep the allocator alive as long as the pool
    return pool


def enable(conf=None, path=None, mode="pool", device=None):
    """Make gpumem PyTorch's allocator for the rest of the program. Call it before the first
    CUDA allocation. ``conf``: GPUMEM_CONF syntax (also exported to child processes);
    ``path``: the library; ``mode``: "pool" (default, safe out of memory) or "replace";
    ``device``: pool mode's device (default: the current one). Returns an ``Enabled``."""
    global _enabled
    import torch
    if _enabled is not None:
        raise GpumemError("gpumem.torch is already enabled (%r)" % (_enabled,))
    if mode not in ("pool", "replace"):
        raise ValueError('mode must be "pool" or "replace", not %r' % (mode,))
    if conf is not None:
        os.environ["GPUMEM_CONF"] = conf
        configure(conf)
    allocator = _pluggable(path)
    if mode == "replace":
        warnings.warn(
            "gpumem.torch.enable(mode='replace'): out of memory is NOT safe in this mode. PyTorch "
            "(2.11) does not check the allocator's result: a failed allocation gives a tensor a "
            "null pointer, and the next kernel on it poisons the CUDA context. "
            "torch.cuda.memory_stats() and friends also raise. Prefer mode='pool'.",
            RuntimeWarning, stacklevel=2)
        torch.cuda.memory.change_current_allocator(allocator)
        _enabled = Enabled("replace", torch.cuda.current_device(), allocator)
        return _enabled
    torch.cuda.init()
    if device is None:
        dev = torch.cuda.current_device()
    else:
        dev = device.index if isinstance(device, torch.device) else int(device)
    pool = torch.cuda.MemPool(allocator.allocator())
    begin = getattr(torch._C, "_cuda_beginAllocateToPool", None)
    if begin is not None and hasattr(torch._C, "_cuda_endAllocateToPool"):
        # Every thread's allocations on the device (autograd runs backward on its own thread).
        begin(dev, pool.id)
        _enabled = Enabled("pool", dev, allocator, pool, "all threads")
    else:
        ctx = torch.cuda.use_mem_pool(pool, dev)
        ctx.__enter__()
        warnings.warn(
            "gpumem.torch: this PyTorch has no _cuda_beginAllocateToPool; only this thread's "
            "allocations go to gpumem (backward's, on autograd's thread, do not). "
            "torch.autograd.set_multithreading_enabled(False) keeps backward on this thread.",
            RuntimeWarning, stacklevel=2)
        _enabled = Enabled("pool", dev, allocator, pool, "this thread", ctx)
    return _enabled


def disable():
    """End pool routing: later allocations go to PyTorch's own allocator again (tensors made
    while enabled stay valid and return their memory to gpumem when freed). Replace mode cannot
    be undone: PyTorch's allocator is fixed for the process."""
    global _enabled
    import torch
    e = _enabled
    if e is None:
        return
    if e.mode == "replace":
        raise GpumemError("replace mode cannot be disabled: PyTorch cannot change its allocator "
                          "once it was used")
    if e._context is not None:
        e._context.__exit__(None, None, None)
    else:
        torch._C._cuda_endAllocateToPool(e.device, e.pool.id)
        release = getattr(torch._C, "_cuda_releasePool", None)
        if release is not None:
            release(e.device, e.pool.id)  # the reference _cuda_beginAllocateToPool took
    # The MemPool stays alive: tensors made while enabled still live in it.
    _retired.append(e)
    _enabled = None
