"""Build and install the Python package `gpumem` (docs/python.md):

    pip install --no-build-isolation .

- gpumem: ctypes bindings over the C library, which is compiled here with the package's C glue
  (python/gpumem/_glue.c, _cupy.c) into one shared object, gpumem/_gpumem*.so: a C compiler is
  all it needs (no cmake). The library's sources are CMakeLists.txt's GM_SOURCES, read by
  gm_sources.py (integrations/torch/torch_ext.py reads them there too).
- gpumem.cupy: CuPy's allocator hook (it imports CuPy only when used).
- gpumem.torch: PyTorch's allocator backend, with its C++ extension built by
  integrations/torch/torch_ext.py, only when torch is importable here.
Build files go to build-python/ (GPUMEM_BUILD_BASE overrides it), never to build/.
"""
import importlib.util
import json
import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
os.chdir(ROOT)
BUILD_BASE = os.environ.get("GPUMEM_BUILD_BASE", "build-python")
os.makedirs(BUILD_BASE, exist_ok=True)
sys.path.insert(0, ROOT)  # gm_sources.py: CMakeLists.txt's GM_SOURCES, torch_ext.py's too
from gm_sources import library_sources  # noqa: E402


def version():
    with open(os.path.join("include", "gpumem.h")) as f:
        return re.search(r'#define GM_VERSION_STRING "([^"]+)"', f.read()).group(1)


# The command-line tool's trace reader, replay engine, backend registry and JSON report:
# gpumem.replay is the tool's replay (_glue.c). The reader needs zlib.
CLI_SOURCES = ["tools/gpumem/" + f
               for f in ("trace.c", "replay.c", "backends.c", "settings.c", "report_json.c")]
core = Extension(
    "gpumem._gpumem",
    sources=library_sources(ROOT) + CLI_SOURCES + ["python/gpumem/_glue.c",
                                                   "python/gpumem/_cupy.c"],
    include_dirs=["include", "src", "src/backend", "src/strategy", "tools/gpumem"],
    define_macros=[("_GNU_SOURCE", None), ("GM_DEBUG", "1")],
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-pthread"],
    extra_link_args=["-pthread"],
    libraries=["z", "dl", "m"],
)


spec = importlib.util.spec_from_file_location(
    "gpumem_torch_ext", os.path.join(ROOT, "integrations", "torch", "torch_ext.py"))
TORCH_EXT = importlib.util.module_from_spec(spec)
spec.loader.exec_module(TORCH_EXT)
# Why gpumem.torch._C was not built, if it was not: written to gpumem/torch/_build_info.json,
# which gpumem.torch.enable() reads to say so (docs/torch.md, "Build").
BUILD_INFO = {"built": False, "torch": None, "supported": TORCH_EXT.SUPPORTED, "reason": None}


def not_built(reason):
    BUILD_INFO["reason"] = reason
    sys.stderr.write("gpumem: installing without the PyTorch backend (gpumem.torch._C): %s. "
                     "It builds with %s and the CUDA toolkit; set GPUMEM_NO_TORCH=1 to build "
                     "without it silently.\n" % (reason, TORCH_EXT.SUPPORTED))


def torch_extension():
    """(Extension, build_ext class) of gpumem.torch, or None when it cannot be built here (no
    torch, an unsupported one, no CUDA toolkit; BUILD_INFO says why) or GPUMEM_NO_TORCH is set."""
    if os.environ.get("GPUMEM_NO_TORCH"):
        BUILD_INFO["reason"] = "GPUMEM_NO_TORCH was set when gpumem was installed"
        return None
    if importlib.util.find_spec("torch") is None:
        BUILD_INFO["reason"] = "torch was not installed when gpumem was installed"
        return None
    try:
        import torch
        BUILD_INFO["torch"] = torch.__version__
        ver = TORCH_EXT.torch_version_tuple(torch.__version__)
        if ver is None or ver < TORCH_EXT.TORCH_MIN:
            not_built("torch %s is older than %s" % (torch.__version__, TORCH_EXT.SUPPORTED))
            return None
        return TORCH_EXT.extension(ROOT)
    except Exception as e:  # a broken torch, no CUDA_HOME, headers the scan cannot read
        not_built("torch %s: %s: %s" % (BUILD_INFO["torch"], type(e).__name__, e))
        return None


ext_modules, base = [core], build_ext
torch_ext = torch_extension()
if torch_ext:
    ext_modules.append(torch_ext[0])
    base = torch_ext[1]


class BuildExt(base):
    """Compiles the C sources in parallel (the library is ~20 files). A failure of the PyTorch
    extension does not fail the install: the core package installs, and _build_info.json says
    why gpumem.torch has no backend."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext):
        if ext.name != TORCH_EXT.EXT_NAME:
            return super().build_extension(ext)
        try:
            super().build_extension(ext)
            BUILD_INFO.update(built=True, reason=None)
        except Exception as e:  # compile or link error: the compiler's text is above
            why = "compiling it against torch %s failed (%s)" % (BUILD_INFO["torch"], e)
            try:
                unknown = TORCH_EXT.unknown_pure_virtuals(TORCH_EXT.torch_include_paths())
                if unknown:
                    why += "; this torch declares allocator methods gpumem does not know: " + ", ".join(unknown)
            except Exception:
                pass
            ver = TORCH_EXT.torch_version_tuple(BUILD_INFO["torch"])
            if ver and ver > TORCH_EXT.TORCH_MAX:
                why += "; it is newer than " + TORCH_EXT.SUPPORTED
            not_built(why)
            self._torch_failed = ext

    def run(self):
        super().run()
        if getattr(self, "_torch_failed", None) in self.extensions:
            self.extensions.remove(self._torch_failed)
        out = os.path.join(self.build_lib, "gpumem", "torch")
        if os.path.isdir(out):
            with open(os.path.join(out, "_build_info.json"), "w") as f:
                json.dump(BUILD_INFO, f, indent=1)


packages = ["gpumem"]
if os.path.isfile(os.path.join("python", "gpumem", "torch", "__init__.py")):
    packages.append("gpumem.torch")

setup(
    version=version(),
    packages=packages,
    package_dir={"": "python"},
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExt},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
