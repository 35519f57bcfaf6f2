"""The pip-installed `gpumem` package on the simulated backend (run by run_tests.sh, which
installs it first). GPUMEM_CLI: the gpumem binary, to cross-check replays; GPUMEM_SRC: the
checkout (traces, header)."""
import ctypes
import gzip
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest
import warnings

import gpumem

SRC = os.environ.get("GPUMEM_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("GPUMEM_CLI")
H = "Thread,Time,Action,Pointer,Size,Stream\n"


class Package(unittest.TestCase):
    def test_installed_with_its_shared_object(self):
        here = os.path.dirname(gpumem.__file__)
        self.assertTrue(gpumem.library_path().startswith(here), gpumem.library_path())
        self.assertNotIn(os.path.abspath(SRC), os.path.abspath(here))  # not the checkout
        with open(os.path.join(SRC, "include", "gpumem.h")) as f:
            want = re.search(r'GM_VERSION_STRING "([^"]+)"', f.read()).group(1)
        self.assertEqual(gpumem.version(), want)

    def test_config_keys(self):
        names = [k["name"] for k in gpumem.config_keys()]
        for key in ("strategy", "segments", "reserve_limit", "sim.capacity"):
            self.assertIn(key, names)
        self.assertTrue(all(k["help"] for k in gpumem.config_keys()))

    def test_cupy_module_needs_cupy_only_when_used(self):
        import gpumem.cupy as gc
        self.assertFalse(gc.enabled())
        try:
            import cupy  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ImportError, "gpumem.cupy needs CuPy"):
                gc.enable()
            gc.disable()  # not enabled: nothing to give back, CuPy or not

    def test_cupy_refuses_bad_arguments_before_cupy(self):
        # Arguments of the wrong kind are told apart from a missing CuPy or pool: settings
        # that are not text, a device that is no ordinal, a keep that is no byte count.
        import gpumem.cupy as gc
        for call, exc, words in (
                (lambda: gc.enable(5), TypeError, "gpumem.cupy.enable: conf must be a str"),
                (lambda: gc.enable(b"x"), TypeError, "not bytes"),
                (lambda: gc.enable("a\0b"), ValueError, "NUL"),
                (lambda: gc.stats(1.5), TypeError, "gpumem.cupy.stats: device must be an int"),
                (lambda: gc.summary(True), TypeError, "not bool"),
                (lambda: gc.snapshot(-1), ValueError, "device must be 0 to"),
                (lambda: gc.wake("0"), TypeError, "not str"),
                (lambda: gc.trim(-1), ValueError, "keep must be 0 to"),
                (lambda: gc.trim(1.0), TypeError, "keep must be an int"),
                (lambda: gc.stats(0), gpumem.GpumemError, "gpumem.cupy.stats: gpumem.cupy is "
                                                          "not enabled")):
            with self.assertRaisesRegex(exc, re.escape(words)):
                call()


