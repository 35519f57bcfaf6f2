"""gpumem as PyTorch's CUDA allocator: a native backend (docs/torch.md).

    import gpumem.torch
    gpumem.torch.enable()             # before CUDA starts in this process
    import torch
    x = torch.randn(4096, 4096, device="cuda")   # served by gpumem
    print(torch.cuda.memory_stats()["allocated_bytes.all.current"], gpumem.torch.stats())

or, with no change to a script:

    python -m gpumem.torch train.py ARGS

``enable()`` installs ``gpumem.torch._C`` (a C++ subclass of PyTorch's CUDAAllocator over
libgpumem, built by the root setup.py when torch is importable) as PyTorch's allocator:
every CUDA tensor, CUDA-graph pool and ``raw_alloc`` comes from gpumem, and PyTorch's own memory
tools (memory_stats, memory_summary, empty_cache, set_per_process_memory_fraction,
memory_snapshot, _record_memory_history) report it. ``stats()``, ``snapshot()`` and ``trim()``
give gpumem's own view.
"""

import json
import os

__all__ = ["enable", "enabled", "build_info", "stats", "snapshot", "summary", "trim", "trace_stop",
           "last_error", "sleep", "sleep_prepare", "wake", "sleep_stats", "tag", "GpumemError",
           "DEFAULT_CONF", "effective_conf"]

# The backend's settings before the user's (docs/torch.md, "Which settings"): VMM segments where
# the device has them, blocks placed on mapped pages first, no size cache, old mappings unmapped
# by a helper thread, learned layouts for loops that repeat exactly. Measured on an H200 beside
# PyTorch's allocators (docs/benchmarks.md): step times at PyTorch default's, peak reserved /
# peak live 1.02 on dynamic shapes where expandable_segments gives 1.06, and on an H100 no
# memory call in the steady state of a loop whose shapes do not change. The user's settings come
# after them and win.
DEFAULT_CONF = "segments=auto,cache_disable=1,vmm_mapped_first=1,vmm_unmap_thread=1,vmm_plan=1"


class GpumemError(RuntimeError):
    """gpumem.torch cannot do what was asked (the message says why)."""


def _ext():
    try:
        import torch  # noqa: F401  (the extension links against libtorch: load it first)
    except ImportError as e:
        raise GpumemError("gpumem.torch needs PyTorch, which is not installed (%s)" % e) from e
    try:
        from . import _C
    except ImportError as e:
        raise GpumemError(_not_built_message(e)) from e
    return _C


def build_info():
    """What setup.py recorded about gpumem.torch._C when gpumem was installed: {"built",
    "torch" (the version it saw), "supported", "reason" (why it was not built)}; None when
    this copy of gpumem was not installed by setup.py."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_info.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _not_built_message(err):
    import torch
    info = build_info() or {}
    supported = info.get("supported") or "PyTorch 2.4 to 2.15"
    now = getattr(torch, "__version__", "?")
    redo = ("pip install --no-build-isolation --force-reinstall --no-deps . from the gpumem checkout")
    if info.get("built"):
        return ("gpumem.torch._C was built against torch %s but does not load with torch %s (%s): "
                "reinstall gpumem with this torch (%s)" % (info.get("torch"), now, err, redo))
    if info.get("reason"):
        return ("gpumem.torch has no PyTorch backend: it was not built when gpumem was installed: "
                "%s. It needs %s (torch %s is installed now) and the CUDA toolkit whose major "
                "version matches torch's; then %s (docs/torch.md)." % (info["reason"], supported, now, redo))
    return ("gpumem.torch._C is not built (%s). It needs %s and the CUDA toolkit; build it with "
            "`pip install --no-build-isolation .` from the gpumem checkout (docs/torch.md)." % (err, supported))


def _conf_text(conf, what):
    """conf as given (None: $GPUMEM_CONF), stripped; TypeError if it is not settings text."""
    if conf is None:
        conf = os.environ.get("GPUMEM_CONF", "")
    elif not isinstance(conf, str):
        raise TypeError('%s: conf is settings text such as "reserve_limit=60GiB" (a str) or None, '
                        "not %s" % (what, type(conf).__name__))
    if "\0" in conf:
        raise ValueError("%s: conf contains a NUL character" % what)
    return conf.strip()


def _trace_files(conf):
    """The files that conf's trace=FILE settings name."""
    items = (item.partition("=") for item in conf.split(","))
    return [value.strip() for key, _, value in items if key.strip() == "trace" and value.strip()]


