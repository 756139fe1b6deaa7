"""A transformer training step under bf16 autocast: `tpu` against CPU eager.

A 2-layer `nn.TransformerEncoder` language model (d_model 256, 4 heads,
batch 8 x 128, AdamW), one step = forward, loss, backward, optimizer step,
reading the loss. Prints the median step time of each way, measured in one
run, and the ratios; `--scaler` adds a float16 run with `GradScaler`.

Run: .venv/bin/python bindings/bench/amp_step.py [--steps 12] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import deferfuse
import torch

VOCAB, D, HEADS, FF, LAYERS, BATCH, SEQ = 512, 256, 4, 1024, 2, 8, 128


def make(device: str):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, D), torch.nn.TransformerEncoder(layer, LAYERS), torch.nn.Linear(D, VOCAB)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return model, opt, data[:, :-1].to(device), data[:, 1:].to(device)


def median_step(device: str, low: torch.dtype | None, steps: int, scaler: bool = False) -> float:
    model, opt, x, y = make(device)
    grad_scaler = torch.amp.GradScaler(device) if scaler else None
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        region = torch.autocast(device, dtype=low) if low is not None else contextlib.nullcontext()
        with region:
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        if grad_scaler is None:
            loss.backward()
            opt.step()
        else:
            grad_scaler.scale(loss).backward()
            grad_scaler.step(opt)
            grad_scaler.update()
        loss.item()
        times.append(time.perf_counter() - start)
    kept = sorted(times[steps // 3 :])  # the first steps compile
    return kept[len(kept) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--scaler", action="store_true", help="also float16 with GradScaler")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ways = [
        ("CPU eager, bf16 autocast", "cpu", torch.bfloat16, False),
        ("tpu DeferAndFuse, bf16 autocast", "tpu", torch.bfloat16, False),
        ("tpu DeferAndFuse, float32", "tpu", None, False),
        ("CPU eager, float32", "cpu", None, False),
    ]
    if args.scaler:
        ways += [
            ("CPU eager, f16 autocast + GradScaler", "cpu", torch.float16, True),
            ("tpu DeferAndFuse, f16 autocast + GradScaler", "tpu", torch.float16, True),
        ]
    print(f"{LAYERS}-layer transformer LM, d_model {D}, batch {BATCH}x{SEQ}, {args.threads} thread(s)")
    with deferfuse.mode("defer_and_fuse"):
        results = [(name, median_step(dev, low, args.steps, scaler)) for name, dev, low, scaler in ways]
    base = results[0][1]
    print("| way | ms per step | CPU bf16 autocast / way |")
    print("| --- | ---: | ---: |")
    for name, t in results:
        print(f"| {name} | {t * 1e3:.1f} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
