"""The pip-installed `gpumem` package on the simulated backend (run by run_tests.sh, which
installs it first). GPUMEM_CLI: the gpumem binary, to cross-check replays; GPUMEM_SRC: the
checkout (traces, header)."""
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

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
            with self.assertRaises(ImportError):
                gc.enable()


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
        """A block freed on a stream the device does not know cannot be synchronized, so the
        pool keeps its memory and closing says so (backend error); the pool is gone all the
        same: no second destroy when it is collected (before: a double free)."""
        pool = gpumem.Pool("sim")
        pool.free(pool.alloc(4096), stream=0x7)
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
            r = gpumem.replay(path)
            self.assertEqual(r["ops"], 6)
            self.assertEqual(r["peak_live_bytes"], 1048576 + 4096)
            self.assertEqual(r["oom_count"], 0)
            self.assertGreaterEqual(r["reserved_over_live"], 1)
            self.assertGreater(r["ns_per_op"], 0)
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
        trace = os.path.join(SRC, "traces", "resnet_train.csv.gz")
        for conf, sets in (("", []), ("segments=vmm", ["--set", "segments=vmm"])):
            cli = json.loads(subprocess.run([CLI, "replay", "--json", "--no-progress"] + sets +
                                            [trace], check=True, capture_output=True).stdout)
            py = gpumem.replay(trace, conf=conf)
            self.assertEqual(py["ops"], cli["ops"])
            self.assertEqual(py["peak_live_bytes"], cli["peak_live_bytes"])
            self.assertEqual(py["peak_reserved_bytes"], cli["peak_reserved_bytes"], conf)


if __name__ == "__main__":
    unittest.main()
