#!/usr/bin/env python3
"""GPT-2 small training with PyTorch's allocator and with gpumem: same losses? same speed?

Run from the repository root on a GPU machine, after installing (docs/torch.md):

    pip install --no-build-isolation --no-deps .
    python3 integrations/torch/gpu_train_check.py

Each run is its own process (this script with --worker):
  default   PyTorch's own caching allocator
  gpumem    gpumem.torch.enable(): gpumem as PyTorch's allocator (the native backend,
            gpumem.torch._C)
  control   PyTorch's allocator again: if it differs from `default`, the workload itself is
            not deterministic here and the loss comparison proves nothing (said so)
  oom       gpumem with reserve_limit=1GiB: a 2 GiB tensor must raise torch.OutOfMemoryError,
            and the CUDA context must stay healthy (a kernel on a new tensor, checked result)

The workload is gpt2_train of tools/torch_record_traces.py (same model, optimizer,
seeds and batch/sequence schedule), made deterministic: CUBLAS_WORKSPACE_CONFIG=:4096:8 before
CUDA starts, cudnn.deterministic, use_deterministic_algorithms(True, warn_only=True), and (by
default, --sdpa math) attention on the math kernels, whose backward is deterministic.

Prints a per-step table (loss as float.hex, step time), then one JSON summary line. Exit
status 0 when the losses are bit-identical and the out-of-memory check passed; the step-time
ratio and peak reserved bytes are reported, not judged.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GiB = 1 << 30


def find_package_dir(build):
    """Where gpumem.torch comes from: "" when it is installed (pip install
    --no-build-isolation .), else `build` or ROOT/python when gpumem/torch/_C*.so is there."""
    import glob
    import importlib.util
    if not build and importlib.util.find_spec("gpumem") is not None:
        return ""
    d = os.path.abspath(build or os.path.join(ROOT, "python"))
    if glob.glob(os.path.join(d, "gpumem", "torch", "_C*.so")):
        return d
    sys.exit("gpu_train_check: gpumem.torch._C is neither installed nor built under %s; run "
             "`pip install --no-build-isolation --no-deps .` first (docs/torch.md)" % d)


class Installed:
    """What gpumem.torch.enable() installed (the old shim's handle had these fields)."""
    routing = "native backend"

    def __init__(self, device):
        self.device = device


# --- workers (separate processes) -----------------------------------------------------------

def setup_torch(args):
    """Import torch deterministically; with gpumem, enable it before the first allocation."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    gmt = handle = None
    if args.allocator == "gpumem":
        # Before CUDA starts: PyTorch cannot swap an allocator that is initialized.
        if args.pkg:
            sys.path.insert(0, args.pkg)
        import gpumem.torch as gmt
        gmt.enable(conf=args.conf)
    torch.cuda.init()
    if gmt is not None:
        handle = Installed(torch.cuda.current_device())
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.sdpa == "math":
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)
    return torch, gmt, handle


def gpt2_setup(torch, dev, wrap=None):
    """gpt2_train's model (wrapped by `wrap`, e.g. DistributedDataParallel), its optimizer and
    the generator of batch shapes (ddp_train_check.py trains the same)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config()).to(dev)
    if wrap is not None:
        m = wrap(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    return m, opt, torch.Generator().manual_seed(1)


def gpt2_shape(torch, g):
    """The next (batch, sequence length) of gpt2_train's schedule."""
    bs = int(torch.randint(2, 17, (1,), generator=g))
    sl = int(torch.randint(64, 1025, (1,), generator=g))
    return bs, sl


def gpt2_step(torch, m, opt, bs, sl, dev):
    """One training step of gpt2_train on random tokens; returns the loss tensor."""
    x = torch.randint(0, 50257, (bs, sl), device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = m(input_ids=x, labels=x).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return loss


def worker_train(args):
    torch, gmt, handle = setup_torch(args)

    dev = "cuda"
    # gpt2_train, step for step; only the timing and the loss readout are added.
    m, opt, g = gpt2_setup(torch, dev)
    steps = []
    torch.cuda.synchronize()
    for s in range(args.steps):
        bs, sl = gpt2_shape(torch, g)
        t0 = time.perf_counter()
        loss = gpt2_step(torch, m, opt, bs, sl, dev)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        steps.append({"step": s, "bs": bs, "sl": sl, "loss": float(loss.detach().float().item()),
                      "ms": dt * 1e3})
    torch.cuda.synchronize()

    out = {"allocator": args.allocator, "mode": args.mode if gmt else None, "steps": steps,
           "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "sdpa": args.sdpa}
    for key, fn in (("torch_max_reserved", torch.cuda.max_memory_reserved),
                    ("torch_max_allocated", torch.cuda.max_memory_allocated),
                    ("torch_reserved_end", torch.cuda.memory_reserved)):
        try:
            out[key] = fn()
        except Exception as e:  # PyTorch's stats must not raise: report it if they do
            out[key] = None
            out.setdefault("torch_stats_errors", []).append("%s: %s" % (key, str(e)[:200]))
    if gmt is not None:
        st = gmt.stats()
        out["gpumem"] = {k: st[k] for k in (
            "peak_reserved_bytes", "reserved_bytes", "peak_live_bytes", "live_bytes",
            "alloc_count", "free_count", "oom_count", "segments")}
        out["gpumem_routing"] = handle.routing
        out["gpumem_conf"] = gmt._ext().conf()
        if out.get("torch_reserved_end"):
            # PyTorch's memory_reserved is gpumem's reserved bytes: the ratio should be 1.
            out["gpumem_share_of_torch_reserved"] = st["reserved_bytes"] / out["torch_reserved_end"]
    return out


def worker_oom(args):
    torch, gmt, handle = setup_torch(args)
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    out = {"allocator": "gpumem", "mode": args.mode, "conf": args.conf, "routing": handle.routing}
    try:
        big = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
        big.fill_(1)
        torch.cuda.synchronize()
        out["oom"] = "FAIL: a 2 GiB tensor was created under reserve_limit=1GiB (data_ptr %#x)" \
            % big.data_ptr()
        del big
    except oom_type as e:
        out["oom"] = "OK"
        out["oom_message"] = str(e).splitlines()[0][:300]
    except Exception as e:
        out["oom"] = "FAIL: %s instead of torch.OutOfMemoryError: %s" % (type(e).__name__,
                                                                          str(e)[:300])
    out["gpumem_last_error"] = gmt.last_error(handle.device)[:300]
    # The context must be healthy: a new tensor, a kernel on it, the right answer.
    try:
        x = torch.ones(1 << 20, device="cuda")
        total = x.sum().item()
        mid = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # fits under the limit
        mid.fill_(3)
        mid_sum = int(mid[:1024].sum().item())
        torch.cuda.synchronize()
        ok = total == float(1 << 20) and mid_sum == 3 * 1024
        out["after"] = "OK" if ok else "FAIL: wrong results %r %r" % (total, mid_sum)
    except Exception as e:
        out["after"] = "FAIL: %s: %s" % (type(e).__name__, str(e)[:300])
    try:
        st = gmt.stats(handle.device)
        out["gpumem_oom_count"] = st["oom_count"]
        out["gpumem_peak_reserved"] = st["peak_reserved_bytes"]
    except Exception as e:
        out["gpumem_stats_error"] = str(e)[:300]
    return out


def worker_main(args):
    try:
        res = worker_oom(args) if args.worker == "oom" else worker_train(args)
    except Exception:
        res = {"error": traceback.format_exc()}
    with open(args.out, "w") as f:
        json.dump(res, f)
    return 0 if "error" not in res else 1


# --- the orchestrator -----------------------------------------------------------------------

def run_worker(args, name, extra, pkg):
    fd, path = tempfile.mkstemp(prefix="gm_%s_" % name, suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", extra.pop("worker"),
           "--out", path, "--pkg", pkg, "--steps", str(args.steps), "--sdpa", args.sdpa]
    for k, v in extra.items():
        cmd += ["--" + k, str(v)]
    env = dict(os.environ)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONHASHSEED"] = "0"
    env.pop("GPUMEM_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout after %d s" % args.timeout, e.stderr or ""
        if isinstance(err, bytes):
            err = err.decode("utf-8", "replace")
    wall = time.time() - t0
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"error": "worker %s wrote no result (exit %s)" % (name, rc)}
    os.unlink(path)
    if "error" in res:
        res["stderr_tail"] = err[-3000:]
    shim = [l for l in err.splitlines() if "gpumem" in l]
    if shim:
        res["stderr_gpumem"] = shim[:20]
    print("  %-14s %5.1f s  %s" % (name, wall, "ERROR" if "error" in res else "done"), flush=True)
    return res


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return float("nan") if not n else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def compare_losses(a, b):
    diffs = []
    for sa, sb in zip(a["steps"], b["steps"]):
        if sa["loss"] != sb["loss"] or (sa["bs"], sa["sl"]) != (sb["bs"], sb["sl"]):
            diffs.append({"step": sa["step"], "a": float.hex(sa["loss"]),
                          "b": float.hex(sb["loss"])})
    if len(a["steps"]) != len(b["steps"]):
        diffs.append({"step": "count", "a": len(a["steps"]), "b": len(b["steps"])})
    return diffs


def step_ms(res, warmup):
    return [s["ms"] for s in res["steps"][warmup:]]


def main_orchestrate(args):
    pkg = find_package_dir(args.build)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m != "native"]
    if bad:
        sys.exit("gpu_train_check: unknown mode(s) %s (the only one is native; the shim's pool "
                 "and replace modes are gone, docs/torch.md)" % ",".join(bad))
    print("gpu_train_check: GPT-2 small, %d steps (%d warm-up), sdpa=%s, gpumem from %s"
          % (args.steps, args.warmup, args.sdpa, pkg or "the installed package"), flush=True)
    runs = {"default": run_worker(args, "default", {"worker": "train", "allocator": "default"},
                                  pkg)}
    for m in modes:
        runs["gpumem_" + m] = run_worker(
            args, "gpumem_" + m,
            {"worker": "train", "allocator": "gpumem", "mode": m, "conf": args.conf}, pkg)
    if not args.no_control:
        runs["control"] = run_worker(args, "control", {"worker": "train", "allocator": "default"},
                                     pkg)
    oom = run_worker(args, "oom", {"worker": "oom", "allocator": "gpumem", "mode": "native",
                                   "conf": "reserve_limit=1GiB"}, pkg)

    for name, res in list(runs.items()) + [("oom", oom)]:
        if "error" in res:
            print("\n--- %s failed ---\n%s\n%s" % (name, res["error"], res.get("stderr_tail", "")))
        for line in res.get("stderr_gpumem", []):
            print("  [%s stderr] %s" % (name, line))

    base = runs["default"]
    summary = {"steps": args.steps, "warmup": args.warmup, "sdpa": args.sdpa,
               "torch": base.get("torch"), "device": base.get("device")}
    ok = "error" not in base
    names = [n for n in runs if n != "default" and "error" not in runs[n]]
    if ok:
        cols = ["default"] + names
        short = {"default": "default", "control": "control", "gpumem_native": "gpumem"}
        print("\nstep  bs    sl  " + "".join("%-24s" % ("loss " + short[c]) for c in cols)
              + "".join("%12s" % ("ms " + short[c]) for c in cols))
        for i, s in enumerate(base["steps"]):
            print("%4d %3d %5d  " % (s["step"], s["bs"], s["sl"])
                  + "".join("%-24s" % float.hex(runs[c]["steps"][i]["loss"])
                            if i < len(runs[c]["steps"]) else "%-24s" % "-" for c in cols)
                  + "".join("%12.1f" % runs[c]["steps"][i]["ms"]
                            if i < len(runs[c]["steps"]) else "%12s" % "-" for c in cols))
        d_ms = step_ms(base, args.warmup)
        summary["step_ms_default"] = round(mean(d_ms), 3)
        summary["peak_reserved_default"] = base.get("torch_max_reserved")
        summary["peak_allocated_default"] = base.get("torch_max_allocated")
        for n in names:
            r = runs[n]
            diffs = compare_losses(base, r)
            n_ms = step_ms(r, args.warmup)
            ratios = [b / a for a, b in zip(d_ms, n_ms) if a > 0]
            entry = {"losses_identical": not diffs, "loss_diffs": diffs[:5],
                     "step_ms": round(mean(n_ms), 3),
                     "step_time_ratio": round(mean(n_ms) / mean(d_ms), 4),
                     "median_step_ratio": round(median(ratios), 4),
                     "peak_reserved_torch_view": r.get("torch_max_reserved"),
                     "peak_allocated_torch_view": r.get("torch_max_allocated")}
            if "gpumem" in r:
                entry["peak_reserved_gpumem"] = r["gpumem"]["peak_reserved_bytes"]
                entry["gpumem_segment_requests"] = r["gpumem"]["alloc_count"]
                entry["gpumem_routing"] = r.get("gpumem_routing")
                entry["gpumem_share_of_torch_reserved"] = r.get("gpumem_share_of_torch_reserved")
                entry["within_2pct"] = abs(entry["step_time_ratio"] - 1) <= 0.02
            if r.get("torch_stats_errors"):
                entry["torch_stats_errors"] = r["torch_stats_errors"]
            summary[n] = entry
            if n.startswith("gpumem"):
                ok = ok and not diffs
        for n in runs:
            if "error" in runs[n]:
                summary[n] = {"error": runs[n]["error"].strip().splitlines()[-1][:300]}
                ok = False
        if "control" in summary and "losses_identical" in summary["control"] \
                and not summary["control"]["losses_identical"]:
            summary["note"] = ("PyTorch's allocator alone gave different losses in two runs: the "
                               "workload is not deterministic on this machine, so a loss "
                               "difference with gpumem is not gpumem's doing")
    summary["oom_check"] = oom.get("oom") or \
        "FAIL: " + oom.get("error", "?").strip().splitlines()[-1][:300]
    summary["oom_after"] = oom.get("after")
    summary["oom_message"] = oom.get("oom_message")
    summary["oom_gpumem_last_error"] = oom.get("gpumem_last_error")
    ok = ok and oom.get("oom") == "OK" and oom.get("after") == "OK"
    summary["ok"] = ok
    print()
    for n in names:
        e = summary.get(n, {})
        if "losses_identical" in e:
            print("%-14s losses %s; step time %.2f ms vs %.2f ms (ratio %.4f, median per-step "
                  "%.4f); peak reserved torch %s%s"
                  % (n, "bit-identical" if e["losses_identical"] else "DIFFER",
                     e["step_ms"], summary["step_ms_default"], e["step_time_ratio"],
                     e["median_step_ratio"], e["peak_reserved_torch_view"],
                     ", gpumem %s" % e["peak_reserved_gpumem"] if "peak_reserved_gpumem" in e
                     else ""))
    print("default        peak reserved %s, peak allocated %s"
          % (summary.get("peak_reserved_default"), summary.get("peak_allocated_default")))
    print("oom check      %s; afterwards %s" % (summary["oom_check"], summary["oom_after"]))
    print(json.dumps(summary))
    return 0 if ok else 1


def parse_args(doc, workers, timeout, more=None):
    """The options of this script and ddp_train_check.py: the orchestrator's, the hidden worker
    ones, and `more(ap)`'s own."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--build", help="a directory holding gpumem/torch/_C*.so (default: the "
                    "installed package, else python/)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--conf", default="", help="GPUMEM_CONF for the gpumem training runs")
    ap.add_argument("--sdpa", default="math", choices=["math", "default"],
                    help="attention kernels: math (deterministic backward) or PyTorch's choice")
    ap.add_argument("--no-control", action="store_true",
                    help="skip the second run with PyTorch's allocator")
    ap.add_argument("--timeout", type=int, default=timeout, help="seconds per worker")
    if more:
        more(ap)
    # worker side
    ap.add_argument("--worker", choices=workers, help=argparse.SUPPRESS)
    ap.add_argument("--allocator", choices=["default", "gpumem"], help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="native", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--pkg", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.conf == "":
        args.conf = None if args.worker else ""
    return args


def main():
    def more(ap):
        ap.add_argument("--warmup", type=int, default=3, help="steps left out of the mean time")
        ap.add_argument("--modes", default="native", help=argparse.SUPPRESS)
    args = parse_args(__doc__, ["train", "oom"], 300, more)
    if args.worker:
        return worker_main(args)
    return main_orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
