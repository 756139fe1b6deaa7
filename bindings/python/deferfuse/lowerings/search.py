"""Searches and distances as elementwise ops and reductions: searchsorted and
bucketize (PyTorch's binary search, step by step), cdist, equal, and the
accurate log1p / expm1."""

from __future__ import annotations

import math
from typing import Any

from .._engine import Tensor as ET
from ._registry import Unsupported, broadcast_batch, eng, is_float, lower
from .lookups import ONE_HOT_LIMIT


def _pick_last(table: ET, position: ET, n: int) -> ET:
    """`table[..., position[..., j]]` for positions in [0, n] (n picks 0): a
    masked sum over the last axis of `table` ([..., n], or [n] for every
    position). `position` is f32 holding whole numbers."""
    mask = position.reshape(list(position.shape) + [1]).binary(
        "eq", eng().arange(0, n, 1, "f32")
    )  # [..., m, n]
    rows = table.reshape(list(table.shape[:-1]) + [1, n]) if len(table.shape) > 1 else table
    return mask.where_(rows, eng().full(0.0, [], table.dtype)).reduce("sum", [-1], False)


def _search(seq: ET, values: ET, right: bool, sorter: ET | None) -> ET:
    """PyTorch's `cus_lower_bound` / `cus_upper_bound` on every value at once:
    the same midpoints and the same comparisons, so unsorted sequences and NaN
    give PyTorch's answers too. [..., m] positions as f32."""
    n = seq.shape[-1]
    m = math.prod(values.shape)
    if n == 0:
        return eng().full(0.0, list(values.shape), "f32")
    if m * n * max(1, math.prod(seq.shape[:-1])) > ONE_HOT_LIMIT or n >= 1 << 22:
        raise Unsupported("a search too large for masked sums")
    lo = eng().full(0.0, list(values.shape), "f32")
    hi = eng().full(float(n), list(values.shape), "f32")
    for _ in range(n.bit_length()):
        active = lo.binary("lt", hi)
        mid = lo.binary("add", hi).binary("mul", 0.5).unary("floor")
        if sorter is not None:
            at = _pick_last(sorter, mid, n).cast("f32")
            mid_val = _pick_last(seq, at, n)
        else:
            mid_val = _pick_last(seq, mid, n)
        # PyTorch moves right when !(mid_val >= v) (lower bound) or !(mid_val > v).
        go_right = mid_val.binary("gt" if right else "ge", values).unary("logical_not")
        lo = active.binary("logical_and", go_right).where_(mid.binary("add", 1.0), lo)
        hi = active.binary("logical_and", go_right.unary("logical_not")).where_(mid, hi)
    return lo


def _searchsorted(
    seq: ET, values: Any, out_int32: bool, right: bool, side: str | None, sorter: ET | None
) -> ET:
    if not isinstance(seq, ET) or len(seq.shape) == 0:
        raise Unsupported("searchsorted of a zero-dimensional sequence")
    if side is not None:
        if side not in ("left", "right") or (right and side == "left"):
            raise Unsupported("conflicting side and right")
        right = side == "right"
    if not isinstance(values, ET):
        if len(seq.shape) != 1 or isinstance(values, complex):
            raise Unsupported("a scalar value with a batched sequence")
        values = eng().full(float(values), [], "f32" if isinstance(values, float) or is_float(seq) else "i64")
    if seq.dtype == "bool" or values.dtype == "bool":
        raise Unsupported("bool searchsorted")
    if len(seq.shape) > 1 and (
        len(values.shape) != len(seq.shape) or list(values.shape[:-1]) != list(seq.shape[:-1])
    ):
        raise Unsupported("mismatched leading dimensions")
    if sorter is not None and (list(sorter.shape) != list(seq.shape) or sorter.dtype != "i64"):
        raise Unsupported("sorter of another shape or dtype")
    found = _search(seq, values, right, sorter)
    return found.cast("i32" if out_int32 else "i64")


@lower("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(
    sorted_sequence: ET,
    self: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: ET | None = None,
) -> ET:
    return _searchsorted(sorted_sequence, self, out_int32, right, side, sorter)


@lower("bucketize.Tensor", "bucketize.Scalar")
def bucketize(self: Any, boundaries: ET, *, out_int32: bool = False, right: bool = False) -> ET:
    if not isinstance(boundaries, ET) or len(boundaries.shape) != 1:
        raise Unsupported("boundaries that are not one-dimensional")
    return _searchsorted(boundaries, self, out_int32, right, None, None)


