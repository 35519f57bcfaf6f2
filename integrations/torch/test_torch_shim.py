"""libgpumem_torch.so and gpumem.torch on the simulated GPU: no GPU, no PyTorch, stdlib only.

usage: test_torch_shim.py LIBRARY PACKAGE_PARENT

LIBRARY is libgpumem_torch.so; PACKAGE_PARENT holds the gpumem package (the build's copy, with
the library beside it). Each configuration runs in its own process (the shim reads GPUMEM_CONF
once), this script calling itself with --case NAME. Prints "N passed, M failed".
"""
import ctypes
import json
import os
import subprocess
import sys
import threading

LIB, PKG = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
ALIGN = 512
GiB = 1 << 30
MiB = 1 << 20

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, flush=True)


def load():
    """The shim, loaded by gpumem.torch.library (which declares its C signatures) from LIB."""
    sys.path.insert(0, PKG)
    import gpumem.torch as gmt
    return gmt.library(LIB)


def err(lib, device=0):
    return lib.gm_torch_last_error(device).decode()


def stats(lib, device=0):
    buf = ctypes.create_string_buffer(1 << 16)
    n = lib.gm_torch_stats_json(device, buf, len(buf))
    assert 0 < n < len(buf), (n, err(lib, device))
    return json.loads(buf.value.decode())


def snapshot(lib, device=0):
    out = ctypes.c_void_p()
    assert lib.gm_torch_snapshot(device, ctypes.byref(out)) == 0, err(lib, device)
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.gm_torch_string_free(out)


# --- cases, each run in a fresh process ------------------------------------------------------

def case_basic():
    """GPUMEM_CONF=backend=sim: alloc, free, 0 bytes, out of memory, stats, snapshot, trim."""
    lib = load()
    sizes = [1, 1000, 4096, 100000, 3 * MiB + 17, 40 * MiB]
    ptrs = [lib.gm_torch_alloc(s, 0, None) for s in sizes]
    check(all(p for p in ptrs), "alloc returns non-NULL pointers: %r (%s)" % (ptrs, err(lib)))
    check(all(p % ALIGN == 0 for p in ptrs if p), "pointers are %d-aligned: %r" % (ALIGN, ptrs))
    check(len(set(ptrs)) == len(ptrs), "pointers are distinct")
    st = stats(lib)
    check(st["backend"] == "sim" and st["device"] == 0, "stats name the sim backend, device 0")
    check(st["live_bytes"] == sum(sizes), "stats live_bytes %d == %d" % (st["live_bytes"],
                                                                          sum(sizes)))
    check(st["live_blocks"] == len(sizes), "stats live_blocks")
    check(st["reserved_bytes"] >= sum(sizes) and st["segments"] >= 1, "stats reserved, segments")
    # the shim's default growth is exact (PyTorch's segment sizes): one 2 MiB small segment, one
    # 20 MiB medium segment, one of 40 MiB; geometric growth would have made the medium one 64 MiB
    check(st["reserved_bytes"] == (2 + 20 + 40) * MiB and st["segments"] == 3,
          "exact growth by default: reserved %d in %d segments" % (st["reserved_bytes"],
                                                                  st["segments"]))
    check("mem_alloc" in st["device_calls"] and len(st["free_histogram"]) == 28,
          "stats device_calls and free_histogram")

    snap = snapshot(lib)
    check(isinstance(snap.get("segments"), list) and snap["segments"], "snapshot has segments")
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "live"]
    check(len(live) == len(sizes), "snapshot shows %d live blocks (%d)" % (len(sizes), len(live)))
    check(snap.get("stats", {}).get("live_bytes") == sum(sizes), "snapshot stats live_bytes")

    check(lib.gm_torch_alloc(0, 0, None) is None, "size 0 returns NULL")
    check(err(lib) == "", "size 0 records no error (%r)" % err(lib))
    check(lib.gm_torch_alloc(1 << 50, 0, None) is None, "an impossible size returns NULL")
    check("out of memory" in err(lib), "last_error says out of memory: %r" % err(lib))
    check(lib.gm_torch_alloc(-5, 0, None) is None and "negative" in err(lib),
          "a negative size returns NULL and says so")
    check(stats(lib)["oom_count"] >= 1, "stats count the out-of-memory failure")

    for p, s in zip(ptrs, sizes):
        lib.gm_torch_free(p, s, 0, None)
    st = stats(lib)
    check(st["live_bytes"] == 0 and st["free_count"] == len(sizes), "free brings live to 0")
    check(lib.gm_torch_trim(0, 0) == 0, "trim succeeds")
    check(stats(lib)["reserved_bytes"] == 0, "trim(0) brings reserved to 0 (%d)"
          % stats(lib)["reserved_bytes"])
    lib.gm_torch_free(None, 0, 0, None)  # PyTorch frees the NULL of a 0-byte allocation
    check(stats(lib)["free_count"] == len(sizes), "free(NULL) is ignored")

    # A second device gets its own pool; a buffer of too small a size is cut, not overrun.
    p = lib.gm_torch_alloc(MiB, 3, None)
    check(p is not None and stats(lib, 3)["live_bytes"] == MiB, "device 3 has its own pool")
    small = ctypes.create_string_buffer(16)
    n = lib.gm_torch_stats_json(3, small, 16)
    check(n > 16 and small.value == small.value[:15], "stats_json returns the full length, cut")
    lib.gm_torch_free(p, MiB, 3, None)
    check(lib.gm_torch_alloc(10, 64, None) is None and lib.gm_torch_alloc(10, -1, None) is None,
          "devices outside 0..63 return NULL")
    check("out of range" in err(lib, -1), "and say so: %r" % err(lib, -1))


