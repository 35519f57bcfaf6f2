"""The setuptools extension ``gpumem.torch._C``: gpumem's PyTorch allocator backend
(integrations/torch/gm_torch_backend.cpp over libgpumem; docs/torch.md).

The root setup.py calls ``extension(root)`` only when torch is importable:

    ext, build_ext = torch_ext.extension(root)
    setup(..., ext_modules=[ext], cmdclass={"build_ext": build_ext})

so that ``pip install --no-build-isolation .`` builds it against the installed torch, offline.
The library's C sources (src/**/*.c) are compiled as C11 by a plain C compiler (never as C++,
never by torch's ninja route), archived, and linked into the extension with their symbols
hidden (-Wl,--exclude-libs,ALL), so this copy of gpumem cannot clash with another one loaded
in the same process (libgpumem.so of gpumem.cupy, say).
"""

import importlib.util
import os
import re

EXT_NAME = "gpumem.torch._C"
C_FLAGS = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-pthread"]
C_MACROS = [("_GNU_SOURCE", None), ("GM_DEBUG", "1")]
CXX_FLAGS = ["-O2", "-fvisibility=hidden"]  # gm_torch_backend.cpp's own (torch adds -std=, ...)

# The PyTorch releases the backend is built and checked against (docs/torch.md, "Versions"):
# tests/torch_compile_check.py compiles it against the headers of each, a GPU run checks it.
# Older releases lack interfaces it needs and are not built; newer ones are tried (the feature
# scan below adapts to what their headers declare) and, if they fail, say so.
TORCH_MIN = (2, 4)
TORCH_MAX = (2, 15)
SUPPORTED = "PyTorch %d.%d to %d.%d" % (TORCH_MIN + TORCH_MAX)


def torch_version_tuple(version):
    """(major, minor) of a torch version string ("2.15.0+cu130" -> (2, 15)), None if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


# ---------------------------------------------------------------------------------------------
# Feature scan: what the installed torch's allocator interface declares, read from its headers
# (not from its version number), as GM_TORCH_* macros for gm_torch_backend.cpp's #if blocks.
# PyTorch adds, renames and re-signs CUDAAllocator's methods from release to release (2.4 ->
# 2.15: docs/torch.md's table); each macro names one such difference.

HEADERS = {"cca": "c10/cuda/CUDACachingAllocator.h", "cda": "c10/core/CachingDeviceAllocator.h",
           "alloc": "c10/core/Allocator.h"}

# Every pure virtual method of CUDAAllocator and its bases that the backend implements in some
# release. A header that declares another one is newer than the backend: the build would fail on
# an abstract class, and the scan names the method beforehand (unknown_pure_virtuals).
KNOWN_PURE_VIRTUALS = {
    "allocate", "raw_deleter", "copy_data", "raw_alloc", "raw_alloc_with_stream", "raw_delete",
    "init", "initialized", "getMemoryFraction", "setMemoryFraction", "getExpandableSegmentSizes",
    "enable", "isEnabled", "emptyCache", "cacheInfo", "getBaseAllocation", "recordStream",
    "getDeviceStats", "resetAccumulatedStats", "resetPeakStats", "snapshot", "beginAllocateToPool",
    "endAllocateToPool", "releasePool", "shareIpcHandle", "getIpcDevPtr", "recordHistory",
    "attachOutOfMemoryObserver", "attachOomRejectionObserver", "attachAllocatorTraceTracker",
    "enablePeerAccess", "memcpyAsync", "getCheckpointState", "setCheckpointPoolState", "name",
}


class HeaderError(RuntimeError):
    """torch's headers are missing or not what the scan understands."""


def _normalize(text):
    """C++ text without comments, whitespace collapsed, none around punctuation."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"\s+", " ", text)
    return re.sub(r" ?([(){}<>,;:*&=]) ?", r"\1", text)


def _body(text, head):
    """The {...} body after the first match of regex `head` in normalized text, or ""."""
    m = re.search(head, text)
    if not m:
        return ""
    i = text.find("{", m.end() - 1)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return text[i + 1:]


def _params(body, method):
    """Parameter lists (one string each) of `method`'s declarations in a class body."""
    out = []
    for m in re.finditer(r"\b%s\(" % re.escape(method), body):
        depth, j = 1, m.end()
        while j < len(body) and depth:
            depth += {"(": 1, ")": -1}.get(body[j], 0)
            j += 1
        out.append(body[m.end():j - 1])
    return out


