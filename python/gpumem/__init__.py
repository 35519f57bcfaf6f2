"""gpumem from Python: the C library's pools through ctypes (docs/python.md).

    import gpumem
    with gpumem.Pool("sim", conf="strategy=tlsf,sim.capacity=8G") as pool:
        p = pool.alloc(1 << 20)
        print(pool.summary())
        pool.free(p)
    print(gpumem.replay("traces/resnet_train.csv.gz")["reserved_over_live"])

The C library is compiled into this package's shared object (``_gpumem*.so``) by setup.py;
``GPUMEM_LIBRARY=/path/libgpumem.so`` loads another build instead (without the CuPy glue).
``gpumem.torch`` (PyTorch's allocator backend) and ``gpumem.cupy`` (CuPy's) are submodules.
Settings everywhere are GPUMEM_CONF text: "key=value,key=value" with the keys of
``gpumem.config_keys()`` (docs/cli.md lists them; "sim." keys configure the simulated device).
"""

import ctypes
import glob
import gzip
import json
import os
from array import array

__all__ = ["Pool", "replay", "read_trace", "version", "config_keys", "GpumemError",
           "OutOfMemoryError", "library_path"]

# gm_status values (include/gpumem.h).
OK, INVALID_ARGUMENT, OUT_OF_MEMORY, BUSY = 0, 1, 2, 7


class GpumemError(RuntimeError):
    """A gpumem call failed; ``status`` is the gm_status name, the message gpumem's own."""

    def __init__(self, status, message):
        text = message if message.startswith(status) else "%s: %s" % (status, message)
        super().__init__(text if message else status)
        self.status = status


class OutOfMemoryError(GpumemError, MemoryError):
    """gm_alloc could not be satisfied; the message names the request, reserved and live
    bytes, the largest free block and the fragmentation rate."""


def library_path():
    """The shared object the bindings load."""
    env = os.environ.get("GPUMEM_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_gpumem*.so")))
    if not found:
        raise ImportError("gpumem: the package's shared object (_gpumem*.so) is missing next to "
                          "%s: install with `pip install --no-build-isolation .` from the gpumem "
                          "checkout, or set GPUMEM_LIBRARY" % here)
    return found[0]


def _load():
    path = library_path()
    lib = ctypes.CDLL(path)
    vp, sz, st = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    sigs = {
        "gm_version": (ctypes.c_char_p, []),
        "gm_status_str": (ctypes.c_char_p, [st]),
        "gm_last_error": (ctypes.c_char_p, [vp]),
        "gm_backend_last_error": (ctypes.c_char_p, []),
        "gm_alloc": (st, [vp, sz, vp, ctypes.POINTER(vp)]),
        "gm_free": (st, [vp, vp, vp]),
        "gm_record_stream": (st, [vp, vp, vp]),
        "gm_sim_stream_create": (st, [vp, ctypes.POINTER(vp)]),
        "gm_trim": (st, [vp, sz]),
        "gm_pool_check": (st, [vp]),
        "gm_pool_reset_peaks": (st, [vp]),
        "gm_pool_summary": (st, [vp, ctypes.c_char_p, sz]),
        "gm_pool_snapshot": (st, [vp, vp, vp]),
        "gm_config_keys": (vp, [ctypes.POINTER(sz)]),
        "gm_sim_config_keys": (vp, [ctypes.POINTER(sz)]),
        "gmpy_open": (st, [ctypes.c_char_p, st, ctypes.c_char_p, ctypes.POINTER(vp),
                           ctypes.POINTER(vp)]),
        "gmpy_close": (st, [vp, vp, st]),
        "gmpy_stats_json": (sz, [vp, ctypes.c_char_p, sz]),
        "gmpy_replay": (st, [ctypes.c_char_p, st, ctypes.c_char_p, sz, vp, vp, vp, vp,
                             ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64),
                             ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, sz]),
    }
    for name, (res, args) in sigs.items():
        if name.startswith("gmpy_") and not hasattr(lib, name):
            continue  # GPUMEM_LIBRARY without the package's glue: Pool and replay say so
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib, path


class _Missing:
    """Stands for the shared object when it cannot be loaded, so that `import gpumem` (and its
    subpackage gpumem.torch, which has its own extension) still works; any use says why."""

    def __init__(self, error):
        self._error = error

    def __getattr__(self, name):
        raise ImportError(str(self._error))


try:
    _lib, _path = _load()
except (ImportError, OSError) as _e:
    _lib, _path = _Missing(_e), None
SUMMARY_BYTES = 8192  # GM_SUMMARY_BYTES
_WRITE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def _check(status, pool=None, what="gpumem"):
    if status == OK:
        return
    name = _text(_lib.gm_status_str(status))
    msg = _text(_lib.gm_last_error(pool))
    if status == OUT_OF_MEMORY:
        raise OutOfMemoryError(name, msg)
    if status == INVALID_ARGUMENT and pool is None:
        raise ValueError("%s: %s" % (what, msg or name))
    raise GpumemError(name, msg)


