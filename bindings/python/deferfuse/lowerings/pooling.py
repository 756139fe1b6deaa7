"""Average and adaptive pooling as masked sums over constant window masks.

Shapes are static, so each output's window along each spatial axis is known
in Python: a bool matrix [out, in] per axis, uploaded once as a constant.
Averages are separable (sum along one axis at a time, then divide by the
divisor PyTorch uses for that cell); adaptive max pooling masks the whole
plane at once, since its index needs both coordinates. Half-precision inputs
are pooled in f32 and rounded once, as PyTorch's CPU kernels accumulate in
float.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, is_float, lower
from .lookups import ONE_HOT_LIMIT, _move_back, _move_last
from .nn import _offsets, _pool_param


def const(t: torch.Tensor) -> ET:
    """A CPU tensor computed in Python from static shapes, as an engine constant."""
    from .._handles import from_cpu_value

    return from_cpu_value(t)


def _axis_mask(windows: list[tuple[int, int]], size: int) -> torch.Tensor:
    """[out, in] bool: row i is true on [start_i, end_i)."""
    mask = torch.zeros(len(windows), size, dtype=torch.bool)
    for i, (start, end) in enumerate(windows):
        mask[i, start:end] = True
    return mask


def _sum_windows(x: ET, axis: int, mask: torch.Tensor) -> ET:
    """Sums `x` over each window of one axis: [..., in, ...] -> [..., out, ...]."""
    out, size = mask.shape
    moved = _move_last(x, axis)
    if math.prod(moved.shape) * out > ONE_HOT_LIMIT:
        raise Unsupported("pooling too large for masked sums")
    rows = moved.reshape(list(moved.shape[:-1]) + [1, size])
    summed = const(mask).where_(rows, eng().full(0.0, [], x.dtype)).reduce("sum", [-1], False)
    return _move_back(summed, axis)


def _check_input(x: ET, n: int) -> None:
    if not is_float(x) or len(x.shape) not in (n + 1, n + 2) or 0 in x.shape[-n:]:
        raise Unsupported("pooling of an integer tensor or empty planes")


def _widen(x: ET) -> ET:
    return x.cast("f32") if x.dtype in ("bf16", "f16") else x


def _adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: [floor(i*in/out), ceil((i+1)*in/out))."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive_avg(x: ET, output_size: Any, n: int) -> ET:
    _check_input(x, n)
    outs = _pool_param(output_size, n, None)
    if any(o is None or o <= 0 for o in outs):
        raise Unsupported("adaptive pooling to an empty size")
    rank = len(x.shape)
    y = _widen(x)
    divisor = torch.ones([1] * 0)
    for k, (size, o) in enumerate(zip(x.shape[-n:], outs)):
        windows = _adaptive_windows(size, o)
        y = _sum_windows(y, rank - n + k, _axis_mask(windows, size))
        lengths = torch.tensor([float(e - s) for s, e in windows])
        divisor = lengths if k == 0 else divisor.reshape(list(divisor.shape) + [1]) * lengths
    return y.binary("div", const(divisor.float())).cast(x.dtype)


@lower("_adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(self: ET, output_size: Any) -> ET:
    return _adaptive_avg(self, output_size, 2)


@lower("_adaptive_avg_pool3d.default")
def adaptive_avg_pool3d(self: ET, output_size: Any) -> ET:
    if self.dtype in ("bf16", "f16"):
        # PyTorch's 3-d kernel sums in the half type itself, rounding every
        # addition; an f32 sum differs from it by an ulp now and then.
        raise Unsupported("half-precision adaptive_avg_pool3d")
    return _adaptive_avg(self, output_size, 3)


def _adaptive_max(x: ET, output_size: Any, n: int) -> tuple[ET, ET]:
    """Each window's maximum and its flat index in the input plane, with
    PyTorch's CPU rule `val > max || isnan(val)` walked in row-major order:
    the first of equal maxima, the last NaN."""
    _check_input(x, n)
    outs = _pool_param(output_size, n, None)
    if any(o is None or o <= 0 for o in outs):
        raise Unsupported("adaptive pooling to an empty size")
    spatial = list(x.shape[-n:])
    planes = list(x.shape[:-n])
    cells, plane = math.prod(outs), math.prod(spatial)
    if math.prod(planes) * cells * plane > ONE_HOT_LIMIT:
        raise Unsupported("adaptive max pooling too large for masked sums")
    mask = None
    for size, o in zip(spatial, outs):
        m = _axis_mask(_adaptive_windows(size, o), size)
        mask = (
            m
            if mask is None
            else (mask[:, None, :, None] & m[None, :, None, :]).reshape(mask.shape[0] * o, -1)
        )
    window = const(mask)  # [cells, plane]
    values = x.reshape(planes + [1, plane])
    # Masked-out terms take the window's first element (no infinity of our
    # own: Debug checks every op); a NaN in the window still wins.
    first = torch.zeros_like(mask)
    first[torch.arange(cells), mask.to(torch.int8).argmax(dim=1)] = True
    start = (
        const(first).where_(values, eng().full(0.0, [], x.dtype)).reduce("sum", [-1], True)
    )  # [*planes, cells, 1]
    best = window.where_(values, start).reduce("max", [-1], False)
    where_at = const(torch.arange(plane, dtype=torch.int64))
    is_nan = values.binary("ne", values)
    last_nan = window.binary("logical_and", is_nan).where_(where_at, -1).reduce("max", [-1], False)
    equal = window.binary("logical_and", values.binary("eq", best.reshape(planes + [cells, 1])))
    first_max = equal.where_(where_at, plane).reduce("min", [-1], False)
    index = best.binary("ne", best).where_(last_nan, first_max)
    return best.reshape(planes + outs).cast(x.dtype), index.reshape(planes + outs)


@lower("adaptive_max_pool2d.default")
def adaptive_max_pool2d(self: ET, output_size: Any) -> tuple[ET, ET]:
    return _adaptive_max(self, output_size, 2)


@lower("adaptive_max_pool3d.default")
def adaptive_max_pool3d(self: ET, output_size: Any) -> tuple[ET, ET]:
    return _adaptive_max(self, output_size, 3)


def _avg_windows(
    size: int, k: int, s: int, p: int, ceil_mode: bool, count_include_pad: bool
) -> tuple[list[tuple[int, int]], list[float]]:
    """PyTorch's avg_pool output size, each window clipped to the input, and
    its divisor (the window clipped to the padded input, or the input)."""
    if p > k // 2 or k <= 0 or s <= 0:
        raise Unsupported("avg_pool arguments PyTorch rejects")
    o = (size + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    if o <= 0:
        raise Unsupported("pooling window larger than the input")
    windows, divisors = [], []
    for i in range(o):
        start = i * s - p
        end = min(start + k, size + p)
        padded = end - start
        start, end = max(start, 0), min(end, size)
        windows.append((start, end))
        divisors.append(float(padded if count_include_pad else end - start))
    return windows, divisors


def _avg_pool(
    x: ET,
    n: int,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> ET:
    _check_input(x, n)
    k = _pool_param(kernel_size, n, None)
    s = _pool_param(stride, n, k)
    p = _pool_param(padding, n, 0)
    rank = len(x.shape)
    y = _widen(x)
    divisor = None
    for axis, (size, kk, ss, pp) in enumerate(zip(x.shape[-n:], k, s, p)):
        windows, divisors = _avg_windows(size, kk, ss, pp, ceil_mode, count_include_pad)
        y = _sum_windows(y, rank - n + axis, _axis_mask(windows, size))
        d = torch.tensor(divisors)
        divisor = d if divisor is None else divisor.reshape(list(divisor.shape) + [1]) * d
    if divisor_override:
        return y.binary("div", float(divisor_override)).cast(x.dtype)
    return y.binary("div", const(divisor.float())).cast(x.dtype)


@lower("avg_pool2d.default")
def avg_pool2d(
    self: ET,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> ET:
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower("avg_pool3d.default")
def avg_pool3d(
    self: ET,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> ET:
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


# ---- linear and cubic interpolation ---------------------------------------------


def _source_index(size: int, out: int, align_corners: bool, scale: float | None, cubic: bool) -> torch.Tensor:
    """PyTorch's area_pixel_compute_source_index in float32, for every output."""
    dst = torch.arange(out, dtype=torch.float32)
    if align_corners:
        ratio = torch.tensor((size - 1) / (out - 1) if out > 1 else 0.0, dtype=torch.float32)
        return ratio * dst
    ratio = torch.tensor(1.0 / scale if scale is not None and scale > 0 else size / out, dtype=torch.float32)
    src = ratio * (dst + 0.5) - 0.5
    return src if cubic else src.clamp(min=0.0)


