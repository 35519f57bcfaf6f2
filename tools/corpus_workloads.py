"""The corpus's workloads: real PyTorch programs, each a setup and a step, small enough to record
in seconds on one GPU (tools/corpus_record.py runs them; traces/corpus/README.md lists them).

Every workload is a function(dev) returning (step, steps): ``step(i)`` runs iteration i (a
training step, a batch of inference, one generate() call), ``steps`` how many to run. Models are
built from configurations with random weights (no download), seeded, on the device. Shapes that
vary are drawn from a generator seeded per workload, so a rerun asks for the same sizes.
Peaks range from about 100 MB (tiny_cnn_train) to tens of GB (llama_1b_train).

GM_FIXED_SHAPES=1 in the environment makes every draw the middle of its range, so that each step
repeats the one before exactly: the same programs as loops whose shapes never change (what most
training runs are), for bench/corpus_steps.sh. The recorded traces were made without it.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def _rng(seed):
    return torch.Generator().manual_seed(seed)


FIXED_SHAPES = os.environ.get("GM_FIXED_SHAPES") == "1"


def _pick(g, lo, hi):
    """An int in [lo, hi] from g (GM_FIXED_SHAPES=1: the middle of the range, every time)."""
    if FIXED_SHAPES:
        return (lo + hi) // 2
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


# Every batch size a workload draws is multiplied by this (at least 1): bench/corpus_max_batch.py
# searches the largest scale that runs under a memory limit. The draws themselves are unchanged,
# so at 1.0 a workload asks for exactly the sizes its trace recorded.
BATCH_SCALE = 1.0


def _scaled(bs):
    """Batch size bs times BATCH_SCALE, at least 1."""
    return max(1, round(bs * BATCH_SCALE))


def _batch(g, lo, hi):
    """A batch size: an int in [lo, hi] from g (as _pick), scaled (_scaled)."""
    return _scaled(_pick(g, lo, hi))


def _train_step(model, opt, loss_fn, scaler=None, accum=1, dtype=torch.bfloat16):
    """A training step closure: ``loss_fn(model, micro)`` under autocast(dtype) (None: fp32),
    ``accum`` micro-batches, then the optimizer."""
    def run(batch_fn):
        for micro in range(accum):
            if dtype is None:
                loss = loss_fn(model, batch_fn(micro))
            else:
                with torch.autocast("cuda", dtype=dtype):
                    loss = loss_fn(model, batch_fn(micro))
            if scaler is not None:
                scaler.scale(loss / accum).backward()
            else:
                (loss / accum).backward()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return run


# --- encoders ---------------------------------------------------------------------------------

def _bert(dev, layers=12, hidden=768, heads=12, labels=2):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     intermediate_size=4 * hidden, num_labels=labels)
    with torch.device(dev):
        return BertForSequenceClassification(cfg)


def bert_finetune(dev):
    """BERT-base fine-tuning, AdamW, bf16 autocast, batch 4-64 x sequence 16-512 per step."""
    m = _bert(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=2e-5)
    g = _rng(11)
    run = _train_step(m, opt, lambda m, b: m(input_ids=b[0], labels=b[1]).loss)

    def step(i):
        bs, sl = _batch(g, 4, 64), _pick(g, 16, 512)
        run(lambda _: (torch.randint(0, 30522, (bs, sl), device=dev),
                       torch.randint(0, 2, (bs,), device=dev)))
    return step, 24


def bert_infer_fp16(dev):
    """BERT-base inference in fp16, batch 1-128 x sequence 32-384."""
    m = _bert(dev).half().eval()
    g = _rng(12)

    @torch.no_grad()
    def step(i):
        bs, sl = _batch(g, 1, 128), _pick(g, 32, 384)
        m(input_ids=torch.randint(0, 30522, (bs, sl), device=dev)).logits.float().softmax(-1)
    return step, 40


def bert_large_ckpt(dev):
    """BERT-large fine-tuning with activation checkpointing (gradient_checkpointing_enable),
    fp16 autocast with a GradScaler, batch 16-48 x sequence 128-512."""
    m = _bert(dev, layers=24, hidden=1024, heads=16)
    m.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(m.parameters(), lr=2e-5)
    scaler = torch.amp.GradScaler("cuda")
    g = _rng(13)
    run = _train_step(m, opt, lambda m, b: m(input_ids=b[0], labels=b[1]).loss, scaler=scaler,
                      dtype=torch.float16)

    def step(i):
        bs, sl = _batch(g, 16, 48), _pick(g, 128, 512)
        run(lambda _: (torch.randint(0, 30522, (bs, sl), device=dev),
                       torch.randint(0, 2, (bs,), device=dev)))
    return step, 16


# --- decoders ---------------------------------------------------------------------------------

def _gpt2(dev, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.device(dev):
        return GPT2LMHeadModel(GPT2Config(**kw))


def _lm_loss(m, x):
    return m(input_ids=x, labels=x).loss


def gpt2_train_accum(dev):
    """GPT-2 small, AdamW, bf16 autocast, gradient accumulation over 4 micro-batches of 2-8 x
    128-1024 tokens."""
    m = _gpt2(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(21)
    run = _train_step(m, opt, _lm_loss, accum=4)

    def step(i):
        shapes = [(_batch(g, 2, 8), _pick(g, 128, 1024)) for _ in range(4)]
        run(lambda k: torch.randint(0, 50257, shapes[k], device=dev))
    return step, 12


def gpt2_medium_ckpt(dev):
    """GPT-2 medium with activation checkpointing, bf16 autocast, batch 8-24 x 1024 tokens."""
    m = _gpt2(dev, n_embd=1024, n_layer=24, n_head=16)
    m.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(22)
    run = _train_step(m, opt, _lm_loss)

    def step(i):
        bs = _batch(g, 8, 24)
        run(lambda _: torch.randint(0, 50257, (bs, 1024), device=dev))
    return step, 12


def gpt2_generate_sample(dev):
    """GPT-2 small generate() with sampling, batch 1-32, prompts 8-256, 32-256 new tokens."""
    m = _gpt2(dev).half().eval()
    g = _rng(23)
    torch.manual_seed(23)

    @torch.no_grad()
    def step(i):
        bs, sl = _batch(g, 1, 32), _pick(g, 8, 256)
        x = torch.randint(0, 50257, (bs, sl), device=dev)
        m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=_pick(g, 32, 96),
                   do_sample=True, top_k=50, pad_token_id=0)
    return step, 4


def _llama(dev, hidden=1024, layers=8, heads=16, kv=4, inter=2816, vocab=32000, dtype=None):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                      max_position_embeddings=4096)
    with torch.device(dev):
        m = LlamaForCausalLM(cfg)
    return m.to(dtype) if dtype is not None else m


def llama_train(dev):
    """A Llama-style decoder (1024 wide, 8 layers, GQA), AdamW, bf16 autocast, batch 2-16 x
    256-2048 tokens."""
    m = _llama(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(31)
    run = _train_step(m, opt, _lm_loss)

    def step(i):
        bs, sl = _batch(g, 2, 16), _pick(g, 256, 2048)
        run(lambda _: torch.randint(0, 32000, (bs, sl), device=dev))
    return step, 16


def llama_generate(dev):
    """Llama-style decoder in bf16, generate() with batch 1-16, prompts 16-1024, 32-192 new
    tokens: the KV cache grows at every token."""
    m = _llama(dev, dtype=torch.bfloat16).eval()
    g = _rng(32)

    @torch.no_grad()
    def step(i):
        bs, sl = _batch(g, 1, 16), _pick(g, 16, 1024)
        x = torch.randint(0, 32000, (bs, sl), device=dev)
        m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=_pick(g, 32, 96),
                   do_sample=False, pad_token_id=0)
    return step, 4


def llama_1b_train(dev):
    """A 1.3B-parameter Llama-style decoder (2048 wide, 24 layers), fp32 master weights, AdamW,
    bf16 autocast, batch 2-4 x 1024-2048 tokens: the corpus's largest peak (about 40 GB)."""
    m = _llama(dev, hidden=2048, layers=24, heads=16, kv=8, inter=5632)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    g = _rng(33)
    run = _train_step(m, opt, _lm_loss)

    def step(i):
        bs, sl = _batch(g, 2, 4), _pick(g, 1024, 2048)
        run(lambda _: torch.randint(0, 32000, (bs, sl), device=dev))
    return step, 8