class PoolTests(unittest.TestCase):
    def test_alloc_free_stats_peaks(self):
        with gpumem.Pool("sim", conf="segments=plain,sim.capacity=8G") as pool:
            a = pool.alloc(3 << 20)
            b = pool.alloc(1000)
            self.assertEqual(a % 512, 0)
            st = pool.stats()
            self.assertEqual(st["live_bytes"], (3 << 20) + 1000)
            self.assertEqual(st["live_blocks"], 2)
            self.assertGreaterEqual(st["reserved_bytes"], st["allocated_bytes"])
            pool.free(a)
            st = pool.stats()
            self.assertEqual(st["live_bytes"], 1000)
            self.assertEqual(st["peak_live_bytes"], (3 << 20) + 1000)
            pool.reset_peaks()
            self.assertEqual(pool.stats()["peak_live_bytes"], 1000)
            pool.free(b)
            pool.trim()
            self.assertEqual(pool.stats()["reserved_bytes"], 0)
            pool.check()

    def test_summary_and_snapshot(self):
        with gpumem.Pool("sim") as pool:
            p = pool.alloc(5 << 20)
            text = pool.summary()
            self.assertIn("gpumem pool summary", text)
            self.assertRegex(text, r"live \(requested\)\s+\|\s+5\.00 MiB")
            snap = pool.snapshot()
            blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] != "free"]
            self.assertEqual([int(b["address"], 16) for b in blocks], [p])
            self.assertEqual(snap["segments"][0]["stream"], "0x0")
            pool.free(p)

    def test_errors(self):
        pool = gpumem.Pool("sim", conf="sim.capacity=1G")
        p = pool.alloc(4096)
        pool.free(p)
        with self.assertRaises(gpumem.GpumemError) as e:
            pool.free(p)
        self.assertEqual(e.exception.status, "double free")
        with self.assertRaises(gpumem.OutOfMemoryError) as e:
            pool.alloc(2 << 30)
        self.assertIsInstance(e.exception, MemoryError)
        self.assertIn("cannot allocate 2.00 GiB", str(e.exception))
        pool.check()  # still valid
        q = pool.alloc(1 << 20)
        with self.assertRaises(gpumem.GpumemError) as e:
            pool.close()
        self.assertEqual(e.exception.status, "busy")
        pool.free(q)
        pool.close()
        with self.assertRaises(gpumem.GpumemError):
            pool.alloc(1)
        with self.assertRaisesRegex(ValueError, 'unknown key "nope"'):
            gpumem.Pool("sim", conf="nope=1")
        with self.assertRaisesRegex(ValueError, "min_block"):
            gpumem.Pool("sim", conf="min_block=lots")
        with self.assertRaises(ValueError):
            gpumem.Pool("tpu")

    def test_close_after_device_refusal(self):
        """A stream destroyed while its heap still holds memory cannot be synchronized, so the
        pool keeps that memory and closing says so (backend error); the pool is gone all the
        same: no second destroy when it is collected (before: a double free)."""
        pool = gpumem.Pool("sim")
        s1 = pool.stream()
        pool.free(pool.alloc(4096, stream=s1), stream=s1)
        self.assertEqual(gpumem._lib.gm_sim_stream_destroy(pool._backend, ctypes.c_void_p(s1)),
                         0)  # against the contract (docs/api.md): the stream outlives the pool
        with self.assertRaises(gpumem.GpumemError) as e:
            pool.close()
        self.assertEqual(e.exception.status, "backend error")
        with self.assertRaisesRegex(gpumem.GpumemError, "closed"):
            pool.alloc(1)
        pool.close()  # a no-op now
        del pool
        s = gpumem.Pool("sim")
        s1 = s.stream()
        s.free(s.alloc(4096, stream=s1), stream=s1)  # a stream of the sim: synchronized
        s.close()


    def test_not_picklable(self):
        """Before: ValueError "ctypes objects containing pointers cannot be pickled", which
        named neither the Pool nor why."""
        import copy
        with gpumem.Pool("sim") as pool:
            for f in (pickle.dumps, copy.copy, copy.deepcopy):
                with self.assertRaisesRegex(TypeError, "gpumem.Pool cannot be pickled"):
                    f(pool)
            self.assertEqual(pool.stats()["reserved_bytes"], 0)  # still usable
            pool.free(pool.alloc(4096))

    def test_streams_the_device_does_not_know(self):
        """Before: alloc, free and record_stream took any int as a stream; a block freed or
        recorded on one waited forever for an event that could not be recorded, and closing
        the pool left its memory on the device. Now each is refused with nothing changed."""
        pool = gpumem.Pool("sim")
        bogus = 0xDEAD0
        with self.assertRaisesRegex(gpumem.InvalidArgumentError, "gm_alloc: stream 0xdead0"):
            pool.alloc(4096, stream=bogus)
        a = pool.alloc(3 << 20)
        with self.assertRaisesRegex(gpumem.InvalidArgumentError, "gm_record_stream: stream"):
            pool.record_stream(a, bogus)
        with self.assertRaisesRegex(gpumem.InvalidArgumentError, "gm_free: stream"):
            pool.free(a, stream=bogus)
        self.assertEqual(pool.stats()["live_bytes"], 3 << 20)  # still live, still ours
        side = pool.stream()  # a stream the device knows, with no heap: taken
        pool.record_stream(a, side)
        pool.free(a)
        pool.trim()
        self.assertEqual(pool.stats()["reserved_bytes"], 0)
        pool.close()  # nothing left on the device


