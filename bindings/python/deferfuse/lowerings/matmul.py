"""Matrix products, and convolution as im2col and one batched matmul (its
backward as the same columns: a matmul for the weight's gradient, and the
transposed matmul put back in place, col2im, for the input's)."""

from __future__ import annotations

import math
from typing import Any

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, is_float, lower
from .elementwise import _alpha
from .lookups import _check_size
from .nn import _offsets, _pool_param, add_windows_back


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


def _geometry(
    input: ET, weight: ET, stride: Any, padding: Any, dilation: Any, transposed: bool
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Stride, padding, dilation and output size of a convolution the
    lowerings take (not transposed, batched, float, non-empty)."""
    n = len(weight.shape) - 2
    if (
        transposed
        or len(input.shape) != n + 2
        or not is_float(input)
        or input.dtype != weight.dtype
        or math.prod(input.shape) == 0
        or math.prod(weight.shape) == 0
    ):
        raise Unsupported("transposed, unbatched, integer or empty convolution")
    s, p, d = _pool_param(stride, n, 1), _pool_param(padding, n, 0), _pool_param(dilation, n, 1)
    k = list(weight.shape[2:])
    spatial = list(input.shape[2:])
    out = [(size + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for size, kk, ss, pp, dd in zip(spatial, k, s, p, d)]
    if any(o <= 0 for o in out):
        raise Unsupported("convolution window larger than the input")
    _check_size(input.shape[0] * input.shape[1] * math.prod(k), math.prod(out))
    return s, p, d, out


def _columns(input: ET, k: list[int], s: list[int], p: list[int], d: list[int], out: list[int]) -> ET:
    """im2col: the input under each kernel offset, [N, C, prod(k), *out]."""
    batch, channels = input.shape[0], input.shape[1]
    x = input
    for axis, pp in enumerate(p):
        if pp:
            shape = list(x.shape)
            shape[2 + axis] = pp
            zeros = eng().full(0.0, shape, x.dtype)
            x = eng().cat([zeros, x, zeros], 2 + axis)
    columns = []
    for offset in _offsets(k):
        window = x
        for axis, (o, ss, dd, off) in enumerate(zip(out, s, d, offset)):
            window = window.slice(2 + axis, off * dd, off * dd + (o - 1) * ss + 1, ss)
        columns.append(window.reshape([batch, channels, 1] + out))
    return eng().cat(columns, 2) if len(columns) > 1 else columns[0]


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
        cols = _columns(batched, k, s, p, d, out).reshape([n, c * math.prod(k), math.prod(out)])
    return cols if len(self.shape) == 4 else cols.reshape(list(cols.shape[1:]))


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
    (im2col) and one batched matmul with the weight, per group."""
    s, p, d, out = _geometry(input, weight, stride, padding, dilation, transposed)
    k = list(weight.shape[2:])
    n = len(k)
    batch, channels = input.shape[0], input.shape[1]
    cols = _columns(input, k, s, p, d, out)  # [N, C, K, *out]
    per_group = channels // groups
    cols = cols.reshape([batch, groups, per_group * math.prod(k), math.prod(out)])
    w = weight.reshape([1, groups, weight.shape[0] // groups, per_group * math.prod(k)])
    y = w.matmul(cols).reshape([batch, weight.shape[0]] + out)
    if bias is not None:
        y = y.binary("add", bias.reshape([1, weight.shape[0]] + [1] * n))
    return y


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
    where `output_mask` asks), from the forward's im2col columns."""
    s, p, d, out = _geometry(input, weight, stride, padding, dilation, transposed)
    if grad_output.dtype != input.dtype or list(grad_output.shape[2:]) != out:
        raise Unsupported("a gradient of another dtype or shape")
    k = list(weight.shape[2:])
    n, taps = len(k), math.prod(k)
    batch, channels, spatial = input.shape[0], input.shape[1], list(input.shape[2:])
    per_group, out_per_group = channels // groups, weight.shape[0] // groups
    gy = grad_output.reshape([batch, groups, out_per_group, math.prod(out)])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        w = weight.reshape([1, groups, out_per_group, per_group * taps]).permute([0, 1, 3, 2])
        cols = w.matmul(gy).reshape([batch, channels, taps] + out)
        pieces = (
            (o, cols.slice(2, i, i + 1, 1).reshape([batch, channels] + out))
            for i, o in enumerate(_offsets(k))
        )
        padded = [size + 2 * pp for size, pp in zip(spatial, p)]
        grad_input = add_windows_back(pieces, 2, s, d, p, spatial, padded)
    if output_mask[1]:
        # One matmul per group over every (sample, position) pair: a matmul
        # per sample then a sum would write the weight's size once per sample.
        positions = batch * math.prod(out)
        cols = _columns(input, k, s, p, d, out).reshape([batch, groups, per_group * taps, math.prod(out)])
        cols = cols.permute([1, 0, 3, 2]).reshape([groups, positions, per_group * taps])
        rows = gy.permute([1, 2, 0, 3]).reshape([groups, out_per_group, positions])
        grad_weight = rows.matmul(cols).reshape(list(weight.shape))
    if output_mask[2]:
        grad_bias = grad_output.reduce("sum", [0] + list(range(2, n + 2)), False)
    return grad_input, grad_weight, grad_bias