def _check_trace_folder(conf, what):
    """A trace=FILE setting names a file in a folder that exists and can be written: the file is
    opened only when the first CUDA allocation creates the pool, so a bad path is told here."""
    for path in _trace_files(conf):
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise ValueError("%s: trace=%s: the folder %r does not exist" % (what, path, folder))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError("%s: trace=%s: the folder %r is not writable" % (what, path, folder))


def _ext_device(device, what):
    """The extension and the CUDA device ordinal that ``device`` names: an int >= 0, "cuda" or
    "cuda:N", or a torch.device of type cuda ("cuda" alone: the current device). TypeError or
    ValueError for anything else (before torch is needed), ValueError for an ordinal the machine
    does not have."""
    index = device
    if isinstance(device, str) or type(device).__name__ == "device":
        text = str(device)
        kind, _, num = text.partition(":")
        if kind != "cuda" or (num and not num.isdigit()):
            raise ValueError("%s: device %r is not a CUDA device" % (what, text))
        index = int(num) if num else None
    elif isinstance(device, bool) or not isinstance(device, int):
        raise TypeError('%s: device is an int, "cuda:N" or a torch.device, not %s'
                        % (what, type(device).__name__))
    elif device < 0:
        raise ValueError("%s: device must be >= 0, not %d" % (what, device))
    C = _ext()
    import torch
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device() if count else 0
    if index >= count:
        raise ValueError("%s: device %d is not one of the %d CUDA devices of this process"
                         % (what, index, count))
    return C, index


def effective_conf(conf=None):
    """The settings enable(conf) runs with: DEFAULT_CONF, then ``conf`` (None: $GPUMEM_CONF),
    whose keys win. The library's own defaults (plain segments, the size cache) come back with
    "segments=plain,cache_disable=0,vmm_mapped_first=0,vmm_unmap_thread=0,vmm_plan=0"."""
    conf = _conf_text(conf, "gpumem.torch.effective_conf")
    return DEFAULT_CONF + "," + conf if conf else DEFAULT_CONF


def enable(conf=None):
    """Make gpumem PyTorch's CUDA allocator for the rest of the process.

    Call it before CUDA is initialized (before the first CUDA tensor or torch.cuda.init());
    PyTorch cannot swap an allocator that was used, and this raises GpumemError then.
    ``conf``: settings in GPUMEM_CONF syntax ("reserve_limit=60GiB"), applied after
    DEFAULT_CONF (effective_conf); None reads $GPUMEM_CONF. A given ``conf`` is also exported as
    GPUMEM_CONF, so child processes that enable gpumem get the same settings. A bad setting raises
    ValueError naming it. Calling it again with the same settings does nothing; other settings
    raise GpumemError."""
    given = _conf_text(conf, "gpumem.torch.enable")
    _check_trace_folder(given, "gpumem.torch.enable")
    C = _ext()
    import torch
    conf = effective_conf(given)
    if C.installed():
        if C.conf() == conf:
            return
        raise GpumemError("gpumem.torch is already enabled with GPUMEM_CONF=%r; cannot switch to %r"
                          % (C.conf(), conf))
    if torch.cuda.is_initialized():
        raise GpumemError(
            "gpumem.torch.enable() must run before CUDA is initialized in this process: PyTorch "
            "cannot swap an allocator that was used. Call it first, or run the script with "
            "`python -m gpumem.torch script.py`.")
    C.check_conf(conf)  # ValueError before anything changes
    C.install(conf)
    if given:
        os.environ["GPUMEM_CONF"] = given
    if _trace_files(conf):
        import atexit
        atexit.register(trace_stop)  # the pools live until the process ends: complete the file


