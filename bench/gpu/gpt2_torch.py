#!/usr/bin/env python3
"""bench/gpu/gpt2_torch.py — the PyTorch peer of plexus's GPU GPT-2 benchmark.

GPT-2 124M written in plain torch (no transformers): the same model as
plexus's zoo GPT (docs/GPT.md): learned token and position embeddings,
pre-LayerNorm blocks, causal self-attention through
F.scaled_dot_product_attention (flash / memory-efficient kernels), a GELU
(tanh) MLP of width 4C, a final LayerNorm and the head tied to the token
embedding; vocabulary 50257 (not padded), dropout 0; GPT-2's initialisation.
AdamW (betas 0.9/0.95, weight decay 0.1, fused), f32 master weights.

  --precision bf16   torch.autocast(bfloat16): bf16 GEMM operands and
                     activations where autocast casts, f32 weights
  --precision f32    full f32: TF32 off (fp32_precision 'ieee'; allow_tf32 =
                     False before torch 2.9), as plexus's f32 path
  --compile          torch.compile(model) (the default inductor backend)

A step is zero_grad, forward, cross-entropy over the vocabulary, backward,
AdamW, and loss.item() (the host reads the loss every step, as plexus does).
The batches are consecutive windows of the token shard that plexus reads
(llm.c's format, bench/gpu/make_tokens.py), held on the GPU.  --warmup steps
run first (compilation and autotuning fall there), then --steps steps are
timed with a synchronised host clock.  Prints one JSON line.
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, context, L, H, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(context, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def no_tf32():
    """f32 matrix products in full f32 (IEEE), never TF32: the API of torch
    2.9+ where it exists (mixing it with the old flags is refused there),
    else the old flags."""
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    if header[0] == 20240520:
        dtype = "<u2"
    elif header[0] == 20240801:
        dtype = "<u4"
    else:
        sys.exit(f"{path}: bad magic {header[0]}")
    tokens = np.fromfile(path, dtype=dtype, offset=1024)
    if tokens.size != header[2]:
        sys.exit(f"{path}: header says {header[2]} tokens, file holds {tokens.size}")
    return tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="token shard (llm.c format)")
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    no_tf32()
    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    B, T = a.batch, a.context

    tokens = torch.from_numpy(read_shard(a.data).astype(np.int64)).to(dev)
    need = (a.warmup + a.steps) * B * T + 1
    if tokens.numel() < need:
        sys.exit(f"{a.data}: {tokens.numel()} tokens, the run needs {need}")

    model = GPT(a.vocab, T, a.n_layer, a.n_head, a.n_embd).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, fused=True)
    run = torch.compile(model) if a.compile else model
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def step(i):
        s = i * B * T
        x = tokens[s : s + B * T].view(B, T)
        y = tokens[s + 1 : s + 1 + B * T].view(B, T)
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = run(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    t_start = time.perf_counter()
    warm_losses = [step(i) for i in range(a.warmup)]
    torch.cuda.synchronize()
    t_warm = time.perf_counter() - t_start
    torch.cuda.reset_peak_memory_stats()
    step_s = []
    t0 = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        ts = time.perf_counter()
        loss = step(i)
        step_s.append(time.perf_counter() - ts)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({
        "side": "pytorch", "mode": "compile" if a.compile else "eager", "precision": a.precision,
        "batch": B, "context": T, "params": n_params, "warmup_steps": a.warmup, "timed_steps": a.steps,
        "tokens_per_s": a.steps * B * T / dt, "median_step_ms": 1e3 * float(np.median(step_s)),
        "warmup_s": t_warm, "first_loss": warm_losses[0] if warm_losses else None, "last_loss": loss,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