class ErrorTests(unittest.TestCase):
    """Every failure raises its status's class with the message of that failure."""

    def test_replay_failures_raise_their_class(self):
        """Before: TypeError (GpumemError built with one argument) for any failure but invalid
        argument."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            write_trace(path, ["1,0.1,allocate,0x1000,4096,0x0", "1,0.2,free,0x1000,4096,0x0"])
            with self.assertRaises(gpumem.UnsupportedError) as e:
                gpumem.replay(path, conf="segments=vmm,sim.no_vmm=1")
            self.assertEqual(e.exception.status, "unsupported")
            self.assertIn("VMM", str(e.exception))
            try:
                r = gpumem.replay(path, backend="cuda")  # a machine with a GPU replays it
                self.assertEqual(r["ops"], 2)
            except gpumem.NoDeviceError as e:
                self.assertEqual(e.status, "no device")
                self.assertIn("cuda", str(e))
            with self.assertRaisesRegex(gpumem.InvalidArgumentError, "no sim device 3"):
                gpumem.replay(path, device=3)

    def test_messages_are_current(self):
        """Before: "invalid argument" alone, or an older failure's message ('unknown key
        "stratgy"' for Pool("tpu"))."""
        with self.assertRaisesRegex(ValueError, 'unknown key "stratgy"'):
            gpumem.Pool("sim", conf="stratgy=tlsf")
        cases = [(lambda: gpumem.Pool("tpu"), 'unknown backend "tpu"'),
                 (lambda: gpumem.Pool("sim", device=-1), "device must be 0 to"),
                 (lambda: gpumem.Pool("sim", device=99), "no sim device 99"),
                 (lambda: gpumem.Pool("sim", device=1), r"1 device \(set sim.devices\)")]
        for make, want in cases:
            with self.assertRaises(gpumem.InvalidArgumentError) as e:
                make()
            self.assertIsInstance(e.exception, ValueError)
            self.assertRegex(str(e.exception), want)
            self.assertNotIn("stratgy", str(e.exception))
        with gpumem.Pool("sim", device=1, conf="sim.devices=2") as pool:
            self.assertEqual(pool.stats()["device"], 1)

    def test_each_status_has_its_class(self):
        with gpumem.Pool("sim", conf="sim.capacity=1G") as pool:
            p = pool.alloc(4096)
            pool.free(p)
            with self.assertRaises(gpumem.DoubleFreeError):
                pool.free(p)
            with self.assertRaises(gpumem.UnknownPointerError) as e:
                pool.free(p + (1 << 40))
            self.assertIn("foreign pointer", str(e.exception))
            with self.assertRaises(gpumem.OutOfMemoryError):
                pool.alloc(4 << 30)
            q = pool.alloc(4096)
            with self.assertRaises(gpumem.BusyError) as e:
                pool.close()
            self.assertIn("close(force=True)", str(e.exception))  # not gm_pool_destroy_force
            self.assertNotIn("gm_pool_destroy", str(e.exception))
            self.assertIn("1 blocks (4096 bytes)", str(e.exception))
            pool.free(q)
        for cls in (gpumem.InvalidArgumentError, gpumem.OutOfMemoryError, gpumem.NoDeviceError,
                    gpumem.DoubleFreeError, gpumem.UnknownPointerError, gpumem.BusyError,
                    gpumem.UnsupportedError, gpumem.BackendError, gpumem.HostMemoryError,
                    gpumem.TraceError):
            self.assertTrue(issubclass(cls, gpumem.GpumemError), cls)
        e = pickle.loads(pickle.dumps(gpumem.DoubleFreeError("double free", "gm_free: x")))
        self.assertEqual((type(e), e.status, str(e)),
                         (gpumem.DoubleFreeError, "double free", "double free: gm_free: x"))

    def test_record_stream_on_a_freed_block(self):
        """Before: "double free"; nothing was freed twice."""
        with gpumem.Pool("sim") as pool:
            p = pool.alloc(4096)
            pool.free(p)
            with self.assertRaises(gpumem.UnknownPointerError) as e:
                pool.record_stream(p, pool.stream())
            self.assertIn("already freed", str(e.exception))
            self.assertNotIn("double free", str(e.exception))
            pool.check()


