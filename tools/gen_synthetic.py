#!/usr/bin/env python3
"""Synthetic allocation traces in RMM's logging CSV (docs/trace-format.md), for the strategy
comparison in docs/strategies.md. Standard library only; the same seed gives the same file.

Workloads (the design documents' scenarios):
  inference  fixed tensor sizes: weights loaded once, then requests whose activations come
             from a small fixed set of shapes and whose KV cache grows in equal 1 MiB pages
  training   widely varying sizes: persistent weights, gradients and optimizer state, then
             iterations whose activations scale with a random sequence length (dynamic
             padding), allocated forward and freed backward
  mixed      many small short-lived tensors, medium and large ones with random lifetimes

usage: gen_synthetic.py WORKLOAD [--seed N] [--ops N] -o FILE(.csv or .csv.gz)
"""
import argparse
import gzip
import io
import random
import sys

KiB = 1024
MiB = 1024 * KiB


class Trace:
    """Writes allocate/free lines with fake, never reused pointers and a steady clock."""

    def __init__(self, out):
        self.out = out
        self.next_ptr = 0x7F0000000000
        self.t = 0.0
        self.live = {}
        self.ops = 0
        out.write("Thread,Time,Action,Pointer,Size,Stream\n")

    def _line(self, action, ptr, size):
        self.t += 0.000004
        self.ops += 1
        self.out.write("0,%.6f,%s,0x%x,%d,0x0\n" % (self.t, action, ptr, size))

    def alloc(self, size):
        ptr = self.next_ptr
        self.next_ptr += (size + 511) // 512 * 512 + 512
        self.live[ptr] = size
        self._line("allocate", ptr, size)
        return ptr

    def free(self, ptr):
        self._line("free", ptr, self.live.pop(ptr))

    def free_all(self):
        for ptr in list(self.live):
            self.free(ptr)


def inference(tr, rng, ops):
    for _ in range(160):  # weights: 1-64 MiB matrices, kept
        tr.alloc(rng.choice([1, 2, 4, 8, 16, 32, 64]) * MiB)
    shapes = [256 * KiB, 512 * KiB, 1 * MiB, 1 * MiB, 1 * MiB, 768 * KiB, 4 * KiB]
    requests = []
    while tr.ops < ops:
        if len(requests) < 24 and rng.random() < 0.6:  # a new request: prompt KV pages
            requests.append([tr.alloc(1 * MiB) for _ in range(rng.randint(4, 32))])
        for kv in requests:  # one decode step: activations of fixed shapes, one new KV page
            acts = [tr.alloc(s) for s in shapes]
            for p in reversed(acts):
                tr.free(p)
            if rng.random() < 0.25:
                kv.append(tr.alloc(1 * MiB))
        for kv in [r for r in requests if rng.random() < 0.08]:  # finished requests
            requests.remove(kv)
            for p in kv:
                tr.free(p)
    tr.free_all()


def training(tr, rng, ops):
    layers = [rng.choice([4, 8, 16, 32, 64, 128]) * 64 * KiB * rng.randint(1, 8)
              for _ in range(96)]
    for size in layers:  # weights, gradients, two optimizer moments
        for _ in range(4):
            tr.alloc(size)
    while tr.ops < ops:
        seq = rng.randint(16, 512)  # dynamic padding: every activation scales with it
        acts = []
        for size in layers:
            act = max(512, size // 64 * seq // 8 + rng.randint(0, 4096))
            acts.append(tr.alloc(act))
            if rng.random() < 0.5:  # a temporary inside the layer
                tr.free(tr.alloc(max(512, act // rng.randint(1, 8))))
        for p in reversed(acts):
            g = tr.alloc(tr.live[p])  # the activation's gradient, freed with it
            tr.free(p)
            tr.free(g)
    tr.free_all()


def mixed(tr, rng, ops):
    held = []
    while tr.ops < ops:
        r = rng.random()
        if r < 0.70:
            size = rng.randint(1, 64) * 512 + rng.randint(0, 511)
        elif r < 0.95:
            size = rng.randint(64 * KiB, 8 * MiB)
        else:
            size = rng.randint(8 * MiB, 256 * MiB)
        held.append(tr.alloc(size))
        while held and (len(held) > 3000 or rng.random() < 0.48):
            tr.free(held.pop(rng.randrange(len(held))))
    tr.free_all()


WORKLOADS = {"inference": inference, "training": training, "mixed": mixed}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ops", type=int, default=200000, help="about this many lines")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    rng = random.Random("%s:%d" % (args.workload, args.seed))
    if args.output.endswith(".gz"):  # no name or time in the header: same seed, same bytes
        raw = open(args.output, "wb")
        out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
        text = io.TextIOWrapper(out, encoding="ascii", newline="\n")
    else:
        text = open(args.output, "w", encoding="ascii", newline="\n")
    with text:
        WORKLOADS[args.workload](Trace(text), rng, args.ops)
    if args.output.endswith(".gz"):
        raw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