def _split_params(params):
    parts, depth, cur = [], 0, ""
    for c in params:
        depth += {"<": 1, "(": 1, "{": 1, ">": -1, ")": -1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return [p for p in parts + [cur] if p]


def read_headers(include_dirs):
    """{"cca": text, "cda": text, "alloc": text} from the first include dir holding each
    (normalized; "" for a header this release does not have). HeaderError without
    CUDACachingAllocator.h: torch without its CUDA headers."""
    texts = {}
    for key, rel in HEADERS.items():
        texts[key] = ""
        for d in include_dirs:
            path = os.path.join(d, rel)
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts[key] = _normalize(f.read())
                break
    if not texts["cca"]:
        raise HeaderError("torch's headers have no %s (searched %s): this torch has no CUDA "
                          "allocator interface to build against" % (HEADERS["cca"], ", ".join(include_dirs)))
    return texts


def header_features(include_dirs):
    """[(macro, value)] for gm_torch_backend.cpp, from the headers under include_dirs (torch's
    include paths). Raises HeaderError when the CUDAAllocator class cannot be found."""
    t = read_headers(include_dirs)
    cls = _body(t["cca"], r"class (?:C10_CUDA_API )?CUDAAllocator:public")
    if not cls:
        raise HeaderError("%s declares no class CUDAAllocator" % HEADERS["cca"])
    # Since 2.9 some methods are declared by the base class c10::DeviceAllocator.
    base = _body(t["cda"], r"struct (?:C10_API )?DeviceAllocator:public")
    both = cls + " " + base
    stats = _body(t["cda"] + t["cca"], r"struct (?:C10_API )?DeviceStats\{")
    trace = _body(t["cda"] + t["cca"], r"struct (?:C10_API )?TraceEntry\{")

    def has(method, where=cls):
        return bool(_params(where, method))

    def nparams(method, where=cls):
        return max([len(_split_params(p)) for p in _params(where, method)] or [0])

    create = _params(cls, "createOrIncrefPool")
    stat_ns = "c10::cuda::CUDACachingAllocator"
    for key, ns in (("alloc", "c10::CachingAllocator"), ("cda", "c10::CachingDeviceAllocator")):
        if re.search(r"struct (?:C10_API )?Stat\{", t[key]):
            stat_ns = ns
    f = [
        # 2.5: IPC through a ShareableHandle (pure virtual)
        ("GM_TORCH_HAS_SHARE_IPC_HANDLE", has("shareIpcHandle")),
        # 2.6: getMemoryFraction, enable/isEnabled (pure virtual); getPoolUseCount
        ("GM_TORCH_HAS_GET_MEMORY_FRACTION", has("getMemoryFraction")),
        ("GM_TORCH_HAS_ENABLE", has("enable") and has("isEnabled")),
        ("GM_TORCH_HAS_GET_POOL_USE_COUNT", has("getPoolUseCount")),
        # 2.6-2.7: MemPool's pools made by ensureExistsAndIncrefPool; 2.8: createOrIncrefPool
        # with the MemPool's allocator as a raw pointer, 2.11: as a shared_ptr
        ("GM_TORCH_HAS_ENSURE_EXISTS_AND_INCREF_POOL", has("ensureExistsAndIncrefPool")),
        ("GM_TORCH_HAS_CREATE_OR_INCREF_POOL", bool(create)),
        ("GM_TORCH_HAS_CREATE_OR_INCREF_POOL_SHARED_PTR",
         any("std::shared_ptr<CUDAAllocator>" in p for p in create)),
        # 2.8: setUseOnOOM(device, id); 2.11: setUseOnOOM(device, id, bool); 2.10: setNoSplit
        ("GM_TORCH_HAS_SET_USE_ON_OOM", has("setUseOnOOM")),
        ("GM_TORCH_HAS_SET_USE_ON_OOM_BOOL", nparams("setUseOnOOM") >= 3),
        ("GM_TORCH_HAS_SET_NO_SPLIT", has("setNoSplit")),
        # 2.8: emptyCache(mempool_id), snapshot(mempool_id); 2.11: snapshot(id, include_traces)
        ("GM_TORCH_HAS_EMPTY_CACHE_MEMPOOL", nparams("emptyCache", both) >= 1),
        ("GM_TORCH_HAS_SNAPSHOT_MEMPOOL", nparams("snapshot") >= 1),
        ("GM_TORCH_HAS_SNAPSHOT_INCLUDE_TRACES", nparams("snapshot") >= 2),
        # recordHistory(enabled, recorder, max_entries, when) + clearHistory (2.8) +
        # skip_actions (2.11)
        ("GM_TORCH_HAS_RECORD_HISTORY_CLEAR", nparams("recordHistory") >= 5),
        ("GM_TORCH_HAS_RECORD_HISTORY_SKIP_ACTIONS", nparams("recordHistory") >= 6),
        # 2.10: getExpandableSegmentSizes (pure virtual)
        ("GM_TORCH_HAS_EXPANDABLE_SEGMENT_SIZES", has("getExpandableSegmentSizes")),
        # 2.12: getContextForPointer; attachOomRejectionObserver (pure virtual) and
        # DeviceStats::num_oom_rejections
        ("GM_TORCH_HAS_CONTEXT_FOR_POINTER", has("getContextForPointer")),
        ("GM_TORCH_HAS_OOM_REJECTION_OBSERVER", has("attachOomRejectionObserver")),
        ("GM_TORCH_HAS_NUM_OOM_REJECTIONS", bool(re.search(r"\bnum_oom_rejections\b", stats))),
        # 2.8: a trace entry names its mempool (a constructor argument)
        ("GM_TORCH_HAS_TRACE_ENTRY_MEMPOOL", any("MempoolId_t" in p for p in _params(trace, "TraceEntry"))),
    ]
    return [(k, "1" if v else "0") for k, v in f] + [("GM_TORCH_STAT_NS", stat_ns),
                                                     ("GM_TORCH_FEATURES", "1")]


def unknown_pure_virtuals(include_dirs):
    """Pure virtual methods of CUDAAllocator (and its bases' headers) that the backend does not
    know: a torch newer than the backend; its build would fail on an abstract class."""
    t = read_headers(include_dirs)
    bodies = [_body(t["cca"], r"class (?:C10_CUDA_API )?CUDAAllocator:public"),
              _body(t["cda"], r"struct (?:C10_API )?DeviceAllocator:public"),
              _body(t["alloc"], r"struct (?:C10_API )?Allocator\{")]
    found = set(re.findall(r"(\w+)\([^;{]*\)(?:const)?(?:noexcept)?=0;", " ".join(bodies)))
    return sorted(found - KNOWN_PURE_VIRTUALS)


def torch_include_paths():
    """The installed torch's include dirs (torch.utils.cpp_extension.include_paths, CPU ones)."""
    from torch.utils.cpp_extension import include_paths
    return include_paths()


def c_sources(root):
    """The library's C sources, absolute: CMakeLists.txt's GM_SOURCES (the one list of what the
    library is), read by the checkout's gm_sources.py, as setup.py reads them."""
    path = os.path.join(root, "gm_sources.py")
    spec = importlib.util.spec_from_file_location("gm_sources", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [os.path.join(root, s) for s in mod.library_sources(root)]


def _rel(path):
    """setuptools wants source paths relative to the directory setup.py runs in."""
    rel = os.path.relpath(path, os.getcwd())
    return path if rel.startswith("..") else rel


def extension(root):
    """(Extension, build_ext class) for gpumem.torch._C. `root`: the gpumem checkout.
    Raises HeaderError when the installed torch's allocator headers are missing or unreadable,
    OSError when torch finds no CUDA toolkit (CUDA_HOME)."""
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    root = os.path.abspath(root)
    ext = CUDAExtension(
        name=EXT_NAME,
        sources=[_rel(os.path.join(root, "integrations", "torch", "gm_torch_backend.cpp"))],
        include_dirs=[os.path.join(root, "include")],
        define_macros=header_features(torch_include_paths()),
        extra_compile_args={"cxx": list(CXX_FLAGS), "nvcc": []},
        libraries=["dl", "m"],
    )
    ext._gpumem_root = root

    # No ninja: with ninja, torch compiles every extension's sources with the C++ compiler, and
    # the root setup.py builds the C extension gpumem._gpumem with this class too.
    class GpumemBuildExt(BuildExtension.with_options(use_ninja=False)):
        """BuildExtension that first builds libgpumem (C11, static, hidden) for our extension."""

        def build_extension(self, e):
            if getattr(e, "_gpumem_root", None) and not getattr(e, "_gpumem_linked", False):
                e.extra_link_args = list(e.extra_link_args or []) + [
                    self._build_c_library(e._gpumem_root), "-Wl,--exclude-libs,ALL", "-pthread"]
                e._gpumem_linked = True
            super().build_extension(e)

        def _build_c_library(self, src_root):
            from setuptools._distutils.ccompiler import new_compiler
            from setuptools._distutils.sysconfig import customize_compiler

            cc = new_compiler(verbose=self.verbose, force=self.force)
            customize_compiler(cc)
            out = os.path.join(os.path.abspath(self.build_temp), "gpumem_c")
            inc = [os.path.join(src_root, d) for d in
                   ("include", "src", os.path.join("src", "backend"), os.path.join("src", "strategy"))]
            from concurrent.futures import ThreadPoolExecutor

            def one(src):  # one file per call, so that the files compile in parallel
                return cc.compile([src], output_dir=out, macros=C_MACROS, include_dirs=inc,
                                  extra_postargs=C_FLAGS)
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                objs = [o for got in pool.map(one, c_sources(src_root)) for o in got]
            cc.create_static_lib(objs, "gpumem_torch_c", output_dir=out)
            return os.path.join(out, cc.library_filename("gpumem_torch_c"))

    return ext, GpumemBuildExt
