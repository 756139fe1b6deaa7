"""Window, order and moment ops composed from slices, concatenations and
reductions: var_mean / std_mean, roll, flip.

The engine has slices with positive steps only, so reversing an axis is either
a concatenation of one-element slices (short axes) or a one-hot masked sum
(`lookups.index_select`, longer ones). Shapes are static, so every index is
worked out in Python.
"""

from __future__ import annotations

import math
from typing import Any

from .._engine import Tensor as ET
from ._registry import Unsupported, dims, eng, is_float, lower
from .lookups import index_select

#: Axes up to this long are reversed by concatenating one-element slices;
#: longer ones by a one-hot lookup (fewer trace nodes).
FLIP_BY_SLICES = 32


# ---- var_mean / std_mean ------------------------------------------------------


def _moments(self: ET, dim: Any, correction: Any, keepdim: bool) -> tuple[ET, ET]:
    """(variance, mean) as PyTorch's CPU kernel defines them: the divisor is
    max(0, n - correction), so too few elements give inf (or NaN for a zero
    sum of squares) rather than an error; no elements give NaN for both."""
    if not is_float(self):
        raise Unsupported("var_mean of a non-float tensor")
    x = self
    if len(x.shape) == 0:
        x, axes, keepdim = x.reshape([1]), [0], False
    else:
        axes = [a % len(x.shape) for a in dims(x, dim)]
    n = math.prod(x.shape[a] for a in axes)
    c = 1.0 if correction is None else float(correction)
    if n == 0:
        shape = [1 if a in axes else s for a, s in enumerate(x.shape) if keepdim or a not in axes]
        nan = eng().full(float("nan"), shape, x.dtype)
        return nan, nan
    mean = x.reduce("mean", axes, True)
    centered = x.binary("sub", mean)
    squares = centered.binary("mul", centered).reduce("sum", axes, keepdim)
    var = squares.binary("div", max(0.0, n - c))
    return var, mean if keepdim else mean.reshape(list(var.shape))


@lower("var_mean.correction")
def var_mean(self: ET, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple[ET, ET]:
    return _moments(self, dim, correction, keepdim)


@lower("std_mean.correction")
def std_mean(self: ET, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple[ET, ET]:
    var, mean = _moments(self, dim, correction, keepdim)
    return var.unary("sqrt"), mean


# ---- roll and flip --------------------------------------------------------------


def _roll_axis(x: ET, shift: int, axis: int) -> ET:
    """Elements move `shift` places along `axis`, wrapping around: the last
    `shift` elements come first."""
    n = x.shape[axis]
    if n == 0:
        return x
    s = shift % n
    if s == 0:
        return x
    return eng().cat([x.slice(axis, n - s, n, 1), x.slice(axis, 0, n - s, 1)], axis)


@lower("roll.default")
def roll(self: ET, shifts: Any, dims: Any = ()) -> ET:
    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims_ = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if len(dims_) == 0:
        # No dims: roll the flattened tensor, then restore the shape.
        if len(shifts) != 1:
            raise Unsupported("several shifts without dims")
        n = math.prod(self.shape)
        return _roll_axis(self.reshape([n]), shifts[0], 0).reshape(list(self.shape))
    if len(shifts) != len(dims_) or len(self.shape) == 0:
        raise Unsupported("roll arguments PyTorch rejects")
    x = self
    for shift, axis in zip(shifts, dims_):
        x = _roll_axis(x, shift, axis % len(self.shape))
    return x


def _reverse_axis(x: ET, axis: int) -> ET:
    n = x.shape[axis]
    if n <= 1:
        return x
    if n <= FLIP_BY_SLICES:
        return eng().cat([x.slice(axis, i, i + 1, 1) for i in range(n - 1, -1, -1)], axis)
    backwards = eng().arange(float(n - 1), -1.0, -1.0, "i64")
    source = x.cast("i32") if x.dtype == "bool" else x
    out = index_select(source, axis, backwards)
    return out.cast("bool") if x.dtype == "bool" else out


@lower("flip.default")
def flip(self: ET, dims: Any) -> ET:
    if len(self.shape) == 0:
        return self
    rank = len(self.shape)
    axes = sorted({d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims])})
    x = self
    for axis in axes:
        x = _reverse_axis(x, axis)
    return x