def t5_train(dev):
    """T5-base-like encoder-decoder, Adafactor-free AdamW, bf16 autocast, sources 64-512 and
    targets 16-128 tokens, batch 4-32."""
    from transformers import T5Config, T5ForConditionalGeneration
    with torch.device(dev):
        m = T5ForConditionalGeneration(T5Config(d_model=768, d_ff=3072, num_layers=12,
                                                num_heads=12, decoder_start_token_id=0))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(34)
    run = _train_step(m, opt, lambda m, b: m(input_ids=b[0], labels=b[1]).loss)

    def step(i):
        bs, sl, tl = _batch(g, 4, 32), _pick(g, 64, 512), _pick(g, 16, 128)
        run(lambda _: (torch.randint(0, 32128, (bs, sl), device=dev),
                       torch.randint(0, 32128, (bs, tl), device=dev)))
    return step, 16


def t5_generate(dev):
    """T5-base-like generate() (beam search, 4 beams), batch 1-16, sources 32-512."""
    from transformers import T5Config, T5ForConditionalGeneration
    with torch.device(dev):
        m = T5ForConditionalGeneration(T5Config(d_model=768, d_ff=3072, num_layers=12,
                                                num_heads=12, decoder_start_token_id=0))
    m = m.half().eval()
    g = _rng(35)

    @torch.no_grad()
    def step(i):
        bs, sl = _batch(g, 1, 16), _pick(g, 32, 512)
        x = torch.randint(0, 32128, (bs, sl), device=dev)
        m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=_pick(g, 16, 96),
                   num_beams=4, do_sample=False)
    return step, 3


