#!/usr/bin/env python3
"""RL-like check of gpumem.torch.sleep / wake on a GPU (docs/sleep.md), beside torch_memory_saver.

A trainer and an inference engine take turns on one GPU, in one process, as RL post-training
does: (1) a causal LM (a Llama built from a config, random weights, no download) trains a few
steps, deterministically; a CUDA graph of its forward is captured; (2) gpumem.torch.sleep keeps
the weights and the optimizer state (tagged "weights" / "optimizer") in pinned host memory and
drops everything else (a "kv_cache" ballast the trainer held, activations); the device memory
given back is measured with torch.cuda.mem_get_info; (3) a second model loads into a MemPool
and runs generate(), sized so that it would NOT fit without the sleep; (4) wake, the graph
replays with the same outputs, training goes on. The losses must be bit-identical to the same
script without the sleep (a second process), and the timings are set against the pinned
host<->device bandwidth measured in the same run.

    python integrations/torch/gpu_sleep_check.py             # every mode, one JSON line
    python integrations/torch/gpu_sleep_check.py --mode gpumem|gpumem_nosleep|tms|tms_nosleep

Modes (each a process of its own; `all` runs them and compares):
  gpumem          gpumem.torch enabled; sleep/wake between the phases (the check)
  gpumem_nosleep  the same training with no sleep (the losses' reference)
  tms             PyTorch's allocator with torch_memory_saver (the anchor): the same phases with
                  region(tag, enable_cpu_backup) / pause() / resume(); skipped if not installed
                  (pip install torch_memory_saver; its hook_mode "torch" is used unless
                  LD_PRELOAD already names its preload library)
  tms_nosleep     PyTorch's allocator, no pause (the anchor's losses' reference)

Needs torch with CUDA and transformers. Prints one JSON line (`all`: {"ok": ..., "gpumem":
{...}, "tms": {...}, "checks": {...}}); exit status 0 only when every gpumem check passed.
Targets: with nothing saved, <= 50 ms per 10 GiB given back (checked beside a kv cache of
--kv-gib, so that the pool holds more than 10 GiB; the trainer's own few GiB are reported); a
sleep and wake that save bytes <= 1.2 x those bytes / the measured bandwidths, plus the
nosave time of what is given back without a copy (the trainer gives back ~56 GB beside the
2 GB it keeps). Checked on the first cycle (which pins the host buffer) and the second (which
reuses it); the time over the copies alone is reported. bench/bench_sleep measures the copies
alone (a pool that holds only kept blocks) against 1.2 x.
"""

import argparse
import json
import os
import subprocess
import sys
import time

GiB = 1 << 30


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="all",
                    choices=["all", "gpumem", "gpumem_nosleep", "tms", "tms_nosleep"])
    ap.add_argument("--steps", type=int, default=4, help="training steps before and after (each)")
    ap.add_argument("--hidden", type=int, default=1024, help="trainer's hidden size")
    ap.add_argument("--layers", type=int, default=8, help="trainer's layers")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--fill", type=float, default=0.70,
                    help="fraction of the GPU the trainer holds (its state plus a discarded "
                         "kv_cache ballast)")
    ap.add_argument("--infer-hidden", type=int, default=2048, help="inference model's hidden size")
    ap.add_argument("--infer-layers", type=int, default=8)
    ap.add_argument("--bw-bytes", type=int, default=2 * GiB, help="bytes for the bandwidth test")
    ap.add_argument("--prepare", action="store_true",
                    help="gpumem: sleep_prepare once the optimizer state exists (the first "
                    "sleep then only copies; prepare_s reports the pinning)")
    ap.add_argument("--kv-gib", type=int, default=16,
                    help="GiB of 64 MiB kv-cache tensors for the nosave cycle per 10 GiB")
    return ap.parse_args(argv)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the workload (every mode)

def llama(hidden, layers, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128),
                      num_key_value_heads=max(1, hidden // 128), max_position_embeddings=4096,
                      attention_dropout=0.0)
    cfg._attn_implementation = "eager"  # deterministic backward
    return LlamaForCausalLM(cfg).to(dtype)