class ArgumentTests(unittest.TestCase):
    """Arguments are checked before C sees them: ctypes would wrap or convert them."""

    def test_sizes_and_streams(self):
        class Index:  # e.g. a numpy integer
            def __index__(self):
                return 8192

        with gpumem.Pool("sim") as pool:
            for size in (-1, 0, 1 << 70, 2**64 + 4096):
                with self.assertRaisesRegex(ValueError, "size must be 1 to 18446744073709551615"):
                    pool.alloc(size)
            for size in (1.5, True, "16", None):
                with self.assertRaisesRegex(TypeError, "size must be an int"):
                    pool.alloc(size)
            for stream in ("x", 1.0, b"\0"):
                with self.assertRaisesRegex(TypeError, "stream must be an int"):
                    pool.alloc(16, stream=stream)
            for stream in (-1, 2**64):
                with self.assertRaisesRegex(ValueError, "stream must be 0 to"):
                    pool.alloc(16, stream=stream)
            self.assertEqual(pool.stats()["live_blocks"], 0)  # nothing was allocated
            p = pool.alloc(Index(), stream=None)
            self.assertEqual(pool.stats()["live_bytes"], 8192)
            with self.assertRaisesRegex(TypeError, "ptr must be an int"):
                pool.free(str(p))
            with self.assertRaisesRegex(ValueError, "ptr must be 0 to"):
                pool.free(p - 2**64)  # would be p once wrapped
            with self.assertRaisesRegex(ValueError, "ptr must be 0 to"):
                pool.record_stream(p + 2**64, 0)
            with self.assertRaisesRegex(ValueError, "keep must be 0 to"):
                pool.trim(keep=-1)
            with self.assertRaisesRegex(TypeError, "keep must be an int"):
                pool.trim(keep=0.5)
            pool.free(p, stream=0)
            pool.check()

    def test_pool_and_replay_arguments(self):
        with self.assertRaisesRegex(TypeError, "conf must be a str"):
            gpumem.Pool("sim", conf=5)
        with self.assertRaisesRegex(ValueError, "conf contains a NUL"):
            gpumem.Pool("sim", conf="strategy=tlsf\0,nonsense")
        with self.assertRaisesRegex(TypeError, "backend must be a str"):
            gpumem.Pool(None)
        for device in ("0", 0.0, True):
            with self.assertRaisesRegex(TypeError, "device must be an int"):
                gpumem.Pool("sim", device=device)
        with self.assertRaisesRegex(ValueError, "device must be 0 to"):
            gpumem.Pool("sim", device=2**40)
        with self.assertRaisesRegex(TypeError, "conf must be a str"):
            gpumem.replay(os.path.join(SRC, "traces", "comm_overlap.csv.gz"), conf=5)
        with self.assertRaisesRegex(TypeError, "trace must be a"):
            gpumem.replay(42)

    def test_closed_pool(self):
        pool = gpumem.Pool("sim")
        pool.close()
        calls = [lambda: pool.alloc(16), lambda: pool.free(4096), lambda: pool.trim(),
                 lambda: pool.stats(), lambda: pool.summary(), lambda: pool.snapshot(),
                 lambda: pool.check(), lambda: pool.reset_peaks(), lambda: pool.stream(),
                 lambda: pool.record_stream(4096, 0)]
        for call in calls:
            with self.assertRaisesRegex(gpumem.InvalidArgumentError, "the pool is closed"):
                call()
        pool.close()


