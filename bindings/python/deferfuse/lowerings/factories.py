"""Constructors, fills, copies and layout ops (cat, tril/triu)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _state
from .._engine import Tensor as ET
from ._registry import Unsupported, dt, eng, lower


@lower("cat.default")
def cat(tensors: list[Any], dim: int = 0) -> ET:
    parts = [t for t in tensors if isinstance(t, ET) and not (len(t.shape) == 1 and t.shape[0] == 0)]
    if len(parts) != len([t for t in tensors if isinstance(t, ET)]) or not parts:
        if not parts:
            raise Unsupported("cat of empty tensors only")
    if any(not isinstance(t, ET) for t in tensors):
        raise Unsupported("cat of mixed operands")
    return eng().cat(parts, dim)


def _tril_mask(shape: list[int], diagonal: int, lower_tri: bool) -> ET:
    rows, cols = shape[-2], shape[-1]
    r = eng().arange(0, rows, 1, "i64").reshape([rows, 1])
    c = eng().arange(0, cols, 1, "i64").reshape([1, cols])
    d = c.binary("sub", r)
    return d.binary("le", diagonal) if lower_tri else d.binary("ge", diagonal)


@lower("tril.default")
def tril(self: ET, diagonal: int = 0) -> ET:
    if len(self.shape) < 2:
        raise Unsupported("tril needs two dimensions")
    return _tril_mask(list(self.shape), diagonal, True).where_(self, eng().full(0.0, [], self.dtype))


@lower("triu.default")
def triu(self: ET, diagonal: int = 0) -> ET:
    if len(self.shape) < 2:
        raise Unsupported("triu needs two dimensions")
    return _tril_mask(list(self.shape), diagonal, False).where_(self, eng().full(0.0, [], self.dtype))


def constant(value: float, shape: list[int], dtype: str) -> ET:
    """A filled tensor. Debug mode checks every op's output for NaN and Inf, so
    a non-finite constant the program asks for (an attention mask's -inf) is
    uploaded as data instead of computed by an op."""
    if not math.isfinite(value) and _state.get_mode() == "debug":
        from .._handles import TO_TORCH, from_cpu_value

        return from_cpu_value(torch.full(shape, value, dtype=TO_TORCH[dtype]))
    return eng().full(value, shape, dtype)


def _factory_dtype(dtype: torch.dtype | None, default: torch.dtype) -> str:
    return dt(dtype if dtype is not None else default)


@lower("full.default")
def full(
    size: Any,
    fill_value: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> ET:
    if dtype is None:
        dtype = (
            torch.bool
            if isinstance(fill_value, bool)
            else torch.int64
            if isinstance(fill_value, int)
            else torch.get_default_dtype()
        )
    return constant(float(fill_value), list(size), _factory_dtype(dtype, dtype))


@lower("scalar_tensor.default")
def scalar_tensor(
    s: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> ET:
    return constant(float(s), [], _factory_dtype(dtype, torch.get_default_dtype()))


@lower("empty.memory_format")
def empty(
    size: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> ET:
    return eng().full(0.0, list(size), _factory_dtype(dtype, torch.get_default_dtype()))


@lower("empty_strided.default")
def empty_strided(
    size: Any,
    stride: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> ET:
    return empty(size, dtype=dtype)


def _arange(start: Any, end: Any, step: Any, dtype: Any) -> ET:
    if dtype is None:
        dtype = (
            torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype()
        )
    name = dt(dtype)
    if name != "i64" and any(isinstance(v, float) for v in (start, end, step)) and name != "f32":
        raise Unsupported("low-precision float arange")
    return eng().arange(float(start), float(end), float(step), name)


@lower("arange.default")
def arange(
    end: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> ET:
    return _arange(0, end, 1, dtype)


@lower("arange.start")
def arange_start(
    start: Any, end: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> ET:
    return _arange(start, end, 1, dtype)


@lower("arange.start_step")
def arange_start_step(
    start: Any,
    end: Any,
    step: Any = 1,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> ET:
    return _arange(start, end, step, dtype)


@lower("eye.default", "eye.m")
def eye(
    n: int,
    m: int | None = None,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> ET:
    m = n if m is None else m
    rows = eng().arange(0, n, 1, "i64").reshape([n, 1])
    cols = eng().arange(0, m, 1, "i64").reshape([1, m])
    return rows.binary("eq", cols).cast(_factory_dtype(dtype, torch.get_default_dtype()))


@lower("fill.Scalar")
def fill(self: ET, value: Any) -> ET:
    return constant(float(value), list(self.shape), self.dtype)


@lower("fill.Tensor")
def fill_tensor(self: ET, value: ET) -> ET:
    if len(value.shape) != 0:
        raise Unsupported("fill with a tensor that has dimensions")
    return value.cast(self.dtype).expand(list(self.shape))


@lower("zero.default")
def zero(self: ET) -> ET:
    return eng().full(0.0, list(self.shape), self.dtype)


@lower("clone.default")
def clone(self: ET, *, memory_format: Any = None) -> ET:
    # Engine values are immutable (a write replaces a root's value), so the
    # clone may share the value.
    return self
