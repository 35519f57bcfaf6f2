#!/usr/bin/env python3
"""CI check of gpumem.torch without a GPU (torch may be missing): the package imports without
torch, says clearly what is missing, the launcher's usage, and torch_ext's list of the
library's C sources (CMakeLists.txt's GM_SOURCES, every file present), read by gm_sources.py
alone (setup.py reads it there too, so the two builds cannot drift apart). The allocator itself
is checked on a GPU by gpu_check_backend.py (docs/torch.md).

    python3 test_torch_package.py ROOT [LIBGPUMEM]

With LIBGPUMEM (the build's shared library), the backend's default settings are parsed by
the library's own gm_config_parse, as the extension parses them.
"""

import ctypes
import importlib.util
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
failed = 0


def check(cond, what):
    global failed
    if not cond:
        failed += 1
        print("FAILED: " + what)


# gpumem.torch on its own: the package `gpumem` (python/gpumem/__init__.py) loads its shared
# object, which only `pip install` builds; this module needs nothing of it until enable().
spec = importlib.util.spec_from_file_location(
    "gpumem_torch_under_test", os.path.join(ROOT, "python", "gpumem", "torch", "__init__.py"))
gmt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gmt)

check("torch" not in sys.modules, "importing gpumem.torch imported torch")
for name in ("enable", "enabled", "stats", "snapshot", "trim", "last_error", "GpumemError"):
    check(hasattr(gmt, name), "gpumem.torch lacks " + name)
have_torch = importlib.util.find_spec("torch") is not None
if not have_torch:
    try:
        gmt.enable()
        check(False, "enable() without the extension did not fail")
    except gmt.GpumemError as e:
        msg = str(e)
        check("PyTorch" in msg and "not installed" in msg, "unclear message: " + msg)
    check(gmt.enabled() is False, "enabled() without the extension")

# sleep(offload): what it asks the library to keep (docs/sleep.md), and the refusals.
for name in ("sleep", "wake", "tag"):
    check(hasattr(gmt, name) and name in gmt.__all__, "gpumem.torch lacks " + name)
for offload, want in ((True, "*"), (False, ""), (None, ""), (["weights", "optimizer"], "weights,optimizer"),
                      (("weights",), "weights"), ("kv_cache", "kv_cache"), (iter(["a"]), "a"), ([], "")):
    got = gmt._offload_tags(offload)
    check(got == want, "sleep(offload=%r) keeps %r, not %r" % (offload, got, want))
for bad, exc in ((["a,b"], ValueError), ([""], ValueError), (["*"], ValueError), ([3], ValueError),
                 (7, TypeError)):
    try:
        gmt._offload_tags(bad)
        check(False, "sleep(offload=%r) accepted" % (bad,))
    except exc:
        pass
if not have_torch:
    for call in (lambda: gmt.sleep(), gmt.wake, lambda: gmt.tag("weights").__enter__()):
        try:
            call()
            check(False, "sleep/wake/tag without the extension did not fail")
        except gmt.GpumemError as e:
            check("not installed" in str(e), "unclear message: %s" % e)
try:
    gmt.tag(3)
    check(False, "tag(3) accepted")
except TypeError:
    pass

# Arguments of the wrong kind are refused before torch is needed, whether or not it is there:
# settings text that is not a str, a trace= folder that does not exist, a device that is no
# CUDA ordinal, a byte count that is no int >= 0.
refusals = (
    ("enable(5)", lambda: gmt.enable(5), TypeError, "settings text"),
    ("enable(b'x')", lambda: gmt.enable(b"x"), TypeError, "not bytes"),
    ("effective_conf(3)", lambda: gmt.effective_conf(3), TypeError, "not int"),
    ("enable(trace=missing)", lambda: gmt.enable("trace=/nonexistent-gpumem-dir/t.csv.gz"),
     ValueError, "'/nonexistent-gpumem-dir' does not exist"),
    ("stats(1.5)", lambda: gmt.stats(1.5), TypeError, "not float"),
    ("stats(True)", lambda: gmt.stats(True), TypeError, "not bool"),
    ("stats(-1)", lambda: gmt.stats(-1), ValueError, ">= 0"),
    ("snapshot('cpu')", lambda: gmt.snapshot("cpu"), ValueError, "not a CUDA device"),
    ("summary('cuda:x')", lambda: gmt.summary("cuda:x"), ValueError, "not a CUDA device"),
    ("last_error(None)", lambda: gmt.last_error(None), TypeError, "not NoneType"),
    ("sleep_stats([0])", lambda: gmt.sleep_stats([0]), TypeError, "not list"),
    ("trim(-1)", lambda: gmt.trim(-1), ValueError, ">= 0 bytes"),
    ("trim(1.0)", lambda: gmt.trim(1.0), TypeError, "not float"),
    ("trim(0, device=-2)", lambda: gmt.trim(0, device=-2), ValueError, ">= 0"))
