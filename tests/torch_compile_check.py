#!/usr/bin/env python3
"""Compile gpumem's PyTorch backend against the headers of given torch releases, without torch
installed and without a GPU (docs/testing.md, "PyTorch versions").

    python3 tests/torch_compile_check.py [--cache DIR] [--jobs N] [--offline] VERSION...
    python3 tests/torch_compile_check.py 2.4.0 2.15.0        # what .ci/run checks

For each version: the torch wheel is fetched with `pip download` (any CPython wheel for
x86-64 Linux: the headers are the same in all), only torch/include/ and
torch/utils/cpp_extension.py are kept, and the wheel is deleted (a wheel is 0.5-0.9 GB, its
headers 50-63 MB). They are cached in DIR (default $GPUMEM_TORCH_CACHE, else
$XDG_CACHE_HOME/gpumem-torch, else ~/.cache/gpumem-torch), one folder per version, so a second
run downloads nothing. Then integrations/torch/gm_torch_backend.cpp is compiled with
-fsyntax-only, with the GM_TORCH_* macros torch_ext.header_features() derives from those
headers (the scan setup.py's build uses), the C++ standard that release's cpp_extension passes,
the CUDA toolkit's headers ($CUDA_HOME, else /usr/local/cuda) and this Python's Python.h.

Exit 0 when every version compiles; 1 when one does not (its errors are printed); 2 when a
version cannot be fetched or a prerequisite (C++ compiler, CUDA headers) is missing.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "integrations", "torch"))
import torch_ext  # noqa: E402

# Any of these wheels carries the same headers; pinning the tags lets a Python without a wheel
# of that release (3.13 for torch 2.4) still fetch it.
PIP_TAGS = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"] + [
    a for p in ("manylinux1_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64",
                "manylinux_2_28_x86_64") for a in ("--platform", p)]
KEEP = ("torch/include/", "torch/utils/cpp_extension.py")


def cache_dir(arg):
    if arg:
        return arg
    if os.environ.get("GPUMEM_TORCH_CACHE"):
        return os.environ["GPUMEM_TORCH_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpumem-torch")


def fetch(version, cache, offline):
    """The folder holding torch/include of `version`, fetched into the cache if needed.
    Returns (folder, note) or raises RuntimeError."""
    dest = os.path.join(cache, version)
    if os.path.isfile(os.path.join(dest, ".complete")):
        return dest, "cached"
    if offline:
        raise RuntimeError("torch %s is not in the cache %s (--offline)" % (version, cache))
    os.makedirs(cache, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
               "--only-binary=:all:", "--disable-pip-version-check", "--quiet", "-d", tmp,
               "torch==" + version] + PIP_TAGS
        p = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if p.returncode != 0 or not wheels:
            raise RuntimeError("pip download torch==%s failed:\n%s" % (version, (p.stdout + p.stderr)[-2000:]))
        wheel = os.path.join(tmp, wheels[0])
        size = os.path.getsize(wheel)
        t1 = time.time()
        part = os.path.join(tmp, "headers")
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(KEEP):
                    z.extract(name, part)
        os.remove(wheel)
        if not os.path.isfile(os.path.join(part, "torch", "include", torch_ext.HEADERS["cca"])):
            raise RuntimeError("the torch %s wheel has no %s" % (version, torch_ext.HEADERS["cca"]))
        open(os.path.join(part, ".complete"), "w").close()
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(part, dest)
    return dest, "downloaded %.0f MB in %.1f s, headers extracted in %.1f s" % (
        size / 1e6, t1 - t0, time.time() - t1)


def cxx_standard(folder):
    """The -std= that release's torch.utils.cpp_extension passes to C++ extensions."""
    path = os.path.join(folder, "torch", "utils", "cpp_extension.py")
    with open(path) as f:
        m = re.search(r"cpp_flag_prefix \+ '(c\+\+\d+)'", f.read())
    return m.group(1) if m else "c++17"


def cuda_include():
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")):
            return os.path.join(home, "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include")
        if os.path.isfile(os.path.join(inc, "cuda_runtime_api.h")):
            return inc
    return None


def compile_one(version, folder, cxx, cuda_inc):
    """(ok, seconds, text): the backend compiled against `folder`'s headers."""
    inc = os.path.join(folder, "torch", "include")
    dirs = [inc, os.path.join(inc, "torch", "csrc", "api", "include")]
    macros = torch_ext.header_features(dirs)
    cmd = [cxx, "-std=" + cxx_standard(folder), "-fsyntax-only", "-DTORCH_EXTENSION_NAME=_C",
           "-DTORCH_API_INCLUDE_EXTENSION_H"] + torch_ext.CXX_FLAGS
    cmd += ["-D%s=%s" % kv for kv in macros]
    cmd += ["-I" + d for d in [os.path.join(ROOT, "include")] + dirs +
            [cuda_inc, sysconfig.get_paths()["include"]]]
    cmd.append(os.path.join(ROOT, "integrations", "torch", "gm_torch_backend.cpp"))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    text = "features: " + " ".join("%s=%s" % kv for kv in macros if kv[0] != "GM_TORCH_FEATURES")
    unknown = torch_ext.unknown_pure_virtuals(dirs)
    if unknown:
        text += "\npure virtual methods the backend does not know: " + ", ".join(unknown)
    if p.returncode != 0:
        errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
        text += "\n" + "\n".join(errors[:40] or p.stderr.splitlines()[-40:])
    return p.returncode == 0, time.time() - t0, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="+", metavar="VERSION", help="torch releases, e.g. 2.4.0 2.15.0")
    ap.add_argument("--cache", help="where the headers are kept (see above)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compilers at once")
    ap.add_argument("--offline", action="store_true", help="use the cache only, never pip")
    args = ap.parse_args()
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    cuda_inc = cuda_include()
    if not cxx or not cuda_inc:
        print("torch_compile_check: needs a C++ compiler ($CXX, c++) and the CUDA toolkit's headers "
              "($CUDA_HOME/include/cuda_runtime_api.h); found compiler %s, CUDA headers %s" % (cxx, cuda_inc))
        return 2
    cache = cache_dir(args.cache)
    folders = {}
    for v in args.versions:  # one download at a time: each is hundreds of MB
        try:
            folders[v], note = fetch(v, cache, args.offline)
        except RuntimeError as e:
            print("torch %s: %s" % (v, e))
            return 2
        print("torch %s: headers %s (%s)" % (v, note, folders[v]), flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda v: (v,) + compile_one(v, folders[v], cxx, cuda_inc), args.versions))
    failed = 0
    for v, ok, secs, text in results:
        print("torch %s: %s in %.1f s\n  %s" % (v, "compiles" if ok else "FAILED", secs,
                                                text.replace("\n", "\n  ")))
        failed += not ok
    print("%d of %d torch versions compile" % (len(results) - failed, len(results)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