# --- vision -----------------------------------------------------------------------------------

def _cls_step(m, opt, dtype=torch.bfloat16, scaler=None, channels_last=False):
    run = _train_step(m, opt, lambda m, b: F.cross_entropy(m(b[0]), b[1]), scaler=scaler,
                      dtype=dtype)

    def batch(bs, res, dev):
        x = torch.randn(bs, 3, res, res, device=dev)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        return x, torch.randint(0, 1000, (bs,), device=dev)
    return run, batch


def resnet18_train(dev):
    """ResNet-18, SGD with momentum, bf16 autocast, channels-last, batch 32-256 at 160-256 px."""
    import torchvision
    m = torchvision.models.resnet18().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    run, batch = _cls_step(m, opt, channels_last=True)
    g = _rng(41)

    def step(i):
        bs, res = _batch(g, 32, 256), [160, 192, 224, 256][_pick(g, 0, 3)]
        run(lambda _: batch(bs, res, dev))
    return step, 20


def resnet50_infer_fp16(dev):
    """ResNet-50 inference in fp16, batch 1-256 at 224 px."""
    import torchvision
    return _image_infer(torchvision.models.resnet50(), dev, 42, 256)


def _image_infer(model, dev, seed, max_batch, steps=40):
    """Inference in fp16 at 224 px over batches of 1-max_batch images."""
    m = model.to(dev).half().eval()
    g = _rng(seed)

    @torch.no_grad()
    def step(i):
        bs = _batch(g, 1, max_batch)
        m(torch.randn(bs, 3, 224, 224, device=dev, dtype=torch.half)).softmax(-1)
    return step, steps


def vit_train(dev):
    """ViT-B/16, AdamW, bf16 autocast, batch 16-96 at 224 px."""
    import torchvision
    m = torchvision.models.vit_b_16().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    run, batch = _cls_step(m, opt)
    g = _rng(43)

    def step(i):
        bs = _batch(g, 16, 96)
        run(lambda _: batch(bs, 224, dev))
    return step, 16


def vit_infer_fp16(dev):
    """ViT-B/16 inference in fp16, batch 1-128."""
    import torchvision
    return _image_infer(torchvision.models.vit_b_16(), dev, 44, 128)


class _UNet(nn.Module):
    """A conv UNet (4 levels, 64-512 channels, GroupNorm + SiLU, skip connections)."""

    def __init__(self, ch=(64, 128, 256, 512), cin=3):
        super().__init__()
        self.down, self.up = nn.ModuleList(), nn.ModuleList()
        c = cin
        for co in ch:
            self.down.append(self._block(c, co))
            c = co
        for co in reversed(ch[:-1]):
            self.up.append(nn.ModuleList([nn.ConvTranspose2d(c, co, 2, stride=2),
                                          self._block(2 * co, co)]))
            c = co
        self.out = nn.Conv2d(c, cin, 1)

    @staticmethod
    def _block(ci, co):
        return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1), nn.GroupNorm(8, co), nn.SiLU(),
                             nn.Conv2d(co, co, 3, padding=1), nn.GroupNorm(8, co), nn.SiLU())

    def forward(self, x):
        skips = []
        for i, d in enumerate(self.down):
            x = d(x)
            if i < len(self.down) - 1:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for (up, block), s in zip(self.up, reversed(skips)):
            x = block(torch.cat([up(x), s], 1))
        return self.out(x)


