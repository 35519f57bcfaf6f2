#!/usr/bin/env python3
"""Convert a PyTorch CUDA memory snapshot to an RMM allocation log that `gpumem replay` reads.

A snapshot is the pickle that torch.cuda.memory._dump_snapshot() writes (or a pickle of the dict
torch.cuda.memory._snapshot() returns) after torch.cuda.memory._record_memory_history(). Its
'device_traces' holds, per device, the allocator's events in program order:

    {'action': 'alloc' | 'free_requested' | 'free_completed' | 'segment_alloc' | 'oom' | ...,
     'addr': int, 'size': int, 'stream': int, 'time_us': int, 'frames': [...]}

Mapping (docs/trace-format.md):
    alloc                          -> allocate
    free_completed                 -> free   (the block is reusable: what an allocator sees)
    free_requested                 -> free   only when the device has no free_completed events
                                              (or with --frees requested)
    oom                            -> allocate failure (pointer 0x0, the requested size)
    segment_* / snapshot / others  -> skipped (they are the caching allocator's own actions)
Time is time_us relative to the first event, in seconds; Thread is 0; Stream is in hex.

Safety: a pickle can run code while it loads. This script uses the standard library only and an
Unpickler whose find_class refuses every class, so only plain data (dict, list, tuple, str,
bytes, int, float, bool, None) loads; a snapshot that names any class is refused with a message.

usage: torch_snapshot_to_csv.py SNAPSHOT [-o OUT.csv|OUT.csv.gz] [--device N]
                                [--frees auto|completed|requested]
Exit codes: 0 done, 1 the snapshot is refused or unusable, 2 usage error.
"""
import argparse
import gzip
import io
import pickle
import sys

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"


class RefusedPickle(Exception):
    pass


class PlainDataUnpickler(pickle.Unpickler):
    """Loads plain data only: every class or function reference is refused."""

    def find_class(self, module, name):
        raise RefusedPickle(
            "the snapshot references %s.%s; only plain data (dict, list, str, int, float, "
            "bool, None) is accepted, so it was not loaded" % (module, name))

    def persistent_load(self, pid):
        raise RefusedPickle("the snapshot uses persistent ids; refused")


def load_snapshot(data):
    try:
        return PlainDataUnpickler(io.BytesIO(data)).load()
    except RefusedPickle:
        raise
    except Exception as e:  # a damaged or non-pickle file
        raise RefusedPickle("not a readable pickle: %s" % e)


def device_events(snapshot, device):
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise RefusedPickle("no 'device_traces' in the snapshot: record it with "
                            "torch.cuda.memory._record_memory_history() before the snapshot")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not 0 <= device < len(traces):
        raise RefusedPickle("device %d not in the snapshot (it has %d)"
                            % (device, len(traces) if isinstance(traces, list) else 0))
    events = traces[device]
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise RefusedPickle("device_traces[%d] is not a list of event dicts" % device)
    return events


def convert(events, frees):
    """Return (csv_text, counts) for one device's events."""
    if frees == "auto":
        frees = ("completed" if any(e.get("action") == "free_completed" for e in events)
                 else "requested")
    free_action = "free_" + frees
    t0 = next((e["time_us"] for e in events if "time_us" in e), 0)
    out = [HEADER]
    counts = {"allocate": 0, "free": 0, "allocate failure": 0}
    for e in events:
        action = e.get("action")
        if action == "alloc":
            act, addr = "allocate", e.get("addr", 0)
        elif action == free_action:
            act, addr = "free", e.get("addr", 0)
        elif action == "oom":
            act, addr = "allocate failure", 0
        else:
            continue
        seconds = (e.get("time_us", t0) - t0) / 1e6
        out.append("0,%.6f,%s,0x%x,%d,0x%x\n"
                   % (seconds, act, addr, e.get("size", 0), e.get("stream", 0) or 0))
        counts[act] += 1
    return "".join(out), counts, frees


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch memory snapshot -> RMM CSV for gpumem")
    p.add_argument("snapshot", help="pickle from torch.cuda.memory._dump_snapshot()")
    p.add_argument("-o", "--output", help="output file (.gz: gzip); default stdout")
    p.add_argument("--device", type=int, default=0, help="device index (default 0)")
    p.add_argument("--frees", choices=("auto", "completed", "requested"), default="auto",
                   help="which free events become frees (default auto: free_completed, or "
                        "free_requested when the trace has no completions)")
    args = p.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = load_snapshot(f.read())
        text, counts, frees = convert(device_events(snapshot, args.device), args.frees)
    except (OSError, RefusedPickle) as e:
        print("torch_snapshot_to_csv: error: %s: %s" % (args.snapshot, e), file=sys.stderr)
        return 1
    if args.output:
        opener = gzip.open if args.output.endswith(".gz") else open
        with opener(args.output, "wt") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print("torch_snapshot_to_csv: device %d: %d allocate, %d free (from free_%s), "
          "%d allocate failure" % (args.device, counts["allocate"], counts["free"], frees,
                                   counts["allocate failure"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
