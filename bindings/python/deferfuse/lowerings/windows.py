"""Window, order and moment ops composed from slices, concatenations and
reductions: var_mean / std_mean, roll, flip, the reflection, replication and
constant pads, and nearest upsampling (im2col is in `matmul.py`, linear and
cubic upsampling in `pooling.py`).

The engine has slices with positive steps only, so reversing an axis is either
a concatenation of one-element slices (short axes) or a one-hot masked sum
(`lookups.index_select`, longer ones). Shapes are static, so every index is
worked out in Python.
"""

from __future__ import annotations

import math
from typing import Any

from .._engine import Tensor as ET
from ._registry import Unsupported, axis, dims, eng, is_float, lower
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
        axes = [axis(a, len(x.shape)) for a in dims(x, dim)]
    n = math.prod(x.shape[a] for a in axes)
    c = 1.0 if correction is None else float(correction)
    if n == 0:
        shape = [1 if a in axes else s for a, s in enumerate(x.shape) if keepdim or a not in axes]
        nan = eng().full(float("nan"), shape, x.dtype)
        return nan, nan
    # bfloat16 / half accumulate in float32 and round once, as PyTorch's CPU kernel does.
    wide = x.cast("f32") if x.dtype != "f32" else x
    mean = wide.reduce("mean", axes, True)
    centered = wide.binary("sub", mean)
    squares = centered.binary("mul", centered).reduce("sum", axes, keepdim)
    var = squares.binary("div", max(0.0, n - c))
    mean = mean if keepdim else mean.reshape(list(var.shape))
    return var.cast(x.dtype), mean.cast(x.dtype)


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
    for shift, along in zip(shifts, dims_):
        x = _roll_axis(x, shift, axis(along, len(self.shape)))
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
    listed = [axis(d, rank) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
    if len(set(listed)) != len(listed):
        raise Unsupported("repeated dims (PyTorch raises)")
    axes = sorted(listed)
    x = self
    for a in axes:
        x = _reverse_axis(x, a)
    return x


# ---- lookups with indices known in Python ----------------------------------------

#: At most this many slices for one static lookup; beyond, a one-hot lookup.
MAX_PIECES = 64


def _runs(index: list[int]) -> list[tuple[int, int, int]]:
    """`index` as (first source, source count, repeats): consecutive ascending
    sources become one slice, one source repeated becomes one expanded slice."""
    runs: list[tuple[int, int, int]] = []
    for i in index:
        if runs:
            first, count, reps = runs[-1]
            if reps == 1 and i == first + count:
                runs[-1] = (first, count + 1, 1)
                continue
            if count == 1 and i == first:
                runs[-1] = (first, 1, reps + 1)
                continue
        runs.append((i, 1, 1))
    return runs


def _take(x: ET, axis: int, index: list[int]) -> ET:
    """x[..., index, ...] along `axis` for indices known in Python, as slices
    (exact: signs of zeros and NaN kept) or, when there would be too many, a
    one-hot lookup."""
    n = x.shape[axis]
    if index == list(range(n)):
        return x
    runs = _runs(index)
    if len(runs) > MAX_PIECES:
        source = x.cast("i32") if x.dtype == "bool" else x
        out = index_select(source, axis, _index_tensor(index))
        return out.cast("bool") if x.dtype == "bool" else out
    pieces = []
    for first, count, reps in runs:
        piece = x.slice(axis, first, first + count, 1)
        if reps > 1:
            shape = list(piece.shape)
            shape[axis] = reps
            piece = piece.expand(shape)
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else eng().cat(pieces, axis)


def _index_tensor(index: list[int]) -> ET:
    import torch

    from .._handles import from_cpu_value

    return from_cpu_value(torch.tensor(index, dtype=torch.int64))


# ---- padding ----------------------------------------------------------------------


def _pad(self: ET, padding: Any, spatial: int, source_of: Any) -> ET:
    """Pads the last `spatial` axes; `padding` pairs (before, after) start at
    the last axis, as PyTorch's do. `source_of(k, n)` maps an output position
    k - before (which may lie outside [0, n)) to the input position it copies."""
    padding = list(padding)
    if len(padding) != 2 * spatial or len(self.shape) not in (spatial + 1, spatial + 2):
        raise Unsupported("padding arguments PyTorch rejects")
    x = self
    rank = len(self.shape)
    for i in range(spatial):
        axis = rank - 1 - i
        before, after = int(padding[2 * i]), int(padding[2 * i + 1])
        n = x.shape[axis]
        size = n + before + after
        if size <= 0 or n == 0:
            raise Unsupported("padding to an empty axis or of an empty axis")
        index = [source_of(k - before, n) for k in range(size)]
        if any(not 0 <= s < n for s in index):
            raise Unsupported("padding wider than the input")
        x = _take(x, axis, index)
    return x


def _reflect(k: int, n: int) -> int:
    if k < 0:
        return -k
    if k >= n:
        return 2 * (n - 1) - k
    return k


def _replicate(k: int, n: int) -> int:
    return min(max(k, 0), n - 1)


@lower("reflection_pad1d.default")
def reflection_pad1d(self: ET, padding: Any) -> ET:
    return _pad(self, padding, 1, _reflect)


@lower("reflection_pad2d.default")
def reflection_pad2d(self: ET, padding: Any) -> ET:
    return _pad(self, padding, 2, _reflect)


@lower("reflection_pad3d.default")
def reflection_pad3d(self: ET, padding: Any) -> ET:
    return _pad(self, padding, 3, _reflect)


@lower("replication_pad1d.default")
def replication_pad1d(self: ET, padding: Any) -> ET:
    return _pad(self, padding, 1, _replicate)


@lower("replication_pad2d.default")
def replication_pad2d(self: ET, padding: Any) -> ET:
    return _pad(self, padding, 2, _replicate)


@lower("replication_pad3d.default")
def replication_pad3d(self: ET, padding: Any) -> ET:
    return _pad(self, padding, 3, _replicate)


@lower("constant_pad_nd.default")
def constant_pad_nd(self: ET, pad: Any, value: Any = 0) -> ET:
    """Pairs (before, after) from the last axis: a negative one crops by a
    slice, a positive one adds a block of `value` by concatenation. An input
    with no elements pads to a constant."""
    pad = [int(p) for p in pad]
    rank = len(self.shape)
    if len(pad) % 2 or len(pad) // 2 > rank or isinstance(value, complex):
        raise Unsupported("padding arguments PyTorch rejects")
    shape = list(self.shape)
    for i in range(len(pad) // 2):
        shape[rank - 1 - i] += pad[2 * i] + pad[2 * i + 1]
    if any(n < 0 for n in shape):
        raise Unsupported("padding to a negative size")
    fill = float(value)
    if math.prod(self.shape) == 0 or math.prod(shape) == 0:
        return eng().full(fill, shape, self.dtype)
    x = self
    for i in range(len(pad) // 2):
        axis = rank - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        n = x.shape[axis]
        x = x.slice(axis, max(0, -before), n - max(0, -after), 1) if before < 0 or after < 0 else x
        parts = []
        for width in (before, None, after):
            if width is None:
                parts.append(x)
            elif width > 0:
                block = list(x.shape)
                block[axis] = width
                parts.append(eng().full(fill, block, self.dtype))
        x = parts[0] if len(parts) == 1 else eng().cat(parts, axis)
    return x


# ---- nearest upsampling -------------------------------------------------------------


def _nearest_sources(n_in: int, n_out: int, scale: float | None, exact: bool) -> list[int]:
    """PyTorch's CPU source index for every output position: the scale is a
    float32 (1 / scale when given and positive, else in / out), the product is
    float32 (nearest) or double rounded to float32 (nearest-exact), floored and
    clamped to the input."""
    import numpy as np

    if not exact and n_out == n_in:
        return list(range(n_out))
    if not exact and n_out == 2 * n_in:
        return [k >> 1 for k in range(n_out)]
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n_in) / np.float32(n_out)
    out = []
    for k in range(n_out):
        if exact:
            v = np.float32(np.float64(k + 0.5) * np.float64(s))
        else:
            v = np.float32(k) * s
        out.append(min(int(np.floor(v)), n_in - 1))
    return out


def _upsample(self: ET, output_size: Any, scales: list[Any], exact: bool) -> ET:
    spatial = len(scales)
    if len(self.shape) != spatial + 2 or len(output_size) != spatial or math.prod(self.shape) == 0:
        raise Unsupported("upsampling arguments PyTorch rejects, or an empty input")
    x = self
    for i in range(spatial):
        axis = 2 + i
        n_out = int(output_size[i])
        if n_out <= 0:
            raise Unsupported("an empty output")
        x = _take(x, axis, _nearest_sources(x.shape[axis], n_out, scales[i], exact))
    return x


@lower("upsample_nearest1d.default")
def upsample_nearest1d(self: ET, output_size: Any, scales: float | None = None) -> ET:
    return _upsample(self, output_size, [scales], False)


@lower("upsample_nearest2d.default")
def upsample_nearest2d(
    self: ET, output_size: Any, scales_h: float | None = None, scales_w: float | None = None
) -> ET:
    return _upsample(self, output_size, [scales_h, scales_w], False)


@lower("upsample_nearest3d.default")
def upsample_nearest3d(
    self: ET,
    output_size: Any,
    scales_d: float | None = None,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    return _upsample(self, output_size, [scales_d, scales_h, scales_w], False)


@lower("_upsample_nearest_exact1d.default")
def upsample_nearest_exact1d(self: ET, output_size: Any, scales: float | None = None) -> ET:
    return _upsample(self, output_size, [scales], True)


@lower("_upsample_nearest_exact2d.default")
def upsample_nearest_exact2d(
    self: ET, output_size: Any, scales_h: float | None = None, scales_w: float | None = None
) -> ET:
    return _upsample(self, output_size, [scales_h, scales_w], True)


@lower("_upsample_nearest_exact3d.default")
def upsample_nearest_exact3d(
    self: ET,
    output_size: Any,
    scales_d: float | None = None,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    return _upsample(self, output_size, [scales_d, scales_h, scales_w], True)


def _upsample_backward(grad_output: ET, output_size: Any, input_size: Any, scales: list[Any]) -> ET:
    """The gradient of nearest upsampling by whole factors: each input
    element's r outputs, summed (a reshape and a sum per axis). Other ratios
    go to the CPU."""
    spatial = len(scales)
    g = grad_output
    if len(g.shape) != spatial + 2 or list(g.shape[2:]) != [int(s) for s in output_size]:
        raise Unsupported("upsampling gradient arguments PyTorch rejects")
    for i in range(spatial):
        axis, n_in, n_out = 2 + i, int(input_size[2 + i]), int(output_size[i])
        if (
            n_in <= 0
            or n_out % n_in
            or _nearest_sources(n_in, n_out, scales[i], False) != [k // (n_out // n_in) for k in range(n_out)]
        ):
            raise Unsupported("nearest upsampling by a factor that is not whole")
        r = n_out // n_in
        if r > 1:
            shape = list(g.shape)
            g = g.reshape(shape[:axis] + [n_in, r] + shape[axis + 1 :]).reduce("sum", [axis + 1], False)
    return g


@lower("upsample_nearest1d_backward.default")
def upsample_nearest1d_backward(
    grad_output: ET, output_size: Any, input_size: Any, scales: float | None = None
) -> ET:
    return _upsample_backward(grad_output, output_size, input_size, [scales])


@lower("upsample_nearest2d_backward.default")
def upsample_nearest2d_backward(
    grad_output: ET,
    output_size: Any,
    input_size: Any,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    return _upsample_backward(grad_output, output_size, input_size, [scales_h, scales_w])


@lower("upsample_nearest3d_backward.default")
def upsample_nearest3d_backward(
    grad_output: ET,
    output_size: Any,
    input_size: Any,
    scales_d: float | None = None,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    return _upsample_backward(grad_output, output_size, input_size, [scales_d, scales_h, scales_w])
