"""minGPT: a character-level GPT in plain PyTorch (causal self-attention,
scaled_dot_product_attention, GELU MLPs, pre-norm residual blocks, weight-tied head), trained with AdamW
on a text, on `tpu` against CPU eager; then greedy sampling.

    python bindings/examples/mingpt.py [--size tiny|small] [--steps 5] [--compile]

Tolerance: 1e-4 relative on each loss (float32 sums in another order,
compounded over the steps). Dropout is off, so every run is deterministic.
"""

from __future__ import annotations

import torch
from _runner import Timer, main
from torch import nn

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be "
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered as the rightful property of some one or other "
    "of their daughters."
)
SIZES = {"tiny": (2, 32, 2, 4, 16), "small": (4, 128, 4, 16, 64)}  # (layers, width, heads, batch, context)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, layers: int, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.norm(self.blocks(self.tokens(idx) + self.positions(positions))))


def train(device: str, steps: int, size: str, compiled: bool, timer: Timer) -> list[float]:
    layers, width, heads, batch, context = SIZES[size]
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    model = GPT(len(chars), layers, width, heads, context).to(device)
    run = torch.compile(model, backend="tpu" if device == "tpu" else "inductor") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    starts = torch.randint(
        0, len(data) - context - 1, (steps, batch), generator=torch.Generator().manual_seed(1)
    )
    losses = []
    for s in starts:
        x = torch.stack([data[i : i + context] for i in s]).to(device)
        y = torch.stack([data[i + 1 : i + context + 1] for i in s]).to(device)
        with timer:
            opt.zero_grad()
            logits = run(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, len(chars)), y.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    # Greedy sampling: the sampled characters' indices must match CPU's too.
    idx = data[:4].reshape(1, -1).to(device)
    with torch.no_grad():
        for _ in range(8):
            idx = torch.cat([idx, model(idx[:, -context:])[:, -1].argmax(-1, keepdim=True)], 1)
    losses.extend(float(i) for i in idx[0, 4:].cpu())
    return losses


if __name__ == "__main__":
    main("minGPT", train, tolerance=1e-4)
