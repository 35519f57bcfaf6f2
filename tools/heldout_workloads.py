"""Held-out workloads: real PyTorch programs that no default was chosen on. They are not in the
corpus (tools/corpus_workloads.py): their figures are only ever reported, never tuned on, so they
stand for the programs a user brings. Written on 2026-12-07 after every current default was
fixed; traces/heldout/README.md says how they were measured.

Same contract as the corpus's workloads: a function(dev) returning (step, steps), random
weights from configurations (no download), shapes drawn from a generator seeded per workload.
What they add to the corpus's patterns:

- serve_cb_decoder: continuous batching (requests join and leave every step, each with its own
  KV cache grown by concatenation, attention run request by request);
- moe_train: a mixture-of-experts decoder whose tokens per expert change every step;
- fasterrcnn_train: detection training with images of several sizes and 1-24 boxes each;
- gnn_train: message passing over random graphs of 20k-200k nodes (index_add_ scatters);
- lora_llama_train: LoRA on a frozen bf16 Llama-style decoder (no optimizer state for the base);
- dit_ckpt_train: a diffusion transformer over 64-1024 latent patches, activation checkpointing;
- convnext_infer_res: ConvNeXt-T inference in fp16 at four resolutions and batches of 1-64;
- side_preproc_vit: ViT inference whose inputs are converted and resized on a side stream
  (record_stream), the main stream running the model: two streams.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus_workloads  # noqa: E402
from corpus_workloads import _batch, _llama, _pick, _rng, _scaled, _train_step  # noqa: E402


# --- serving ----------------------------------------------------------------------------------

class _Decoder(nn.Module):
    """A pre-norm decoder (fp16 weights) whose attention reads per-request KV caches."""

    def __init__(self, layers=12, d=1024, heads=16, vocab=32000):
        super().__init__()
        self.heads, self.d = heads, d
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                               nn.Linear(4 * d, d)) for _ in range(layers))
        self.n1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.n2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, toks, caches):
        """toks: one list of new token ids per request (a prompt, or the last token); caches:
        per request a list of (k, v) per layer, grown in place of the list. Returns the next
        token of each request (greedy)."""
        lens = [len(t) for t in toks]
        x = self.emb(torch.cat(toks))                       # (sum lens, d)
        h, hd = self.heads, self.d // self.heads
        for li in range(len(self.qkv)):
            q, k, v = self.qkv[li](self.n1[li](x)).split(self.d, -1)
            outs = []
            for r, (qs, ks, vs) in enumerate(zip(q.split(lens), k.split(lens), v.split(lens))):
                ck, cv = caches[r][li] if li < len(caches[r]) else (None, None)
                ks = ks if ck is None else torch.cat([ck, ks])  # the cache grows by a copy
                vs = vs if cv is None else torch.cat([cv, vs])
                if li < len(caches[r]):
                    caches[r][li] = (ks, vs)
                else:
                    caches[r].append((ks, vs))
                n = qs.shape[0]
                a = F.scaled_dot_product_attention(
                    qs.view(n, h, hd).transpose(0, 1), ks.view(-1, h, hd).transpose(0, 1),
                    vs.view(-1, h, hd).transpose(0, 1), is_causal=n > 1)
                outs.append(a.transpose(0, 1).reshape(n, self.d))
            x = x + self.proj[li](torch.cat(outs))
            x = x + self.mlp[li](self.n2[li](x))
        last = torch.stack([t[-1] for t in x.split(lens)])
        return self.head(last).argmax(-1)


def serve_cb_decoder(dev):
    """Continuous batching: a 12-layer decoder (1024 wide, fp16) serving requests that arrive
    0-4 per step (prompts 16-768 tokens, answers 8-160 tokens), up to 24 at once; a step is one
    prefill of the arrivals plus one decode token for every running request. Its batch is the
    requests at once: corpus_workloads.BATCH_SCALE scales the arrivals and the 24 (at 1.0, the
    recorded program)."""
    m = _Decoder().to(dev).half().eval()
    g = _rng(61)
    live = []  # [tokens left, kv caches, last token]
    scale, most = corpus_workloads.BATCH_SCALE, _scaled(24)  # arrivals may round to 0

    @torch.no_grad()
    def step(i):
        for _ in range(round((_pick(g, 0, 4) if i else 8) * scale)):
            if len(live) < most:
                p = torch.randint(0, 32000, (_pick(g, 16, 768),), device=dev)
                live.append([_pick(g, 8, 160), [], p])
        if not live:
            return
        nxt = m([r[2] for r in live], [r[1] for r in live])
        for r, t in zip(live, nxt.split(1)):
            r[0], r[2] = r[0] - 1, t
        live[:] = [r for r in live if r[0] > 0]
    return step, 120


# --- training ---------------------------------------------------------------------------------

class _MoE(nn.Module):
    """Top-2 routed experts (SwiGLU), tokens gathered per expert and scattered back."""

    def __init__(self, d, experts=8, inter=2048):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, inter) * d ** -0.5)
        self.w3 = nn.Parameter(torch.randn(experts, d, inter) * d ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, inter, d) * inter ** -0.5)

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        w, e = self.router(flat).softmax(-1).topk(2, -1)
        out = torch.zeros_like(flat)
        for j in range(self.w1.shape[0]):
            rows, slot = (e == j).nonzero(as_tuple=True)   # a count that changes every step
            if rows.numel() == 0:
                continue
            t = flat[rows]
            y = (F.silu(t @ self.w1[j]) * (t @ self.w3[j])) @ self.w2[j]
            y = y * w[rows, slot].unsqueeze(1).to(y.dtype)
            out.index_add_(0, rows, y.to(out.dtype))
        return out.view_as(x)


class _MoELM(nn.Module):
    def __init__(self, d=1024, layers=6, heads=16, vocab=32000):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab, bias=False)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True)
                                  for _ in range(layers))
        self.moe = nn.ModuleList(_MoE(d) for _ in range(layers))
        self.n1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.n2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))

    def forward(self, x):
        h = self.emb(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device,
                                                              dtype=torch.bool)
        for a, e, n1, n2 in zip(self.attn, self.moe, self.n1, self.n2):
            y = n1(h)
            h = h + a(y, y, y, attn_mask=mask, need_weights=False)[0]
            h = h + e(n2(h))
        return self.head(h)


def moe_train(dev):
    """A mixture-of-experts decoder (6 layers, 1024 wide, 8 experts, top-2), AdamW, bf16
    autocast, batch 2-12 x 128-1024 tokens: how many tokens each expert gets changes every
    step, so the expert matmuls' sizes do too."""
    m = _MoELM().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(62)

    def loss(m, x):
        return F.cross_entropy(m(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
    run = _train_step(m, opt, loss)

    def step(i):
        bs, sl = _batch(g, 2, 12), _pick(g, 128, 1024)
        run(lambda _: torch.randint(0, 32000, (bs, sl + 1), device=dev))
    return step, 20


def fasterrcnn_train(dev):
    """Faster R-CNN (MobileNetV3-Large FPN backbone, 21 classes), SGD, fp32, batches of 2-8
    images of 320-800 px sides with 1-24 boxes each: detection's proposals, sampling and
    RoI pooling make sizes change at every step."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
    m = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=21)
    m = m.to(dev).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    g = _rng(63)

    def target(h, w):
        n = _pick(g, 1, 24)
        xy = torch.rand(n, 2, generator=g) * torch.tensor([w * 0.7, h * 0.7])
        wh = 16 + torch.rand(n, 2, generator=g) * torch.tensor([w * 0.3, h * 0.3])
        return {"boxes": torch.cat([xy, xy + wh], 1).to(dev),
                "labels": torch.randint(1, 21, (n,), generator=g).to(dev)}

    def step(i):
        imgs, tgts = [], []
        for _ in range(_batch(g, 2, 8)):
            h, w = _pick(g, 320, 800), _pick(g, 320, 800)
            imgs.append(torch.rand(3, h, w, device=dev))
            tgts.append(target(h, w))
        losses = m(imgs, tgts)
        sum(losses.values()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, 24


def gnn_train(dev):
    """A 3-layer graph convolution network (256 features), Adam, fp32, on a new random graph
    each step: 20k-200k nodes, 4-16 edges per node, messages gathered per edge and summed per
    node with index_add_."""
    class GCN(nn.Module):
        def __init__(self, d=256, layers=3, classes=32):
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.out = nn.Linear(d, classes)

        def forward(self, x, src, dst, norm):
            for lin in self.lin:
                msg = lin(x)[src] * norm[:, None]
                x = F.relu(torch.zeros_like(x).index_add_(0, dst, msg)) + x
            return self.out(x)
    m = GCN().to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    g = _rng(64)

    def step(i):
        n = _batch(g, 20_000, 200_000)
        e = n * _pick(g, 4, 16)
        src = torch.randint(0, n, (e,), device=dev)
        dst = torch.randint(0, n, (e,), device=dev)
        deg = torch.zeros(n, device=dev).index_add_(0, dst, torch.ones(e, device=dev))
        norm = deg.clamp(min=1).rsqrt()[dst]
        x = torch.randn(n, 256, device=dev)
        y = torch.randint(0, 32, (n,), device=dev)
        F.cross_entropy(m(x, src, dst, norm), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, 30


class _LoRA(nn.Module):
    """A frozen linear layer plus a trained low-rank update (rank r, scale alpha / r)."""

    def __init__(self, base, r=16, alpha=32):
        super().__init__()
        self.base, self.scale = base, alpha / r
        self.a = nn.Parameter(torch.randn(r, base.in_features, device=base.weight.device,
                                          dtype=torch.float32) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, r, device=base.weight.device,
                                          dtype=torch.float32))

    def forward(self, x):
        return self.base(x) + (x @ self.a.to(x.dtype).t() @ self.b.to(x.dtype).t()) * self.scale


def lora_llama_train(dev):
    """LoRA (rank 16 on every attention and MLP projection) on a frozen bf16 Llama-style
    decoder (2048 wide, 16 layers), AdamW on the adapters only, batch 1-8 x 256-2048 tokens."""
    m = _llama(dev, hidden=2048, layers=16, heads=16, kv=8, inter=5632, dtype=torch.bfloat16)
    for p in m.parameters():
        p.requires_grad_(False)
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for mod in list(m.modules()):
        for n in names:
            if isinstance(getattr(mod, n, None), nn.Linear):
                setattr(mod, n, _LoRA(getattr(mod, n)))
    m.train()
    m.gradient_checkpointing_enable()
    m.enable_input_require_grads()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    g = _rng(65)
    run = _train_step(m, opt, lambda m, x: m(input_ids=x, labels=x).loss)

    def step(i):
        bs, sl = _batch(g, 1, 8), _pick(g, 256, 2048)
        run(lambda _: torch.randint(0, 32000, (bs, sl), device=dev))
    return step, 20


class _DiT(nn.Module):
    """A diffusion transformer: 2x2 patches of 4-channel latents, a timestep embedding added to
    every token, 12 pre-norm blocks (768 wide), each checkpointed in training."""

    def __init__(self, d=768, layers=12, heads=12):
        super().__init__()
        self.patch = nn.Conv2d(4, d, 2, stride=2)
        self.temb = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True,
                                                               norm_first=True, dropout=0.0)
                                    for _ in range(layers))
        self.out = nn.Linear(d, 16)

    def forward(self, x, t):
        b, _, h, w = x.shape
        freqs = torch.exp(-math.log(10000) * torch.arange(128, device=x.device) / 128)
        te = self.temb(torch.cat([(t[:, None] * freqs).sin(), (t[:, None] * freqs).cos()], 1))
        z = self.patch(x).flatten(2).transpose(1, 2) + te[:, None]
        for blk in self.blocks:
            z = torch.utils.checkpoint.checkpoint(blk, z, use_reentrant=False)
        z = self.out(z).view(b, h // 2, w // 2, 4, 2, 2)
        return z.permute(0, 3, 1, 4, 2, 5).reshape(b, 4, h, w)


def dit_ckpt_train(dev):
    """A diffusion transformer (DiT-B-like) with activation checkpointing, AdamW, bf16
    autocast, latents of 16-64 px (64-1024 tokens) in batches of 4-64."""
    m = _DiT().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(66)

    def loss(m, b):
        x, noise, t = b
        return F.mse_loss(m(x + noise, t).float(), noise)
    run = _train_step(m, opt, loss)

    def step(i):
        res = [16, 32, 48, 64][_pick(g, 0, 3)]
        bs = _batch(g, 4, 64) * 16 * 16 // (res * res) or 1
        run(lambda _: (torch.randn(bs, 4, res, res, device=dev),
                       torch.randn(bs, 4, res, res, device=dev),
                       torch.rand(bs, device=dev) * 1000))
    return step, 24


# --- inference --------------------------------------------------------------------------------

def convnext_infer_res(dev):
    """ConvNeXt-T inference in fp16, channels-last, batches of 1-64 at 160, 224, 288 or 384 px."""
    import torchvision
    m = torchvision.models.convnext_tiny().to(dev).half().eval()
    m = m.to(memory_format=torch.channels_last)
    g = _rng(67)

    @torch.no_grad()
    def step(i):
        bs, res = _batch(g, 1, 64), [160, 224, 288, 384][_pick(g, 0, 3)]
        x = torch.randn(bs, 3, res, res, device=dev, dtype=torch.half)
        m(x.to(memory_format=torch.channels_last)).softmax(-1)
    return step, 48


def side_preproc_vit(dev):
    """ViT-B/16 inference in fp16 whose inputs, uint8 images of 256-512 px, are converted,
    normalized and resized to 224 px on a side stream one batch ahead; record_stream hands each
    batch to the main stream. Batches of 8-96."""
    import torchvision
    m = torchvision.models.vit_b_16().to(dev).half().eval()
    side = torch.cuda.Stream()
    g = _rng(68)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1)
    state = {}

    @torch.no_grad()
    def prepare():
        bs, res = _batch(g, 8, 96), _pick(g, 256, 512)
        raw = torch.randint(0, 256, (bs, 3, res, res), dtype=torch.uint8, generator=g)
        with torch.cuda.stream(side):
            x = raw.to(dev, non_blocking=False).float().div_(255).sub_(mean).div_(std)
            x = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True).half()
        return x

    @torch.no_grad()
    def step(i):
        if i == 0:
            state["next"] = prepare()
        torch.cuda.current_stream().wait_stream(side)
        x = state["next"]
        x.record_stream(torch.cuda.current_stream())
        state["next"] = prepare()
        m(x).softmax(-1)
    return step, 40


HELD_OUT = {f.__name__: f for f in (
    serve_cb_decoder, moe_train, fasterrcnn_train, gnn_train, lora_llama_train, dit_ckpt_train,
    convnext_infer_res, side_preproc_vit)}
MULTI_STREAM = {"side_preproc_vit"}
