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


# The command-line tool's trace reader, replay engine and JSON report: gpumem.replay is the
# tool's replay (_glue.c). The reader needs zlib.
CLI_SOURCES = ["tools/gpumem/" + f for f in ("trace.c", "replay.c", "settings.c", "report_json.c")]
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


def torch_extension():
    """(Extension, build_ext class) of gpumem.torch, or None when torch is not importable (or
    GPUMEM_NO_TORCH is set: a build of the core and CuPy parts only)."""
    if os.environ.get("GPUMEM_NO_TORCH") or importlib.util.find_spec("torch") is None:
        return None
    spec = importlib.util.spec_from_file_location(
        "gpumem_torch_ext", os.path.join(ROOT, "integrations", "torch", "torch_ext.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.extension(ROOT)


ext_modules, base = [core], build_ext
torch_ext = torch_extension()
if torch_ext:
    ext_modules.append(torch_ext[0])
    base = torch_ext[1]


class BuildExt(base):
    """Compiles the C sources in parallel (the library is ~20 files)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


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
