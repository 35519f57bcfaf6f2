"""tools/torch_snapshot_to_csv.py: exact CSV from a small snapshot the test builds (plain dicts and
lists, pickled like torch.cuda.memory._dump_snapshot), the free_requested fallback, gzip output,
and refusal of pickles that reference any class (os.system through a crafted __reduce__).

usage: test_torch_snapshot.py CONVERTER [GPUMEM_BINARY]
"""
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

CONVERTER = sys.argv[1] if len(sys.argv) > 1 else "tools/torch_snapshot_to_csv.py"
GPUMEM = sys.argv[2] if len(sys.argv) > 2 else None

MiB = 1 << 20


def event(action, addr, size, time_us, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us,
            "frames": [{"filename": "train.py", "line": 7, "name": "forward"}]}


SNAPSHOT = {
    "segments": [{"device": 0, "address": 0x7F0000000000, "total_size": 20 * MiB,
                  "stream": 0, "segment_type": "large", "blocks": []}],
    "device_traces": [
        [
            event("segment_alloc", 0x7F0000000000, 20 * MiB, 1000),
            event("alloc", 0x7F0000000000, 4 * MiB, 1000),
            event("alloc", 0x7F0000400000, 512, 1250, stream=0x5A5A00),
            event("free_requested", 0x7F0000000000, 4 * MiB, 2000),
            event("free_completed", 0x7F0000000000, 4 * MiB, 2500),
            event("oom", 12345, 64 * MiB, 3000),
            event("free_requested", 0x7F0000400000, 512, 4000, stream=0x5A5A00),
            event("free_completed", 0x7F0000400000, 512, 4000000, stream=0x5A5A00),
            event("segment_free", 0x7F0000000000, 20 * MiB, 4000001),
        ],
        [
            event("alloc", 0x10000, 1024, 5),
            event("free_requested", 0x10000, 1024, 7),
        ],
    ],
}

EXPECTED_DEVICE0 = (
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "0,0.000000,allocate,0x7f0000000000,4194304,0x0\n"
    "0,0.000250,allocate,0x7f0000400000,512,0x5a5a00\n"
    "0,0.001500,free,0x7f0000000000,4194304,0x0\n"
    "0,0.002000,allocate failure,0x0,67108864,0x0\n"
    "0,3.999000,free,0x7f0000400000,512,0x5a5a00\n"
)

EXPECTED_DEVICE1 = (
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "0,0.000000,allocate,0x10000,1024,0x0\n"
    "0,0.000002,free,0x10000,1024,0x0\n"
)


class Evil:
    """Unpickling this would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch %s" % self.marker,))


class ConverterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.snap = os.path.join(self.dir.name, "snapshot.pickle")

    def tearDown(self):
        self.dir.cleanup()

    def dump(self, obj):
        with open(self.snap, "wb") as f:
            pickle.dump(obj, f)

    def run_converter(self, *args):
        return subprocess.run([sys.executable, CONVERTER, self.snap] + list(args),
                              capture_output=True, text=True)

    def test_exact_csv(self):
        self.dump(SNAPSHOT)
        r = self.run_converter()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, EXPECTED_DEVICE0)
        self.assertIn("2 allocate, 2 free (from free_completed), 1 allocate failure", r.stderr)

    def test_free_requested_fallback_and_device(self):
        self.dump(SNAPSHOT)
        r = self.run_converter("--device", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, EXPECTED_DEVICE1)
        self.assertIn("from free_requested", r.stderr)

    def test_frees_requested_option(self):
        self.dump(SNAPSHOT)
        r = self.run_converter("--frees", "requested")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("0,0.001000,free,0x7f0000000000,4194304,0x0\n", r.stdout)
        self.assertIn("0,0.003000,free,0x7f0000400000,512,0x5a5a00\n", r.stdout)

    def test_gzip_output_replays(self):
        self.dump(SNAPSHOT)
        out = os.path.join(self.dir.name, "trace.csv.gz")
        r = self.run_converter("-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with gzip.open(out, "rt") as f:
            self.assertEqual(f.read(), EXPECTED_DEVICE0)
        if GPUMEM:
            g = subprocess.run([GPUMEM, "replay", "--json", out], capture_output=True, text=True)
            self.assertEqual(g.returncode, 0, g.stderr)
            d = json.loads(g.stdout)
            self.assertEqual(d["ops"], 4)
            self.assertEqual(d["logged_allocate_failures"], 1)
            self.assertEqual(d["peak_live_bytes"], 4 * MiB + 512)
            self.assertEqual(d["streams"], 2)

    def test_refuses_code(self):
        marker = os.path.join(self.dir.name, "pwned")
        self.dump({"device_traces": [[]], "evil": Evil(marker)})
        r = self.run_converter()
        self.assertEqual(r.returncode, 1)
        self.assertIn("references", r.stderr)
        self.assertIn("system", r.stderr)
        self.assertFalse(os.path.exists(marker), "the pickle's code ran")
        self.assertEqual(r.stdout, "")

    def test_refuses_any_class(self):
        import collections
        self.dump(collections.OrderedDict(device_traces=[[]]))
        r = self.run_converter()
        self.assertEqual(r.returncode, 1)
        self.assertIn("collections.OrderedDict", r.stderr)

    def test_unusable_snapshots(self):
        self.dump({"segments": []})
        r = self.run_converter()
        self.assertEqual(r.returncode, 1)
        self.assertIn("_record_memory_history", r.stderr)
        self.dump(SNAPSHOT)
        r = self.run_converter("--device", "5")
        self.assertEqual(r.returncode, 1)
        self.assertIn("device 5", r.stderr)
        with open(self.snap, "wb") as f:
            f.write(b"not a pickle at all")
        r = self.run_converter()
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a readable pickle", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