def measure_bandwidth(torch, nbytes):
    """Pinned host <-> device copy bandwidth (bytes/s), each way, median of 3."""
    n = max(nbytes, 64 << 20)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    res = {}
    for name, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        times = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        times = sorted(times[1:])
        res[name] = n / times[len(times) // 2]
    del host, dev
    return res


class Phases:
    """How a mode keeps and gives back memory: gpumem, torch_memory_saver, or nothing."""

    def __init__(self, mode):
        self.mode = mode
        self.tms = None
        if mode.startswith("gpumem"):
            import gpumem.torch as gmt
            self.gmt = gmt
        elif mode == "tms":
            import torch_memory_saver as tmsmod
            tms = getattr(tmsmod, "torch_memory_saver", None) or tmsmod.TorchMemorySaver()
            if "torch_memory_saver" not in os.environ.get("LD_PRELOAD", ""):
                try:
                    tms.hook_mode = "torch"  # no LD_PRELOAD needed (newer releases)
                except Exception as e:  # older releases: preload only
                    log("torch_memory_saver: hook_mode unavailable (%s); set LD_PRELOAD" % e)
            self.tms = tms

    def region(self, tag, keep):
        """Allocations inside belong to `tag`; keep: contents survive the sleep."""
        import contextlib
        if self.mode == "gpumem":
            return self.gmt.tag(tag)
        if self.tms is not None:
            try:
                return self.tms.region(tag=tag, enable_cpu_backup=keep)
            except TypeError:  # a release without CPU backup: contents are lost
                return self.tms.region(tag=tag)
        return contextlib.nullcontext()

    def sleep(self, keep_tags):
        if self.mode == "gpumem":
            self.gmt.sleep(offload=keep_tags)
        elif self.tms is not None:
            self.tms.pause()

    def wake(self):
        if self.mode == "gpumem":
            self.gmt.wake()
        elif self.tms is not None:
            self.tms.resume()


def calls_between(a, b):
    """The device pool's memory calls between two gpumem.torch.stats(): {kind: [count, ms]}."""
    return {k: [b["device_calls"][k] - a["device_calls"][k],
                round((b["device_call_ns"][k] - a["device_call_ns"][k]) / 1e6, 3)]
            for k in b["device_calls"] if b["device_calls"][k] != a["device_calls"][k]}


def timed_cycle(torch, gmt, offload):
    """One sleep and wake: seconds of each and their memory calls ({"sleep": .., "wake": ..})."""
    torch.cuda.synchronize()
    s0 = gmt.stats()
    t0 = time.perf_counter()
    gmt.sleep(offload=offload)
    t1 = time.perf_counter()
    s1 = gmt.stats()
    t2 = time.perf_counter()
    gmt.wake()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, {"sleep": calls_between(s0, s1), "wake": calls_between(s1, gmt.stats()),
                              "reserved_before": s0["reserved_bytes"]}


def budget_s(ideal_s, reserved, saved):
    """What a sleep and wake may take: 1.2 x the copies at the bandwidth measured, plus 50 ms
    per 10 GiB of the memory given back without a copy."""
    return 1.2 * ideal_s + 0.050 * max(reserved - saved, 0) / (10 * GiB)


def child(args):
    if args.mode.startswith("gpumem"):
        import gpumem.torch
        gpumem.torch.enable()  # before CUDA starts
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {"mode": args.mode, "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    ph = Phases(args.mode)
    sleeping = args.mode in ("gpumem", "tms")
    free0, total = torch.cuda.mem_get_info()
    out["gpu_total_bytes"] = total

    with ph.region("weights", True):
        model = llama(args.hidden, args.layers, torch.float32).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    g = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, 32000, (args.batch, args.seq), generator=g) for _ in range(2 * args.steps)]

    def step(i):
        x = batches[i].cuda()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        with ph.region("optimizer", True):
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    losses = [step(i) for i in range(args.steps)]
    if args.prepare and args.mode == "gpumem":
        t0 = time.perf_counter()
        ph.gmt.sleep_prepare(offload=["weights", "optimizer"])
        out["prepare_s"] = time.perf_counter() - t0
    # A CUDA graph of the forward, captured before the sleep: it must replay after the wake.
    with ph.region("weights", True):  # the graph's input is kept too (its output is rewritten)
        static_in = batches[0][:1, :64].cuda()
    model.eval()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    def graphed(x):
        # the model's own weights without transformers' mask code, which copies a host tensor
        # and so cannot be captured: embeddings, the first layer's MLP, the norm and the head
        h = model.model.embed_tokens(x)
        h = h + model.model.layers[0].mlp(h)
        return model.lm_head(model.model.norm(h))

    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            graphed(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = graphed(static_in)
    graph.replay()
    torch.cuda.synchronize()
    graph_ref = static_out.clone().cpu()
    model.train()
    # The trainer's discarded memory (a kv cache of the rollout, activations): fill the GPU.
    free_now = torch.cuda.mem_get_info()[0]
    ballast_bytes = max(0, int(total * args.fill) - (total - free_now))
    with ph.region("kv_cache", False):
        ballast = torch.empty(ballast_bytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out["trainer_bytes"] = total - torch.cuda.mem_get_info()[0]
    out["state_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
        if torch.is_tensor(t))

    if sleeping:  # the ballast stays allocated: its contents are what the sleep discards
        torch.cuda.synchronize()
        if args.mode == "tms":
            torch.cuda.empty_cache()  # PyTorch's cache is outside the saver's regions
        free_before = torch.cuda.mem_get_info()[0]
        stats0 = ph.gmt.stats() if args.mode == "gpumem" else None
        t0 = time.perf_counter()
        ph.sleep(["weights", "optimizer"])
        torch.cuda.synchronize()
        out["sleep_s"] = time.perf_counter() - t0
        free_after = torch.cuda.mem_get_info()[0]
        out["given_back_bytes"] = free_after - free_before
        if args.mode == "gpumem":
            st = ph.gmt.sleep_stats()
            stats1 = ph.gmt.stats()
            out["calls"] = {"sleep": calls_between(stats0, stats1)}
            out["saved_bytes"] = st["sleep_saved_bytes"]
            out["reserved_while_asleep"] = torch.cuda.memory_reserved()
            out["graph_pools_reserved_bytes"] = st["graph_pools_reserved_bytes"]
            out["allocated_while_asleep"] = torch.cuda.memory_allocated()
            # PyTorch's snapshot while asleep: every kept tensor still an allocated block there
            live = set()
            snap_bytes = 0
            for seg in torch.cuda.memory_snapshot():
                a = seg["address"]
                for b in seg["blocks"]:
                    if b["state"] == "active_allocated":
                        live.add(a)
                        snap_bytes += b["size"]
                    a += b["size"]
            kept = [p.data_ptr() for p in model.parameters()] + [
                t.data_ptr() for st_ in opt.state.values() for t in st_.values()
                if torch.is_tensor(t) and t.is_cuda]
            out["snapshot_asleep_kept_found"] = sum(k in live for k in kept)
            out["snapshot_asleep_kept"] = len(kept)
            out["snapshot_asleep_allocated_bytes"] = snap_bytes
        else:
            out["saved_bytes"] = out["state_bytes"]
        # The inference engine: needs more than was free before the sleep.
        need = free_before + (free_after - free_before) // 2
        out["infer_need_bytes"] = need
        out["infer_fits_without_sleep"] = need <= free_before
        pool = torch.cuda.MemPool() if args.mode == "gpumem" else None
        import contextlib
        with (torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()):
            im = llama(args.infer_hidden, args.infer_layers, torch.bfloat16).cuda().eval()
            rest = need - sum(p.numel() * p.element_size() for p in im.parameters())
            kv = torch.empty(max(rest, 0), dtype=torch.uint8, device="cuda")
            prompt = batches[0][:2, :32].cuda()
            t0 = time.perf_counter()
            with torch.no_grad():
                gen = im.generate(input_ids=prompt, max_new_tokens=16, do_sample=False)
            torch.cuda.synchronize()
            out["generate_s"] = time.perf_counter() - t0
            out["generated_tokens"] = int(gen.shape[1] - prompt.shape[1])
            del im, kv, gen, prompt
        del pool
        import gc
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        stats0 = ph.gmt.stats() if args.mode == "gpumem" else None
        t0 = time.perf_counter()
        ph.wake()
        torch.cuda.synchronize()
        out["wake_s"] = time.perf_counter() - t0
        if args.mode == "gpumem":
            out["calls"]["wake"] = calls_between(stats0, ph.gmt.stats())
    del ballast
    graph.replay()
    torch.cuda.synchronize()
    out["graph_same"] = bool(torch.equal(static_out.cpu(), graph_ref))
    losses += [step(i) for i in range(args.steps, 2 * args.steps)]
    out["losses"] = losses
    out["losses_hex"] = [float(v).hex() for v in losses]
    del graph, static_out
    if args.mode == "gpumem":
        # Bandwidth in the same run, and a sleep that saves nothing (time per 10 GiB).
        bw = measure_bandwidth(torch, min(args.bw_bytes, int(out["saved_bytes"]) or args.bw_bytes))
        out["bw_d2h_Bps"], out["bw_h2d_Bps"] = bw["d2h"], bw["h2d"]
        ideal = out["saved_bytes"] / bw["d2h"] + out["saved_bytes"] / bw["h2d"]
        out["ideal_copy_s"] = ideal
        out["sleep_wake_over_ideal"] = (out["sleep_s"] + out["wake_s"]) / ideal if ideal else None
        # A second cycle: the pinned buffer of the first is reused (no pinning: docs/sleep.md).
        out["sleep2_s"], out["wake2_s"], out["calls2"] = timed_cycle(
            torch, ph.gmt, ["weights", "optimizer"])
        out["sleep_wake_over_ideal_reused"] = (
            (out["sleep2_s"] + out["wake2_s"]) / ideal if ideal else None)
        out["budget_first_s"] = budget_s(ideal, out["given_back_bytes"], out["saved_bytes"])
        out["budget_reused_s"] = budget_s(ideal, out["calls2"]["reserved_before"], out["saved_bytes"])
        # Nothing saved, ms per 10 GiB reserved: the trainer's own state (a few GiB, where the
        # fixed costs weigh), then beside a kv cache of --kv-gib in 64 MiB tensors.
        for key, kv_bytes in (("nosave", 0), ("nosave_kv", args.kv_gib * GiB)):
            with ph.region("kv_cache", False):
                kv = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
                      for _ in range(kv_bytes >> 26)]
            reserved = torch.cuda.memory_reserved()
            ts, tw, calls = timed_cycle(torch, ph.gmt, False)
            del kv
            out[key + "_reserved_bytes"] = reserved
            out[key + "_sleep_ms_per_10GiB"] = ts * 1e3 * 10 * GiB / max(reserved, 1)
            out[key + "_wake_ms_per_10GiB"] = tw * 1e3 * 10 * GiB / max(reserved, 1)
            out[key + "_calls"] = calls
        out["gm_sleep_stats"] = ph.gmt.sleep_stats()
    print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- the driver

def run_mode(mode, argv):
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode] + argv
    log("running: " + " ".join(cmd))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"mode": mode, "failed": True, "returncode": p.returncode,
            "stderr_tail": p.stderr[-3000:]}


