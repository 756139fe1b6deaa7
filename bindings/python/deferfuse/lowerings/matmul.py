"""Matrix products, and convolution as im2col and one batched matmul (its
backward as the same columns: a matmul for the weight's gradient, and the
transposed matmul put back in place, col2im, for the input's)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, is_float, lower
from .elementwise import _alpha
from .lookups import _check_size
from .nn import _pool_param
from .pooling import const


def _mm_check(a: ET, b: ET) -> None:
    if a.dtype != b.dtype or not is_float(a):
        raise Unsupported("matmul of mixed or integer dtypes")


@lower("mm.default", "bmm.default")
def mm(self: ET, mat2: ET) -> ET:
    _mm_check(self, mat2)
    return self.matmul(mat2)


@lower("dot.default", "mv.default")
def dot(self: ET, tensor: ET) -> ET:
    _mm_check(self, tensor)
    return self.matmul(tensor)


@lower("addmm.default", "baddbmm.default")
def addmm(self: ET, mat1: ET, mat2: ET, *, beta: Any = 1, alpha: Any = 1) -> ET:
    _mm_check(mat1, mat2)
    prod = _alpha(mat1.matmul(mat2), alpha)
    if beta == 0:
        return prod
    return prod.binary("add", _alpha(self, beta))


@lower("addmv.default")
def addmv(self: ET, mat: ET, vec: ET, *, beta: Any = 1, alpha: Any = 1) -> ET:
    return addmm(self, mat, vec, beta=beta, alpha=alpha)


def _check_operands(input: ET, weight: ET) -> int:
    """The number of spatial dimensions of a convolution the lowerings take
    (batched, float, non-empty)."""
    n = len(weight.shape) - 2
    if (
        len(input.shape) != n + 2
        or not is_float(input)
        or input.dtype != weight.dtype
        or math.prod(input.shape) == 0
        or math.prod(weight.shape) == 0
    ):
        raise Unsupported("unbatched, integer or empty convolution")
    return n


def _geometry(
    input: ET, weight: ET, stride: Any, padding: Any, dilation: Any, transposed: bool
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Stride, padding, dilation and output size of a convolution the
    lowerings take (not transposed, batched, float, non-empty), refused
    when its im2col buffer would be too large. A 1x1 window without padding
    reads its columns from the input itself: no buffer, so no limit."""
    if transposed:
        raise Unsupported("a transposed convolution")
    n = _check_operands(input, weight)
    s, p, d = _pool_param(stride, n, 1), _pool_param(padding, n, 0), _pool_param(dilation, n, 1)
    k = list(weight.shape[2:])
    spatial = list(input.shape[2:])
    out = [(size + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for size, kk, ss, pp, dd in zip(spatial, k, s, p, d)]
    if any(o <= 0 for o in out):
        raise Unsupported("convolution window larger than the input")
    if math.prod(k) > 1 or any(p):
        _check_size(input.shape[0] * input.shape[1] * math.prod(k), math.prod(out))
    return s, p, d, out


def _transposed_geometry(
    input: ET, weight: ET, stride: Any, padding: Any, dilation: Any, output_padding: Any
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Stride, padding, dilation and output size of a transposed
    convolution: the convolution with the same weight maps an output of
    that size back to `input`'s, and the transposed one is its gradient."""
    n = _check_operands(input, weight)
    s, p, d = _pool_param(stride, n, 1), _pool_param(padding, n, 0), _pool_param(dilation, n, 1)
    extra = _pool_param(output_padding, n, 0)
    k = list(weight.shape[2:])
    out = [
        (size - 1) * ss - 2 * pp + dd * (kk - 1) + ee + 1
        for size, kk, ss, pp, dd, ee in zip(input.shape[2:], k, s, p, d, extra)
    ]
    if any(o <= 0 for o in out) or any(e >= max(ss, dd) for e, ss, dd in zip(extra, s, d)):
        raise Unsupported("a transposed convolution PyTorch rejects")  # for PyTorch's own error
    _check_size(input.shape[0] * weight.shape[1] * math.prod(k), math.prod(input.shape[2:]))
    return s, p, d, out


@lower("im2col.default")
def im2col(self: ET, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> ET:
    """[N, C, H, W] (or [C, H, W]) -> [N, C * kh * kw, L], rows channel-major
    and columns row-major over the output positions, as PyTorch lays them out."""
    if len(self.shape) not in (3, 4):
        raise Unsupported("im2col of a tensor that is not 3-D or 4-D")
    batched = self if len(self.shape) == 4 else self.reshape([1] + list(self.shape))
    k, d, p, s = (_pool_param(v, 2, 1) for v in (kernel_size, dilation, padding, stride))
    out = [
        (size + 2 * pp - dd * (kk - 1) - 1) // ss + 1
        for size, kk, ss, pp, dd in zip(batched.shape[2:], k, s, p, d)
    ]
    if min(k + d + s) <= 0 or min(p) < 0 or min(out) <= 0:
        raise Unsupported("im2col arguments PyTorch rejects")  # for PyTorch's own error
    n, c = batched.shape[0], batched.shape[1]
    if n * c == 0:  # no values: a constant of the right shape
        cols = eng().full(0.0, [n, c * math.prod(k), math.prod(out)], self.dtype)
    else:
        cols = _column_matrix(batched, k, s, p, d, out, 1)  # [1, C * taps, N * positions]
        cols = cols.reshape([c * math.prod(k), n, math.prod(out)]).permute([1, 0, 2])
    return cols if len(self.shape) == 4 else cols.reshape(list(cols.shape[1:]))


# Window indices by engine and geometry, least recently used first: a
# model's convolutions reuse a few dozen, and building one costs more than
# the gather it drives. They live on the device, so their bytes are capped.
_INDICES: dict[tuple, ET] = {}
_INDEX_BYTES = 256 << 20


def _window_index(
    batch: int,
    channels: int,
    spatial: list[int],
    k: list[int],
    s: list[int],
    p: list[int],
    d: list[int],
    out: list[int],
) -> ET:
    """The im2col geometry as one index: for each column entry, in the order
    [channel, tap, sample, output position], the flat position of the input
    element it reads, or the input's size where it reads padding. Built once
    per geometry on the CPU and kept on the engine (see `_INDICES`)."""
    geometry = (batch, channels, *map(tuple, (spatial, k, s, p, d, out)))
    key = (id(eng()), geometry)
    index = _INDICES.pop(key, None)
    if index is None:
        index = const(_window_positions(geometry))
        while _INDICES and 8 * sum(math.prod(i.shape) for i in _INDICES.values()) > _INDEX_BYTES:
            _INDICES.pop(next(iter(_INDICES)))
    _INDICES[key] = index
    return index


def _window_positions(geometry: tuple) -> torch.Tensor:
    batch, channels, spatial, k, s, p, d, out = geometry
    rank, size = len(spatial), math.prod(spatial)
    position = torch.zeros([1] * 2 * rank, dtype=torch.int64)  # over [*taps, *outputs]
    inside = torch.ones([1] * 2 * rank, dtype=torch.bool)
    step = 1
    for a in reversed(range(rank)):
        coord = (torch.arange(k[a]) * d[a]).view(-1, 1) + (torch.arange(out[a]) * s[a] - p[a]).view(1, -1)
        shape = [1] * 2 * rank
        shape[a], shape[rank + a] = k[a], out[a]
        coord = coord.view(shape)
        inside = inside & (coord >= 0) & (coord < spatial[a])
        position = position + coord * step
        step *= spatial[a]
    taps, outputs = math.prod(k), math.prod(out)
    position = position.expand(k + out).reshape(1, taps, 1, outputs)
    inside = inside.expand(k + out).reshape(1, taps, 1, outputs)
    plane = (torch.arange(channels) * size).view(channels, 1, 1, 1)
    sample = (torch.arange(batch) * channels * size).view(1, 1, batch, 1)
    index = torch.where(inside, plane + position + sample, batch * channels * size)
    return index.reshape(-1)


def _direct(k: list[int], p: list[int]) -> bool:
    """Whether the columns are the input itself, strided: a 1x1 window
    without padding."""
    return math.prod(k) == 1 and not any(p)


def _by_group(x: ET, groups: int) -> ET:
    """[N, C, *spatial] -> [groups, C / groups, N * prod(spatial)]: the
    batch folded into the columns, so each group is one matrix product."""
    batch, channels, positions = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    x = x.reshape([batch, groups, channels // groups, positions]).permute([1, 2, 0, 3])
    return x.reshape([groups, channels // groups, batch * positions])


def _column_matrix(
    input: ET, k: list[int], s: list[int], p: list[int], d: list[int], out: list[int], groups: int
) -> ET:
    """im2col with the batch folded in: [groups, C / groups * taps, N * positions],
    rows channel-major then tap, as the weight's [O, C / groups, *k] flattens.
    One gather of the input (with a zero appended for the padding) through
    the geometry's index, or the strided input itself for a 1x1 window."""
    batch, channels, spatial = input.shape[0], input.shape[1], list(input.shape[2:])
    if _direct(k, p):
        window = input
        for axis, (o, ss) in enumerate(zip(out, s)):
            window = window.slice(2 + axis, 0, (o - 1) * ss + 1, ss)
        return _by_group(window, groups)
    flat = input.reshape([math.prod(input.shape)])
    flat = eng().cat([flat, eng().full(0.0, [1], input.dtype)], 0)
    index = _window_index(batch, channels, spatial, k, s, p, d, out)
    taps, positions = math.prod(k), batch * math.prod(out)
    return flat.gather_rows(index).reshape([groups, channels // groups * taps, positions])


def _unfold_batch(y: ET, batch: int, out: list[int]) -> ET:
    """[groups, O / groups, N * positions] -> [N, O, *out]."""
    channels = y.shape[0] * y.shape[1]
    y = y.reshape([channels, batch] + out)
    return y.permute([1, 0] + list(range(2, 2 + len(out))))


def _forward(
    input: ET, weight: ET, s: list[int], p: list[int], d: list[int], out: list[int], groups: int
) -> ET:
    """im2col and one matmul with the weight per group, over every sample's
    columns at once (a matmul per sample is as narrow as one image's output)."""
    k = list(weight.shape[2:])
    cols = _column_matrix(input, k, s, p, d, out, groups)
    w = weight.reshape([groups, weight.shape[0] // groups, cols.shape[1]])
    return _unfold_batch(w.matmul(cols), input.shape[0], out)


def _input_gradient(
    grad_output: ET, weight: ET, s: list[int], p: list[int], d: list[int], spatial: list[int], groups: int
) -> ET:
    """The gradient of a convolution's input of `spatial` size (channels
    from the weight) from its output's: the transposed matmul, then col2im,
    a scatter-add of each column entry to the input position it was read
    from (padding positions are out of range and add nothing)."""
    k = list(weight.shape[2:])
    taps, out = math.prod(k), list(grad_output.shape[2:])
    batch, channels = grad_output.shape[0], weight.shape[1] * groups
    gy = _by_group(grad_output, groups)
    w = weight.reshape([groups, weight.shape[0] // groups, weight.shape[1] * taps]).permute([0, 2, 1])
    cols = w.matmul(gy)  # [groups, C / groups * taps, N * positions]
    if _direct(k, p) and all(ss == 1 for ss in s):
        return _unfold_batch(cols, batch, spatial)
    index = _window_index(batch, channels, spatial, k, s, p, d, out)
    numel = batch * channels * math.prod(spatial)
    grad = cols.reshape([math.prod(cols.shape)]).scatter_add_rows(index, numel)
    return grad.reshape([batch, channels] + spatial)


def _weight_gradient(
    grad_output: ET, input: ET, weight_shape: list[int], s: list[int], p: list[int], d: list[int], groups: int
) -> ET:
    """The gradient of a convolution's weight: one matmul per group over
    every (sample, position) pair (a matmul per sample then a sum would
    write the weight's size once per sample)."""
    k, out = weight_shape[2:], list(grad_output.shape[2:])
    cols = _column_matrix(input, k, s, p, d, out, groups)
    rows = _by_group(grad_output, groups)  # [groups, O / groups, N * positions]
    return rows.matmul(cols.permute([0, 2, 1])).reshape(list(weight_shape))


def convolution(
    input: ET,
    weight: ET,
    bias: ET | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> ET:
    """A convolution as the kernel's strided slices of the padded input
    (im2col) and one batched matmul with the weight, per group. A
    transposed convolution is the input gradient of the convolution with
    the same weight (a matmul, then col2im). bfloat16 and float16 compute
    in float32 and round once, as the CPU's kernels accumulate."""
    low = _low_precision(input)
    if low is not None:
        input, weight, bias = (None if t is None else t.cast("f32") for t in (input, weight, bias))
    if transposed:
        s, p, d, out = _transposed_geometry(input, weight, stride, padding, dilation, output_padding)
        y = _input_gradient(input, weight, s, p, d, out, groups)
        channels = weight.shape[1] * groups
    else:
        s, p, d, out = _geometry(input, weight, stride, padding, dilation, transposed)
        y = _forward(input, weight, s, p, d, out, groups)
        channels = weight.shape[0]
    if bias is not None:
        y = y.binary("add", bias.reshape([1, channels] + [1] * len(out)))
    return y if low is None else y.cast(low)


def convolution_backward(
    grad_output: ET,
    input: ET,
    weight: ET,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Any,
) -> tuple[ET | None, ET | None, ET | None]:
    """The gradients of `convolution` for input, weight and bias (each only
    where `output_mask` asks), from the forward's im2col columns. For a
    transposed convolution the roles swap: its input's gradient is the
    convolution of the output's gradient, and its weight's gradient is the
    convolution's weight gradient with input and output gradient swapped."""
    if transposed:
        s, p, d, out = _transposed_geometry(input, weight, stride, padding, dilation, output_padding)
    else:
        s, p, d, out = _geometry(input, weight, stride, padding, dilation, transposed)
    if grad_output.dtype != input.dtype or list(grad_output.shape[2:]) != out:
        raise Unsupported("a gradient of another dtype or shape")
    low = _low_precision(input)
    if low is not None:
        grad_output, input, weight = (t.cast("f32") for t in (grad_output, input, weight))
    grad_input = grad_weight = grad_bias = None
    if transposed:
        if output_mask[0]:
            grad_input = _forward(grad_output, weight, s, p, d, list(input.shape[2:]), groups)
        if output_mask[1]:
            grad_weight = _weight_gradient(input, grad_output, list(weight.shape), s, p, d, groups)
    else:
        if output_mask[0]:
            grad_input = _input_gradient(grad_output, weight, s, p, d, list(input.shape[2:]), groups)
        if output_mask[1]:
            grad_weight = _weight_gradient(grad_output, input, list(weight.shape), s, p, d, groups)
    if output_mask[2]:
        grad_bias = grad_output.reduce("sum", [0] + list(range(2, len(out) + 2)), False)
    if low is not None:
        grad_input, grad_weight, grad_bias = (
            None if t is None else t.cast(low) for t in (grad_input, grad_weight, grad_bias)
        )
    return grad_input, grad_weight, grad_bias


def _low_precision(x: ET) -> str | None:
    """`x`'s dtype if a convolution of it computes in float32 (bf16, f16)."""
    return x.dtype if x.dtype in ("bf16", "f16") else None
