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

import ctypes as _ctypes
import glob as _glob
import json as _json
import operator as _operator
import os as _os
import threading as _threading
import warnings as _warnings
from array import array as _array

__all__ = ["Pool", "replay", "read_trace", "version", "config_keys", "library_path",
           "GpumemError", "InvalidArgumentError", "OutOfMemoryError", "NoDeviceError",
           "DoubleFreeError", "UnknownPointerError", "BusyError", "UnsupportedError",
           "BackendError", "HostMemoryError", "AsleepError", "TraceError", "TraceWarning",
           "tag"]

# gm_status values (include/gpumem.h).
(_OK, _INVALID_ARGUMENT, _OUT_OF_MEMORY, _NO_DEVICE, _DOUBLE_FREE, _UNKNOWN_POINTER, _NOT_READY,
 _BUSY, _UNSUPPORTED, _BACKEND, _HOST_MEMORY, _CORRUPT, _ABORTED, _ASLEEP) = range(14)
_SIZE_MAX = (1 << (8 * _ctypes.sizeof(_ctypes.c_size_t))) - 1  # 2**64-1 on 64-bit hosts
_PTR_MAX = (1 << (8 * _ctypes.sizeof(_ctypes.c_void_p))) - 1
_INT_MAX = (1 << (8 * _ctypes.sizeof(_ctypes.c_int) - 1)) - 1
_ERR_BYTES = 2048  # a failure's message (GM_ERROR_TEXT is 512; the tool's reach 1 KiB)
_MAX_WARNINGS = 5  # bad trace lines described per kind, as the command-line tool


class GpumemError(RuntimeError):
    """A gpumem call failed; ``status`` is the gm_status name ("double free", ...), the message
    gpumem's own. Each status has its subclass (below); a status without one raises this."""

    def __init__(self, status, message=""):
        text = message if message.startswith(status) else "%s: %s" % (status, message)
        super().__init__(text if message else status)
        self.status, self.message = status, message

    def __reduce__(self):
        return type(self), (self.status, self.message)


class InvalidArgumentError(GpumemError, ValueError):
    """invalid argument: a bad setting, size, device, stream or backend name, or a pool that is
    closed. Also a ValueError."""


class OutOfMemoryError(GpumemError, MemoryError):
    """out of memory: the message names the request, reserved and live bytes, the largest free
    block and the fragmentation rate. Also a MemoryError."""


class NoDeviceError(GpumemError):
    """no device: no CUDA driver, or no GPU of that ordinal."""


class DoubleFreeError(GpumemError):
    """double free: the block was already freed."""


class UnknownPointerError(GpumemError):
    """unknown pointer: not a live block of this pool (foreign, interior, or freed before)."""


class BusyError(GpumemError):
    """busy: close() with live blocks (close(force=True) releases them)."""


class UnsupportedError(GpumemError):
    """unsupported: the device lacks what was asked for (e.g. segments=vmm without VMM)."""


class BackendError(GpumemError):
    """backend error: the device driver failed (or kept memory it was given back)."""


class HostMemoryError(GpumemError, MemoryError):
    """host memory exhausted: the allocator's own metadata could not be allocated."""


class AsleepError(GpumemError):
    """the pool is asleep (Pool.sleep): it allocates again after Pool.wake()."""


class TraceError(InvalidArgumentError):
    """A trace that cannot be replayed (not an RMM trace, gzip with no data, no allocations; under
    ``strict`` the first bad line), with the file and line, as the command-line tool says it."""


class TraceWarning(UserWarning):
    """A bad trace line that was counted and skipped (the command-line tool's warnings)."""


_ERRORS = {_INVALID_ARGUMENT: InvalidArgumentError, _OUT_OF_MEMORY: OutOfMemoryError,
           _NO_DEVICE: NoDeviceError, _DOUBLE_FREE: DoubleFreeError,
           _UNKNOWN_POINTER: UnknownPointerError, _BUSY: BusyError,
           _UNSUPPORTED: UnsupportedError, _BACKEND: BackendError,
           _HOST_MEMORY: HostMemoryError, _ASLEEP: AsleepError}