def main():
    args = parse_args()
    if args.mode != "all":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        child(args)
        return 0
    argv = []  # the options again for each mode's process (a flag only when set)
    for k, v in vars(args).items():
        flag = "--" + k.replace("_", "-")
        if k != "mode" and v is not False:
            argv.append(flag if v is True else "%s=%s" % (flag, v))
    res = {m: run_mode(m, argv) for m in ("gpumem", "gpumem_nosleep")}
    try:
        import importlib.util
        have_tms = importlib.util.find_spec("torch_memory_saver") is not None
    except Exception:
        have_tms = False
    if have_tms:
        for m in ("tms", "tms_nosleep"):
            res[m] = run_mode(m, argv)
    else:
        res["tms"] = {"skipped": "torch_memory_saver is not installed"}
    g, ref = res["gpumem"], res["gpumem_nosleep"]
    checks = {}
    if not g.get("failed") and not ref.get("failed"):
        checks["losses_bit_identical"] = g["losses_hex"] == ref["losses_hex"]
        checks["graph_replays_same"] = g["graph_same"]
        checks["memory_given_back"] = g["given_back_bytes"] > 0
        checks["infer_needed_the_sleep"] = not g["infer_fits_without_sleep"]
        # the graph's private pool stays mapped (docs/sleep.md): all that may stay reserved
        checks["reserved_asleep_only_graphs"] = (
            g["reserved_while_asleep"] <= g["graph_pools_reserved_bytes"])
        checks["allocated_kept_asleep"] = g["allocated_while_asleep"] > 0
        checks["snapshot_asleep_lists_kept_tensors"] = (
            g["snapshot_asleep_kept_found"] == g["snapshot_asleep_kept"] > 0)
        # 1.2 x the copies' time plus 50 ms per 10 GiB given back without a copy (the pool also
        # gives back the memory it discards); bench/bench_sleep checks the copies alone
        checks["sleep_wake_within_budget"] = g["sleep2_s"] + g["wake2_s"] <= g["budget_reused_s"]
        checks["first_sleep_wake_within_budget"] = (
            g["sleep_s"] + g["wake_s"] <= g["budget_first_s"])
        # per 10 GiB on a pool of more than 10 GiB (the trainer's own few GiB: reported)
        checks["nosave_within_50ms_per_10GiB"] = (
            g["nosave_kv_sleep_ms_per_10GiB"] + g["nosave_kv_wake_ms_per_10GiB"]) <= 50
    t = res.get("tms", {})
    if "losses_hex" in t and "losses_hex" in res.get("tms_nosleep", {}):
        checks["tms_losses_bit_identical"] = t["losses_hex"] == res["tms_nosleep"]["losses_hex"]
    required = ("losses_bit_identical", "graph_replays_same", "memory_given_back",
                "infer_needed_the_sleep", "reserved_asleep_only_graphs", "allocated_kept_asleep",
                "snapshot_asleep_lists_kept_tensors")
    ok = all(checks.get(k) for k in required)
    summary = {"ok": ok, "checks": checks}
    for m in ("gpumem", "tms"):
        r = res.get(m, {})
        summary[m] = {k: r.get(k) for k in (
            "given_back_bytes", "saved_bytes", "sleep_s", "wake_s", "bw_d2h_Bps", "bw_h2d_Bps",
            "ideal_copy_s", "sleep_wake_over_ideal", "sleep2_s", "wake2_s",
            "sleep_wake_over_ideal_reused", "budget_first_s", "budget_reused_s", "prepare_s",
            "nosave_reserved_bytes", "nosave_sleep_ms_per_10GiB",
            "nosave_wake_ms_per_10GiB", "nosave_kv_reserved_bytes", "nosave_kv_sleep_ms_per_10GiB",
            "nosave_kv_wake_ms_per_10GiB", "calls", "calls2", "nosave_calls", "nosave_kv_calls",
            "trainer_bytes", "infer_need_bytes", "graph_same",
            "reserved_while_asleep", "graph_pools_reserved_bytes", "allocated_while_asleep",
            "snapshot_asleep_kept_found", "snapshot_asleep_kept", "snapshot_asleep_allocated_bytes",
            "skipped", "failed", "stderr_tail") if r.get(k) is not None}
    summary["device"] = g.get("device")
    print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
