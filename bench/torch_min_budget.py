"""The smallest memory budget PyTorch's allocator runs a trace in, on the GPU: bisection on
torch.cuda.set_per_process_memory_fraction, the figure beside `gpumem replay --min-budget`.

usage: bench/torch_min_budget.py TRACE.csv.gz...   (one JSON line per trace)
The allocator is chosen by PYTORCH_CUDA_ALLOC_CONF as usual ("", "expandable_segments:True").
Each trial replays the whole trace through PyTorch's allocator from C++ (tools/torch_replay.py's
extension, replay_ooms: every op on the current stream, allocations PyTorch refuses counted),
after torch.cuda.empty_cache(), with the fraction set to budget / device memory. A budget runs
when no allocation is refused; PyTorch frees its cache and retries before it refuses, so the
budget is far below its unlimited peak reserved. The search runs between peak live bytes and
the unlimited run's peak reserved (doubled while that fails), over multiples of 2 MiB, like
gpumem's; it assumes a larger budget never fails where a smaller one ran. The CUDA context
and what PyTorch held before the replay (torch.zeros(1)) are outside the budget: the fraction
caps what the caching allocator reserves.
"""
import json, os, sys
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import torch_replay  # noqa: E402

STEP = 2 << 20


def main():
    torch.cuda.init(); torch.zeros(1, device="cuda")
    e = torch_replay.ext()
    total = torch.cuda.get_device_properties(0).total_memory
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    for path in sys.argv[1:]:
        kinds, ids, sizes, nid, peak = torch_replay.load(path)
        k, i, s = torch.tensor(kinds, dtype=torch.int8), torch.tensor(ids), torch.tensor(sizes)
        base = torch.cuda.memory_reserved()
        trials = 0

        def runs(budget):
            nonlocal trials
            trials += 1
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.set_per_process_memory_fraction(min(1.0, (budget + base) / total), 0)
            fails = e.replay_ooms(k, i, s, nid)
            return fails == 0

        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        assert e.replay_ooms(k, i, s, nid) == 0, "the trace does not run with the whole device"
        unlimited = torch.cuda.max_memory_reserved() - base
        lo, hi = peak - 1, unlimited
        while not runs(hi):
            lo, hi = hi, min(total, hi * 2)
        while True:
            mid = (lo + (hi - lo) // 2) // STEP * STEP
            if mid <= lo:
                mid += STEP
            if mid >= hi:
                break
            if runs(mid):
                hi = mid
            else:
                lo = mid
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
        print(json.dumps(dict(trace=os.path.basename(path), conf=conf, trace_peak_live=peak,
                              unlimited_max_reserved=unlimited, min_budget_bytes=hi,
                              min_budget_ratio=hi / peak, unlimited_ratio=unlimited / peak,
                              trials=trials)), flush=True)


if __name__ == "__main__":
    main()
