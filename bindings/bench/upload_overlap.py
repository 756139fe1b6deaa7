"""Non-blocking uploads from pinned memory against blocking ones, in a
training loop fed the way a `DataLoader(pin_memory=True)` feeds it.

Each step takes the next pinned batch (made before timing, as the loader's
pinning thread would), uploads it with `.to("tpu", non_blocking=...)`,
runs an MLP classifier's forward, backward and SGD update, and reads the
loss. A blocking upload copies the batch on the Python thread; a
non-blocking one copies it on the context's stream while the thread
records the step. Both loops run in this process, alternating, `--repeats`
times; each row prints the median step time of each and their ratio.

Run: TORCH_TPU_CACHE_DIR=off .venv/bin/python bindings/bench/upload_overlap.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import deferfuse
import torch
from torch import nn


def loop(batches: list[torch.Tensor], labels: torch.Tensor, non_blocking: bool, warm: int = 3) -> float:
    """Median seconds per step after `warm` steps."""
    torch.manual_seed(0)
    width = batches[0][0].numel()
    model = nn.Sequential(nn.Flatten(), nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    y = labels.to("tpu")
    times = []
    for i, batch in enumerate(batches):
        start = time.perf_counter()
        x = batch.to("tpu", non_blocking=non_blocking)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= warm:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    print("| mode | batch | MiB per batch | blocking ms | non-blocking ms | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for mode in ("defer_and_fuse", "strict"):
        deferfuse.set_mode(mode)
        for shape in ((256, 3, 32, 32), (64, 3, 96, 96)):
            batches = [torch.randn(*shape, generator=g).pin_memory() for _ in range(args.steps)]
            labels = torch.randint(0, 10, (shape[0],), generator=g)
            blocking, overlapped = [], []
            for _ in range(args.repeats):
                blocking.append(loop(batches, labels, non_blocking=False))
                overlapped.append(loop(batches, labels, non_blocking=True))
            b, o = statistics.median(blocking), statistics.median(overlapped)
            mib = batches[0].numel() * 4 / 2**20
            shape_text = "x".join(map(str, shape))
            print(f"| {mode} | {shape_text} | {mib:.1f} | {1e3 * b:.2f} | {1e3 * o:.2f} | {o / b:.2f} |")


if __name__ == "__main__":
    main()
