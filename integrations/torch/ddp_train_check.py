#!/usr/bin/env python3
"""GPT-2 small with DistributedDataParallel on 2 GPUs over NCCL: gpumem vs PyTorch's allocator.

Run from the repository root on a machine with 2 or more GPUs, after installing (docs/torch.md,
docs/multi-gpu.md):

    pip install --no-build-isolation --no-deps .
    python3 integrations/torch/ddp_train_check.py

With fewer than 2 GPUs (or without PyTorch) it says so and exits 0: there is nothing to compare.

Each configuration is one worker process (this script with --worker) that starts 2 ranks with
torch.multiprocessing (rank r on GPU r, NCCL over the env:// rendezvous on localhost):
  default   PyTorch's own caching allocator in both ranks
  gpumem    gpumem.torch.enable() in both ranks (the native backend; one gpumem pool per device)
  control   PyTorch's allocator again: if it differs from `default`, the workload is not
            deterministic here and the loss comparison proves nothing (said so)

The model, optimizer and batch schedule are gpu_train_check.py's (gpt2_train of
tools/torch_record_traces.py), made deterministic the same way; each rank draws its
own tokens (seeded by rank), DDP averages the gradients. NCCL's NVLink multicast (NVLS) stays
off: NCCL_NVLS_ENABLE=0, as the device machines require.

Prints each rank's losses side by side and one JSON summary line: per configuration and rank
the peak reserved bytes (PyTorch's max_memory_reserved, and gpumem's own peak for gpumem).
Exit status 0 when every rank's losses are bit-identical between default and gpumem.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_train_check as single  # noqa: E402  (the model, the setup, the comparisons)

WORLD = 2


# --- a rank (a process of its own, started by torch.multiprocessing) --------------------------

def rank_main(rank, args, port, out_prefix):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
                       "NCCL_NVLS_ENABLE": "0"})
    # gpumem first: set_device starts CUDA, and PyTorch cannot swap an initialized allocator.
    # gpumem makes one pool per device, on the device's first allocation.
    torch, gmt, _ = single.setup_torch(args)
    torch.cuda.set_device(rank)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    dev = torch.device("cuda", rank)
    m, opt, g = single.gpt2_setup(torch, dev, wrap=lambda mod: DDP(mod, device_ids=[rank]))
    torch.manual_seed(100 + rank)  # each rank its own tokens; DDP averages the gradients
    steps = []
    for s in range(args.steps):
        bs, sl = single.gpt2_shape(torch, g)
        t0 = time.perf_counter()
        loss = single.gpt2_step(torch, m, opt, bs, sl, dev)
        torch.cuda.synchronize()
        steps.append({"step": s, "bs": bs, "sl": sl, "loss": float(loss.detach().float().item()),
                      "ms": (time.perf_counter() - t0) * 1e3})
    out = {"rank": rank, "allocator": args.allocator, "steps": steps,
           "torch_max_reserved": torch.cuda.max_memory_reserved(dev),
           "torch_max_allocated": torch.cuda.max_memory_allocated(dev)}
    if gmt is not None:
        st = gmt.stats(device=rank)
        out["gpumem"] = {k: st[k] for k in ("peak_reserved_bytes", "reserved_bytes",
                                            "peak_live_bytes", "alloc_count", "free_count",
                                            "oom_count", "device")}
    dist.barrier()
    dist.destroy_process_group()
    with open("%s.rank%d" % (out_prefix, rank), "w") as f:
        json.dump(out, f)


def worker_ddp(args):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port, args.out), nprocs=WORLD, join=True)
    ranks = []
    for r in range(WORLD):
        with open("%s.rank%d" % (args.out, r)) as f:
            ranks.append(json.load(f))
        os.unlink("%s.rank%d" % (args.out, r))
    with open(args.out, "w") as f:
        json.dump({"allocator": args.allocator, "ranks": ranks}, f)


# --- orchestration ------------------------------------------------------------------------------

def gpus_available():
    """How many GPUs PyTorch sees, asked in a child process (this one never starts CUDA)."""
    r = subprocess.run([sys.executable, "-c",
                        "import torch; print(torch.cuda.device_count() if "
                        "torch.cuda.is_available() else 0)"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return 0, "PyTorch is not usable here: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    n = int(r.stdout.strip() or 0)
    return n, "PyTorch sees %d GPU%s" % (n, "" if n == 1 else "s")


def run_config(args, name, allocator, pkg):
    fd, path = tempfile.mkstemp(prefix="gm_ddp_%s_" % name, suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "ddp", "--allocator",
           allocator, "--out", path, "--pkg", pkg, "--steps", str(args.steps), "--sdpa",
           args.sdpa] + (["--conf", args.conf] if args.conf else [])
    env = dict(os.environ)
    env.update({"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0",
                "NCCL_NVLS_ENABLE": "0"})
    for k in ("GPUMEM_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout after %d s" % args.timeout, str(e.stderr or "")
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"error": "worker %s wrote no result (exit %s)" % (name, rc),
               "stderr_tail": err[-3000:]}
    os.unlink(path)
    print("  %-10s %6.1f s  %s" % (name, time.time() - t0, "ERROR" if "error" in res else "done"),
          flush=True)
    return res


def main_orchestrate(args):
    n, why = gpus_available()
    if n < WORLD:
        print("ddp_train_check: needs %d GPUs; %s: nothing to compare, skipped" % (WORLD, why))
        return 0
    pkg = single.find_package_dir(args.build)
    print("ddp_train_check: GPT-2 small, DDP over NCCL, %d ranks, %d steps (NCCL_NVLS_ENABLE=0)"
          % (WORLD, args.steps), flush=True)
    configs = [("default", "default"), ("gpumem", "gpumem")]
    if not args.no_control:
        configs.append(("control", "default"))
    res = {name: run_config(args, name, alloc, pkg) for name, alloc in configs}
    failed = [name for name, r in res.items() if "error" in r]
    summary = {"world": WORLD, "steps": args.steps, "errors": {k: res[k] for k in failed}}
    ok = not failed
    if ok:
        summary["loss_diffs"] = {}
        for r in range(WORLD):
            a, b = res["default"]["ranks"][r], res["gpumem"]["ranks"][r]
            print("rank %d: step  bs    sl  default loss            gpumem loss" % r)
            for sa, sb in zip(a["steps"], b["steps"]):
                print("        %4d %3d %5d  %-22s  %-22s %s" % (
                    sa["step"], sa["bs"], sa["sl"], float.hex(sa["loss"]), float.hex(sb["loss"]),
                    "" if sa["loss"] == sb["loss"] else "DIFFERS"))
            summary["loss_diffs"]["rank%d" % r] = single.compare_losses(a, b)
        if "control" in res:
            summary["control_deterministic"] = all(
                not single.compare_losses(res["default"]["ranks"][r], res["control"]["ranks"][r])
                for r in range(WORLD))
        summary["peak_reserved"] = {
            name: [{"rank": rr["rank"], "torch_max_reserved": rr["torch_max_reserved"],
                    "gpumem_peak_reserved": rr.get("gpumem", {}).get("peak_reserved_bytes")}
                   for rr in r["ranks"]] for name, r in res.items()}
        ok = not any(summary["loss_diffs"].values())
        for name, r in summary["peak_reserved"].items():
            for rr in r:
                print("peak reserved %-8s rank %d: torch %s, gpumem %s" % (
                    name, rr["rank"], rr["torch_max_reserved"], rr["gpumem_peak_reserved"]))
    summary["ok"] = ok
    print(json.dumps(summary))
    return 0 if ok else 1


def main():
    args = single.parse_args(__doc__, ["ddp"], 600)
    if args.worker:
        worker_ddp(args)
        return 0
    return main_orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