def _need_glue():
    if not hasattr(_lib, "gmpy_open"):
        raise GpumemError("unsupported", "%s lacks the package's glue (gmpy_*): use the package's "
                          "own shared object (unset GPUMEM_LIBRARY)" % _path)


def version():
    """The loaded library's version ("0.1.0")."""
    return _text(_lib.gm_version())


class _Key(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_char_p),
                ("default_text", ctypes.c_char_p), ("help", ctypes.c_char_p)]


def config_keys():
    """Every settings key: a list of dicts with name, type, default and help (pool keys, then
    the simulated device's "sim." keys)."""
    out = []
    for fn in (_lib.gm_config_keys, _lib.gm_sim_config_keys):
        n = ctypes.c_size_t()
        keys = ctypes.cast(fn(ctypes.byref(n)), ctypes.POINTER(_Key))
        for i in range(n.value):
            k = keys[i]
            out.append({"name": _text(k.name), "type": _text(k.type),
                        "default": _text(k.default_text), "help": _text(k.help)})
    return out


class Pool:
    """A gpumem pool on its own backend: ``backend`` "sim" (the simulated H200, no GPU needed)
    or "cuda"; ``device`` its ordinal; ``conf`` settings text. Pointers are ints; streams are
    ints (a cudaStream_t's value; 0 = the default stream). Close it (or use ``with``) when
    done: closing with live blocks raises GpumemError unless ``force``."""

    def __init__(self, backend="sim", device=0, conf=""):
        _need_glue()
        b, p = ctypes.c_void_p(), ctypes.c_void_p()
        _check(_lib.gmpy_open(backend.encode(), int(device), conf.encode(), ctypes.byref(b),
                              ctypes.byref(p)), None, "gpumem.Pool(%r, conf=%r)" % (backend, conf))
        self._backend, self._pool = b, p
        self.backend, self.device, self.conf = backend, device, conf

    def _handle(self):
        if self._pool is None:
            raise GpumemError("invalid argument", "the pool is closed")
        return self._pool

    def alloc(self, size, stream=0):
        """gm_alloc: a device pointer (int) to ``size`` bytes usable on ``stream``."""
        out = ctypes.c_void_p()
        pool = self._handle()
        _check(_lib.gm_alloc(pool, int(size), stream or None, ctypes.byref(out)), pool)
        return out.value

    def free(self, ptr, stream=0):
        """gm_free: ``stream`` is the stream whose work last used the block."""
        pool = self._handle()
        _check(_lib.gm_free(pool, ptr, stream or None), pool)

    def record_stream(self, ptr, stream):
        pool = self._handle()
        _check(_lib.gm_record_stream(pool, ptr, stream or None), pool)

    def trim(self, keep=0):
        """gm_trim: give free memory back until at most ``keep`` bytes stay reserved."""
        pool = self._handle()
        _check(_lib.gm_trim(pool, int(keep)), pool)

    def check(self):
        """gm_pool_check: raise GpumemError if an invariant is broken."""
        pool = self._handle()
        _check(_lib.gm_pool_check(pool), pool)

    def reset_peaks(self):
        pool = self._handle()
        _check(_lib.gm_pool_reset_peaks(pool), pool)

    def stats(self):
        """gm_pool_stats as a dict (gm_stats' field names; ``device_calls`` is the total,
        ``device_calls_by_kind`` the calls by gm_call_str name)."""
        return _stats(self._handle())

    def summary(self):
        """gm_pool_summary: the table as text."""
        return _summary(self._handle())

    def snapshot(self):
        """gm_pool_snapshot's JSON, parsed: {"segments": [...], "stats": {...}}."""
        return _snapshot(self._handle())

    def close(self, force=False):
        if self._pool is None:
            return
        st = _lib.gmpy_close(self._backend, self._pool, 1 if force else 0)
        if st != BUSY:  # the pool is gone, even when the device kept memory (BACKEND)
            self._pool = self._backend = None
        _check(st, self._pool, "gpumem.Pool.close")

    def stream(self):
        """A new stream of the simulated device (backend "sim" only), as an int for alloc and
        free: work the pool must wait for is ordered on it as on a CUDA stream. It lives as long
        as the pool."""
        if self.backend != "sim":
            raise ValueError("gpumem.Pool.stream: the sim backend only (use your CUDA streams)")
        pool = self._handle()
        out = ctypes.c_void_p()
        _check(_lib.gm_sim_stream_create(self._backend, ctypes.byref(out)), pool)
        return out.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(force=exc[0] is not None)

    def __del__(self):
        try:
            if self._pool is not None:
                self.close(force=True)
        except Exception:
            pass