def enabled():
    """True once enable() has installed gpumem as PyTorch's allocator in this process."""
    try:
        return _ext().installed()
    except GpumemError:
        return False


def stats(device=0):
    """gpumem's statistics of the device's pool (gm_stats) as a dict: live, allocated,
    reserved bytes and their peaks, segments, fragmentation, cache, device calls by kind."""
    C, d = _ext_device(device, "gpumem.torch.stats")
    return C.stats(d)


def snapshot(device=0):
    """Every segment and block of the device's pool (docs/api.md's snapshot format)."""
    C, d = _ext_device(device, "gpumem.torch.snapshot")
    return json.loads(C.snapshot_json(d))


def summary(device=0):
    """gpumem's summary of the device's pool as text (gm_pool_summary): current and peak live,
    allocated, reserved and cached bytes, counts, fragmentation, segments, device calls."""
    C, d = _ext_device(device, "gpumem.torch.summary")
    return C.summary(d)


def trace_stop():
    """Stop tracing (the ``trace=FILE`` setting) and complete the trace files: every allocation
    and free so far is written, a ".gz" file is finished. enable() registers it to run at exit;
    call it earlier to replay the file while the program still runs. Later calls are not traced.
    Device 0 writes FILE, device d > 0 "FILE.devD" before its ".csv[.gz]" ending; the private
    pools of CUDA graphs and MemPools are not traced."""
    C = _ext()
    if C.installed():
        C.trace_stop()


def trim(keep=0, device=0):
    """Give free device memory of the device's pool back until at most ``keep`` bytes stay
    reserved (torch.cuda.empty_cache() is trim(0) on every device)."""
    if isinstance(keep, bool) or not isinstance(keep, int):
        raise TypeError("gpumem.torch.trim: keep is a byte count (an int), not %s"
                        % type(keep).__name__)
    if keep < 0:
        raise ValueError("gpumem.torch.trim: keep must be >= 0 bytes, not %d" % keep)
    C, d = _ext_device(device, "gpumem.torch.trim")
    C.trim(d, min(keep, (1 << 64) - 1))


def last_error(device=0):
    """The last message gpumem recorded for the device's pool ("" if none)."""
    C, d = _ext_device(device, "gpumem.torch.last_error")
    return C.last_error(d)


# ---- sleep and wake (docs/sleep.md) ------------------------------------------------------------

def _offload_tags(offload):
    """The C library's offload_tags text for sleep(offload)."""
    if offload is True:
        return "*"
    if offload is False or offload is None:
        return ""
    if isinstance(offload, str):
        names = [offload]
    else:
        try:
            names = list(offload)
        except TypeError:
            raise TypeError("gpumem.torch.sleep: offload is True, False or an iterable of tag names, "
                            "not %r" % (offload,)) from None
    for n in names:
        if not isinstance(n, str) or not n or "," in n or n == "*":
            raise ValueError("gpumem.torch.sleep: %r is not a tag name" % (n,))
    return ",".join(names)


def _clear_blas_workspaces():
    """Free PyTorch's cached cuBLAS / cuBLASLt workspaces. They are tensors PyTorch keeps live and
    hands to every later matrix product on the same stream: asleep, the next product (another
    phase's model) would run on unmapped memory; after a wake, one allocated in that phase's
    MemPool would keep its pool. PyTorch allocates a new one on first use."""
    import torch
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and torch.cuda.is_initialized():
        clear()