def case_bad_frees():
    """Frees PyTorch should never make: foreign, double, wrong device, no pool. No crash; one
    stderr line per kind (the parent checks stderr)."""
    lib = load()
    p0 = lib.gm_torch_alloc(65536, 0, None)
    # The simulated devices are one machine with unified addresses, as CUDA's: device 1's
    # block is foreign to device 0's pool.
    a1 = lib.gm_torch_alloc(4096, 1, None)
    p1 = lib.gm_torch_alloc(8192, 1, None)
    check(p1 is not None and not (p0 <= p1 < p0 + 65536), "the wrong-device case is set up")
    lib.gm_torch_free(p1, 8192, 0, None)             # device 1's block named device 0: freed
    check(stats(lib, 1)["live_bytes"] == 4096, "a block freed under the wrong device is found")
    lib.gm_torch_free(a1, 4096, 1, None)
    lib.gm_torch_free(0xdead000, 4096, 0, None)      # not a block: reported
    lib.gm_torch_free(0xdead200, 4096, 0, None)      # same kind again: silent
    lib.gm_torch_free(p0, 65536, 0, None)
    lib.gm_torch_free(p0, 65536, 0, None)            # double free: reported
    lib.gm_torch_free(0xbeef000, 4096, 5, None)      # device 5 has no pool: reported
    lib.gm_torch_free(0xbeef000, 4096, 99, None)     # no such device: reported
    check(stats(lib, 0)["live_bytes"] == 0, "device 0 is intact")
    q = lib.gm_torch_alloc(4096, 0, None)
    check(q is not None, "the pool works after bad frees")
    lib.gm_torch_free(q, 4096, 0, None)
    check("double free" in err(lib, 0) or "not a gpumem block" in err(lib, 0),
          "last_error keeps the free problem: %r" % err(lib, 0))


def case_threads():
    """16 threads race to create device 2's pool, then allocate and free at once."""
    lib = load()
    errors = []
    barrier = threading.Barrier(16)

    def work(t):
        barrier.wait()
        mine = []
        for i in range(300):
            size = 512 * (1 + (i * 7 + t) % 200)
            p = lib.gm_torch_alloc(size, 2, None)
            if not p or p % ALIGN:
                errors.append((t, i, p, err(lib, 2)))
                return
            mine.append((p, size))
            if i % 3 == 2:
                for q, s in mine:
                    lib.gm_torch_free(q, s, 2, None)
                mine = []
        for q, s in mine:
            lib.gm_torch_free(q, s, 2, None)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "threads allocate without error: %r" % errors[:3])
    st = stats(lib, 2)
    check(st["live_bytes"] == 0 and st["alloc_count"] == 16 * 300 and st["free_count"] == 16 * 300,
          "all blocks came back: %r" % {k: st[k] for k in ("live_bytes", "alloc_count",
                                                           "free_count")})


