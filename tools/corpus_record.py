"""Run one corpus workload (tools/corpus_workloads.py) or held-out one
(tools/heldout_workloads.py) on the GPU under one allocator and print
its figures as one JSON line; with --record, also write its allocation trace.

usage: corpus_record.py NAME OUTDIR --alloc default|expandable|gpumem [--record]

- default: PyTorch's caching allocator; expandable: the same with expandable_segments:True;
  gpumem: gpumem.torch.enable() with its defaults (GPUMEM_CONF adds settings).
- --record with default writes OUTDIR/NAME.csv.gz from PyTorch's memory history (allocations and
  completed frees in program order, no stacks: tools/torch_record_traces.py's export); with
  gpumem it uses the backend's own trace= setting.
- Each step is timed with CUDA events (the first is warm-up and left out of the median); peak
  reserved and peak live are PyTorch's max_memory_reserved / max_memory_allocated.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("out")
    ap.add_argument("--alloc", choices=("default", "expandable", "gpumem"), default="default")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    trace = os.path.join(a.out, a.name + ".csv.gz")
    if a.alloc == "gpumem":
        import gpumem.torch
        conf = os.environ.get("GPUMEM_CONF", "")
        if a.record:
            conf = (conf + "," if conf else "") + "trace=" + trace
        gpumem.torch.enable(conf)
    import torch
    sys.path.insert(0, HERE)
    import corpus_workloads
    torch.manual_seed(0)
    torch.cuda.init()
    if a.record and a.alloc == "default":
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=20_000_000)
    t0 = time.time()
    make = corpus_workloads.workload(a.name)
    if make is None:
        sys.exit("corpus_record.py: %r is no workload of tools/corpus_workloads.py or "
                 "tools/heldout_workloads.py" % a.name)
    step, steps = make("cuda")
    times = []
    for i in range(steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step(i)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    torch.cuda.synchronize()
    info = dict(workload=a.name, alloc=a.alloc, steps=steps, seconds=round(time.time() - t0, 2),
                peak_reserved=torch.cuda.max_memory_reserved(),
                peak_live=torch.cuda.max_memory_allocated(),
                step_ms_median=round(statistics.median(times[1:]), 3),
                step_ms_min=round(min(times[1:]), 3), step_ms_max=round(max(times[1:]), 3),
                num_alloc_retries=torch.cuda.memory_stats().get("num_alloc_retries", 0),
                torch=torch.__version__, device=torch.cuda.get_device_name(0))
    if a.record and a.alloc == "default":
        import torch_record_traces
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        info["events"] = torch_record_traces.export(snap, trace)
    elif a.record:
        gpumem.torch.trace_stop()
    if a.alloc == "gpumem":
        st = gpumem.torch.stats()
        info["gpumem_device_calls"] = st.get("device_calls")
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
