"""Softmax, layer and group norm, max pooling and the NLL loss, forward and backward."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._engine import Tensor as ET
from ._registry import Unsupported, check_bounds, dt, eng, is_float, lower
from .lookups import _check_size, _one_hot


@lower("_softmax.default")
def softmax(self: ET, dim: int, half_to_float: bool) -> ET:
    x = self.cast("f32") if half_to_float else self
    return x.softmax(dim) if len(x.shape) else x.binary("mul", 0).binary("add", 1.0)


@lower("_log_softmax.default")
def log_softmax(self: ET, dim: int, half_to_float: bool) -> ET:
    x = self.cast("f32") if half_to_float else self
    return x.log_softmax(dim) if len(x.shape) else x.binary("mul", 0)


@lower("_safe_softmax.default")
def safe_softmax(self: ET, dim: int, dtype: torch.dtype | None = None) -> ET:
    """Softmax whose rows of only -inf give zeros instead of NaN (the math
    path of scaled_dot_product_attention); its gradient is softmax's."""
    if not is_float(self) or not len(self.shape):
        raise Unsupported("safe softmax of a non-float or zero-dimensional tensor")
    x = self.cast(dt(dtype)) if dtype is not None else self
    axis = dim % len(x.shape)
    finite = x.binary("eq", float("-inf")).unary("logical_not").cast("i64").reduce("sum", [axis], True)
    return finite.binary("eq", 0).where_(0.0, x.softmax(dim))


@lower("_softmax_backward_data.default")
def softmax_backward(grad_output: ET, output: ET, dim: int, input_dtype: torch.dtype) -> ET:
    g = grad_output.binary("mul", output)
    out = g.binary("sub", output.binary("mul", g.reduce("sum", [dim], True)) if len(output.shape) else g)
    return out.cast(dt(input_dtype))


@lower("_log_softmax_backward_data.default")
def log_softmax_backward(grad_output: ET, output: ET, dim: int, input_dtype: torch.dtype) -> ET:
    total = grad_output.reduce("sum", [dim], True) if len(output.shape) else grad_output
    return grad_output.binary("sub", output.unary("exp").binary("mul", total)).cast(dt(input_dtype))


def _norm_axes(x: ET, normalized_shape: Any) -> list[int]:
    n = len(normalized_shape)
    if n == 0 or n > len(x.shape) or list(x.shape[len(x.shape) - n :]) != list(normalized_shape):
        raise Unsupported("normalized_shape does not match")
    return list(range(len(x.shape) - n, len(x.shape)))


def _standardize(x: ET, axes: list[int], eps: float) -> tuple[ET, ET, ET]:
    """`(x - mean) * rstd` over `axes` of an f32 `x`, with the mean and the
    reciprocal standard deviation (kept dimensions): layer and group norm."""
    mean = x.reduce("mean", axes, True)
    centered = x.binary("sub", mean)
    rstd = centered.binary("mul", centered).reduce("mean", axes, True).binary("add", eps).unary("rsqrt")
    return centered.binary("mul", rstd), mean, rstd


def _standardize_backward(gw: ET, xhat: ET, rstd: ET, axes: list[int]) -> ET:
    """The gradient through `_standardize` of `gw` (the output's gradient
    times the weight), in f32."""
    a = gw.reduce("mean", axes, True)
    b = gw.binary("mul", xhat).reduce("mean", axes, True)
    return gw.binary("sub", a).binary("sub", xhat.binary("mul", b)).binary("mul", rstd)


@lower("native_layer_norm.default")
def native_layer_norm(
    input: ET, normalized_shape: Any, weight: ET | None, bias: ET | None, eps: float
) -> tuple[ET, ET, ET]:
    if not is_float(input) or math.prod(input.shape) == 0:
        raise Unsupported("layer_norm of a non-float or empty tensor")
    axes = _norm_axes(input, normalized_shape)
    y, mean, rstd = _standardize(input.cast("f32"), axes, eps)
    if weight is not None:
        y = y.binary("mul", weight.cast("f32"))
    if bias is not None:
        y = y.binary("add", bias.cast("f32"))
    return y.cast(input.dtype), mean.cast(input.dtype), rstd.cast(input.dtype)