def unet_train(dev):
    """A conv UNet denoiser, AdamW, bf16 autocast, batch 4-32 at 64-256 px (a diffusion-like
    training loop: noise in, noise predicted)."""
    m = _UNet().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = _rng(45)
    run = _train_step(m, opt, lambda m, b: F.mse_loss(m(b[0] + b[1]), b[1]))

    def step(i):
        bs, res = _batch(g, 4, 32), [64, 128, 192, 256][_pick(g, 0, 3)]
        run(lambda _: (torch.randn(bs, 3, res, res, device=dev),
                       torch.randn(bs, 3, res, res, device=dev)))
    return step, 16


def unet_sample(dev):
    """The UNet sampling in fp16: 20 denoising iterations per image batch of 1-16 at 128-384 px."""
    m = _UNet().to(dev).half().eval()
    g = _rng(46)

    @torch.no_grad()
    def step(i):
        bs, res = _batch(g, 1, 16), [128, 256, 384][_pick(g, 0, 2)]
        x = torch.randn(bs, 3, res, res, device=dev, dtype=torch.half)
        for t in range(20):
            x = x - 0.05 * m(x)
    return step, 6


def tiny_cnn_train(dev):
    """A small CNN on 32 px images, batch 64-512: the corpus's smallest peak (about 100 MB)."""
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(),
                      nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    g = _rng(47)
    run = _train_step(m, opt, lambda m, b: F.cross_entropy(m(b[0]), b[1]), dtype=None)

    def step(i):
        bs = _batch(g, 64, 512)
        run(lambda _: (torch.randn(bs, 3, 32, 32, device=dev),
                       torch.randint(0, 10, (bs,), device=dev)))
    return step, 40


def lstm_train(dev):
    """A 2-layer LSTM language model (1024 hidden), fp32, batch 16-64 x 64-512 steps."""
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.rnn = nn.Embedding(10000, 512), nn.LSTM(512, 1024, 2, batch_first=True)
            self.head = nn.Linear(1024, 10000)

        def forward(self, x):
            return self.head(self.rnn(self.emb(x))[0])
    m = LM().to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    g = _rng(48)
    run = _train_step(m, opt, lambda m, x: F.cross_entropy(m(x[:, :-1]).flatten(0, 1),
                                                           x[:, 1:].flatten()), dtype=None)

    def step(i):
        bs, sl = _batch(g, 16, 64), _pick(g, 64, 512)
        run(lambda _: torch.randint(0, 10000, (bs, sl), device=dev))
    return step, 16


# --- compile, streams, alternating models -----------------------------------------------------

def mlp_compile_train(dev):
    """An 8-layer MLP (4096 wide) under torch.compile, AdamW, bf16 autocast, batch 256-4096 (two
    shapes recompile; the rest run compiled graphs with their own buffers)."""
    m = nn.Sequential(*[nn.Sequential(nn.Linear(4096, 4096), nn.GELU()) for _ in range(8)]).to(dev)
    cm = torch.compile(m, dynamic=False)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    run = _train_step(cm, opt, lambda m, x: m(x).float().pow(2).mean())
    sizes = [256, 1024, 4096]

    def step(i):
        bs = _scaled(sizes[i % 3])
        run(lambda _: torch.randn(bs, 4096, device=dev))
    return step, 18


