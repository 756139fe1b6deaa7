"""Reductions: sums, means, extrema, arg-extrema, variance, norms, cumsum."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._engine import Tensor as ET
from ._registry import LOWERINGS, Unsupported, as_float, axis, dims, dt, eng, is_float, lower
from .lookups import _check_size, _move_back, _move_last


def _reduce_dtype(x: ET, dtype: torch.dtype | None) -> ET:
    return x.cast(dt(dtype)) if dtype is not None else x


@lower("sum.default")
def sum_all(self: ET, *, dtype: torch.dtype | None = None) -> ET:
    return _reduce_dtype(self, dtype).reduce("sum", dims(self, None), False)


@lower("sum.dim_IntList")
def sum_dim(self: ET, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> ET:
    if len(self.shape) == 0:
        return _reduce_dtype(self, dtype).reduce("sum", [], False)
    return _reduce_dtype(self, dtype).reduce("sum", dims(self, dim), keepdim)


def _mean(x: ET, axes: list[int], keepdim: bool) -> ET:
    if len(x.shape) and any(x.shape[a] == 0 for a in axes):
        # The mean of no elements is 0 / 0, NaN, as in PyTorch, whatever the
        # (absent) values: a constant, which needs no kernel.
        if not is_float(x):
            raise Unsupported("mean of an empty integer tensor")
        rank = len(x.shape)
        picked = {axis(a, rank) for a in axes}
        shape = [1 if a in picked else n for a, n in enumerate(x.shape) if keepdim or a not in picked]
        return eng().full(float("nan"), shape, x.dtype)
    return x.reduce("mean", axes, keepdim)


@lower("mean.default")
def mean_all(self: ET, *, dtype: torch.dtype | None = None) -> ET:
    return _mean(_reduce_dtype(self, dtype), dims(self, None), False)


@lower("mean.dim")
def mean_dim(self: ET, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> ET:
    if len(self.shape) == 0:
        return _reduce_dtype(self, dtype).reduce("mean", [], False)
    return _mean(_reduce_dtype(self, dtype), dims(self, dim), keepdim)


@lower("prod.default")
def prod_all(self: ET, *, dtype: torch.dtype | None = None) -> ET:
    # The product of no elements is 1, as the engine's reduction gives it.
    return _reduce_dtype(self, dtype).reduce("prod", dims(self, None), False)


@lower("prod.dim_int")
def prod_dim(self: ET, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> ET:
    if len(self.shape) == 0:
        return _reduce_dtype(self, dtype).reduce("prod", [], False)
    return _reduce_dtype(self, dtype).reduce("prod", [dim], keepdim)


def _nonempty(x: ET, what: str) -> None:
    if math.prod(x.shape) == 0:
        raise Unsupported(f"{what} of an empty tensor")


@lower("amax.default")
def amax(self: ET, dim: Any = (), keepdim: bool = False) -> ET:
    _nonempty(self, "amax")
    if self.dtype == "bool":
        return amax(self.cast("i32"), dim, keepdim).cast("bool")
    return self.reduce("max", dims(self, dim) if len(self.shape) else [], keepdim)


@lower("amin.default")
def amin(self: ET, dim: Any = (), keepdim: bool = False) -> ET:
    _nonempty(self, "amin")
    if self.dtype == "bool":
        return amin(self.cast("i32"), dim, keepdim).cast("bool")
    return self.reduce("min", dims(self, dim) if len(self.shape) else [], keepdim)


@lower("max.default")
def max_all(self: ET) -> ET:
    return amax(self)


@lower("min.default")
def min_all(self: ET) -> ET:
    return amin(self)


@lower("max.dim")
def max_dim(self: ET, dim: int, keepdim: bool = False) -> tuple[ET, ET]:
    if self.dtype == "bool":
        raise Unsupported("max.dim of a bool tensor")
    if len(self.shape) == 0:  # the value itself, at index 0
        return self, eng().full(0.0, [], "i64")
    _nonempty(self, "max")
    return self.reduce("max", [dim], keepdim), self.arg_reduce("argmax", dim, keepdim)


@lower("min.dim")
def min_dim(self: ET, dim: int, keepdim: bool = False) -> tuple[ET, ET]:
    if self.dtype == "bool":
        raise Unsupported("min.dim of a bool tensor")
    if len(self.shape) == 0:  # the value itself, at index 0
        return self, eng().full(0.0, [], "i64")
    _nonempty(self, "min")
    return self.reduce("min", [dim], keepdim), self.arg_reduce("argmin", dim, keepdim)


def _arg_extreme(x: ET, kind: str, dim: int | None, keepdim: bool) -> ET:
    """argmax / argmin: a zero-dimensional tensor's index is 0, and without
    a dim the index is into the flattened tensor (every dim 1 with keepdim)."""
    if x.dtype == "bool":
        raise Unsupported(f"{kind} of a bool tensor")  # PyTorch's own error
    _nonempty(x, kind)
    rank = len(x.shape)
    if rank == 0:
        return eng().full(0.0, [], "i64")
    if dim is None:
        flat = x.reshape([math.prod(x.shape)]).arg_reduce(kind, 0, False)
        return flat.reshape([1] * rank) if keepdim else flat
    return x.arg_reduce(kind, dim, keepdim)


@lower("argmax.default")
def argmax(self: ET, dim: int | None = None, keepdim: bool = False) -> ET:
    return _arg_extreme(self, "argmax", dim, keepdim)


@lower("argmin.default")
def argmin(self: ET, dim: int | None = None, keepdim: bool = False) -> ET:
    return _arg_extreme(self, "argmin", dim, keepdim)


@lower("any.default", "any.dim", "any.dims")
def any_(self: ET, dim: Any = None, keepdim: bool = False) -> ET:
    # Counting (not max) so that a reduction over no elements is False.
    axes = dims(self, dim) if len(self.shape) else []
    return self.cast("bool").cast("i64").reduce("sum", axes, keepdim).binary("gt", 0)


@lower("all.default", "all.dim", "all.dims")
def all_(self: ET, dim: Any = None, keepdim: bool = False) -> ET:
    # Counting the False elements, so that a reduction over none is True.
    axes = dims(self, dim) if len(self.shape) else []
    return self.cast("bool").unary("logical_not").cast("i64").reduce("sum", axes, keepdim).binary("eq", 0)


def _var(self: ET, dim: Any, correction: Any, keepdim: bool) -> ET:
    if not is_float(self) or len(self.shape) == 0:
        raise Unsupported("var of a non-float or zero-dimensional tensor")
    axes = dims(self, dim)
    n = math.prod(self.shape[a] for a in axes)
    c = 1 if correction is None else correction
    if n - c <= 0:
        raise Unsupported("var with too few elements")
    centered = self.binary("sub", self.reduce("mean", axes, True))
    return centered.binary("mul", centered).reduce("sum", axes, keepdim).binary("div", float(n - c))


LOWERINGS["var.correction"] = lambda self, dim=None, *, correction=None, keepdim=False: _var(
    self, dim, correction, keepdim
)


LOWERINGS["std.correction"] = lambda self, dim=None, *, correction=None, keepdim=False: _var(
    self, dim, correction, keepdim
).unary("sqrt")


@lower("logsumexp.default")
def logsumexp(self: ET, dim: Any, keepdim: bool = False) -> ET:
    x = as_float(self)
    if len(x.shape) == 0:
        return logsumexp(x.reshape([1]), [0], False)
    axes = [a % len(x.shape) for a in dims(x, dim)]
    if any(x.shape[a] == 0 for a in axes):  # the log of an empty sum
        shape = (
            [1 if a in axes else n for a, n in enumerate(x.shape)]
            if keepdim
            else [n for a, n in enumerate(x.shape) if a not in axes]
        )
        return eng().full(float("-inf"), shape, x.dtype)
    m = x.reduce("max", axes, True)
    # An infinite maximum would make x - m NaN; shift by 0 there instead.
    m = m.unary("abs").binary("eq", float("inf")).where_(0.0, m)
    total = x.binary("sub", m).unary("exp").reduce("sum", axes, keepdim).unary("log")
    return total.binary("add", m if keepdim else m.reduce("max", axes, False))


@lower("linalg_vector_norm.default")
def vector_norm(self: ET, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> ET:
    if not is_float(self):
        raise Unsupported("norm of a non-float tensor")
    x = self.cast(dt(dtype)) if dtype is not None else self
    if len(x.shape) == 0:
        x, axes = x.reshape([1]), [0]
        keepdim = False
    else:
        axes = dims(x, dim)
    if math.prod(x.shape) == 0 and ord in (float("inf"), float("-inf")):
        raise Unsupported("max-norm of an empty tensor")
    a = x.unary("abs")
    if ord == float("inf"):
        return a.reduce("max", axes, keepdim)
    if ord == float("-inf"):
        return a.reduce("min", axes, keepdim)
    if ord == 0:
        return a.binary("ne", 0).cast(x.dtype).reduce("sum", axes, keepdim)
    if ord == 1:
        return a.reduce("sum", axes, keepdim)
    if ord == 2:
        return x.binary("mul", x).reduce("sum", axes, keepdim).unary("sqrt")
    # Any other order, negative ones too: a zero element makes |x|^ord
    # infinite for ord < 0, and the norm 0, as PyTorch's is.
    return a.binary("pow", float(ord)).reduce("sum", axes, keepdim).binary("pow", 1.0 / float(ord))


@lower("cumsum.default")
def cumsum(self: ET, dim: int, *, dtype: Any = None) -> ET:
    x = _reduce_dtype(self, dtype)
    # Integers sum in int64, and the result keeps a `dtype=` asked for.
    out_dtype = x.dtype if dtype is not None or x.dtype not in ("bool", "i32") else "i64"
    if len(x.shape) == 0:
        return x.cast(out_dtype)
    if x.dtype in ("bool", "i32"):
        x = x.cast("i64")
    dim = axis(dim, len(x.shape))
    n = x.shape[dim]
    _check_size(math.prod(x.shape), n)
    # out[..., i] = sum over j <= i of x[..., j]
    lower_tri = (
        eng().arange(0, n, 1, "i64").reshape([n, 1]).binary("ge", eng().arange(0, n, 1, "i64"))
    )  # [i, j]
    moved = _move_last(x, dim)
    terms = lower_tri.where_(moved.reshape(list(moved.shape[:-1]) + [1, n]), eng().full(0.0, [], x.dtype))
    return _move_back(terms.reduce("sum", [-1], False), dim).cast(out_dtype)
