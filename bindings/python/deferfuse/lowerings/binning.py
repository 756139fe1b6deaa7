"""Histograms as engine compositions: histc, histogram and the histogramdd
family.

Each element's bin is found the way PyTorch's CPU kernel
(aten/src/ATen/native/cpu/HistogramKernel.cpp) finds it, so counts match
exactly, not just within a tolerance:

- histc: `trunc((x - left) * bins / (right - left))` in the input's dtype
  (no look at the inner edges);
- histogram / histogramdd with a bin count: that division, then a search of
  the neighbouring edges, which amounts to "the number of edges <= x, minus
  one";
- histogram / histogramdd with bin tensors: `std::upper_bound` over the edges
  (emulated step by step, so unsorted edges give PyTorch's answer too).

Elements outside [left, right] (and NaN) count nowhere; the last bin is closed.
The counts are a masked sum of a one-hot [elements, bins] compare, so large
ones (`ONE_HOT_LIMIT`) stay on the CPU. Only float32 is lowered: PyTorch's
bfloat16 kernel rounds after every operation in its own way.

Edges from a given range are PyTorch's own `linspace` of Python numbers
(constants, computed on the host like any other shape argument). Edges from
the data's min / max are computed on the engine; `linspace` there is
`start + step * k` with one rounding (a fused multiply-add), which is emulated
with error-free products and sums (Dekker): exact but for a double rounding in
the last addition, which needs an element within an ulp of an inner edge as
well to change a count. A range that is not finite (inf or NaN in the data)
makes PyTorch raise; here it makes every count NaN (no host read).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._engine import Tensor as ET
from .._handles import from_cpu_value
from ._registry import Unsupported, eng, lower
from ._registry import axis as as_axis  # segment_reduce has an argument named axis
from .lookups import ONE_HOT_LIMIT


def _check_input(x: ET, weight: ET | None) -> None:
    if not isinstance(x, ET) or x.dtype != "f32":
        raise Unsupported("histograms of dtypes other than float32")
    if weight is not None and (not isinstance(weight, ET) or weight.dtype != "f32"):
        raise Unsupported("weights of another dtype")


def _host_edges(lo: float, hi: float, bins: int) -> ET:
    """PyTorch's own linspace of two Python numbers: a constant."""
    return from_cpu_value(torch.linspace(lo, hi, bins + 1, dtype=torch.float32))


def _split(a: ET) -> tuple[ET, ET]:
    """Veltkamp's split of a float32 into two halves of 12 significant bits."""
    c = a.binary("mul", 4097.0)
    hi = c.binary("sub", c.binary("sub", a))
    return hi, a.binary("sub", hi)


def _fma(a: ET, b: ET, c: ET) -> ET:
    """a * b + c with (almost always) one rounding, from float32 ops only:
    Dekker's exact product, Knuth's exact sum, and the two errors added last."""
    p = a.binary("mul", b)
    ah, al = _split(a)
    bh, bl = _split(b)
    p_err = (
        ah.binary("mul", bh)
        .binary("sub", p)
        .binary("add", ah.binary("mul", bl))
        .binary("add", al.binary("mul", bh))
        .binary("add", al.binary("mul", bl))
    )
    s = c.binary("add", p)
    z = s.binary("sub", c)
    s_err = c.binary("sub", s.binary("sub", z)).binary("add", p.binary("sub", z))
    return s.binary("add", s_err.binary("add", p_err))