def _stats(pool):
    _need_glue()
    buf = ctypes.create_string_buffer(4096)
    n = _lib.gmpy_stats_json(pool, buf, len(buf))
    if not n:
        _check(INVALID_ARGUMENT, pool)
    return json.loads(buf.raw[:n].decode())


def _summary(pool):
    buf = ctypes.create_string_buffer(SUMMARY_BYTES)
    _check(_lib.gm_pool_summary(pool, buf, len(buf)), pool)
    return _text(buf.value)


def _snapshot(pool):
    parts = []

    def write(user, data, n):
        parts.append(ctypes.string_at(data, n))
        return 0

    _check(_lib.gm_pool_snapshot(pool, _WRITE_FN(write), None), pool)
    return json.loads(b"".join(parts).decode("utf-8", "replace"))


def read_trace(path):
    """Read an RMM CSV trace (plain or .gz; docs/trace-format.md) and resolve it: returns a
    dict of arrays (kind 0 alloc / 1 free, slot, size, stream index) with n_slots, n_streams
    and the counts of lines skipped. Pointers are matched as the CLI matches them: a free of a
    pointer that is not live is skipped, an allocate of a live one frees it first."""
    opener = gzip.open if path.endswith(".gz") else open
    kind, slot, size, stream = array("B"), array("I"), array("Q"), array("I")
    live, streams, sizes = {}, {0: 0}, []
    skipped = 0
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as f:
        header = [h.strip() for h in f.readline().lstrip("\ufeff").split(",")]
        try:
            ia, ip, isz = header.index("Action"), header.index("Pointer"), header.index("Size")
        except ValueError:
            raise ValueError("%s: not an RMM trace (header %r)" % (path, header)) from None
        ist = header.index("Stream") if "Stream" in header else -1
        for line in f:
            fields = line.split(",")
            if len(fields) != len(header):
                skipped += line.strip() != ""
                continue
            action = fields[ia].strip()
            if action not in ("allocate", "free"):
                skipped += action != "allocate failure"
                continue
            try:
                ptr, nbytes = int(fields[ip], 16), int(fields[isz])
                s = int(fields[ist], 16) if ist >= 0 else 0
            except ValueError:
                skipped += 1
                continue
            si = streams.setdefault(s, len(streams))
            if action == "allocate":
                if ptr in live:  # allocate of a live pointer: it was freed unlogged
                    k = live.pop(ptr)
                    kind.append(1), slot.append(k), size.append(sizes[k]), stream.append(si)
                if nbytes == 0:
                    continue
                live[ptr] = len(sizes)
                kind.append(0), slot.append(len(sizes)), size.append(nbytes), stream.append(si)
                sizes.append(nbytes)
            elif ptr in live:
                k = live.pop(ptr)
                kind.append(1), slot.append(k), size.append(sizes[k]), stream.append(si)
            else:
                skipped += 1
    return {"kind": kind, "slot": slot, "size": size, "stream": stream, "n_slots": len(sizes),
            "n_streams": len(streams), "skipped_lines": skipped}


def replay(trace, conf="", backend="sim", device=0):
    """Replay an RMM CSV trace (a path, or read_trace's dict) on a fresh pool, the calls made
    from C (no Python between two of them); returns a dict: ops, peak_live_bytes,
    peak_reserved_bytes, reserved_over_live, oom_count, host_ns, ns_per_op, stats (at the end;
    peaks included). ``conf``: settings text, as for Pool."""
    _need_glue()
    t = read_trace(trace) if isinstance(trace, str) else trace
    n = len(t["kind"])
    if n == 0:
        raise ValueError("gpumem.replay: the trace has no allocations")
    ptr = lambda a: a.buffer_info()[0]  # noqa: E731
    host_ns, oom = ctypes.c_uint64(), ctypes.c_uint64()
    out = ctypes.create_string_buffer(8192)
    st = _lib.gmpy_replay(backend.encode(), int(device), conf.encode(), n, ptr(t["kind"]),
                          ptr(t["slot"]), ptr(t["size"]), ptr(t["stream"]), t["n_streams"],
                          max(t["n_slots"], 1), ctypes.byref(host_ns), ctypes.byref(oom), out,
                          len(out))
    if st != OK:
        name = _text(_lib.gm_status_str(st))
        raise (ValueError if st == INVALID_ARGUMENT else GpumemError)(
            "gpumem.replay: %s: %s" % (name, _text(out.value)))
    stats = json.loads(out.value.decode())
    ops = stats["alloc_count"] + stats["free_count"] + oom.value
    return {"ops": ops, "peak_live_bytes": stats["peak_live_bytes"],
            "peak_reserved_bytes": stats["peak_reserved_bytes"],
            "reserved_over_live": (stats["peak_reserved_bytes"] / stats["peak_live_bytes"]
                                   if stats["peak_live_bytes"] else 0.0),
            "oom_count": oom.value, "host_ns": host_ns.value,
            "ns_per_op": host_ns.value / ops if ops else 0.0, "stats": stats}
