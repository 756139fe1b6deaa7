"""ResNet (torchvision's resnet18 and resnet50, random weights) trained with
SGD momentum and batch norm in train mode, then evaluated, on `tpu` against
CPU eager.

    python bindings/examples/resnet.py [--size tiny|small] [--steps 5] [--compile]

Each step trains on a new random batch. Tolerance: 1e-2 relative on each
loss. Float32 convolutions sum hundreds of products in another order than
PyTorch's, and training with batch norm on small batches amplifies such
differences step by step: CPU eager against itself, on one thread instead
of two, differs by 2.1e-3 after eight steps (measured on 2026-12-05); the
first steps agree within 1e-5.
"""

from __future__ import annotations

import torch
import torchvision
from _runner import Timer, main

SIZES = {"tiny": ("resnet18", 8, 32), "small": ("resnet50", 8, 64)}  # (model, batch, image side)


def train(device: str, steps: int, size: str, compiled: bool, timer: Timer) -> list[float]:
    arch, batch, side = SIZES[size]
    model = getattr(torchvision.models, arch)(num_classes=10).to(device)
    run = torch.compile(model, backend="tpu" if device == "tpu" else "inductor") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=2e-4, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, 3, side, side, generator=data).to(device)
        y = torch.randint(0, 10, (batch,), generator=data).to(device)
        with timer:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(run(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        losses.append(torch.nn.functional.cross_entropy(run(x), y).item())
    return losses


if __name__ == "__main__":
    main("ResNet", train, tolerance=1e-2)