def _engine_edges(lo: ET, hi: ET, bins: int) -> ET:
    """PyTorch's CPU linspace of two engine scalars ([1] each): the first half
    counts up from `lo`, the second half down from `hi`, both as a fused
    multiply-add, so the end points are exact."""
    steps = bins + 1
    step = hi.binary("sub", lo).binary("div", float(bins))
    k = eng().arange(0, steps, 1, "f32")
    up = _fma(step.expand([steps]), k, lo.expand([steps]))
    down = _fma(
        step.binary("mul", -1.0).expand([steps]), eng().arange(steps - 1, -1, -1, "f32"), hi.expand([steps])
    )
    return k.binary("lt", float(steps // 2)).where_(up, down)


def _outer_from_data(col: ET, widen: float) -> tuple[ET, ET, ET]:
    """(left, right, finite) from the column's min and max ([1] each), widened
    by `widen` on both sides when they are equal, as PyTorch does."""
    lo = col.reduce("min", [0], False).reshape([1])
    hi = col.reduce("max", [0], False).reshape([1])
    # PyTorch's aminmax propagates NaN, which makes the range non-finite: look for it explicitly
    # rather than rely on how the engine's min / max treat NaN.
    nan_seen = col.binary("ne", col).cast("i32").reduce("max", [0], False).reshape([1]).cast("bool")
    same = lo.binary("eq", hi)
    lo = same.where_(lo.binary("sub", widen), lo)
    hi = same.where_(hi.binary("add", widen), hi)
    finite = (
        lo.unary("abs")
        .binary("lt", float("inf"))
        .binary("logical_and", hi.unary("abs").binary("lt", float("inf")))
    )
    return lo, hi, finite.binary("logical_and", nan_seen.unary("logical_not"))


def _linear_bin(col: ET, left: ET, right: ET, bins: int) -> ET:
    """histc's bin: trunc((x - left) * bins / (right - left)), as float32."""
    return (
        col.binary("sub", left)
        .binary("mul", float(bins))
        .binary("div", right.binary("sub", left))
        .unary("floor")
    )


def _count_le(col: ET, edges: ET) -> ET:
    """The number of edges <= x, minus one (the bin after the neighbouring-edge
    search, for sorted edges)."""
    n = edges.shape[0]
    le = edges.reshape([1, n]).binary("le", col.reshape([col.shape[0], 1]))
    return le.cast("f32").reduce("sum", [1], False).binary("sub", 1.0)


def _pick(edges: ET, position: ET) -> ET:
    n = edges.shape[0]
    mask = position.reshape([position.shape[0], 1]).binary("eq", eng().arange(0, n, 1, "f32"))
    return mask.where_(edges.reshape([1, n]), eng().full(0.0, [], "f32")).reduce("sum", [1], False)


def _upper_bound(col: ET, edges: ET) -> ET:
    """libstdc++'s std::upper_bound step by step (first, len), minus one."""
    n = edges.shape[0]
    first = eng().full(0.0, list(col.shape), "f32")
    length = eng().full(float(n), list(col.shape), "f32")
    for _ in range(n.bit_length()):
        active = length.binary("gt", 0.0)
        half = length.binary("mul", 0.5).unary("floor")
        middle = first.binary("add", half)
        mid_val = _pick(edges, active.where_(middle, 0.0))
        go_left = col.binary("lt", mid_val)
        left = active.binary("logical_and", go_left)
        right = active.binary("logical_and", go_left.unary("logical_not"))
        first = right.where_(middle.binary("add", 1.0), first)
        length = left.where_(half, right.where_(length.binary("sub", half).binary("sub", 1.0), length))
    return first.binary("sub", 1.0)


def _histogramdd(
    x: ET,
    edges: list[ET],
    outer: list[tuple[ET, ET]],
    how: str,
    weight: ET | None,
    density: bool,
    finite: ET | None,
) -> ET:
    """The joint histogram of x's rows ([N, D]) over D edge lists."""
    n, d = x.shape
    bins = [e.shape[0] - 1 for e in edges]
    total = math.prod(bins)
    if n * total > ONE_HOT_LIMIT or n * max(e.shape[0] for e in edges) > ONE_HOT_LIMIT:
        raise Unsupported("a histogram too large for a one-hot count")
    keep = eng().full(1.0, [n], "bool")
    flat = eng().full(0.0, [n], "f32")
    for axis in range(d):
        col = x.slice(1, axis, axis + 1, 1).reshape([n])
        left, right = outer[axis]
        keep = keep.binary("logical_and", col.binary("ge", left)).binary(
            "logical_and", col.binary("le", right)
        )
        if how == "histc":
            pos = _linear_bin(col, left, right, bins[axis])
        elif how == "count":
            pos = _count_le(col, edges[axis])
        else:
            pos = _upper_bound(col, edges[axis])
        pos = pos.binary("eq", float(bins[axis])).where_(float(bins[axis] - 1), pos)  # the last bin is closed
        stride = math.prod(bins[axis + 1 :])
        flat = flat.binary("add", pos.binary("mul", float(stride)))
    # Out-of-range elements point at no bin.
    flat = keep.where_(flat, -1.0)
    mask = flat.reshape([n, 1]).binary("eq", eng().arange(0, total, 1, "f32"))
    value = weight.reshape([n, 1]) if weight is not None else 1.0
    hist = (
        mask.where_(value, eng().full(0.0, [], "f32")).reduce("sum", [0], False)
        if n
        else eng().full(0.0, [total], "f32")
    )
    hist = hist.reshape(bins)
    if density:
        hist = hist.binary("div", hist.reduce("sum", list(range(d)), False))
        for axis, e in enumerate(edges):
            widths = e.slice(0, 1, bins[axis] + 1, 1).binary("sub", e.slice(0, 0, bins[axis], 1))
            shape = [1] * d
            shape[axis] = bins[axis]
            hist = hist.binary("div", widths.reshape(shape))
    if finite is not None:
        hist = finite.reshape([1] * d).where_(hist, float("nan"))
    return hist


def _as_rows(x: ET, d: int) -> ET:
    n = math.prod(x.shape) // d if d else 0
    return x.reshape([n, d])


def _bin_ct_edges(
    x: ET, bins: list[int], range_: Any, widen: float
) -> tuple[list[ET], list[tuple[ET, ET]], ET | None]:
    """Edges for bin counts: from a given range on the host, else from the
    data on the engine."""
    d = len(bins)
    if any(b <= 0 for b in bins):
        raise Unsupported("non-positive bin counts")
    edges, outer, finite = [], [], None
    for axis in range(d):
        if range_ is not None:
            lo, hi = float(range_[2 * axis]), float(range_[2 * axis + 1])
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise Unsupported("a range PyTorch rejects")
            if lo == hi:
                lo, hi = lo - widen, hi + widen
            e = _host_edges(lo, hi, bins[axis])
        elif x.shape[0] == 0:
            e = _host_edges(0.0, 1.0, bins[axis])  # PyTorch's range for no data
        else:
            col = x.slice(1, axis, axis + 1, 1).reshape([x.shape[0]])
            lo_t, hi_t, ok = _outer_from_data(col, widen)
            finite = ok if finite is None else finite.binary("logical_and", ok)
            e = _engine_edges(lo_t, hi_t, bins[axis])
        edges.append(e)
        outer.append((e.slice(0, 0, 1, 1), e.slice(0, bins[axis], bins[axis] + 1, 1)))
    return edges, outer, finite


def _histc_integers(self: ET, bins: int, lo: int, hi: int) -> ET:
    """histc of integers as CUDA computes it (PyTorch's CPU kernel rejects
    them; transformers' MoE routing counts experts this way off the CPU):
    the bin is (x - min) * bins / (max - min) in integer arithmetic, the
    last bin closed, counts in the input's dtype. Done in float32, which is
    exact while (max - min) * bins stays below 2^24."""
    if lo >= hi or bins <= 0 or (hi - lo) * bins >= 1 << 24:
        raise Unsupported("an integer histc without a range, or one too wide for float32")
    n = math.prod(self.shape)
    if n * bins > ONE_HOT_LIMIT:
        raise Unsupported("a histogram too large for a masked sum")
    x = self.reshape([n]).cast("f32")
    inside = x.binary("ge", float(lo)).binary("logical_and", x.binary("le", float(hi)))
    b = x.binary("sub", float(lo)).binary("mul", float(bins)).binary("div", float(hi - lo)).unary("floor")
    b = b.binary("minimum", float(bins - 1)).cast("i64")
    hit = b.reshape([n, 1]).binary("eq", eng().arange(0, bins, 1, "i64").reshape([1, bins]))
    hit = hit.binary("logical_and", inside.reshape([n, 1]))
    return hit.cast("i64").reduce("sum", [0], False).cast(self.dtype)


@lower("histc.default")
def histc(self: ET, bins: int = 100, min: Any = 0, max: Any = 0) -> ET:
    if isinstance(self, ET) and self.dtype in ("i32", "i64"):
        return _histc_integers(self, bins, int(min), int(max))
    _check_input(self, None)
    lo, hi = float(min), float(max)
    x = _as_rows(self, 1)
    if lo == hi and x.shape[0] > 0:
        # The data's own range; equal min and max widen by 1 on each side.
        if bins <= 0:
            raise Unsupported("non-positive bin counts")
        col = x.reshape([x.shape[0]])
        left, right, finite = _outer_from_data(col, 1.0)
        # histc never looks at the inner edges: a placeholder carries the bin count.
        return _histogramdd(
            x, [eng().full(0.0, [bins + 1], "f32")], [(left, right)], "histc", None, False, finite
        )
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi or bins <= 0:
        raise Unsupported("a range PyTorch rejects")
    e = _host_edges(lo, hi, bins)
    return _histogramdd(
        x, [e], [(e.slice(0, 0, 1, 1), e.slice(0, bins, bins + 1, 1))], "histc", None, False, None
    )


@lower("histogram.bin_ct")
def histogram_bin_ct(
    self: ET, bins: int = 100, *, range: Any = None, weight: ET | None = None, density: bool = False
) -> tuple[ET, ET]:
    _check_input(self, weight)
    x = _as_rows(self, 1)
    edges, outer, finite = _bin_ct_edges(x, [bins], range, 0.5)
    return _histogramdd(x, edges, outer, "count", weight, density, finite), edges[0]


@lower("histogram.bins_tensor")
def histogram_bins_tensor(
    self: ET, bins: ET, *, weight: ET | None = None, density: bool = False
) -> tuple[ET, ET]:
    _check_input(self, weight)
    if not isinstance(bins, ET) or bins.dtype != "f32" or len(bins.shape) != 1 or bins.shape[0] < 2:
        raise Unsupported("bin edges PyTorch rejects")
    x = _as_rows(self, 1)
    n = bins.shape[0]
    outer = [(bins.slice(0, 0, 1, 1), bins.slice(0, n - 1, n, 1))]
    return _histogramdd(x, [bins], outer, "search", weight, density, None), bins


def _dd_input(self: ET, d: int, weight: ET | None) -> ET:
    _check_input(self, weight)
    if len(self.shape) < 1 or self.shape[-1] != d or d == 0:
        raise Unsupported("histogramdd arguments PyTorch rejects")
    return _as_rows(self, d)


@lower("_histogramdd_bin_edges.default")
def histogramdd_bin_edges(
    self: ET, bins: Any, *, range: Any = None, weight: ET | None = None, density: bool = False
) -> list[ET]:
    x = _dd_input(self, len(bins), weight)
    edges, _, finite = _bin_ct_edges(x, list(bins), range, 0.5)
    if finite is not None:
        edges = [finite.where_(e, float("nan")) for e in edges]
    return edges


@lower("_histogramdd_from_bin_cts.default")
def histogramdd_from_bin_cts(
    self: ET, bins: Any, *, range: Any = None, weight: ET | None = None, density: bool = False
) -> ET:
    x = _dd_input(self, len(bins), weight)
    edges, outer, finite = _bin_ct_edges(x, list(bins), range, 0.5)
    return _histogramdd(x, edges, outer, "count", _flat_weight(weight), density, finite)


@lower("_histogramdd_from_bin_tensors.default")
def histogramdd_from_bin_tensors(
    self: ET, bins: Any, *, weight: ET | None = None, density: bool = False
) -> ET:
    x = _dd_input(self, len(bins), weight)
    for b in bins:
        if not isinstance(b, ET) or b.dtype != "f32" or len(b.shape) != 1 or b.shape[0] < 2:
            raise Unsupported("bin edges PyTorch rejects")
    outer = [(b.slice(0, 0, 1, 1), b.slice(0, b.shape[0] - 1, b.shape[0], 1)) for b in bins]
    return _histogramdd(x, list(bins), outer, "search", _flat_weight(weight), density, None)


def _flat_weight(weight: ET | None) -> ET | None:
    return None if weight is None else weight.reshape([math.prod(weight.shape)])


# ---- segment_reduce -------------------------------------------------------------

#: What a segment starts from when no `initial` is given (PyTorch's CPU kernel).
_SEGMENT_START = {"max": float("-inf"), "min": float("inf"), "sum": 0.0, "mean": 0.0, "prod": 1.0}


def _segment_bounds(lengths: ET | None, offsets: ET | None) -> tuple[ET, ET]:
    """(start, end) of every segment, [..., S] as i64. From lengths, the end is
    their running sum, a masked sum over the segments before and including
    each one."""
    if offsets is not None:
        s = offsets.shape[-1] - 1
        o = offsets.cast("i64")
        return o.slice(-1, 0, s, 1), o.slice(-1, 1, s + 1, 1)
    s = lengths.shape[-1]
    ln = lengths.cast("i64")
    upto = (
        eng().arange(0, s, 1, "i64").reshape([s, 1]).binary("ge", eng().arange(0, s, 1, "i64"))
    )  # [i, j]: j <= i
    terms = upto.where_(ln.reshape(list(ln.shape[:-1]) + [1, s]), eng().full(0.0, [], "i64"))
    end = terms.reduce("sum", [-1], False)
    return end.binary("sub", ln), end


@lower("segment_reduce.default")
def segment_reduce(
    data: ET,
    reduce: str,
    *,
    lengths: ET | None = None,
    indices: ET | None = None,
    offsets: ET | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: Any = None,
) -> ET:
    """Each segment's reduction as a reduction of the data masked to it: values
    outside the segment become the reduction's identity, and `initial` (or
    PyTorch's default start) joins as one more value. An empty segment's mean
    is `initial`, or NaN without one."""
    if reduce not in _SEGMENT_START or indices is not None or not isinstance(data, ET) or data.dtype != "f32":
        raise Unsupported("segment_reduce with indices, a non-float32 tensor or another reduction")
    bounds = offsets if offsets is not None else lengths
    if not isinstance(bounds, ET) or bounds.dtype not in ("i64", "i32") or len(data.shape) == 0:
        raise Unsupported("segment_reduce without integer lengths or offsets")
    rank = len(data.shape)
    axis = as_axis(axis, rank)
    if len(bounds.shape) != axis + 1 or list(bounds.shape[:-1]) != list(data.shape[:axis]):
        raise Unsupported("lengths / offsets that do not match the data's leading dimensions")
    start, end = _segment_bounds(lengths, offsets)  # [outer..., S]
    s, j = start.shape[-1], data.shape[axis]
    inner = list(data.shape[axis + 1 :])
    if math.prod(data.shape[:axis]) * s * j * max(1, math.prod(inner)) > ONE_HOT_LIMIT:
        raise Unsupported("a segment reduction too large for masks")
    outer = list(data.shape[:axis])
    pos = eng().arange(0, j, 1, "i64")
    member = (
        start.reshape(outer + [s, 1])
        .binary("le", pos)
        .binary("logical_and", end.reshape(outer + [s, 1]).binary("gt", pos))
    )  # [outer..., S, J]
    member = member.reshape(outer + [s, j] + [1] * len(inner))
    values = data.reshape(outer + [1, j] + inner)
    first = _SEGMENT_START[reduce] if initial is None else float(initial)
    kind = "sum" if reduce == "mean" else reduce
    masked = member.where_(values, eng().full(_SEGMENT_START[kind], [], "f32"))
    masked = eng().cat(
        [eng().full(first, outer + [s, 1] + inner, "f32"), masked.expand(outer + [s, j] + inner)], axis + 1
    )
    out = masked.reduce(kind, [axis + 1], False)  # [outer..., S, inner...]
    if reduce != "mean":
        return out
    count = end.binary("sub", start).cast("f32").reshape(outer + [s] + [1] * len(inner))
    empty_value = float("nan") if initial is None else float(initial)
    return count.binary("gt", 0.0).where_(out.binary("div", count.binary("maximum", 1.0)), empty_value)