@lower("native_layer_norm_backward.default")
def native_layer_norm_backward(
    grad_out: ET,
    input: ET,
    normalized_shape: Any,
    mean: ET,
    rstd: ET,
    weight: ET | None,
    bias: ET | None,
    output_mask: Any,
) -> tuple[Any, Any, Any]:
    axes = _norm_axes(input, normalized_shape)
    batch = list(range(len(input.shape) - len(axes)))
    x, g = input.cast("f32"), grad_out.cast("f32")
    xhat = x.binary("sub", mean.cast("f32")).binary("mul", rstd.cast("f32"))
    gw = g.binary("mul", weight.cast("f32")) if weight is not None else g
    dx = None
    if output_mask[0]:
        dx = _standardize_backward(gw, xhat, rstd.cast("f32"), axes).cast(input.dtype)
    dw = (
        g.binary("mul", xhat).reduce("sum", batch, False).cast(weight.dtype)
        if output_mask[1] and weight is not None
        else None
    )
    db = g.reduce("sum", batch, False).cast(bias.dtype) if output_mask[2] and bias is not None else None
    return dx, dw, db


# Group norm in the layout `[n, group, c / group, hw]`: its statistics reduce
# the two trailing dimensions and its per-channel weight and bias broadcast as
# `[1, group, c / group, 1]`, so one loop reads the input and writes the
# output, with no reshape between. Without these lowerings PyTorch runs its
# composite forward (a batch norm over a reshaped input, itself decomposed)
# and its Python backward decomposition, whose recording bounded a UNet
# training step.