def side_prefetch_resnet(dev):
    """ResNet-18 training whose batches (pinned host tensors) are copied on a side stream while
    the main stream trains on the previous one; record_stream marks each batch for the main
    stream. Past its recorded steps (a step A/B runs hundreds) the pinned batches come round
    again."""
    import torchvision
    m = torchvision.models.resnet18().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    side = torch.cuda.Stream()
    g = _rng(51)
    steps = 24
    bss = [_batch(g, 64, 256) for _ in range(steps + 1)]
    host = [torch.randn(b, 3, 224, 224).pin_memory() for b in bss]
    state = {}

    def fetch(i):
        with torch.cuda.stream(side):
            x = host[i % len(host)].to(dev, non_blocking=True).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (x.shape[0],), device=dev)
        return x, y

    def step(i):
        if i == 0:
            state["next"] = fetch(0)
        torch.cuda.current_stream().wait_stream(side)
        x, y = state["next"]
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        state["next"] = fetch(i + 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, steps


def comm_overlap_gpt2(dev):
    """GPT-2 small training with DDP-like gradient buckets reduced on a side stream (pack into a
    flat bucket, scale, copy back; record_stream on each gradient), batch 4-12 x 512-1024."""
    m = _gpt2(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    comm = torch.cuda.Stream()
    params = [p for p in m.parameters() if p.requires_grad]
    buckets = [params[i:i + 12] for i in range(0, len(params), 12)]
    g = _rng(52)

    def step(i):
        bs, sl = _batch(g, 4, 12), _pick(g, 512, 1024)
        x = torch.randint(0, 50257, (bs, sl), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = _lm_loss(m, x)
        loss.backward()
        main = torch.cuda.current_stream()
        for b in reversed(buckets):
            comm.wait_stream(main)
            with torch.cuda.stream(comm):
                grads = [p.grad for p in b if p.grad is not None]
                for t in grads:
                    t.record_stream(comm)
                flat = torch.cat([t.reshape(-1) for t in grads])
                flat.mul_(0.5)
                off = 0
                for t in grads:
                    t.copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()
                del flat
        main.wait_stream(comm)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, 12


def rl_alternate(dev):
    """RL post-training's shape: a policy (GPT-2 small) generates rollouts with its KV cache,
    a frozen reference model (GPT-2 small, bf16) scores them, then the policy trains on them;
    two models alternating in one process, batch 4-16, prompts 32-256, 32-128 new tokens."""
    pol = _gpt2(dev)
    ref = _gpt2(dev).to(torch.bfloat16).eval()
    opt = torch.optim.AdamW(pol.parameters(), lr=1e-5)
    g = _rng(53)

    def step(i):
        bs, sl = _batch(g, 4, 16), _pick(g, 32, 256)
        x = torch.randint(0, 50257, (bs, sl), device=dev)
        pol.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = pol.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=_pick(g, 16, 64), pad_token_id=0)
            ref_logp = ref(input_ids=out).logits.float().log_softmax(-1)
        pol.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp = pol(input_ids=out).logits.float().log_softmax(-1)
            loss = F.kl_div(logp, ref_logp, log_target=True, reduction="batchmean")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, 5


def dyn_mlp_infer(dev):
    """A serving-like loop: a 12-layer MLP (2048 wide, fp16) over request batches of 1-512 rows
    drawn per step, with a growing and shrinking result cache (a list of outputs kept for 1-8
    steps)."""
    m = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.ReLU()) for _ in range(12)])
    m = m.to(dev).half().eval()
    g = _rng(54)
    keep = []

    @torch.no_grad()
    def step(i):
        bs = _batch(g, 1, 512)
        keep.append((i + _pick(g, 1, 8), m(torch.randn(bs, 2048, device=dev, dtype=torch.half))))
        keep[:] = [(t, y) for t, y in keep if t > i]
    return step, 120


WORKLOADS = {f.__name__: f for f in (
    bert_finetune, bert_infer_fp16, bert_large_ckpt, gpt2_train_accum, gpt2_medium_ckpt,
    gpt2_generate_sample, llama_train, llama_generate, llama_1b_train, t5_train, t5_generate,
    resnet18_train, resnet50_infer_fp16, vit_train, vit_infer_fp16, unet_train, unet_sample,
    tiny_cnn_train, lstm_train, mlp_compile_train, side_prefetch_resnet, comm_overlap_gpt2,
    rl_alternate, dyn_mlp_infer)}
MULTI_STREAM = {"side_prefetch_resnet", "comm_overlap_gpt2"}


def workload(name):
    """The workload called name: the corpus's, or a held-out one (tools/heldout_workloads.py,
    imported here on first use: it builds on this module); None if neither has it."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    import heldout_workloads
    return heldout_workloads.HELD_OUT.get(name)