def case_bad_env():
    """GPUMEM_CONF with bad entries: reported once on stderr, the good ones still apply."""
    lib = load()
    p = lib.gm_torch_alloc(MiB, 0, None)
    q = lib.gm_torch_alloc(MiB, 1, None)  # a second pool: the configuration is not read again
    check(p and q, "pools work despite the bad entries: %r" % err(lib))
    segs = snapshot(lib)["segments"]
    check(segs and all(s["segments"] == "vmm" for s in segs), "the good entry segments=vmm applies")
    check("bogus" in err(lib, -1), "last_error(-1) keeps the configuration problem")
    lib.gm_torch_free(p, MiB, 0, None)
    lib.gm_torch_free(q, MiB, 1, None)


def case_configure():
    """gm_torch_configure: strict, applies to pools created afterwards, refused once one exists."""
    lib = load()
    check(lib.gm_torch_configure(b"backend=sim,nonsense=1") == -1, "an unknown key is refused")
    check("nonsense" in err(lib, -1) and "valid keys" in err(lib, -1),
          "and named, with the valid keys: %r" % err(lib, -1)[:200])
    check(lib.gm_torch_configure(b"backend=sim,reserve_limit=lots") == -1, "a bad size is refused")
    check("reserve_limit" in err(lib, -1), "and named: %r" % err(lib, -1))
    check(lib.gm_torch_configure(b"backend=gpu") == -1, "a bad backend is refused")
    check(lib.gm_torch_configure(b"backend=sim,reserve_limit=64MiB,strategy=buddy,") == 0,
          "a good configuration is accepted: %r" % err(lib, -1))
    check(lib.gm_torch_alloc(100 * MiB, 0, None) is None, "reserve_limit=64MiB applies")
    check("out of memory" in err(lib), "as out of memory: %r" % err(lib))
    p = lib.gm_torch_alloc(MiB, 0, None)
    check(p is not None, "a smaller request fits")
    check(lib.gm_torch_configure(b"backend=sim") == -1 and "already exists" in err(lib, -1),
          "configure after the first pool is refused")
    lib.gm_torch_free(p, MiB, 0, None)


def case_module():
    """gpumem.torch's stats/snapshot/trim/configure against the shim, without PyTorch."""
    sys.path.insert(0, PKG)
    import gpumem.torch as gmt
    check("torch" not in sys.modules, "importing gpumem.torch does not import torch")
    check(os.path.realpath(gmt.library_path()) == os.path.realpath(LIB),
          "the module finds the library next to itself")
    try:
        gmt.configure("backend=sim,strategy=nope")
        check(False, "configure raises ValueError on a bad value")
    except ValueError as e:
        check("strategy" in str(e), "configure's ValueError names the key: %s" % e)
    gmt.configure("backend=sim,segments=plain")
    lib = gmt.library()
    p = lib.gm_torch_alloc(5 * MiB, 0, None)
    st = gmt.stats()
    check(st["live_bytes"] == 5 * MiB and st["backend"] == "sim", "stats() reflects the block")
    snap = gmt.snapshot(0)
    check(any(b["state"] == "live" for s in snap["segments"] for b in s["blocks"]),
          "snapshot() shows the live block")
    lib.gm_torch_free(p, 5 * MiB, 0, None)
    gmt.trim()
    check(gmt.stats()["reserved_bytes"] == 0, "trim() releases everything")
    lib.gm_torch_alloc(1 << 52, 0, None)
    check("out of memory" in gmt.last_error(0), "last_error(): %r" % gmt.last_error(0))
    try:
        gmt.configure("backend=sim")
        check(False, "configure after a pool exists raises")
    except gmt.GpumemError:
        check(True, "")
    check("torch" not in sys.modules, "nothing above imported torch")
    try:
        gmt.stats(device=70)
        check(False, "stats of a bad device raises")
    except gmt.GpumemError as e:
        check("out of range" in str(e), "with the shim's message: %s" % e)