def library_path():
    """The shared object the bindings load."""
    env = _os.environ.get("GPUMEM_LIBRARY")
    if env:
        return env
    here = _os.path.dirname(_os.path.abspath(__file__))
    found = sorted(_glob.glob(_os.path.join(here, "_gpumem*.so")))
    if not found:
        raise ImportError("gpumem: the package's shared object (_gpumem*.so) is missing next to "
                          "%s: install with `pip install --no-build-isolation .` from the gpumem "
                          "checkout, or set GPUMEM_LIBRARY" % here)
    return found[0]


def _load():
    path = library_path()
    lib = _ctypes.CDLL(path)
    c = _ctypes
    vp, sz, st, cp = c.c_void_p, c.c_size_t, c.c_int, c.c_char_p
    sigs = {
        "gm_version": (cp, []),
        "gm_status_str": (cp, [st]),
        "gm_last_error": (cp, [vp]),
        "gm_backend_last_error": (cp, []),
        "gm_alloc": (st, [vp, sz, vp, c.POINTER(vp)]),
        "gm_free": (st, [vp, vp, vp]),
        "gm_record_stream": (st, [vp, vp, vp]),
        "gm_sim_stream_create": (st, [vp, c.POINTER(vp)]),
        "gm_trim": (st, [vp, sz]),
        "gm_pool_check": (st, [vp]),
        "gm_pool_reset_peaks": (st, [vp]),
        "gm_pool_summary": (st, [vp, cp, sz]),
        "gm_pool_snapshot": (st, [vp, vp, vp]),
        "gm_pool_sleep": (st, [vp, cp]),
        "gm_pool_sleep_prepare": (st, [vp, cp]),
        "gm_pool_wake": (st, [vp]),
        "gm_tag_push": (st, [cp]),
        "gm_tag_pop": (st, []),
        "gm_tag_current": (cp, []),
        "gm_config_keys": (vp, [c.POINTER(sz)]),
        "gm_sim_config_keys": (vp, [c.POINTER(sz)]),
        "gmpy_open": (st, [cp, st, cp, c.POINTER(vp), c.POINTER(vp), cp, sz]),
        "gmpy_close": (st, [vp, vp, st, cp, sz]),
        "gmpy_stats_json": (st, [vp, cp, sz, c.POINTER(sz), cp, sz]),
        "gmpy_trace_read": (vp, [st, cp, st, c.c_uint, c.POINTER(vp), cp, sz]),
        "gmpy_trace_free": (None, [vp]),
        "gmpy_free": (None, [vp]),
        "gmpy_trace_info": (sz, [vp, cp, sz]),
        "gmpy_trace_ops": (None, [vp, vp, vp, vp, vp, vp]),
        "gmpy_replay": (st, [vp, cp, st, cp, st, c.POINTER(vp), cp, sz]),
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
_SUMMARY_BYTES = 8192  # GM_SUMMARY_BYTES
_WRITE_FN = _ctypes.CFUNCTYPE(_ctypes.c_int, _ctypes.c_void_p, _ctypes.c_void_p,
                              _ctypes.c_size_t)


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def _error(status, message):
    """The exception for a failed call: status's subclass, with message."""
    return _ERRORS.get(status, GpumemError)(_text(_lib.gm_status_str(status)), message)


def _check(status, pool=None):
    """Raise for a failed public-API call on ``pool`` (its message is gm_last_error(pool), which
    the library sets for every failure of that call on this thread)."""
    if status != _OK:
        raise _error(status, _text(_lib.gm_last_error(pool)))


def _check_glue(status, err):
    """Raise for a failed gmpy_* call, which wrote its message into ``err``."""
    if status != _OK:
        raise _error(status, _text(err.value) or "(no message)")


def _need_glue():
    if not hasattr(_lib, "gmpy_open"):
        raise UnsupportedError("unsupported", "%s lacks the package's glue (gmpy_*): use the "
                               "package's own shared object (unset GPUMEM_LIBRARY)" % _path)


def _bad_value(what, text):
    return InvalidArgumentError("invalid argument", "%s: %s" % (what, text))


def _int(value, name, what, lo, hi, unit=""):
    """``value`` as an int in [lo, hi]: TypeError unless an int (or has __index__; bool is not
    one), InvalidArgumentError (a ValueError) outside the range. Never wrapped by ctypes."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError("%s: %s must be an int, not %s" % (what, name, type(value).__name__))
    v = _operator.index(value)
    if not lo <= v <= hi:
        raise _bad_value(what, "%s must be %d to %d%s, not %d" % (name, lo, hi, unit, v))
    return v


def _stream(value, what):
    """A stream: None or 0 (the default stream), or an int that is a stream's address."""
    if value is None:
        return None
    return _int(value, "stream", what, 0, _PTR_MAX, " (a cudaStream_t's value) or None") or None


def _ptr(value, what):
    return _int(value, "ptr", what, 0, _PTR_MAX, " (a block's address)") or None


def _str(value, name, what):
    """Text handed to C: a str without NUL characters (C would stop reading at one)."""
    if not isinstance(value, str):
        raise TypeError("%s: %s must be a str, not %s" % (what, name, type(value).__name__))
    if "\0" in value:
        raise _bad_value(what, "%s contains a NUL character" % name)
    return value.encode()


def _err_buf():
    return _ctypes.create_string_buffer(_ERR_BYTES)


def version():
    """The loaded library's version ("0.1.0")."""
    return _text(_lib.gm_version())


class _Key(_ctypes.Structure):
    _fields_ = [("name", _ctypes.c_char_p), ("type", _ctypes.c_char_p),
                ("default_text", _ctypes.c_char_p), ("help", _ctypes.c_char_p)]


def config_keys():
    """Every settings key: a list of dicts with name, type, default and help (pool keys, then
    the simulated device's "sim." keys)."""
    out = []
    for fn in (_lib.gm_config_keys, _lib.gm_sim_config_keys):
        n = _ctypes.c_size_t()
        keys = _ctypes.cast(fn(_ctypes.byref(n)), _ctypes.POINTER(_Key))
        for i in range(n.value):
            k = keys[i]
            out.append({"name": _text(k.name), "type": _text(k.type),
                        "default": _text(k.default_text), "help": _text(k.help)})
    return out


class Pool:
    """A gpumem pool on its own backend: ``backend`` "sim" (the simulated H200, no GPU needed)
    or "cuda"; ``device`` its ordinal (sim: below the ``sim.devices`` setting, default 1);
    ``conf`` settings text. Pointers are ints; streams are ints (a cudaStream_t's value; 0 or
    None = the default stream). Close it (or use ``with``) when done: closing with live blocks
    raises BusyError unless ``force``.

    Safe to share between threads, as the C pool is: calls run concurrently; close() waits for
    the calls in flight, and calls made after it raise InvalidArgumentError "the pool is
    closed"."""

    def __init__(self, backend="sim", device=0, conf=""):
        self._pool = self._backend = None  # first: __del__ must find them
        self._cv = _threading.Condition(_threading.Lock())
        self._calls = 0          # calls in flight (between _enter and _leave)
        self._closing = False    # close() is waiting for them or destroying the pool
        what = "gpumem.Pool"
        b, c = _str(backend, "backend", what), _str(conf, "conf", what)
        device = _int(device, "device", what, 0, _INT_MAX)
        _need_glue()
        bp, pp, err = _ctypes.c_void_p(), _ctypes.c_void_p(), _err_buf()
        _check_glue(_lib.gmpy_open(b, device, c, _ctypes.byref(bp), _ctypes.byref(pp), err,
                                   len(err)), err)
        self._backend, self._pool = bp, pp
        self.backend, self.device, self.conf = backend, device, conf

    def _enter(self, what):
        """The pool's handle for one call, counted in flight until _leave: close() waits."""
        with self._cv:
            while self._closing:
                self._cv.wait()
            if self._pool is None:
                raise _bad_value(what, "the pool is closed")
            self._calls += 1
            return self._pool

    def _leave(self):
        with self._cv:
            self._calls -= 1
            if self._calls == 0 and self._closing:
                self._cv.notify_all()

    def _call(self, what, fn, *args):
        """fn(pool, *args), a public-API call: raise its failure with its message."""
        pool = self._enter(what)
        try:
            _check(fn(pool, *args), pool)
        finally:
            self._leave()

    def alloc(self, size, stream=0):
        """gm_alloc: a device pointer (int) to ``size`` bytes (1 to 2**64-1) usable on
        ``stream``."""
        what = "gpumem.Pool.alloc"
        size = _int(size, "size", what, 1, _SIZE_MAX, " bytes")
        stream = _stream(stream, what)
        out = _ctypes.c_void_p()
        self._call(what, _lib.gm_alloc, size, stream, _ctypes.byref(out))
        return out.value

    def free(self, ptr, stream=0):
        """gm_free: ``stream`` is the stream whose work last used the block."""
        what = "gpumem.Pool.free"
        self._call(what, _lib.gm_free, _ptr(ptr, what), _stream(stream, what))

    def record_stream(self, ptr, stream):
        """gm_record_stream: ``stream`` also uses the live block ``ptr``."""
        what = "gpumem.Pool.record_stream"
        self._call(what, _lib.gm_record_stream, _ptr(ptr, what), _stream(stream, what))

    def trim(self, keep=0):
        """gm_trim: give free memory back until at most ``keep`` bytes stay reserved."""
        what = "gpumem.Pool.trim"
        self._call(what, _lib.gm_trim, _int(keep, "keep", what, 0, _SIZE_MAX, " bytes"))

    def check(self):
        """gm_pool_check: raise GpumemError if an invariant is broken."""
        self._call("gpumem.Pool.check", _lib.gm_pool_check)

    def reset_peaks(self):
        self._call("gpumem.Pool.reset_peaks", _lib.gm_pool_reset_peaks)

    def _read(self, what, fn):
        pool = self._enter(what)
        try:
            return fn(pool)
        finally:
            self._leave()

    def sleep(self, offload=True):
        """gm_pool_sleep: give every physical page back to the device, keeping each live
        block's address, until wake(). ``offload``: True keeps every block's contents (copied to
        pinned host memory), False discards them all, an iterable of tag names (tag()) keeps
        those tags' blocks and discards the rest. Asleep, alloc raises AsleepError; free works.
        Needs VMM segments (conf "segments=vmm" or "auto"): UnsupportedError otherwise."""
        what = "gpumem.Pool.sleep"
        self._call(what, _lib.gm_pool_sleep, _offload_tags(offload, what).encode())

    def sleep_prepare(self, offload=True):
        """gm_pool_sleep_prepare: pin now the host memory a sleep(offload) would pin (as many
        bytes as the live blocks it would keep), so that the sleep only copies. Call it once
        what is kept is allocated. It serves every later sleep; one that keeps more pins only
        the rest; trim() leaves it; an ``offload`` that keeps no live block (False) frees it."""
        what = "gpumem.Pool.sleep_prepare"
        self._call(what, _lib.gm_pool_sleep_prepare, _offload_tags(offload, what).encode())

    def wake(self):
        """gm_pool_wake: map pages under every live block again, at the same addresses, and copy
        the kept contents back. A failure leaves the pool asleep with its contents saved."""
        self._call("gpumem.Pool.wake", _lib.gm_pool_wake)

    def stats(self):
        """gm_pool_stats as a dict (gm_stats' field names; ``device_calls`` is the total,
        ``device_calls_by_kind`` the calls by gm_call_str name)."""
        return self._read("gpumem.Pool.stats", _stats)

    def summary(self):
        """gm_pool_summary: the table as text."""
        return self._read("gpumem.Pool.summary", _summary)

    def snapshot(self):
        """gm_pool_snapshot's JSON, parsed: {"segments": [...], "stats": {...}}."""
        return self._read("gpumem.Pool.snapshot", _snapshot)

    def close(self, force=False):
        """Destroy the pool, once the calls other threads have in flight return. With live
        blocks it raises BusyError and the pool stays open, unless ``force`` (their memory is
        released). Closing a closed pool does nothing."""
        err = _err_buf()
        with self._cv:
            while self._closing:  # another thread is closing: its outcome first
                self._cv.wait()
            if self._pool is None:
                return
            self._closing = True
            try:
                while self._calls:
                    self._cv.wait()
                st = _lib.gmpy_close(self._backend, self._pool, 1 if force else 0, err, len(err))
                if st != _BUSY:  # the pool is gone, even when the device kept memory (BACKEND)
                    self._pool = self._backend = None
                else:
                    live = _stats(self._pool)
            finally:
                self._closing = False
                self._cv.notify_all()
        if st == _BUSY:
            raise BusyError("busy", "gpumem.Pool.close: %d blocks (%d bytes) are still live; "
                            "free them, or close(force=True) to release them too"
                            % (live["live_blocks"], live["live_bytes"]))
        _check_glue(st, err)

    def stream(self):
        """A new stream of the simulated device (backend "sim" only), as an int for alloc and
        free: work the pool must wait for is ordered on it as on a CUDA stream. It lives as long
        as the pool."""
        what = "gpumem.Pool.stream"
        if self.backend != "sim":
            raise _bad_value(what, "the sim backend only (use your CUDA streams)")
        out = _ctypes.c_void_p()
        self._enter(what)
        try:
            st = _lib.gm_sim_stream_create(self._backend, _ctypes.byref(out))
            if st != _OK:  # a backend call: the backend's message, not the pool's
                raise _error(st, _text(_lib.gm_backend_last_error()))
        finally:
            self._leave()
        return out.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(force=exc[0] is not None)

    def __reduce__(self):
        raise TypeError("gpumem.Pool cannot be pickled or copied: it owns this process's device "
                        "memory (make a Pool in the other process)")

    def __del__(self):
        try:
            if getattr(self, "_pool", None) is not None:
                self.close(force=True)
        except Exception:
            pass


def _stats(pool):
    _need_glue()
    buf, n, err = _ctypes.create_string_buffer(4096), _ctypes.c_size_t(), _err_buf()
    _check_glue(_lib.gmpy_stats_json(pool, buf, len(buf), _ctypes.byref(n), err, len(err)), err)
    return _json.loads(buf.raw[:n.value].decode())


def _summary(pool):
    buf = _ctypes.create_string_buffer(_SUMMARY_BYTES)
    _check(_lib.gm_pool_summary(pool, buf, len(buf)), pool)
    return _text(buf.value)


def _snapshot(pool):
    parts = []

    def write(user, data, n):
        parts.append(_ctypes.string_at(data, n))
        return 0

    _check(_lib.gm_pool_snapshot(pool, _WRITE_FN(write), None), pool)
    return _json.loads(b"".join(parts).decode("utf-8", "replace"))


def _typecode(itemsize):
    """The array typecode of unsigned ints of ``itemsize`` bytes on this platform."""
    return next(c for c in "BHILQ" if _array(c).itemsize == itemsize)


class _Trace:
    """A trace read by the command-line tool's reader (tools/gpumem/trace.c), in C, until
    closed."""

    def __init__(self, path, strict, what):
        _need_glue()
        if not isinstance(path, (str, bytes, _os.PathLike)):
            raise TypeError("%s: trace must be a file path (str, bytes or os.PathLike), not %s"
                            % (what, type(path).__name__))
        name = _os.fsdecode(path)
        warnings, err = _ctypes.c_void_p(), _err_buf()
        with open(path, "rb") as f:  # missing, unreadable: the OSError, with the file's name
            self._t = _lib.gmpy_trace_read(f.fileno(), _os.fsencode(path), int(bool(strict)),
                                           _MAX_WARNINGS, _ctypes.byref(warnings), err, len(err))
        if warnings.value:
            text = _ctypes.string_at(warnings.value).decode("utf-8", "replace")
            _lib.gmpy_free(warnings)
            for line in text.splitlines():
                _warnings.warn(line.replace("gpumem: warning: ", "", 1), TraceWarning, 3)
        if not self._t:
            raise TraceError("invalid argument", _text(err.value))
        buf = _ctypes.create_string_buffer(4096)
        n = _lib.gmpy_trace_info(self._t, buf, len(buf))
        self.info = _json.loads(buf.raw[:n])
        self.name = name

    def close(self):
        if self._t:
            _lib.gmpy_trace_free(self._t)
            self._t = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_trace(path, strict=False):
    """Read an RMM CSV trace (plain or gzip, told by its content; docs/trace-format.md) with the
    command-line tool's reader, and resolve it. Returns a dict: arrays ``kind`` (0 allocate, 1
    free), ``slot`` (the allocation's index), ``size`` (bytes), ``stream`` (an index into
    ``stream_values``, the logged streams; 0 is the default stream), ``n_slots``,
    ``n_streams``, and the reader's counts (``lines``, ``bad_input``, ``first_bad_line``,
    ``logged_allocate_failures``, ``zero_size_allocates``, ``never_freed``,
    ``logged_peak_live_bytes``). Bad lines are counted and skipped with a TraceWarning (the
    first 5 of each kind); with ``strict`` the first raises TraceError. A file that is not a
    trace raises TraceError with its name and line."""
    with _Trace(path, strict, "gpumem.read_trace") as t:
        n = t.info["ops"]
        out = dict(t.info)
        out["kind"] = _array("B", bytes(n))
        out["slot"] = _array(_typecode(4), bytes(4 * n))
        out["size"] = _array(_typecode(8), bytes(8 * n))
        out["stream"] = _array(_typecode(4), bytes(4 * n))
        values = _array(_typecode(8), bytes(8 * t.info["n_streams"]))
        addr = lambda a: a.buffer_info()[0]  # noqa: E731
        _lib.gmpy_trace_ops(t._t, addr(out["kind"]), addr(out["slot"]), addr(out["size"]),
                            addr(out["stream"]), addr(values))
        out["stream_values"] = list(values)
        return out


def replay(trace, conf="", backend="sim", device=0, strict=False):
    """Replay an RMM CSV trace file on fresh pools, as ``gpumem replay --json`` does: the same
    reader (bad lines counted, TraceWarning for the first of each kind; ``strict``: the first bad
    line, or an allocation that fails with out of memory, raises), the same engine, in C (no
    Python between two calls), the same figures. Returns the tool's JSON report as a dict (keys:
    docs/cli.md; among them ops, peak_live_bytes, peak_reserved_bytes, reserved_over_live,
    oom_count, ns_per_op, host_ns, bad_input, logged_allocate_failures, zero_size_allocates,
    never_freed, device_calls, config) and ``stats`` (gm_stats at the end). ``conf``: settings
    text, ``backend`` and ``device`` as for Pool."""
    what = "gpumem.replay"
    b, c = _str(backend, "backend", what), _str(conf, "conf", what)
    device = _int(device, "device", what, 0, _INT_MAX)
    if isinstance(trace, dict):
        raise TypeError("%s: trace must be a trace file's path (read_trace's dict is for "
                        "looking at a trace; replay reads the file itself)" % what)
    with _Trace(trace, strict, what) as t:
        if t.info["ops"] == 0:  # an all-zero report would read as a result
            raise TraceError("invalid argument", "%s: no allocations to replay (%d line%s read)"
                             % (t.name, t.info["lines"], "" if t.info["lines"] == 1 else "s"))
        out, err = _ctypes.c_void_p(), _err_buf()
        st = _lib.gmpy_replay(t._t, b, device, c, int(bool(strict)), _ctypes.byref(out), err,
                              len(err))
    _check_glue(st, err)
    try:
        return _json.loads(_ctypes.string_at(out.value).decode("utf-8", "replace"))
    finally:
        _lib.gmpy_free(out)


def _offload_tags(offload, what="gpumem.Pool.sleep"):
    """gm_pool_sleep's offload_tags text for ``offload``: True -> "*" (every block kept), False
    or None -> "" (none), a tag name or an iterable of them -> "a,b"."""
    if offload is True:
        return "*"
    if offload is False or offload is None:
        return ""
    names = [offload] if isinstance(offload, str) else None
    if names is None:
        try:
            names = list(offload)
        except TypeError:
            raise TypeError("%s: offload is True, False or an iterable of tag names, not %r"
                            % (what, offload)) from None
    for n in names:
        if not isinstance(n, str):
            raise TypeError("%s: a tag name is a str, not %r" % (what, n))
        if not n or "," in n or n == "*" or "\0" in n:
            raise _bad_value(what, "%r is not a tag name" % (n,))
    return ",".join(names)


class tag:
    """Name the blocks this thread allocates inside it (gm_tag_push / gm_tag_pop), for
    Pool.sleep(offload=[...]) and gpumem.cupy.sleep:

        with gpumem.tag("weights"):
            w = pool.alloc(1 << 20)

    also a decorator. Tags nest (at most 16 deep); a name is 1..31 characters of letters,
    digits, '_', '.', '-'. The tag is per thread and applies to every pool of this package's
    library (Pool and gpumem.cupy; gpumem.torch has its own: gpumem.torch.tag)."""

    def __init__(self, name):
        self._name = _str(name, "name", "gpumem.tag")  # bytes for C
        self.name = name

    def __enter__(self):
        st = _lib.gm_tag_push(self._name)
        if st != _OK:
            raise _error(st, _text(_lib.gm_last_error(None)))
        return self

    def __exit__(self, *exc):
        _lib.gm_tag_pop()

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def run(*a, **k):
            with self:
                return fn(*a, **k)
        return run

    @staticmethod
    def current():
        """The calling thread's current tag ("default" when none is pushed)."""
        return _text(_lib.gm_tag_current())