def _linear_weights(size: int, out: int, align_corners: bool, scale: float | None) -> torch.Tensor:
    """[out, in]: each output's two neighbours weighted 1 - t and t."""
    src = _source_index(size, out, align_corners, scale, cubic=False)
    low = src.floor().to(torch.int64).clamp(max=size - 1)
    t = (src - low.to(torch.float32)).clamp(0.0, 1.0)
    high = torch.where(low < size - 1, low + 1, low)
    w = torch.zeros(out, size, dtype=torch.float32)
    rows = torch.arange(out)
    w.index_put_((rows, low), 1.0 - t, accumulate=True)
    w.index_put_((rows, high), t, accumulate=True)
    return w


def _cubic_weights(size: int, out: int, align_corners: bool, scale: float | None) -> torch.Tensor:
    """[out, in]: Keys' cubic convolution (A = -0.75) on the four neighbours,
    indices clamped to the edge as PyTorch reads them."""
    a = -0.75
    src = _source_index(size, out, align_corners, scale, cubic=True)
    base = src.floor()
    t = src - base
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731  |x| <= 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731  1 < |x| < 2
    coeffs = [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
    w = torch.zeros(out, size, dtype=torch.float32)
    rows = torch.arange(out)
    for k, c in enumerate(coeffs):
        at = (base.to(torch.int64) - 1 + k).clamp(0, size - 1)
        w.index_put_((rows, at), c, accumulate=True)
    return w


def _apply_weights(x: ET, axis: int, weights: torch.Tensor) -> ET:
    """sum_j W[i, j] x[..., j, ...] over the non-zero weights only. Known
    difference: next to an infinite input PyTorch's CPU kernel can give NaN
    (it multiplies some zero weights) where this gives the infinity."""
    out, size = weights.shape
    moved = _move_last(x, axis)
    if math.prod(moved.shape) * out > ONE_HOT_LIMIT:
        raise Unsupported("interpolation too large for masked sums")
    rows = moved.reshape(list(moved.shape[:-1]) + [1, size])
    picked = const(weights != 0).where_(rows, eng().full(0.0, [], x.dtype))
    return _move_back(picked.binary("mul", const(weights)).reduce("sum", [-1], False), axis)


def _interpolate(x: ET, n: int, output_size: Any, align_corners: bool, scales: list[Any], cubic: bool) -> ET:
    if not is_float(x) or len(x.shape) != n + 2 or 0 in x.shape[2:]:
        raise Unsupported("interpolation of an integer tensor or empty planes")
    outs = list(output_size)
    if len(outs) != n or any(o <= 0 for o in outs):
        raise Unsupported("interpolation to an empty size")
    y = _widen(x)
    for k, (size, o, scale) in enumerate(zip(x.shape[2:], outs, scales)):
        if size == o and (align_corners or scale is None):
            continue  # PyTorch copies an axis of the same size
        make = _cubic_weights if cubic else _linear_weights
        weights = make(size, o, align_corners, scale)
        if x.dtype in ("bf16", "f16"):
            # PyTorch's generic CPU kernel stores the weights in the input's dtype.
            weights = weights.to(torch.bfloat16 if x.dtype == "bf16" else torch.float16).to(torch.float32)
        y = _apply_weights(y, 2 + k, weights)
    return y.cast(x.dtype)


def _vec_sizes(x: ET, n: int, output_size: Any, scale_factors: Any) -> tuple[list[int], list[Any]]:
    if output_size is not None:
        return list(output_size), [None] * n
    if scale_factors is None:
        raise Unsupported("neither output_size nor scale_factors")
    factors = list(scale_factors)
    return [int(math.floor(s * f)) for s, f in zip(x.shape[2:], factors)], factors


@lower("upsample_linear1d.default")
def upsample_linear1d(self: ET, output_size: Any, align_corners: bool, scales: float | None = None) -> ET:
    return _interpolate(self, 1, output_size, align_corners, [scales], cubic=False)


@lower("upsample_bilinear2d.default")
def upsample_bilinear2d(
    self: ET,
    output_size: Any,
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    return _interpolate(self, 2, output_size, align_corners, [scales_h, scales_w], cubic=False)


@lower("upsample_trilinear3d.default")
def upsample_trilinear3d(
    self: ET,
    output_size: Any,
    align_corners: bool,
    scales_d: float | None = None,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    _no_half_trilinear(self)
    return _interpolate(self, 3, output_size, align_corners, [scales_d, scales_h, scales_w], cubic=False)


def _no_half_trilinear(x: ET) -> None:
    if x.dtype in ("bf16", "f16"):
        # Measured: PyTorch's half-precision trilinear rounds differently from
        # one f32 weighted sum (an ulp on ~1% of elements); keep it on the CPU.
        raise Unsupported("half-precision trilinear interpolation")


@lower("upsample_bicubic2d.default")
def upsample_bicubic2d(
    self: ET,
    output_size: Any,
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> ET:
    return _interpolate(self, 2, output_size, align_corners, [scales_h, scales_w], cubic=True)


def _vec(n: int, cubic: bool) -> Any:
    def run(input: ET, output_size: Any, align_corners: bool, scale_factors: Any) -> ET:
        outs, scales = _vec_sizes(input, n, output_size, scale_factors)
        if n == 3:
            _no_half_trilinear(input)
        return _interpolate(input, n, outs, align_corners, scales, cubic)

    return run


for _name, _n, _cubic in (
    ("upsample_linear1d", 1, False),
    ("upsample_bilinear2d", 2, False),
    ("upsample_trilinear3d", 3, False),
    ("upsample_bicubic2d", 2, True),
):
    lower(f"{_name}.vec")(_vec(_n, _cubic))


# ---- grid_sample ------------------------------------------------------------------


def _unnormalize(coord: ET, size: int, align_corners: bool) -> ET:
    """[-1, 1] to pixel coordinates, as PyTorch's grid_sampler_unnormalize."""
    if align_corners:
        return coord.binary("add", 1.0).binary("mul", 0.5 * (size - 1))
    return coord.binary("add", 1.0).binary("mul", float(size)).binary("sub", 1.0).binary("mul", 0.5)


def _reflect(coord: ET, twice_low: int, twice_high: int) -> ET:
    """PyTorch's reflect_coordinates: fold into [low, high] by mirroring."""
    if twice_low == twice_high:
        return coord.binary("mul", 0.0)
    low = twice_low / 2.0
    span = (twice_high - twice_low) / 2.0
    x = coord.binary("sub", low).unary("abs")
    flips = x.binary("div", span).unary("floor")
    extra = x.binary("sub", flips.binary("mul", span))
    odd = flips.binary("sub", flips.binary("mul", 0.5).unary("floor").binary("mul", 2.0)).binary("ne", 0.0)
    return odd.where_(extra.unary("neg").binary("add", span + low), extra.binary("add", low))


def _source_coord(coord: ET, size: int, padding_mode: int, align_corners: bool) -> ET:
    x = _unnormalize(coord, size, align_corners)
    if padding_mode == 2:
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
    if padding_mode in (1, 2):
        x = x.binary("maximum", 0.0).binary("minimum", float(size - 1))  # clip_coordinates
    return x


def _gather_plane(planes: ET, flat: ET, q: int) -> ET:
    """planes [N, C, Q] read at flat [N, P] (whole numbers in f32): [N, C, P]."""
    n, c = planes.shape[0], planes.shape[1]
    p = flat.shape[1]
    mask = flat.reshape([n, 1, p, 1]).binary("eq", eng().arange(0, q, 1, "f32"))  # [N, 1, P, Q]
    return mask.where_(planes.reshape([n, c, 1, q]), eng().full(0.0, [], planes.dtype)).reduce(
        "sum", [-1], False
    )


def _grid_sample(
    x: ET, grid: ET, interpolation_mode: int, padding_mode: int, align_corners: bool, n_dims: int
) -> ET:
    """Bilinear (trilinear) or nearest sampling: each corner read with a
    one-hot masked sum over the input plane, weighted and summed in
    PyTorch's corner order; out-of-bounds corners add nothing (zeros
    padding; border and reflection clip first)."""
    if (
        interpolation_mode not in (0, 1, 2)
        or padding_mode not in (0, 1, 2)
        or (interpolation_mode == 2 and n_dims != 2)
    ):
        raise Unsupported("grid_sample mode")
    if (
        not is_float(x)
        or len(x.shape) != n_dims + 2
        or len(grid.shape) != n_dims + 2
        or grid.shape[-1] != n_dims
    ):
        raise Unsupported("grid_sample shapes")
    if 0 in x.shape or 0 in grid.shape:
        raise Unsupported("empty grid_sample")
    if x.dtype != "f32" or grid.dtype != "f32":
        # Measured: PyTorch's half-precision kernel computes coordinates in the
        # half type; an f32 composition is off by far more than an ulp.
        raise Unsupported("half-precision grid_sample")
    n, c = x.shape[0], x.shape[1]
    sizes = list(x.shape[2:])  # (H, W) or (D, H, W)
    out_spatial = list(grid.shape[1:-1])
    p, q = math.prod(out_spatial), math.prod(sizes)
    if n * c * p * q > ONE_HOT_LIMIT:
        rows = grid.shape[1]
        if n * c * p * q > 4 * ONE_HOT_LIMIT or rows < 2:
            raise Unsupported("grid_sample too large for masked sums")
        # Up to four times the limit: the output rows in two halves, each a
        # masked sum of its own (the same arithmetic per output point).
        half = rows // 2
        parts = [
            _grid_sample(x, grid.slice(1, a, b, 1), interpolation_mode, padding_mode, align_corners, n_dims)
            for a, b in ((0, half), (half, rows))
        ]
        return eng().cat(parts, 2)
    planes = x.reshape([n, c, q])
    g = grid.reshape([n, p, n_dims])
    # grid's last axis is (x, y[, z]): x indexes the last input axis.
    raw = [g.slice(2, k, k + 1, 1).reshape([n, p]) for k in range(n_dims)]
    if interpolation_mode == 2:
        return (
            _grid_bicubic(planes, raw, sizes, padding_mode, align_corners)
            .reshape([n, c] + out_spatial)
            .cast(x.dtype)
        )
    coords = [_source_coord(v, sizes[n_dims - 1 - k], padding_mode, align_corners) for k, v in enumerate(raw)]
    coords = coords[::-1]  # now in input axis order (z, y, x)
    if interpolation_mode == 1:
        corners = [([_round_half_even(v) for v in coords], None)]
    else:
        lows = [v.unary("floor") for v in coords]
        corners = []
        for bits in _offsets([2] * n_dims):
            at, weight = [], None
            for v, lo, bit in zip(coords, lows, bits):
                at.append(lo.binary("add", 1.0) if bit else lo)
                # the weight of the low corner is (low + 1 - v), of the high one (v - low)
                w = v.binary("sub", lo) if bit else lo.binary("add", 1.0).binary("sub", v)
                weight = w if weight is None else weight.binary("mul", w)
            corners.append((at, weight))
    out = None
    for at, weight in corners:
        inside, flat = None, None
        for v, size in zip(at, sizes):
            ok = v.binary("ge", 0.0).binary("logical_and", v.binary("le", float(size - 1)))
            inside = ok if inside is None else inside.binary("logical_and", ok)
            safe = ok.where_(v, 0.0)
            flat = safe if flat is None else flat.binary("mul", float(size)).binary("add", safe)
        value = _gather_plane(planes, flat, q)  # [N, C, P]
        if weight is not None:
            value = value.binary("mul", weight.reshape([n, 1, p]))
        term = inside.reshape([n, 1, p]).where_(value, 0.0)
        out = term if out is None else out.binary("add", term)
    return out.reshape([n, c] + out_spatial).cast(x.dtype)


def _cubic_coefficients(t: ET) -> list[ET]:
    """Keys' cubic convolution weights (A = -0.75) of the taps at -1, 0, 1, 2."""
    a = -0.75

    def near(x: ET) -> ET:  # |x| <= 1
        return (
            x.binary("mul", a + 2).binary("sub", a + 3).binary("mul", x).binary("mul", x).binary("add", 1.0)
        )

    def far(x: ET) -> ET:  # 1 < |x| < 2
        return (
            x.binary("mul", a)
            .binary("sub", 5 * a)
            .binary("mul", x)
            .binary("add", 8 * a)
            .binary("mul", x)
            .binary("sub", 4 * a)
        )

    one_minus = t.unary("neg").binary("add", 1.0)
    return [far(t.binary("add", 1.0)), near(t), near(one_minus), far(one_minus.binary("add", 1.0))]


def _grid_bicubic(planes: ET, raw: list[ET], sizes: list[int], padding_mode: int, align_corners: bool) -> ET:
    """PyTorch's bicubic grid_sample: the unpadded source point, 4 x 4 taps
    around it, each tap's coordinate padded (border, reflection) and read as 0
    outside (zeros); cubic along x per row, then along y."""
    n, c, q = planes.shape
    p = raw[0].shape[1]
    h, w = sizes
    ix = _unnormalize(raw[0], w, align_corners)
    iy = _unnormalize(raw[1], h, align_corners)
    x0, y0 = ix.unary("floor"), iy.unary("floor")
    cx = _cubic_coefficients(ix.binary("sub", x0))
    cy = _cubic_coefficients(iy.binary("sub", y0))

    def tap(base: ET, offset: int, size: int) -> tuple[ET, ET]:
        v = base.binary("add", float(offset))
        if padding_mode == 2:
            v = _reflect(v, 0, 2 * (size - 1)) if align_corners else _reflect(v, -1, 2 * size - 1)
        if padding_mode in (1, 2):
            v = v.binary("maximum", 0.0).binary("minimum", float(size - 1))
        v = v.unary("floor")
        ok = v.binary("ge", 0.0).binary("logical_and", v.binary("le", float(size - 1)))
        return ok.where_(v, 0.0), ok

    out = None
    for j in range(4):
        yj, oky = tap(y0, j - 1, h)
        row = None
        for i in range(4):
            xi, okx = tap(x0, i - 1, w)
            value = _gather_plane(planes, yj.binary("mul", float(w)).binary("add", xi), q)
            value = okx.binary("logical_and", oky).reshape([n, 1, p]).where_(value, 0.0)
            term = value.binary("mul", cx[i].reshape([n, 1, p]))
            row = term if row is None else row.binary("add", term)
        term = row.binary("mul", cy[j].reshape([n, 1, p]))
        out = term if out is None else out.binary("add", term)
    return out


def _round_half_even(v: ET) -> ET:
    from .elementwise import _round_even

    return _round_even(v)


@lower("grid_sampler_2d.default")
def grid_sampler_2d(
    input: ET, grid: ET, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> ET:
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, 2)


@lower("grid_sampler_3d.default")
def grid_sampler_3d(
    input: ET, grid: ET, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> ET:
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, 3)
