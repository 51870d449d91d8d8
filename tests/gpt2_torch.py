"""gpt2_torch.py -- GPT-2 written with torch.nn primitives, for tests.

Hugging Face's GPT2Model in miniature: the same module names and parameter
layouts ("wte.weight" (V, C), "wpe.weight" (context, C), "h.<l>.ln_1.weight",
"h.<l>.attn.c_attn.weight" (C, 3C) as GPT-2's Conv1D stores it, ...,
"ln_f.bias"), pre-LayerNorm blocks, causal softmax attention, the tanh GELU,
and the output projection tied to wte (logits = ln_f(x) @ wteᵀ).  No dropout:
the tests compare with dropout 0.  Written here, not imported from
transformers, which Debian's python3 lacks.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight (in, out), y = x @ W + b."""

    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.reshape(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)

    def forward(self, x):
        n, t, c = x.shape
        h = self.n_head
        d = c // h
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(n, t, h, d).transpose(1, 2) for z in (q, k, v))  # (n, h, t, d)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(n, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = Conv1D(n_embd, 4 * n_embd)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = Conv1D(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(context, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head: x @ wteᵀ


def random_state(model, seed):
    """Weights larger than GPT-2's N(0, 0.02), so attention is far from
    uniform, with biases and LayerNorm parameters off their defaults, so a
    loader or runner that ignored one would be caught: embeddings N(0, 0.3),
    Conv1D weights N(0, 0.1), biases N(0, 0.05), LayerNorm weights
    1 + N(0, 0.1).  Returns {name: float32 numpy array}."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("wte.weight", "wpe.weight"):
                std = 0.3
            elif "ln_" in name and name.endswith(".weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
                continue
            elif name.endswith(".bias"):
                std = 0.05
            else:
                std = 0.1
            p.copy_(std * torch.randn(p.shape, generator=g))
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def gpt2_init(model):
    """GPT-2's (and nanoGPT's) initialisation, as px_zoo_gpt's: weights
    N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj)
    N(0, 0.02/sqrt(2L)), biases 0, LayerNorm 1 and 0."""
    n_layer = len(model.h)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name:
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif name.endswith("c_proj.weight"):
                p.normal_(0.0, 0.02 / math.sqrt(2 * n_layer))
            else:
                p.normal_(0.0, 0.02)