torch_loaded = "torch" in sys.modules
for what, call, exc, words in refusals:
    try:
        call()
        check(False, what + " accepted")
    except exc as e:
        check(words in str(e) and str(e).startswith("gpumem.torch."),
              "%s: unclear message: %s" % (what, e))
    except Exception as e:
        check(False, "%s raised %s, not %s: %s" % (what, type(e).__name__, exc.__name__, e))
check(torch_loaded or "torch" not in sys.modules, "a refusal imported torch")

# The settings enable() runs with: the backend's defaults, then the user's (which win).
saved = os.environ.pop("GPUMEM_CONF", None)
check(gmt.effective_conf() == gmt.DEFAULT_CONF, "no settings: %r" % gmt.effective_conf())
check(gmt.effective_conf(" reserve_limit=1GiB ") == gmt.DEFAULT_CONF + ",reserve_limit=1GiB",
      "user settings after the defaults: %r" % gmt.effective_conf("reserve_limit=1GiB"))
os.environ["GPUMEM_CONF"] = "segments=plain"
check(gmt.effective_conf() == gmt.DEFAULT_CONF + ",segments=plain", "$GPUMEM_CONF not read")
check(gmt.effective_conf("") == gmt.DEFAULT_CONF, "an explicit empty conf still read $GPUMEM_CONF")
os.environ.pop("GPUMEM_CONF")
if saved is not None:
    os.environ["GPUMEM_CONF"] = saved
if len(sys.argv) > 2:  # the library parses them (gm_config is plain C: a generous buffer)
    lib = ctypes.CDLL(sys.argv[2])
    lib.gm_config_parse.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gm_config_parse.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(1 << 16)
    for text in (gmt.DEFAULT_CONF, gmt.effective_conf(
            "segments=plain,cache_disable=0,vmm_mapped_first=0,vmm_unmap_thread=0,vmm_plan=0")):
        check(lib.gm_config_parse(buf, text.encode()) == 0, "gm_config_parse rejects %r" % text)
    check(lib.gm_config_parse(buf, gmt.effective_conf("segments=sideways").encode()) != 0,
          "a bad user setting is accepted")

launcher = os.path.join(ROOT, "python", "gpumem", "torch", "__main__.py")
p = subprocess.run([sys.executable, launcher, "--help"], capture_output=True, text=True)
check(p.returncode == 0 and "usage: python -m gpumem.torch" in p.stdout, "--help: %r" % (p,))
p = subprocess.run([sys.executable, launcher], capture_output=True, text=True)
check(p.returncode == 2 and "usage" in p.stdout, "no arguments: %r" % (p,))

sys.path.insert(0, os.path.join(ROOT, "integrations", "torch"))
import torch_ext  # noqa: E402

srcs = torch_ext.c_sources(ROOT)
with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    body = f.read().split("set(GM_SOURCES", 1)[1].split(")", 1)[0]
want = [os.path.join(ROOT, t) for t in body.split() if t.endswith(".c")]
check(srcs == want, "torch_ext.c_sources differs from GM_SOURCES")
check(all(os.path.isfile(s) for s in srcs), "a C source is missing")
check("-std=c11" in torch_ext.C_FLAGS, "C sources not compiled as C11")
for recipe in ("setup.py", os.path.join("integrations", "torch", "torch_ext.py")):
    with open(os.path.join(ROOT, recipe)) as f:
        text = f.read()
    check("GM_SOURCES" not in text or "gm_sources" in text, recipe + " does not use gm_sources.py")
    check("set(GM_SOURCES" not in text, recipe + " parses CMakeLists.txt itself")
spec = importlib.util.spec_from_file_location("gm_sources", os.path.join(ROOT, "gm_sources.py"))
gms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gms)
with tempfile.TemporaryDirectory() as d:  # a listed file that is missing is named
    with open(os.path.join(d, "CMakeLists.txt"), "w") as f:
        f.write("set(GM_SOURCES\n  src/gone.c\n)\n")
    try:
        gms.library_sources(d)
        check(False, "gm_sources accepted a missing source")
    except RuntimeError as e:
        check("src/gone.c" in str(e), "unclear message: %s" % e)
check(torch_ext.EXT_NAME == "gpumem.torch._C", "extension name")

# Without torch, what needs it (the extension's import, enable() with it) did not run: ctest
# reports the test as skipped (exit 77), not passed; a failure above still fails it.
if failed:
    print("FAILED (torch %s)" % ("present" if have_torch else "absent"))
    sys.exit(1)
if not have_torch:
    print("skipped: torch is not installed (the checks that need no torch passed)")
    sys.exit(77)
print("ok (torch present)")
sys.exit(0)
