"""DLRM: embedding bags for the sparse features, a bottom MLP for the dense
ones, their pairwise dot products (a `bmm` of the stacked vectors with
themselves, upper triangle kept) and a top MLP to a click logit, trained
with SGD on binary cross-entropy, on `tpu` against CPU eager.

    python bindings/examples/dlrm.py [--size tiny|small] [--steps 5] [--compile]

Tolerance: 1e-5 relative on each loss (float32; short sums).
"""

from __future__ import annotations

import torch
from _runner import Timer, main
from torch import nn

SIZES = {"tiny": (3, 50, 8, 16), "small": (8, 1000, 16, 128)}  # (tables, rows, width, batch)
DENSE, LOOKUPS = 13, 4


def mlp(*widths: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, tables: int, rows: int, width: int) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, width, mode="sum") for _ in range(tables))
        self.bottom = mlp(DENSE, 64, width)
        pairs = (tables + 1) * tables // 2
        self.top = mlp(width + pairs, 64, 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        vectors = [self.bottom(dense)] + [bag(sparse[i], offsets) for i, bag in enumerate(self.bags)]
        stacked = torch.stack(vectors, 1)  # [batch, features, width]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        i, j = torch.triu_indices(len(vectors), len(vectors), 1)
        return self.top(torch.cat([vectors[0], dots[:, i, j]], 1)).squeeze(1)


def train(device: str, steps: int, size: str, compiled: bool, timer: Timer) -> list[float]:
    tables, rows, width, batch = SIZES[size]
    model = DLRM(tables, rows, width).to(device)
    run = torch.compile(model, backend="tpu" if device == "tpu" else "inductor") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        dense = torch.randn(batch, DENSE, generator=g).to(device)
        sparse = torch.randint(0, rows, (tables, batch * LOOKUPS), generator=g).to(device)
        offsets = torch.arange(0, batch * LOOKUPS, LOOKUPS).to(device)
        clicks = torch.randint(0, 2, (batch,), generator=g).float().to(device)
        with timer:
            opt.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(run(dense, sparse, offsets), clicks)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


if __name__ == "__main__":
    main("DLRM", train, tolerance=1e-5)