def case_devices():
    """GPUMEM_CONF=backend=sim,sim.devices=2: one pool per device of one simulated machine,
    created lazily from the device argument, concurrently; a device the machine lacks fails."""
    lib = load()
    import threading
    ptrs = {}

    def work(d):
        ptrs[d] = [lib.gm_torch_alloc(MiB + d, d, None) for _ in range(50)]

    threads = [threading.Thread(target=work, args=(d % 2,)) for d in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in (0, 1):
        st = stats(lib, d)
        check(st["ordinal"] == d and st["device"] == d, "device %d's pool is on sim device %d"
              % (d, st["ordinal"]))
        check(st["live_bytes"] == 50 * (MiB + d), "device %d: its own live bytes" % d)
    check(not set(ptrs[0]) & set(ptrs[1]), "the devices' addresses are disjoint")
    check(lib.gm_torch_alloc(4096, 2, None) is None, "device 2 does not exist")
    check("has 2 devices" in err(lib, 2), "and says why: %r" % err(lib, 2))
    for d in (0, 1):
        for p in ptrs[d]:
            lib.gm_torch_free(p, MiB + d, d, None)
        check(stats(lib, d)["live_bytes"] == 0, "device %d freed" % d)


CASES = {
    "basic": (case_basic, "backend=sim,sim.capacity=16GiB"),
    "bad_frees": (case_bad_frees, "backend=sim"),
    "devices": (case_devices, "backend=sim,sim.devices=2"),
    "threads": (case_threads, "backend=sim,thread_cache_blocks=8"),
    "bad_env": (case_bad_env, "backend=sim,bogus=1,segments=vmm,strategy=nonsense,,"),
    "configure": (case_configure, None),
    "module": (case_module, None),
}


def run_case(name):
    fn, conf = CASES[name]
    env = dict(os.environ)
    env.pop("GPUMEM_CONF", None)
    if conf is not None:
        env["GPUMEM_CONF"] = conf
    r = subprocess.run([sys.executable, __file__, LIB, PKG, "--case", name], env=env,
                       capture_output=True, text=True, timeout=120)
    sys.stdout.write(r.stdout)
    counts = [l for l in r.stdout.splitlines() if l.startswith("CASE ")]
    if r.returncode != 0 or not counts:
        check(False, "case %s exited %d; stderr:\n%s" % (name, r.returncode, r.stderr))
        return r
    p, f = map(int, counts[-1].split()[2:4])
    global passed, failed
    passed += p
    failed += f
    return r


def main():
    if "--case" in sys.argv:
        CASES[sys.argv[sys.argv.index("--case") + 1]][0]()
        print("CASE %s %d %d" % (sys.argv[sys.argv.index("--case") + 1], passed, failed))
        return 0
    for name in ("basic", "threads", "configure", "module"):
        r = run_case(name)
        check("gpumem_torch" not in r.stderr, "case %s is silent on stderr: %r" % (name, r.stderr))
    r = run_case("devices")
    check(r.stderr.count("device 2: sim backend") == 1, "a missing device is reported once:\n"
          + r.stderr)
    r = run_case("bad_frees")
    e = r.stderr
    check(e.count("on device 0: not a gpumem block") == 1, "a foreign free is reported once:\n" + e)
    check(e.count("on device 0: double free") == 1, "a double free is reported once")
    check(e.count("belongs to device 1") == 1, "a wrong-device free is reported once")
    check(e.count("on device 5, which has no gpumem pool") == 1, "a free on a device without a pool is reported")
    check(e.count("on device 99") == 1, "a free on a device out of range is reported")
    r = run_case("bad_env")
    e = r.stderr
    check(e.count('unknown key "bogus"') == 1, "the bad key is reported once on stderr:\n" + e)
    check("valid keys" in e and "reserve_limit" in e, "with the valid keys")
    check(e.count("strategy: bad value \"nonsense\"") == 1, "the bad value is reported once")
    check("GPUMEM_CONF" in e and "--set" not in e, "in GPUMEM_CONF's words")
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
