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


# ---- nonzero ------------------------------------------------------------------


def _read_count(count: ET) -> int:
    """The one value these data-dependent shapes need on the host (PyTorch's
    CUDA kernels synchronize for it the same way); everything else stays on
    the engine."""
    from .._handles import to_cpu_value

    return int(to_cpu_value(count).item())


def _inclusive_count(flags: ET) -> ET:
    """[N] i64: how many of flags[0..=i] are set (a masked sum over j <= i)."""
    n = flags.shape[-1]
    pos = eng().arange(0, n, 1, "i64")
    upto = pos.reshape([n, 1]).binary("ge", pos)  # [i, j]: j <= i
    hits = upto.binary("logical_and", flags.reshape(list(flags.shape[:-1]) + [1, n]))
    return hits.cast("i64").reduce("sum", [-1], False)


def _coordinates(shape: list[int]) -> ET:
    """[N, ndim] i64: the row-major coordinates of every element."""
    cols = []
    for d, size in enumerate(shape):
        view = [1] * len(shape)
        view[d] = size
        cols.append(eng().arange(0, size, 1, "i64").reshape(view).expand(shape).reshape([math.prod(shape), 1]))
    return eng().cat(cols, 1)


def _nonzero_flags(x: ET) -> ET:
    if not isinstance(x, ET):
        raise Unsupported("nonzero of a non-tensor")
    if len(x.shape) == 0:  # one element, and no coordinates to give
        x = x.reshape([1])
    return x.reshape([math.prod(x.shape)]).binary("ne", 0 if x.dtype != "bool" else False) \
        if x.dtype != "bool" else x.reshape([math.prod(x.shape)])


def _nonzero_slots(x: ET, size: int, fill_value: int) -> ET:
    """[size, ndim]: the coordinates of the first `size` nonzeros in row-major
    order, then rows of fill_value."""
    flags = _nonzero_flags(x)
    n, ndim = flags.shape[0], len(x.shape)
    if n == 0 or size == 0 or ndim == 0:
        return eng().full(float(fill_value), [size, ndim], "i64")
    _check_square(1, n)
    if size * n * ndim > ONE_HOT_LIMIT:
        raise Unsupported("a nonzero too large for masked sums")
    slot = flags.where_(_inclusive_count(flags).binary("sub", 1), -1)  # [N]; -1 never matches
    coords = _coordinates(list(x.shape)).permute([1, 0])  # [ndim, N]
    picked = _place(slot.expand([ndim, n]), coords, size).permute([1, 0])  # [size, ndim]
    filled = eng().arange(0, size, 1, "i64").binary("lt", flags.cast("i64").reduce("sum", [0], False))
    return filled.reshape([size, 1]).where_(picked, eng().full(float(fill_value), [], "i64"))


@lower("nonzero_static.default")
def nonzero_static(self: ET, *, size: int, fill_value: int = -1) -> ET:
    return _nonzero_slots(self, size, fill_value)


@lower("nonzero.default")
def nonzero(self: ET) -> ET:
    """Reads the number of nonzeros back to the host (the output's size)."""
    flags = _nonzero_flags(self)
    if flags.shape[0] == 0:
        return eng().full(0.0, [0, len(self.shape)], "i64")
    if flags.shape[0] ** 2 > ONE_HOT_LIMIT:
        raise Unsupported("a nonzero too large for masked sums")
    count = _read_count(flags.cast("i64").reduce("sum", [0], False))
    return _nonzero_slots(self, count, -1)
