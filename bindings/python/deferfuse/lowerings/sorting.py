"""Sorting-based ops as compositions: sort, argsort, msort, nonzero, unique,
topk, kthvalue, median.

The engine has no sort, so a sort along one axis of n elements is written as
ranks: element i goes to slot rank_i = the number of elements that come
before it (a [..., n, n] comparison, summed), and slot k is filled by a
masked sum over i of `where(rank_i == k, x_i, -0.0)`. The comparison is
PyTorch's order (NaN after every number ascending, before them descending,
NaNs equal to one another) with ties broken by position, so the result is
the stable sort, which is also what PyTorch's CPU sort returns. Exactly one
term of each masked sum is the element itself and the others are -0.0
(`x + -0.0` is x for every x, +0.0 included), so values are exact. It costs
n * n elements per row, so larger inputs (`ONE_HOT_LIMIT`) stay on the CPU.
"""

from __future__ import annotations

import math
from typing import Any

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, is_float, lower
from .lookups import ONE_HOT_LIMIT, _move_back, _move_last


def _check_square(rows: int, n: int) -> None:
    if rows * n * n > ONE_HOT_LIMIT:
        raise Unsupported("a sort too large for an n x n comparison")


def _zero(dtype: str) -> float:
    """The neutral term of a masked sum: -0.0 keeps a -0.0 element's sign."""
    return -0.0 if dtype in ("f32", "bf16", "f16") else 0.0


def _before(x: ET, descending: bool) -> ET:
    """[..., j, i]: element j comes before element i in the stable order of
    the last axis (x is [..., n])."""
    n = x.shape[-1]
    xj = x.reshape(list(x.shape[:-1]) + [n, 1])
    xi = x.reshape(list(x.shape[:-1]) + [1, n])
    strict = xj.binary("gt" if descending else "lt", xi)
    same = xj.binary("eq", xi)
    if is_float(x):
        nan_j, nan_i = xj.binary("ne", xj), xi.binary("ne", xi)
        # NaN is the largest value: first descending, last ascending.
        if descending:
            strict = strict.binary("logical_or", nan_j.binary("logical_and", nan_i.unary("logical_not")))
        else:
            strict = strict.binary("logical_or", nan_i.binary("logical_and", nan_j.unary("logical_not")))
        same = same.binary("logical_or", nan_j.binary("logical_and", nan_i))
    pos = eng().arange(0, n, 1, "i64")
    earlier = pos.reshape([n, 1]).binary("lt", pos)  # [j, i]: j < i
    return strict.binary("logical_or", same.binary("logical_and", earlier))


def _ranks(x: ET, descending: bool) -> ET:
    """[..., n] i64: each element's slot in the stable sorted order."""
    return _before(x, descending).cast("i64").reduce("sum", [-2], False)


def _place(rank: ET, value: ET, slots: int) -> ET:
    """out[..., k] = value[..., i] for the i with rank[..., i] == k, for k in
    [0, slots) (a slot no rank names gets the neutral term)."""
    n = rank.shape[-1]
    wanted = eng().arange(0, slots, 1, "i64").reshape([slots, 1])
    mask = rank.reshape(list(rank.shape[:-1]) + [1, n]).binary("eq", wanted)  # [..., k, i]
    if value.dtype == "bool":
        return _place(rank, value.cast("i32"), slots).cast("bool")
    rows = value.reshape(list(value.shape[:-1]) + [1, n])
    picked = mask.where_(rows, eng().full(_zero(value.dtype), [], value.dtype)).reduce("sum", [-1], False)
    return picked.cast(value.dtype)


def _sorted_last(x: ET, descending: bool) -> tuple[ET, ET]:
    """Stable sort of the last axis: (values, indices)."""
    n = x.shape[-1]
    _check_square(math.prod(x.shape[:-1]), n)
    rank = _ranks(x, descending)
    index = eng().arange(0, n, 1, "i64").expand(list(x.shape))
    return _place(rank, x, n), _place(rank, index, n)


def _sort(x: ET, dim: int, descending: bool) -> tuple[ET, ET]:
    if not isinstance(x, ET):
        raise Unsupported("sort of a non-tensor")
    if len(x.shape) == 0:
        if dim not in (0, -1):
            raise Unsupported("sort of a zero-dimensional tensor along another dim")
        return x, eng().full(0.0, [], "i64")
    dim %= len(x.shape)
    if math.prod(x.shape) == 0:
        return x, eng().full(0.0, list(x.shape), "i64")
    values, indices = _sorted_last(_move_last(x, dim), descending)
    return _move_back(values, dim), _move_back(indices, dim)


@lower("sort.default")
def sort(self: ET, dim: int = -1, descending: bool = False) -> tuple[ET, ET]:
    return _sort(self, dim, descending)


@lower("sort.stable")
def sort_stable(self: ET, *, stable: bool | None = None, dim: int = -1, descending: bool = False) -> tuple[ET, ET]:
    return _sort(self, dim, descending)
