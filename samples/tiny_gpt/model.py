"""A tiny GPT-style character model in plain torch.nn, as its users write it.

Token and position embeddings, pre-LayerNorm blocks with causal
``F.scaled_dot_product_attention`` and a GELU MLP, a tied output head, dropout
(eval mode at import) and ``F.cross_entropy``: the module returns its scalar loss.

    gradtool import-torch samples/tiny_gpt/model.py:build --dtype f64 -o tiny_gpt.msgpack

``build()`` returns ``(module, (idx, targets))``: the model (seeded) and the first
training batch of ``sonnets.txt``, as :mod:`record` writes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
TEXT = HERE / "sonnets.txt"
BLOCK = 16            # characters per example
BATCH = 8             # examples per step (the input slots' leading dim)
STRIDE = 7            # between the starts of consecutive examples


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.dropout(self.c_proj(y))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.dropout(self.mlp_proj(h))


class TinyGPT(nn.Module):
    def __init__(self, vocab, block=BLOCK, d=16, heads=2, layers=2, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight            # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.1)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def dataset():
    """(vocab, idx [N, BLOCK], targets [N, BLOCK]) of sonnets.txt: every STRIDE-th window,
    targets the next characters."""
    text = TEXT.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], dtype=np.int64)
    starts = np.arange(0, len(ids) - BLOCK - 1, STRIDE)
    idx = np.stack([ids[s:s + BLOCK] for s in starts])
    tgt = np.stack([ids[s + 1:s + BLOCK + 1] for s in starts])
    return vocab, idx, tgt


def build():
    vocab, idx, tgt = dataset()
    torch.manual_seed(0)
    model = TinyGPT(len(vocab)).eval()
    return model, (torch.from_numpy(idx[:BATCH]), torch.from_numpy(tgt[:BATCH]))
