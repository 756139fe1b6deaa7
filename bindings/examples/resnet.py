"""ResNet (torchvision's resnet18 and resnet50, random weights) trained with
SGD momentum and batch norm in train mode, then evaluated, on `tpu` against
CPU eager.

    python bindings/examples/resnet.py [--size tiny|small] [--steps 5] [--compile]

Tolerance: 2e-3 relative on each loss (measured: below 2e-5 over the first
four steps, 1.1e-3 on the eval loss after eight). Float32 convolutions sum
hundreds of products in another order than PyTorch's, batch norm divides by
the batch's spread, and the model fits its one batch within a few steps, so
a few ulp per layer compound over tens of layers and the steps.
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
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, side, side, generator=data).to(device)
    y = torch.randint(0, 10, (batch,), generator=data).to(device)
    losses = []
    for _ in range(steps):
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
    main("ResNet", train, tolerance=2e-3)
