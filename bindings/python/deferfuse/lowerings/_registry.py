"""The lowering registry and the helpers every lowering uses."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .. import _state
from .._engine import Tensor as ET

LOWERINGS: dict[str, Callable[..., Any]] = {}


class Unsupported(Exception):
    """These arguments have no engine lowering; run the op on the CPU."""


def lower(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            LOWERINGS[name] = fn
        return fn

    return register


def eng():
    return _state.engine()


def dt(dtype: torch.dtype | None) -> str:
    from .._handles import TO_ENGINE

    if dtype not in TO_ENGINE:
        raise Unsupported(f"dtype {dtype}")
    return TO_ENGINE[dtype]


def is_float(x: Any) -> bool:
    return x.dtype in ("f32", "bf16", "f16") if isinstance(x, ET) else isinstance(x, float)


def need_tensor(*xs: Any) -> None:
    for x in xs:
        if not isinstance(x, ET):
            raise Unsupported("operand is not a tensor")


def dims(x: ET, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(len(x.shape)))
    return list(dim) if isinstance(dim, (list, tuple)) else [dim]


def axis(dim: int, rank: int) -> int:
    """`dim` in [-rank, rank) as a non-negative axis. Out of range, the op goes
    to the CPU, where PyTorch raises its own IndexError."""
    if not -rank <= dim < rank:
        raise Unsupported(f"dim {dim} out of range for rank {rank}")
    return dim % rank


def as_float(x: ET) -> ET:
    return x if is_float(x) else x.cast("f32")


def broadcast_batch(a: list[int], b: list[int]) -> list[int]:
    """The broadcast of two batch shapes (NumPy's rule, sizes of 0 kept)."""
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if x != y and 1 not in (x, y):
            raise Unsupported("batch dimensions that do not broadcast")
        out.append(y if x == 1 else x)
    return out[::-1]
