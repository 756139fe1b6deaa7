"""What every example shares: train on CPU eager, then on `tpu` in each mode
(and, with `--compile`, under `torch.compile` on both devices), check the
losses against CPU eager's, and print step times and the ops that fell back.

An example defines `train(device, steps, size, compiled, timer)`, which
returns its losses and times each step with `with timer:`, and calls
`main(name, train, tolerance)`.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Callable

import deferfuse
import torch

MODES = ("strict", "debug", "defer_and_fuse")

# Attention masks hold -inf on purpose (PyTorch's own causal attention makes
# one), so Debug mode checks for NaN only here, as the conformance runs do.
# Read when the Debug engine is made, at its first op.
os.environ.setdefault("TORCH_TPU_DEBUG_CHECKS", "nan")


class Timer:
    """Step times of one run: `with timer:` around each step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.times.append(time.perf_counter() - self.start)

    def warm(self) -> float:
        """The median step after the first (which compiles)."""
        rest = sorted(self.times[1:]) or self.times
        return rest[len(rest) // 2]


Train = Callable[[str, int, str, bool, Timer], list[float]]


def run(
    train: Train, device: str, steps: int, size: str, compiled: bool = False
) -> tuple[list[float], Timer]:
    timer = Timer()
    torch.manual_seed(0)
    return train(device, steps, size, compiled, timer), timer


def check(name: str, want: list[float], got: list[float], tolerance: float) -> float:
    """The largest relative difference of two loss curves; raises past
    `tolerance`. A loss near zero (a model that fits its few batches) is
    compared relative to a hundredth of the largest loss instead."""
    floor = 1e-2 * max(abs(a) for a in want)
    worst = max(abs(a - b) / max(abs(a), floor, 1e-12) for a, b in zip(want, got))
    if len(want) != len(got) or worst > tolerance:
        raise AssertionError(f"{name}: losses {got} differ from CPU eager's {want} (tolerance {tolerance:g})")
    return worst


def compare(
    name: str, train: Train, tolerance: float, steps: int, size: str, modes=MODES, compile: bool = False
) -> list[tuple[str, float, float, dict]]:
    """Rows (way, first step s, warm step s, fallbacks) after checking every
    way's losses against CPU eager's."""
    want, cpu = run(train, "cpu", steps, size)
    rows = [("CPU eager", cpu.times[0], cpu.warm(), {})]
    if compile:
        got, t = run(train, "cpu", steps, size, compiled=True)
        check(f"{name} (Inductor)", want, got, tolerance)
        rows.append(("CPU torch.compile (Inductor)", t.times[0], t.warm(), {}))
    ways = [(mode, False) for mode in modes] + ([("defer_and_fuse", True)] if compile else [])
    for mode, compiled in ways:
        before = deferfuse.fallback_counts()
        with deferfuse.mode(mode):
            got, t = run(train, "tpu", steps, size, compiled)
        fell = dict(deferfuse.fallback_counts() - before)
        label = 'tpu torch.compile(backend="tpu")' if compiled else f"tpu {mode}"
        check(f"{name} ({label})", want, got, tolerance)
        rows.append((label, t.times[0], t.warm(), fell))
    return rows


def report(name: str, rows: list[tuple[str, float, float, dict]]) -> None:
    base = rows[0][2]
    print(f"{name}: losses match CPU eager in every way")
    print("| way | first step ms | warm step ms | CPU eager / way | fell back to the CPU |")
    print("| --- | ---: | ---: | ---: | --- |")
    for way, first, warm, fell in rows:
        ops = ", ".join(f"{k.removeprefix('aten::')} x{v}" for k, v in sorted(fell.items())) or "nothing"
        print(f"| {way} | {first * 1e3:.0f} | {warm * 1e3:.1f} | {base / warm:.2f}x | {ops} |")


def main(name: str, train: Train, tolerance: float) -> None:
    parser = argparse.ArgumentParser(description=f"{name}: trained on tpu in every mode against CPU eager")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--size", choices=["tiny", "small"], default="small")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--compile", action="store_true", help="also torch.compile: Inductor on CPU, tpu's backend"
    )
    args = parser.parse_args()
    rows = compare(name, train, tolerance, args.steps, args.size, tuple(args.modes.split(",")), args.compile)
    report(name, rows)