def sleep(offload=True):
    """Give every CUDA tensor's device memory back to the driver, keeping every tensor's address
    (and so the CUDA graphs captured over them), until wake(). ``offload``: True keeps every
    tensor's contents (copied to pinned host memory), False discards them all (undefined after
    wake), an iterable of tag names keeps the tensors allocated under those tags (tag()) and
    discards the rest. Every pool of the backend sleeps (each device's, and the private pools of
    MemPools), or none: a failure wakes the ones already asleep and raises. A CUDA graph's
    private pool stays mapped (the graph may use any address its capture handed out, freed ones
    too); sleep_stats() reports its bytes. PyTorch's cached cuBLAS workspaces are freed first.
    Meanwhile no CUDA memory can be allocated on gpumem's pools (an allocation raises with
    "the pool is asleep"); tensors may be freed. Needs VMM segments (the backend's default,
    segments=auto, on a GPU with VMM). torch.cuda.memory_reserved() drops to what is still
    mapped (normally 0); memory_allocated() does not change."""
    tags = _offload_tags(offload)
    C = _ext()
    if not C.installed():
        raise GpumemError("gpumem.torch.sleep: gpumem is not PyTorch's allocator in this process "
                          "(gpumem.torch.enable() first)")
    _clear_blas_workspaces()
    try:
        C.sleep(tags)
    except RuntimeError as e:
        raise GpumemError(str(e)) from None


def sleep_prepare(offload=True):
    """Pin now, in every pool sleep(offload) would put to sleep, the host memory that sleep
    would pin: as many bytes as the tensors it would keep (gm_pool_sleep_prepare), so that the
    sleep only copies. Pinning costs more than the copies (docs/sleep.md): call it once the
    kept tensors exist (after the model and its optimizer state are built). It serves every
    later sleep (one that keeps more pins only the rest) and survives
    torch.cuda.empty_cache(); sleep_prepare(offload=False) frees it."""
    tags = _offload_tags(offload)
    C = _ext()
    if not C.installed():
        raise GpumemError("gpumem.torch.sleep_prepare: gpumem is not PyTorch's allocator in this "
                          "process (gpumem.torch.enable() first)")
    try:
        C.sleep_prepare(tags)
    except RuntimeError as e:
        raise GpumemError(str(e)) from None


def wake():
    """Map device memory under every tensor again, at the same addresses, and copy the kept
    contents back (sleep's counterpart). A failure (the memory is not free on the device yet)
    raises and leaves the pools asleep with their saved contents: call wake() again."""
    C = _ext()
    if not C.installed():
        raise GpumemError("gpumem.torch.wake: gpumem is not PyTorch's allocator in this process")
    _clear_blas_workspaces()  # one the other phase allocated in its MemPool frees that pool
    try:
        C.wake()
    except RuntimeError as e:
        raise GpumemError(str(e)) from None


def sleep_stats(device=0):
    """The device's pool's sleep figures: asleep, sleep_host_bytes (pinned host memory holding
    saved contents, kept for the next sleep), sleep_host_buffers (how many buffers hold it),
    sleep_saved_bytes (of tensors still live), sleeps, wakes, reserved_bytes,
    live_bytes (gm_stats), graph_pools_reserved_bytes (CUDA graphs' private pools on the
    device, which sleep leaves mapped)."""
    C, d = _ext_device(device, "gpumem.torch.sleep_stats")
    return C.sleep_stats(d)


class tag:
    """Name the CUDA tensors this thread allocates inside it, for sleep(offload=[...]):

        with gpumem.torch.tag("weights"):
            model = build_model().cuda()

    also a decorator (@gpumem.torch.tag("kv_cache")). Tags nest (at most 16 deep); a name is
    1..31 characters of letters, digits, '_', '.', '-'. The tag is per thread: memory that
    PyTorch allocates on its other threads (autograd's backward pass runs on a thread of its
    own for CUDA) is "default" unless that thread pushes a tag too."""

    def __init__(self, name):
        if not isinstance(name, str):
            raise TypeError("gpumem.torch.tag: the name is a string, not %r" % (name,))
        self.name = name

    def __enter__(self):
        C = _ext()
        try:
            C.tag_push(self.name)
        except RuntimeError as e:  # a bad name, or nested too deep
            raise ValueError(str(e)) from None
        return self

    def __exit__(self, *exc):
        _ext().tag_pop()
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with tag(self.name):
                return fn(*args, **kwargs)
        return wrapped