class NamespaceTests(unittest.TestCase):
    def test_public_names_are_the_api(self):
        """Before: ctypes, glob, gzip, json and os were public names of gpumem."""
        public = {n for n in dir(gpumem) if not n.startswith("_")}
        submodules = {n for n in public if type(getattr(gpumem, n)) is type(os)}
        self.assertLessEqual(submodules, {"cupy", "torch"})  # gpumem's own, once imported
        self.assertEqual(public - submodules, set(gpumem.__all__))
        for name in ("ctypes", "glob", "gzip", "json", "os", "array"):
            self.assertNotIn(name, public)


RACE = """
import sys, threading, time
import gpumem
errors = []
for round in range(int(sys.argv[1])):
    pool = gpumem.Pool("sim")
    started = threading.Barrier(5)
    def work():
        started.wait()
        try:
            while True:
                pool.free(pool.alloc(4096 + 512 * (round % 7)))
        except gpumem.GpumemError as e:
            if "the pool is closed" not in str(e):
                errors.append(repr(e))
        except Exception as e:
            errors.append(repr(e))
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.002)
    pool.close(force=True)
    for t in threads:
        t.join()
print("rounds done; errors:", len(errors), errors[:3])
sys.exit(1 if errors else 0)
"""


class ThreadTests(unittest.TestCase):
    def test_close_while_other_threads_allocate(self):
        """close() waits for the calls in flight; later calls say the pool is closed. Before: the
        pool was destroyed under the other threads' gm_alloc/gm_free (a use after free: ASan
        every run, a crash or stray errors without it). In a child process: a crash fails the
        test instead of ending the suite."""
        run = subprocess.run([sys.executable, "-c", RACE, "40"], capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("errors: 0", run.stdout)


def write_trace(path, lines):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(H + "".join(l + "\n" for l in lines))


class ReplayTests(unittest.TestCase):
    def test_small_trace(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv.gz")
            write_trace(path, ["1,0.1,allocate,0x1000,1048576,0x0",
                               "1,0.2,allocate,0x2000,4096,0x7",
                               "1,0.3,free,0x1000,1048576,0x0",
                               "1,0.4,free,0x9999,64,0x0",       # unknown: skipped
                               "1,0.5,allocate,0x3000,8192,0x7",
                               "1,0.6,free,0x2000,4096,0x7",
                               "1,0.7,free,0x3000,8192,0x7"])
            with self.assertWarnsRegex(gpumem.TraceWarning, "t.csv.gz:5: free of 0x9999"):
                r = gpumem.replay(path)
            self.assertEqual(r["ops"], 6)
            self.assertEqual(r["peak_live_bytes"], 1048576 + 4096)
            self.assertEqual(r["oom_count"], 0)
            self.assertGreaterEqual(r["reserved_over_live"], 1)
            self.assertGreater(r["ns_per_op"], 0)
            with self.assertWarns(gpumem.TraceWarning):
                small = gpumem.replay(path, conf="sim.capacity=64M,reserve_limit=4K")
            self.assertGreater(small["oom_count"], 0)
            with self.assertRaisesRegex(ValueError, "no allocations"):
                empty = os.path.join(d, "e.csv")
                write_trace(empty, [])
                gpumem.replay(empty)

    def test_record_then_replay(self):
        """trace=FILE records what a pool serves; replaying the file gives the same peak."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.csv.gz")
            with gpumem.Pool("sim", conf="trace=" + path) as pool:
                live, s1 = [], pool.stream()
                for i in range(200):
                    live.append(pool.alloc(4096 * (1 + i % 37), stream=s1 if i % 3 else 0))
                    if i % 4 == 3:
                        pool.free(live.pop(0))
                for p in live:
                    pool.free(p)
                peak = pool.stats()["peak_live_bytes"]
            r = gpumem.replay(path)  # the pool is closed: the trace is complete
            self.assertEqual(r["peak_live_bytes"], peak)
            self.assertEqual(r["ops"], 400)
            self.assertEqual(gpumem.read_trace(path)["n_streams"], 2)

    @unittest.skipUnless(CLI, "GPUMEM_CLI not given")
    def test_same_figures_as_the_cli(self):
        """The tool's report, key for key, but for the times measured; on resnet_train, and on
        a two-stream trace with a stream 0x1 (the default stream to the tool) and simulated
        kernels that make events complete late."""
        timed = {"host_ns", "ns_per_op", "ns_per_op_min", "ns_per_op_max"}
        with tempfile.TemporaryDirectory() as d:
            two = os.path.join(d, "two.csv")
            write_trace(two, ["1,%.4f,allocate,0x%x,%d,0x%x" % (i * 1e-4, 0x10000 * (i + 1),
                                                                 4096 * (1 + i % 13), i % 3)
                              for i in range(300)] +
                        ["1,%.4f,free,0x%x,0,0x%x" % (0.03 + i * 1e-4, 0x10000 * (i + 1), i % 2)
                         for i in range(0, 300, 2)])
            for trace, conf in ((os.path.join(SRC, "traces", "resnet_train.csv.gz"), ""),
                                (os.path.join(SRC, "traces", "resnet_train.csv.gz"),
                                 "segments=vmm"),
                                (two, "sim.kernel_ns=20000")):
                sets = ["--set", conf] if conf else []
                cli = json.loads(subprocess.run(
                    [CLI, "replay", "--json", "--no-progress"] + sets + [trace], check=True,
                    capture_output=True).stdout)
                py = gpumem.replay(trace, conf=conf)
                self.assertGreater(py["ops"], 0)
                self.assertEqual(set(py) - {"stats"}, set(cli))
                for key in set(cli) - timed:
                    self.assertEqual(py[key], cli[key], (trace, conf, key))
                self.assertEqual(py["stats"]["peak_reserved_bytes"], cli["peak_reserved_bytes"])


class TraceInputTests(unittest.TestCase):
    """Traces are read by the command-line tool's reader: the format told by content, bad lines
    counted (and warned about with file and line), the same errors."""

    def replay_warned(self, path, **kw):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            r = gpumem.replay(path, **kw)
        for w in seen:
            self.assertIs(w.category, gpumem.TraceWarning)
        return r, [str(w.message) for w in seen]

    def test_truncated_gzip(self):
        """Before: a bare EOFError, no file name."""
        text = H + "".join("0,%d.%06d,allocate,0x%x,%d,0x0\n" % (i, i * 7919 % 1000000,
                                                                 0x100000 + i * 0x1230, i * 37 + 1)
                           for i in range(2000))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "cut.csv.gz")
            with open(path, "wb") as f:
                f.write(gzip.compress(text.encode())[:3000])
            r, said = self.replay_warned(path)
            self.assertEqual(r["bad_input"]["truncated_gzip"], 1)
            self.assertTrue(0 < r["ops"] < 2000, r["ops"])
            self.assertTrue(any(m.startswith(path + ":") and "truncated" in m for m in said), said)
            with self.assertRaises(gpumem.TraceError) as e:
                gpumem.replay(path, strict=True)
            self.assertIn(path + ":", str(e.exception))
            self.assertIn("truncated", str(e.exception))

    def test_bad_lines_are_counted(self):
        """Before: a negative size raised OverflowError; skipped lines vanished uncounted."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            write_trace(path, ["1,0.1,allocate,0x1000,4096,0x0",
                               "1,0.2,allocate,0x2000,-5,0x0",       # line 3: malformed
                               "1,0.3,free,0x9999,64,0x0",           # a free of nothing
                               "1,0.4,allocate failure,0x0,99,0x0",
                               "1,0.5,allocate,0x3000,0,0x0",        # 0 bytes
                               "1,0.6,allocate,0x1000,8192,0x0",     # 0x1000 is still live
                               "1,0.7,free,0x1000,8192,0x0"])
            r, said = self.replay_warned(path)
            want = {"malformed_lines": 1, "unknown_frees": 1, "double_allocates": 1,
                    "truncated_gzip": 0}
            self.assertEqual({k: r["bad_input"][k] for k in want}, want)
            self.assertEqual((r["logged_allocate_failures"], r["zero_size_allocates"]), (1, 1))
            self.assertEqual(r["ops"], 4)  # 2 allocates, the implied free, the free
            self.assertIn(path + ":3: malformed line: size is not a decimal byte count", said)
            self.assertIn(path + ":4: free of 0x9999, which is not live: skipped", said)
            with self.assertWarns(gpumem.TraceWarning):
                t = gpumem.read_trace(path)
            self.assertEqual(t["bad_input"], want)
            self.assertEqual(t["first_bad_line"]["unknown_frees"], 4)
            self.assertEqual(list(t["kind"]), [0, 1, 0, 1])
            self.assertEqual(list(t["size"]), [4096, 4096, 8192, 8192])
            with self.assertRaisesRegex(gpumem.TraceError, re.escape(path) + ":3: .*--strict"):
                gpumem.replay(path, strict=True)

    def test_many_bad_lines_are_summed_up(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            write_trace(path, ["1,0.1,allocate,0x1000,64,0x0"] +
                        ["1,0.2,free,0x%x,64,0x0" % (0x9000 + i) for i in range(9)])
            r, said = self.replay_warned(path)
            self.assertEqual(r["bad_input"]["unknown_frees"], 9)
            self.assertEqual(len([m for m in said if "which is not live" in m]), 5)
            self.assertIn("%s: 9 frees of unknown pointers in all (first at line 3)" % path, said)

    def test_format_told_by_content(self):
        """Before: by the name's .gz suffix (a gzip named .csv, or plain text named .csv.gz,
        failed)."""
        lines = ["1,0.1,allocate,0x1000,4096,0x0", "1,0.2,free,0x1000,4096,0x0"]
        with tempfile.TemporaryDirectory() as d:
            gz_named_csv, csv_named_gz = os.path.join(d, "a.csv"), os.path.join(d, "b.csv.gz")
            with open(gz_named_csv, "wb") as f:
                f.write(gzip.compress((H + "".join(l + "\n" for l in lines)).encode()))
            with open(csv_named_gz, "w") as f:
                f.write(H + "".join(l + "\n" for l in lines))
            for path in (gz_named_csv, csv_named_gz):
                self.assertEqual(gpumem.replay(path)["peak_live_bytes"], 4096, path)
                self.assertEqual(gpumem.read_trace(path)["ops"], 2)
            junk = os.path.join(d, "junk.txt")
            with open(junk, "w") as f:
                f.write("hello\n")
            with self.assertRaisesRegex(gpumem.TraceError, re.escape(junk) + ":1: not an RMM"):
                gpumem.replay(junk)
            with self.assertRaisesRegex(gpumem.TraceError, "empty file"):
                gpumem.replay(os.devnull)
            with self.assertRaises(FileNotFoundError):
                gpumem.replay(os.path.join(d, "missing.csv"))

    def test_replay_reads_files_only(self):
        """Before: replay took a dict of arrays and trusted their lengths and values (a heap
        overflow in C); read_trace's dict is for looking at a trace."""
        path = os.path.join(SRC, "traces", "comm_overlap.csv.gz")
        t = gpumem.read_trace(path)
        with self.assertRaisesRegex(TypeError, "trace must be a trace file's path"):
            gpumem.replay(t)
        self.assertEqual(gpumem.replay(path)["ops"], t["ops"])


class SleepTests(unittest.TestCase):
    """Pool.sleep / wake and gpumem.tag over the library's gm_pool_sleep (docs/sleep.md)."""

    def test_sleep_gives_pages_back_and_wake_restores(self):
        with gpumem.Pool("sim", conf="segments=vmm") as pool:
            with gpumem.tag("weights"):
                self.assertEqual(gpumem.tag.current(), "weights")
                w = pool.alloc(8 << 20)
            self.assertEqual(gpumem.tag.current(), "default")
            kv = pool.alloc(4 << 20)
            tags = {int(b["address"], 16): b.get("tag") for s in pool.snapshot()["segments"]
                    for b in s["blocks"] if b.get("state") == "live"}
            self.assertEqual(tags.get(w), "weights")
            self.assertEqual(tags.get(kv), "default")
            pool.sleep(offload=["weights"])
            st = pool.stats()
            self.assertTrue(st["asleep"])
            self.assertEqual(st["reserved_bytes"], 0)
            self.assertGreaterEqual(st["sleep_saved_bytes"], 8 << 20)
            with self.assertRaises(gpumem.AsleepError):
                pool.alloc(1 << 20)
            with self.assertRaises(gpumem.AsleepError):
                pool.sleep()
            pool.free(kv)  # freeing while asleep is allowed
            pool.wake()
            st = pool.stats()
            self.assertFalse(st["asleep"])
            self.assertEqual((st["sleeps"], st["wakes"]), (1, 1))
            self.assertGreaterEqual(st["reserved_bytes"], 8 << 20)
            pool.check()
            pool.free(w)  # the same address is still the live block
            with self.assertRaises(gpumem.InvalidArgumentError):
                pool.wake()  # not asleep

    def test_sleep_prepare_pins_ahead(self):
        with gpumem.Pool("sim", conf="segments=vmm") as pool:
            with gpumem.tag("weights"):
                w = pool.alloc(6 << 20)
            kv = pool.alloc(4 << 20)
            pool.sleep_prepare(offload=["weights"])
            st = pool.stats()
            self.assertEqual(st["sleep_host_bytes"], 6 << 20)
            pinned = st["device_calls_by_kind"]["host_alloc"]
            pool.trim()  # device memory only: the buffer stays
            self.assertEqual(pool.stats()["sleep_host_bytes"], 6 << 20)
            pool.sleep(offload=["weights"])
            self.assertEqual(pool.stats()["device_calls_by_kind"]["host_alloc"], pinned)
            with self.assertRaises(gpumem.AsleepError):
                pool.sleep_prepare()
            pool.wake()
            with self.assertRaises(TypeError):
                pool.sleep_prepare(offload=5)
            pool.sleep_prepare(offload=False)  # keeps nothing: the buffer goes
            self.assertEqual(pool.stats()["sleep_host_bytes"], 0)
            pool.free(w)
            pool.free(kv)
        with gpumem.Pool("sim", conf="segments=plain") as pool:
            with self.assertRaises(gpumem.UnsupportedError):
                pool.sleep_prepare()

    def test_plain_segments_refuse_with_the_reason(self):
        with gpumem.Pool("sim", conf="segments=plain") as pool:
            with self.assertRaises(gpumem.UnsupportedError) as e:
                pool.sleep()
            self.assertIn("vmm", str(e.exception))

    def test_bad_offload_and_tags(self):
        with gpumem.Pool("sim", conf="segments=vmm") as pool:
            with self.assertRaises(TypeError):
                pool.sleep(offload=5)
            with self.assertRaises(ValueError):
                pool.sleep(offload=["a,b"])
            with self.assertRaises(TypeError):
                pool.sleep(offload=[3])
        with self.assertRaises(TypeError):
            gpumem.tag(3)
        with self.assertRaises(ValueError):
            with gpumem.tag("has space"):
                pass
        self.assertEqual(gpumem.tag.current(), "default")  # a refused push left nothing


if __name__ == "__main__":
    unittest.main()