def _grouped(x: ET, n: int, c: int, hw: int, group: int) -> ET:
    if group <= 0 or c % group or math.prod(x.shape) != n * c * hw:
        raise Unsupported("group_norm's sizes do not match its input")
    return x.cast("f32").reshape([n, group, c // group, hw])


def _per_channel(v: ET, c: int, group: int) -> ET:
    return v.cast("f32").reshape([1, group, c // group, 1])


@lower("native_group_norm.default")
def native_group_norm(
    input: ET, weight: ET | None, bias: ET | None, n: int, c: int, hw: int, group: int, eps: float
) -> tuple[ET, ET, ET]:
    if not is_float(input):
        raise Unsupported("group_norm of a non-float tensor")
    if n == 0:  # an empty batch has empty statistics, as on the CPU
        empty = eng().full(0.0, [0, group], input.dtype)
        return input.binary("mul", 1.0), empty, empty
    y, mean, rstd = _standardize(_grouped(input, n, c, hw, group), [2, 3], eps)
    if weight is not None:
        y = y.binary("mul", _per_channel(weight, c, group))
    if bias is not None:
        y = y.binary("add", _per_channel(bias, c, group))
    stats = [n, group]
    return (
        y.reshape(list(input.shape)).cast(input.dtype),
        mean.reshape(stats).cast(input.dtype),
        rstd.reshape(stats).cast(input.dtype),
    )


@lower("native_group_norm_backward.default")
def native_group_norm_backward(
    grad_out: ET,
    input: ET,
    mean: ET,
    rstd: ET,
    weight: ET | None,
    n: int,
    c: int,
    hw: int,
    group: int,
    output_mask: Any,
) -> tuple[Any, Any, Any]:
    if n * c * hw == 0:
        raise Unsupported("group_norm backward of an empty tensor")
    x, g = _grouped(input, n, c, hw, group), _grouped(grad_out, n, c, hw, group)
    m, r = (v.cast("f32").reshape([n, group, 1, 1]) for v in (mean, rstd))
    xhat = x.binary("sub", m).binary("mul", r)
    dx = dw = db = None
    if output_mask[0]:
        gw = g if weight is None else g.binary("mul", _per_channel(weight, c, group))
        dx = _standardize_backward(gw, xhat, r, [2, 3]).reshape(list(input.shape)).cast(input.dtype)
    param_dtype = input.dtype if weight is None else weight.dtype
    if output_mask[1] and weight is not None:
        dw = g.binary("mul", xhat).reduce("sum", [0, 3], False).reshape([c]).cast(param_dtype)
    if output_mask[2]:
        db = g.reduce("sum", [0, 3], False).reshape([c]).cast(param_dtype)
    return dx, dw, db


def _pool_param(value: Any, n: int, default: Any) -> list[int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return values * n if len(values) == 1 else values


def _max_pool(
    self: ET, n: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool
) -> tuple[ET, ET]:
    """Max pooling as the maximum over the k^n strided slices of a padded
    input, with PyTorch's index (first maximum wins, NaN wins) into each
    input plane."""
    if not is_float(self) or len(self.shape) not in (n + 1, n + 2) or math.prod(self.shape) == 0:
        raise Unsupported("max pooling of a non-float or empty tensor")
    k = _pool_param(kernel_size, n, None)
    s = _pool_param(stride, n, k)
    p = _pool_param(padding, n, 0)
    d = _pool_param(dilation, n, 1)
    spatial = list(self.shape[-n:])
    out_sizes = []
    for size, kk, ss, pp, dd in zip(spatial, k, s, p, d):
        span = size + 2 * pp - dd * (kk - 1) - 1
        o = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (o - 1) * ss >= size + pp:
            o -= 1
        if o <= 0 or pp > kk // 2:
            raise Unsupported("pooling window larger than the input")
        out_sizes.append(o)
    # Pad with zeros beside a validity mask rather than with -inf, so no op
    # produces an infinity of its own (Debug mode checks every op).
    x, valid = self, eng().full(1.0, list(self.shape), "bool")
    rank = len(self.shape)
    for axis, (size, kk, ss, pp, dd, o) in enumerate(zip(spatial, k, s, p, d, out_sizes)):
        dim = rank - n + axis
        need = (o - 1) * ss + dd * (kk - 1) + 1
        right = need - size - pp
        if right < 0:
            x, valid = x.slice(dim, 0, size + right, 1), valid.slice(dim, 0, size + right, 1)
        for width, before in ((pp, True), (max(right, 0), False)):
            if not width:
                continue
            shape = list(x.shape)
            shape[dim] = width
            pad_x, pad_v = eng().full(0.0, shape, x.dtype), eng().full(0.0, shape, "bool")
            x = eng().cat([pad_x, x] if before else [x, pad_x], dim)
            valid = eng().cat([pad_v, valid] if before else [valid, pad_v], dim)
    # Flat index of each window element in its input plane, per kernel offset.
    plane = 1
    strides_in_plane = []
    for size in reversed(spatial):
        strides_in_plane.append(plane)
        plane *= size
    strides_in_plane.reverse()
    best = best_index = best_valid = None
    for offset in _offsets(k):
        window, window_valid = x, valid
        index = None
        for axis, (o, ss, pp, dd, off) in enumerate(zip(out_sizes, s, p, d, offset)):
            dim = rank - n + axis
            start = off * dd
            window = window.slice(dim, start, start + (o - 1) * ss + 1, ss)
            window_valid = window_valid.slice(dim, start, start + (o - 1) * ss + 1, ss)
            shape = [1] * n
            shape[axis] = o
            coord = eng().arange(0, o, 1, "i64").binary("mul", ss).binary("add", off * dd - pp).reshape(shape)
            term = coord.binary("mul", strides_in_plane[axis])
            index = term if index is None else index.binary("add", term)
        if best is None:
            best, best_index, best_valid = window, index.expand(list(window.shape)), window_valid
            continue
        # PyTorch keeps the first maximum, and a NaN wins.
        better = window.binary("gt", best).binary("logical_or", window.binary("ne", window))
        take = window_valid.binary(
            "logical_and", better.binary("logical_or", best_valid.unary("logical_not"))
        )
        best = take.where_(window, best)
        best_index = take.where_(index, best_index)
        best_valid = best_valid.binary("logical_or", window_valid)
    return best, best_index


def _offsets(k: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for kk in k:
        out = [o + (i,) for o in out for i in range(kk)]
    return out


def _scatter_to_planes(
    values: ET, indices: ET, planes: list[int], plane_shape: list[int], accumulate: bool
) -> ET:
    """out[plane, p] = the values[plane, o] whose indices[plane, o] == p,
    summed (max pooling's gradient) or assigned (max_unpool: repeated indices
    come from overlapping windows and carry the same value), as a masked sum."""
    o = math.prod(values.shape[len(planes) :])
    size = math.prod(plane_shape)
    _check_size(math.prod(planes) * o, size)
    v = values.reshape(planes + [o, 1])
    mask = _one_hot(indices.reshape(planes + [o]).cast("i64"), size)  # [*planes, o, size]
    axis = len(planes)
    out = mask.where_(v, eng().full(0.0, [], values.dtype)).reduce("sum", [axis], False)
    if not accumulate:
        # Repeated indices carry the same value: their mean is that value.
        count = mask.cast(values.dtype).reduce("sum", [axis], False)
        out = out.binary("div", count.binary("maximum", 1.0))
    return out.reshape(planes + plane_shape)


def _max_pool_backward(
    grad_output: ET, self: ET, indices: ET, n: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any
) -> ET:
    """Each output's gradient added at the input position its index names:
    one scatter-add into the flattened input, the indices (positions in
    their plane) offset by their plane's start. An index outside its plane
    adds nothing."""
    if not is_float(self) or math.prod(self.shape) == 0:
        raise Unsupported("max pooling gradient of an integer or empty tensor")
    planes, spatial = list(self.shape[:-n]), list(self.shape[-n:])
    count, size = math.prod(planes), math.prod(spatial)
    outputs = math.prod(grad_output.shape[-n:])
    index = indices.cast("i64").reshape([count, outputs])
    inside = index.binary("ge", 0).binary("logical_and", index.binary("lt", size))
    start = eng().arange(0, count * size, size, "i64").reshape([count, 1])
    index = inside.where_(index.binary("add", start), count * size).reshape([count * outputs])
    grad = grad_output.reshape([count * outputs]).scatter_add_rows(index, count * size)
    return grad.reshape(planes + spatial)


@lower("max_pool2d_with_indices_backward.default")
def max_pool2d_backward(
    grad_output: ET,
    self: ET,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    indices: ET,
) -> ET:
    return _max_pool_backward(grad_output, self, indices, 2, kernel_size, stride, padding, dilation)


@lower("max_pool3d_with_indices_backward.default")
def max_pool3d_backward(
    grad_output: ET,
    self: ET,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    indices: ET,
) -> ET:
    return _max_pool_backward(grad_output, self, indices, 3, kernel_size, stride, padding, dilation)


def _max_unpool(self: ET, indices: ET, output_size: Any, n: int) -> ET:
    if not is_float(self) or math.prod(self.shape) == 0 or len(self.shape) not in (n + 1, n + 2):
        raise Unsupported("max_unpool of an integer or empty tensor")
    return _scatter_to_planes(self, indices, list(self.shape[:-n]), list(output_size), accumulate=False)


@lower("max_unpool2d.default")
def max_unpool2d(self: ET, indices: ET, output_size: Any) -> ET:
    return _max_unpool(self, indices, output_size, 2)


@lower("max_unpool3d.default")
def max_unpool3d(self: ET, indices: ET, output_size: Any, stride: Any, padding: Any) -> ET:
    return _max_unpool(self, indices, output_size, 3)


@lower("max_pool2d_with_indices.default")
def max_pool2d_with_indices(
    self: ET, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False
) -> tuple[ET, ET]:
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower("max_pool3d_with_indices.default")
def max_pool3d_with_indices(
    self: ET, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False
) -> tuple[ET, ET]:
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _nll_parts(self: ET, target: ET, weight: ET | None, ignore_index: int) -> tuple[ET, ET, ET]:
    """The one-hot mask of the targets (ignored ones all false) and each
    sample's weight."""
    if len(self.shape) != 2 or len(target.shape) != 1 or not is_float(self):
        raise Unsupported("nll_loss beyond [N, C] inputs")
    n, c = self.shape
    _check_size(n, c)
    t = target.cast("i64")
    mask = _one_hot(t, c).binary("logical_and", t.binary("ne", ignore_index).reshape([n, 1]))
    w = weight.reshape([1, c]) if weight is not None else eng().full(1.0, [1, c], self.dtype)
    zero = eng().full(0.0, [], self.dtype)
    sample_weight = mask.where_(w.expand([n, c]), zero).reduce("sum", [1], False)
    return mask, sample_weight, zero


@lower("nll_loss_forward.default")
def nll_loss_forward(
    self: ET, target: ET, weight: ET | None, reduction: int, ignore_index: int
) -> tuple[ET, ET]:
    if len(self.shape) == 1 and len(target.shape) == 0:
        # One sample of C scores: the [1, C] loss, its row dropped for 'none'.
        out, total = nll_loss_forward(
            self.reshape([1, self.shape[0]]), target.reshape([1]), weight, reduction, ignore_index
        )
        return (out.reshape([]) if reduction == 0 else out), total
    if self.dtype in ("bf16", "f16"):
        # PyTorch accumulates half-precision losses in float.
        w = weight.cast("f32") if weight is not None else None
        out, total = nll_loss_forward(self.cast("f32"), target, w, reduction, ignore_index)
        return out.cast(self.dtype), total.cast(self.dtype)
    mask, sample_weight, zero = _nll_parts(self, target, weight, ignore_index)
    picked = mask.where_(self, zero).reduce("sum", [1], False)
    losses = picked.binary("mul", sample_weight).unary("neg")
    total = sample_weight.reduce("sum", [0], False)
    # Targets equal to ignore_index are never read, so never out of range.
    t = target.cast("i64")
    kept = t.binary("eq", ignore_index).where_(0, t)
    check_bounds("aten::nll_loss", "target", [kept], [self.shape[1]], [0])
    if reduction == 0:
        return losses, total.binary("mul", 0)
    summed = losses.reduce("sum", [0], False)
    return (summed.binary("div", total) if reduction == 1 else summed), total


@lower("nll_loss_backward.default")
def nll_loss_backward(
    grad_output: ET,
    self: ET,
    target: ET,
    weight: ET | None,
    reduction: int,
    ignore_index: int,
    total_weight: ET,
) -> ET:
    mask, sample_weight, zero = _nll_parts(self, target, weight, ignore_index)
    n, c = self.shape
    g = grad_output.reshape([n, 1]) if reduction == 0 else grad_output.reshape([1, 1])
    if reduction == 1:
        g = g.binary("div", total_weight)
    scaled = sample_weight.reshape([n, 1]).binary("mul", g).unary("neg")
    return mask.where_(scaled.expand([n, c]), zero)


def _nll_flat(self: ET, target: ET) -> tuple[ET, ET, list[int]]:
    """[N, C, d...] scores and [N, d...] targets as [N*d..., C] and [N*d...]."""
    if len(self.shape) < 3:
        raise Unsupported("nll_loss2d needs spatial dimensions")
    c = self.shape[1]
    perm = [0] + list(range(2, len(self.shape))) + [1]
    rows = math.prod(target.shape)
    return self.permute(perm).reshape([rows, c]), target.reshape([rows]), list(target.shape)


@lower("nll_loss2d_forward.default")
def nll_loss2d_forward(
    self: ET, target: ET, weight: ET | None, reduction: int, ignore_index: int
) -> tuple[ET, ET]:
    scores, flat_target, shape = _nll_flat(self, target)
    out, total = nll_loss_forward(scores, flat_target, weight, reduction, ignore_index)
    return (out.reshape(shape) if reduction == 0 else out), total


@lower("nll_loss2d_backward.default")
def nll_loss2d_backward(
    grad_output: ET,
    self: ET,
    target: ET,
    weight: ET | None,
    reduction: int,
    ignore_index: int,
    total_weight: ET,
) -> ET:
    scores, flat_target, shape = _nll_flat(self, target)
    g = grad_output.reshape([math.prod(shape)]) if reduction == 0 else grad_output
    grad = nll_loss_backward(
        g, scores, flat_target, weight, reduction, ignore_index, total_weight
    )  # [rows, C]
    spatial = list(self.shape[2:])
    c = self.shape[1]
    back = [0, len(spatial) + 1] + list(range(1, len(spatial) + 1))
    return grad.reshape([self.shape[0]] + spatial + [c]).permute(back)


@lower("binary_cross_entropy.default")
def binary_cross_entropy(self: ET, target: ET, weight: ET | None = None, reduction: int = 1) -> ET:
    """PyTorch's formula, each log clamped at -100: (t - 1) max(log1p(-x), -100)
    - t max(log x, -100). Inputs outside [0, 1] give NaN here where PyTorch's
    CPU kernel raises (checking would read the input back)."""
    from .search import log1p

    if not is_float(self) or not is_float(target):
        raise Unsupported("binary_cross_entropy of integers")
    if self.dtype in ("bf16", "f16"):
        w = weight.cast("f32") if weight is not None else None
        return binary_cross_entropy(self.cast("f32"), target.cast("f32"), w, reduction).cast(self.dtype)
    low = log1p(self.unary("neg")).binary("maximum", -100.0)
    high = self.unary("log").binary("maximum", -100.0)
    loss = target.binary("sub", 1.0).binary("mul", low).binary("sub", target.binary("mul", high))
    if weight is not None:
        loss = loss.binary("mul", weight)
    return _reduce_loss(loss, reduction)


def _reduce_loss(loss: ET, reduction: int) -> ET:
    if reduction == 0:
        return loss
    axes = list(range(len(loss.shape)))
    if reduction == 1 and math.prod(loss.shape) == 0:
        return eng().full(float("nan"), [], loss.dtype)
    return loss.reduce("mean" if reduction == 1 else "sum", axes, False) if axes else loss


@lower("_weight_norm_interface_backward.default")
def weight_norm_backward(grad_w: ET, saved_v: ET, saved_g: ET, saved_norms: ET, dim: int) -> tuple[ET, ET]:
    """The gradients of w = g * v / ||v|| (norms over every axis but `dim`):
    grad_g = sum(grad_w * v) / ||v||, grad_v = (g / ||v||) (grad_w - v sum(grad_w * v) / ||v||^2)."""
    if not is_float(saved_v) or len(saved_v.shape) == 0:
        raise Unsupported("weight norm of a non-float or zero-dimensional weight")
    rank = len(saved_v.shape)
    dim = dim % rank if -rank <= dim < rank else dim
    axes = [a for a in range(rank) if a != dim]
    x, g, v, norms = (t.cast("f32") for t in (grad_w, saved_g, saved_v, saved_norms))
    dot = x.binary("mul", v).reduce("sum", axes, True) if axes else x.binary("mul", v)
    grad_g = dot.binary("div", norms)
    grad_v = g.binary("div", norms).binary(
        "mul", x.binary("sub", v.binary("mul", dot.binary("div", norms.binary("mul", norms))))
    )
    return grad_v.cast(saved_v.dtype), grad_g.cast(saved_g.dtype)
