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

EXT_NAME = "gpumem.torch._C"
C_FLAGS = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-pthread"]
C_MACROS = [("_GNU_SOURCE", None), ("GM_DEBUG", "1")]


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
    """(Extension, build_ext class) for gpumem.torch._C. `root`: the gpumem checkout."""
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    root = os.path.abspath(root)
    ext = CUDAExtension(
        name=EXT_NAME,
        sources=[_rel(os.path.join(root, "integrations", "torch", "gm_torch_backend.cpp"))],
        include_dirs=[os.path.join(root, "include")],
        extra_compile_args={"cxx": ["-O2", "-fvisibility=hidden"], "nvcc": []},
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
