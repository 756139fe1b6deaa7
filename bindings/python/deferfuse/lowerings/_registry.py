"""The lowering registry and the helpers every lowering uses."""

from __future__ import annotations

import os
import sys
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


# ---- bounds checks of indices ---------------------------------------------------

_INTERNAL = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)


def call_site() -> str:
    """`file:line` of the innermost caller outside torch and deferfuse: the
    user's line that an index error names. Only indexing ops pay for it."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_INTERNAL):
            return f"{name.rpartition(os.sep)[2]}:{f.f_lineno}"
        f = f.f_back
    return ""


def check_bounds(op: str, kind: str, indices: list[ET], sizes: list[int], dims: list[int]) -> None:
    """Checks that the indices are in range as the aten op `op` does: `kind`
    names PyTorch's error for it (see deferfuse::BoundsMessage). Debug raises
    here; Strict and DeferAndFuse at the next read of any value, or sync(),
    from a flag computed with the op (no value is read back for it). Call it
    once the lowering has its result, so an op that falls back to the CPU
    (which raises PyTorch's error itself) registers no check."""
    eng().check_indices(indices, sizes, dims, op, kind, call_site())