@lower("_cdist_forward.default")
def cdist(x1: ET, x2: ET, p: float, compute_mode: int | None = None) -> ET:
    """PyTorch's two algorithms, chosen as it chooses them: for p = 2 on more
    than 25 rows (or when asked) the matmul form, otherwise the direct one."""
    if not (isinstance(x1, ET) and isinstance(x2, ET)) or x1.dtype != x2.dtype or not is_float(x1):
        raise Unsupported("cdist of mixed or integer dtypes")
    if len(x1.shape) < 2 or len(x2.shape) < 2 or x1.shape[-1] != x2.shape[-1] or p < 0:
        raise Unsupported("cdist arguments PyTorch rejects")
    r1, r2, m = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    batch = broadcast_batch(list(x1.shape[:-2]), list(x2.shape[:-2]))
    a = x1.expand(batch + [r1, m])
    b = x2.expand(batch + [r2, m])
    mode = compute_mode or 0
    if r1 == 0 or r2 == 0:
        return eng().full(0.0, batch + [r1, r2], x1.dtype)
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        # at::_euclidean_dist: [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T, clamped at 1e-30, sqrt.
        n1 = a.binary("mul", a).reduce("sum", [-1], True)
        n2 = b.binary("mul", b).reduce("sum", [-1], True)
        ones1 = eng().full(1.0, list(n1.shape), a.dtype)
        ones2 = eng().full(1.0, list(n2.shape), a.dtype)
        left = eng().cat([a.binary("mul", -2.0), n1, ones1], -1)
        right = eng().cat([b, ones2, n2], -1)
        rank = len(right.shape)
        prod = left.matmul(right.permute(list(range(rank - 2)) + [rank - 1, rank - 2]))
        return prod.binary("maximum", 1e-30).unary("sqrt")
    if r1 * r2 * m * max(1, math.prod(batch)) > ONE_HOT_LIMIT:
        raise Unsupported("a direct cdist too large")
    diff = a.reshape(batch + [r1, 1, m]).binary("sub", b.reshape(batch + [1, r2, m])).unary("abs")
    if m == 0:
        return eng().full(0.0, batch + [r1, r2], x1.dtype)
    if p == 0:
        return diff.binary("ne", 0.0).cast(x1.dtype).reduce("sum", [-1], False)
    if p == 1:
        return diff.reduce("sum", [-1], False)
    if p == 2:
        return diff.binary("mul", diff).reduce("sum", [-1], False).unary("sqrt")
    if p == float("inf"):
        return diff.reduce("max", [-1], False)
    return diff.binary("pow", float(p)).reduce("sum", [-1], False).binary("pow", 1.0 / float(p))


@lower("equal.default")
def equal(self: ET, other: ET) -> bool:
    """A Python bool, as PyTorch returns: the comparison runs on the engine and
    only its one-element answer is read."""
    if not (isinstance(self, ET) and isinstance(other, ET)) or self.dtype != other.dtype:
        raise Unsupported("equal of mixed dtypes")
    if list(self.shape) != list(other.shape):
        return False
    if math.prod(self.shape) == 0:
        return True
    from .._handles import to_cpu_value

    same = self.binary("eq", other).cast("i32").reduce("min", list(range(len(self.shape))), False)
    return bool(to_cpu_value(same).item())


@lower("log1p.default")
def log1p(self: ET) -> ET:
    """log(1 + x) accurate near 0 (Goldberg): log(u) * x / (u - 1), u = 1 + x,
    and x itself where u rounds to 1 or overflows. No intermediate is
    infinite or NaN unless the result is (Debug checks every op)."""
    x = self if is_float(self) else self.cast("f32")
    u = x.binary("add", 1.0)
    exact = u.binary("eq", 1.0).binary("logical_or", u.binary("eq", float("inf")))
    safe_u = exact.where_(2.0, u)
    general = safe_u.unary("log").binary("mul", x.binary("div", safe_u.binary("sub", 1.0)))
    return exact.where_(x, general)


@lower("expm1.default")
def expm1(self: ET) -> ET:
    """exp(x) - 1 accurate near 0 (Kahan): (u - 1) * x / log(u), u = exp(x),
    and x where u rounds to 1. Away from 0 (|x| >= 0.5) exp(x) - 1 itself has
    no cancellation. No intermediate is infinite or NaN unless the result is
    (Debug checks every op)."""
    x = self if is_float(self) else self.cast("f32")
    small = x.unary("abs").binary("lt", 0.5)
    xs = small.where_(x, 0.25)
    us = xs.unary("exp")
    one = us.binary("eq", 1.0)
    log_us = one.where_(1.0, us.unary("log"))
    near = one.where_(xs, us.binary("sub", 1.0).binary("mul", xs.binary("div", log_us)))
    return small.where_(near, x.unary("exp").binary("sub", 1.0))
