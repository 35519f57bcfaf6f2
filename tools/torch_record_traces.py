"""Record real allocation traces from PyTorch workloads on the GPU.

Each workload runs in its own process (argv[1] = workload name, argv[2] = out dir).
Workloads: gpt2_train, gpt2_generate, resnet_train (need transformers / torchvision), and two
multi-stream ones on PyTorch alone: side_prefetch (batches copied on a side stream, used on the
main one with record_stream) and comm_overlap (compute overlapped with a communication-like side
stream that packs and "reduces" gradient buckets); and dyn_encoder, a BERT-base-like encoder
fine-tuned on batches of random shape (the dynamic-shape workload of
integrations/torch/gpu_bench_backend.py).
Writes <name>.csv.gz in RMM's logging format (Thread,Time,Action,Pointer,Size,Stream)
plus <name>.json with PyTorch's own peak allocated / reserved for the run.
"""
import gzip, json, os, sys, time, traceback
import torch

torch.manual_seed(0)
dev = "cuda"


def gpt2_train(steps=16):
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config()).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    for s in range(steps):
        bs = int(torch.randint(2, 17, (1,), generator=g))
        sl = int(torch.randint(64, 1025, (1,), generator=g))
        x = torch.randint(0, 50257, (bs, sl), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def gpt2_generate(rounds=6):
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)).to(dev).half().eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for r in range(rounds):
            bs = int(torch.randint(1, 33, (1,), generator=g))
            sl = int(torch.randint(16, 513, (1,), generator=g))
            x = torch.randint(0, 50257, (bs, sl), device=dev)
            m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=int(torch.randint(16, 129, (1,), generator=g)),
                       do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()


def resnet_train(steps=12):
    import torchvision
    m = torchvision.models.resnet50(weights=None).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    for s in range(steps):
        bs = [32, 64, 96, 128, 48][s % 5]
        res = [224, 192, 256][s % 3]
        x = torch.randn(bs, 3, res, res, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (bs,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def _mlp(width, depth):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(dev)


def side_prefetch(steps=40):
    """Two streams: each step's batch (a pinned host tensor of a varying shape) is copied to the
    device on a side stream while the main stream trains on the previous one; the main stream
    waits for the copy and marks the batch with record_stream, so PyTorch frees it only once
    the main stream's work on it is done (free_completed in the trace)."""
    m = _mlp(2048, 8)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    g = torch.Generator().manual_seed(4)
    shapes = [(int(torch.randint(256, 4097, (1,), generator=g)), 2048) for _ in range(steps + 1)]
    host = [torch.randn(*s).pin_memory() for s in shapes]

    def fetch(i):
        with torch.cuda.stream(side):
            x = host[i].to(dev, non_blocking=True)
            y = torch.randn(x.shape[0], 2048, device=dev)
        return x, y

    nxt = fetch(0)
    for s in range(steps):
        torch.cuda.current_stream().wait_stream(side)
        x, y = nxt
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        nxt = fetch(s + 1)  # the next copy overlaps this step's compute
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del x, y, loss
    torch.cuda.synchronize()


def comm_overlap(steps=24):
    """Two streams: compute on the main stream overlapped with a communication-like side stream
    (DDP-style gradient buckets: as the backward pass finishes a layer's gradient, the side
    stream waits for it, packs it into a flat bucket, "reduces" the bucket (scale and copy back,
    where an all-reduce would run) and frees it; the gradients are marked with record_stream)."""
    m = _mlp(3072, 10)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    comm = torch.cuda.Stream()
    g = torch.Generator().manual_seed(5)
    params = list(m.parameters())
    buckets = [params[i:i + 4] for i in range(0, len(params), 4)]
    for s in range(steps):
        bs = int(torch.randint(128, 2049, (1,), generator=g))
        x = torch.randn(bs, 3072, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x).float().pow(2).mean()
        loss.backward()
        main = torch.cuda.current_stream()
        for b in reversed(buckets):
            comm.wait_stream(main)
            with torch.cuda.stream(comm):
                grads = [p.grad for p in b]
                for t in grads:
                    t.record_stream(comm)
                flat = torch.cat([t.reshape(-1) for t in grads])  # allocated on comm
                flat.mul_(0.5)  # stands for the all-reduce
                off = 0
                for t in grads:
                    t.copy_(flat[off:off + t.numel()].view_as(t)); off += t.numel()
                del flat
            # more main-stream work (activations of a next micro-batch) overlaps the bucket
            _ = torch.randn(bs, 3072, device=dev).relu_()
        main.wait_stream(comm)
        opt.step(); opt.zero_grad(set_to_none=True)
        del x, loss
    torch.cuda.synchronize()


def dyn_encoder(steps=24):
    """Dynamic shapes: a 6-layer transformer encoder (d=768, BERT-base's width) with a
    classification head, AdamW, bf16 autocast, a batch of 4-64 sequences of 16-512 tokens drawn
    per step (as gpu_bench_backend.py's `dyn` workload trains it)."""
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, dropout=0.0)
    m = torch.nn.Sequential(torch.nn.Embedding(30522, 768),
                            torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False),
                            torch.nn.Linear(768, 2)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    for s in range(steps):
        bs = int(torch.randint(4, 65, (1,), generator=g))
        sl = int(torch.randint(16, 513, (1,), generator=g))
        x = torch.randint(0, 30522, (bs, sl), device=dev)
        y = torch.randint(0, 2, (bs,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x)[:, 0, :].float(), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


WORKLOADS = dict(gpt2_train=gpt2_train, gpt2_generate=gpt2_generate, resnet_train=resnet_train,
                 side_prefetch=side_prefetch, comm_overlap=comm_overlap, dyn_encoder=dyn_encoder)


def export(snap, path):
    """PyTorch snapshot device_traces -> RMM log CSV (allocate/free in program order)."""
    traces = snap["device_traces"][0]
    n = 0
    t0 = traces[0]["time_us"] if traces and "time_us" in traces[0] else 0
    with gzip.open(path, "wt") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for e in traces:
            a = e["action"]
            if a == "alloc":
                act = "allocate"
            elif a == "free_completed":
                act = "free"
            else:
                continue
            f.write("0,%.6f,%s,0x%x,%d,0x%x\n" % ((e.get("time_us", 0) - t0) / 1e6, act, e["addr"], e["size"], e.get("stream", 0)))
            n += 1
    return n


def main():
    name, out = sys.argv[1], sys.argv[2]
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=5_000_000)
    t0 = time.time()
    WORKLOADS[name]()
    dt = time.time() - t0
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    n = export(snap, os.path.join(out, name + ".csv.gz"))
    info = dict(workload=name, events=n, seconds=dt,
                max_allocated=torch.cuda.max_memory_allocated(), max_reserved=torch.cuda.max_memory_reserved(),
                alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                num_alloc_retries=torch.cuda.memory_stats().get("num_alloc_retries"),
                segment_actions={a: sum(1 for e in snap["device_traces"][0] if e["action"] == a)
                                 for a in ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")})
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(info, f)
    print(json.dumps(info))


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
