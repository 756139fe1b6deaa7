"""Scatters and index writes as one-hot masked reductions.

The engine has no scatter, so a write along an axis of n positions is a
reduction over a one-hot mask [..., m, n] relating each of the m sources to
its target position (as lookups.py reads). Repeated targets combine as
PyTorch combines them: sum, prod, mean, amax and amin take all of them. A
plain write (`scatter`, `index_copy`, `put_`, `index_put_` without
accumulate) keeps the last source for a target: PyTorch's CPU kernels walk
the sources in order, along the scatter axis in one sequential loop
(`scatter`), and the others in one thread below PyTorch's grain size, so
larger ones of those stay on the CPU (`_SERIAL_LIMIT`). Masks larger than
`ONE_HOT_LIMIT` stay on the CPU.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .._engine import Tensor as ET
from ._registry import Unsupported, axis, broadcast_batch, check_bounds, eng, is_float, lower, need_tensor
from .lookups import _check_size, _move_back, _move_last, _one_hot, index_select

_SERIAL_LIMIT = 32768  # at::internal::GRAIN_SIZE: below it PyTorch's index kernels run in one thread


def _fill(mode: str) -> float:
    """The identity of a sum or product, for the masked-out terms."""
    return 1.0 if mode == "prod" else 0.0


def masked_extreme(mask: ET, values: ET, kind: str) -> ET:
    """max / min over axis -2 of the values the mask [..., m, n] keeps. The
    masked-out terms are filled with one kept value (the last) rather than
    with an infinity, so no op makes an infinity of its own (Debug checks
    every op) and integer dtypes need no sentinel; a NaN among the kept
    values still wins, as in PyTorch. Rows that keep nothing give that
    fill, 0: callers replace them."""
    m = mask.shape[-2]
    order = eng().arange(0, m, 1, "i64").reshape([m, 1])
    last = mask.where_(order, -1).reduce("max", [-2], True)
    chosen = mask.binary("logical_and", order.binary("eq", last))
    some = (
        chosen.where_(values, eng().full(0.0, [], values.dtype)).reduce("sum", [-2], True).cast(values.dtype)
    )
    return mask.where_(values, some).reduce(kind, [-2], False)


def _combine(base: ET, mask: ET, values: Any, mode: str, include_self: bool) -> ET:
    """base [..., n] combined with the values [..., m] (or a number) that the
    mask [..., m, n] sends to each position."""
    m = mask.shape[-2]
    vals = values.reshape(list(values.shape) + [1]) if isinstance(values, ET) else values
    count = mask.cast("i64").reduce("sum", [-2], False)
    hit = count.binary("gt", 0)
    if mode == "replace":
        if isinstance(vals, ET):
            # The last source wins: the highest source position per target.
            order = eng().arange(0, m, 1, "i64").reshape([m, 1])
            last = mask.where_(order, -1).reduce("max", [-2], True)
            mask = mask.binary("logical_and", order.binary("eq", last))
            vals = mask.where_(vals, eng().full(0.0, [], base.dtype)).reduce("sum", [-2], False)
        return hit.where_(vals, base).cast(base.dtype)
    if mode in ("amax", "amin"):
        full = vals if isinstance(vals, ET) else eng().full(float(vals), [], base.dtype)
        reduced = masked_extreme(
            mask, full.expand(list(mask.shape[:-1]) + [1]) if isinstance(vals, ET) else full, mode[1:]
        ).cast(base.dtype)
        if not include_self:
            return hit.where_(reduced, base)
        return hit.where_(base.binary("maximum" if mode == "amax" else "minimum", reduced), base)
    terms = mask.where_(vals, eng().full(_fill(mode), [], base.dtype))
    if mode == "mean":
        total = terms.reduce("sum", [-2], False)
        if include_self:
            return base.binary("add", total).binary("div", count.binary("add", 1).cast(base.dtype))
        return hit.where_(total.binary("div", count.binary("maximum", 1).cast(base.dtype)), base)
    kind = {"sum": "sum", "prod": "prod"}[mode]
    reduced = terms.reduce(kind, [-2], False).cast(base.dtype)
    if not include_self:
        return hit.where_(reduced, base)
    pair = {"sum": "add", "prod": "mul"}[mode]
    return base.binary(pair, reduced)


def _scatter(self: ET, dim: int, index: ET, src: Any, mode: str, include_self: bool = True) -> ET:
    """PyTorch's scatter family: along `dim`, source position p goes to
    `index[p]`; the index covers a leading block of `self` (and of `src`)."""
    need_tensor(self, index)
    if index.dtype not in ("i64", "i32"):
        raise Unsupported("scatter with a non-integer index")
    if mode != "replace" and self.dtype == "bool":
        raise Unsupported("scatter reductions on bool")
    if mode == "mean" and not is_float(self):
        raise Unsupported("integer scatter mean (PyTorch floors)")
    if len(self.shape) == 0:
        out = _scatter(
            self.reshape([1]),
            0,
            index.reshape([1]) if len(index.shape) == 0 else index,
            src.reshape([1]) if isinstance(src, ET) and len(src.shape) == 0 else src,
            mode,
            include_self,
        )
        return out.reshape([])
    rank = len(self.shape)
    if len(index.shape) != rank or (isinstance(src, ET) and len(src.shape) != rank):
        raise Unsupported("scatter with index or src of another rank")
    dim = axis(dim, rank)
    if math.prod(index.shape) == 0:
        return self
    n = self.shape[dim]
    if any(i > s for a, (i, s) in enumerate(zip(index.shape, self.shape)) if a != dim):
        raise Unsupported("index larger than self")
    _check_size(math.prod(index.shape), n)
    region = self
    for a, (i, s) in enumerate(zip(index.shape, self.shape)):
        if a != dim and i < s:
            region = region.slice(a, 0, i, 1)
    if isinstance(src, ET):
        if any(i > s for i, s in zip(index.shape, src.shape)):
            raise Unsupported("src smaller than index")
        for a, (i, s) in enumerate(zip(index.shape, src.shape)):
            if i < s:
                src = src.slice(a, 0, i, 1)
        src = _move_last(src.cast(self.dtype), dim)
    else:
        src = _scalar(src, self.dtype)
    idx = _move_last(index.cast("i64"), dim)
    idx = idx.binary("lt", 0).where_(idx.binary("add", n), idx)
    base = _move_last(region, dim)
    out = _move_back(_combine(base, _one_hot(idx, n), src, mode, include_self), dim)
    return _stitch(out, self, dim)


def _scalar(value: Any, dtype: str) -> Any:
    if isinstance(value, complex) or (
        dtype != "bool" and not is_float_dtype(dtype) and isinstance(value, float)
    ):
        raise Unsupported("a fractional value into an integer tensor")
    return float(value) if is_float_dtype(dtype) else value


def is_float_dtype(dtype: str) -> bool:
    return dtype in ("f32", "bf16", "f16")


def _stitch(region: ET, self: ET, dim: int) -> ET:
    """`region` (self's leading block on the axes other than dim) completed
    with the rest of self."""
    out = region
    for a, (have, want) in enumerate(zip(region.shape, self.shape)):
        if a == dim or have == want:
            continue
        rest = self.slice(a, have, want, 1)
        for later in range(a + 1, len(self.shape)):
            if later != dim and region.shape[later] < self.shape[later]:
                rest = rest.slice(later, 0, region.shape[later], 1)
        out = eng().cat([out, rest], a)
    return out


REDUCE_NAMES = {
    "add": "sum",
    "multiply": "prod",
    "sum": "sum",
    "prod": "prod",
    "mean": "mean",
    "amax": "amax",
    "amin": "amin",
}


def _checked_scatter(
    op: str, self: ET, dim: int, index: ET, src: Any, mode: str, include_self: bool = True
) -> ET:
    """The scatter family's ops: `_scatter`, then PyTorch's check of the
    index against the size of `dim` (negative indices are out of range)."""
    out = _scatter(self, dim, index, src, mode, include_self)
    d = dim % len(self.shape) if self.shape else 0
    size = self.shape[d] if self.shape else 1
    check_bounds(op, "gather_out_of_bounds", [index], [size], [d])
    return out


@lower("scatter.src", "scatter.value")
def scatter(self: ET, dim: int, index: ET, src: Any) -> ET:
    return _checked_scatter("aten::scatter", self, dim, index, src, "replace")


@lower("scatter.reduce", "scatter.value_reduce")
def scatter_reduce_legacy(self: ET, dim: int, index: ET, src: Any, *, reduce: str) -> ET:
    if reduce not in ("add", "multiply"):
        raise Unsupported(f"scatter reduce {reduce!r}")
    return _checked_scatter("aten::scatter", self, dim, index, src, REDUCE_NAMES[reduce])


@lower("scatter_add.default")
def scatter_add(self: ET, dim: int, index: ET, src: ET) -> ET:
    return _checked_scatter("aten::scatter_add", self, dim, index, src, "sum")


@lower("scatter_reduce.two")
def scatter_reduce(self: ET, dim: int, index: ET, src: ET, reduce: str, *, include_self: bool = True) -> ET:
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise Unsupported(f"scatter_reduce {reduce!r}")
    return _checked_scatter("aten::scatter_reduce", self, dim, index, src, reduce, include_self)


# ---- index_* along one dimension ------------------------------------------------


def _spread_index(self: ET, dim: int, index: ET, source: ET) -> tuple[int, ET, ET]:
    """A one-dimensional index along `dim` as a scatter index of source's shape."""
    need_tensor(self, index, source)
    if len(index.shape) > 1 or index.dtype not in ("i64", "i32"):
        raise Unsupported("index that is not a vector of integers")
    if len(self.shape) == 0:
        return 0, index.reshape([1]), source.reshape([1])
    dim = axis(dim, len(self.shape))
    if len(source.shape) != len(self.shape):
        raise Unsupported("source of another rank")
    m = math.prod(index.shape)
    shape = [1] * len(source.shape)
    shape[dim] = m
    return dim, index.reshape(shape).expand(list(source.shape)), source


def _index_scatter(
    self: ET,
    dim: int,
    index: ET,
    source: ET,
    mode: str,
    include_self: bool = True,
    *,
    op: str,
    kinds: tuple[str, ...],
) -> ET:
    """index_add / index_copy / index_reduce along `dim`, then PyTorch's
    checks of the index, with `kinds` their messages in the order PyTorch
    makes them (the first that fails is raised)."""
    d, idx, src = _spread_index(self, dim, index, source)
    if len(self.shape) == 0:
        out = _scatter(self.reshape([1]), 0, idx, src, mode, include_self).reshape([])
    else:
        out = _scatter(self, d, idx, src, mode, include_self)
    for kind in kinds:
        check_bounds(op, kind, [index], [self.shape[d] if self.shape else 1], [d])
    return out


@lower("index_add.default")
def index_add(self: ET, dim: int, index: ET, source: ET, *, alpha: Any = 1) -> ET:
    rank = len(self.shape)
    d = dim % rank if rank else 0
    # PyTorch's CPU kernel runs as scatter_add (and so raises scatter's
    # RuntimeError) along the first or last dimension of a tensor of rank 2
    # or more, for alpha 1, an int64 index and a source of self's sizes off
    # that dimension; else it raises IndexError "index out of range in self".
    as_scatter = (
        rank > 1
        and d in (0, rank - 1)
        and alpha == 1
        and index.dtype == "i64"
        and len(source.shape) == rank
        and all(a == b for i, (a, b) in enumerate(zip(self.shape, source.shape)) if i != d)
    )
    if alpha != 1:
        source = source.binary("mul", alpha)
    kind = "gather_out_of_bounds" if as_scatter else "out_of_range_in_self"
    return _index_scatter(self, dim, index, source, "sum", op="aten::index_add", kinds=(kind,))


@lower("index_copy.default")
def index_copy(self: ET, dim: int, index: ET, source: ET) -> ET:
    if math.prod(source.shape) > _SERIAL_LIMIT:
        raise Unsupported("index_copy large enough for PyTorch to run in threads")
    return _index_scatter(self, dim, index, source, "replace", op="aten::index_copy", kinds=("index_copy",))


@lower("index_reduce.default")
def index_reduce(self: ET, dim: int, index: ET, source: ET, reduce: str, *, include_self: bool = True) -> ET:
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise Unsupported(f"index_reduce {reduce!r}")
    # Without self, PyTorch first fills the named positions with the
    # reduction's identity (index_fill_), whose own check comes first; it
    # accepts negative indices, which the reduction then rejects.
    kinds = ("out_of_range_in_self",) if include_self else ("out_of_bounds", "out_of_range_in_self")
    return _index_scatter(
        self, dim, index, source, reduce, include_self, op="aten::index_reduce", kinds=kinds
    )


@lower("index_fill.int_Scalar", "index_fill.int_Tensor")
def index_fill(self: ET, dim: int, index: ET, value: Any) -> ET:
    need_tensor(self, index)
    if len(index.shape) > 1 or index.dtype not in ("i64", "i32"):
        raise Unsupported("index that is not a vector of integers")
    if len(self.shape) == 0:
        return index_fill(self.reshape([1]), 0, index, value).reshape([])
    dim = axis(dim, len(self.shape))
    n = self.shape[dim]
    m = math.prod(index.shape)
    idx = index.reshape([m]).cast("i64")
    idx = idx.binary("lt", 0).where_(idx.binary("add", n), idx)
    chosen = _one_hot(idx, n).cast("i32").reduce("max", [0], False).binary("gt", 0)  # [n]
    shape = [1] * len(self.shape)
    shape[dim] = n
    fill = value.cast(self.dtype) if isinstance(value, ET) else _scalar(value, self.dtype)
    out = chosen.reshape(shape).where_(fill, self).cast(self.dtype)
    check_bounds("aten::index_fill", "out_of_bounds", [index], [n], [dim])
    return out


# ---- flat put / take ------------------------------------------------------------


@lower("put.default")
def put(self: ET, index: ET, source: ET, accumulate: bool = False) -> ET:
    need_tensor(self, index, source)
    total, m = math.prod(self.shape), math.prod(index.shape)
    if m == 0:
        return self
    if total == 0 or math.prod(source.shape) != m:
        raise Unsupported("put into an empty tensor")
    if not accumulate and m > _SERIAL_LIMIT:
        raise Unsupported("put large enough for PyTorch to run in threads")
    flat = _scatter(
        self.reshape([total]), 0, index.reshape([m]), source.reshape([m]), "sum" if accumulate else "replace"
    )
    check_bounds("aten::put", "take", [index], [total], [0])
    return flat.reshape(list(self.shape))


@lower("take.default")
def take(self: ET, index: ET) -> ET:
    need_tensor(self, index)
    total, m = math.prod(self.shape), math.prod(index.shape)
    if m == 0:
        return eng().full(0.0, list(index.shape), self.dtype)
    if total == 0:
        raise Unsupported("take from an empty tensor")
    out = index_select(self.reshape([total]), 0, index.reshape([m])).reshape(list(index.shape))
    check_bounds("aten::take", "take", [index], [total], [0])
    return out


# ---- advanced indexing ----------------------------------------------------------


def _linear_index(self: ET, indices: list[Any]) -> tuple[list[int], list[int], ET, list[int], int, list[ET]]:
    """The indexed axes, the others, the flat position [b] within the
    indexed axes (negatives wrapped), the broadcast index shape, the
    product of the indexed sizes, and each index as given, broadcast to [b]
    (what the bounds check reads)."""
    if len(indices) > len(self.shape):
        raise Unsupported("too many indices")
    axes = [a for a, i in enumerate(indices) if i is not None]
    if not axes:
        raise Unsupported("no index tensors")
    for a in axes:
        i = indices[a]
        if not isinstance(i, ET) or i.dtype not in ("i64", "i32"):
            raise Unsupported("bool or non-tensor indices")  # bool masks have data-dependent shapes
    shape = functools.reduce(broadcast_batch, [list(indices[a].shape) for a in axes])
    b = math.prod(shape)
    flat = None
    span = 1
    given = []
    for a in reversed(axes):
        n = self.shape[a]
        i = indices[a].cast("i64").expand(shape).reshape([b])
        given.insert(0, i)
        i = i.binary("lt", 0).where_(i.binary("add", n), i)
        term = i.binary("mul", span) if span != 1 else i
        flat = term if flat is None else flat.binary("add", term)
        span *= n
    rest = [a for a in range(len(self.shape)) if a not in axes]
    return axes, rest, flat, shape, span, given


def _check_advanced(op: str, self: ET, axes: list[int], given: list[ET]) -> None:
    """PyTorch's check of advanced indices: the first element out of range
    in any of them, named by the index's place among the index tensors."""
    check_bounds(op, "out_of_bounds", given, [self.shape[a] for a in axes], list(range(len(axes))))


def _adjacent(axes: list[int]) -> bool:
    return axes == list(range(axes[0], axes[0] + len(axes)))


@lower("index.Tensor")
def index(self: ET, indices: list[Any]) -> ET:
    """x[i, :, j]: the indexed axes flattened into one, read with a row gather;
    the index's shape replaces the indexed axes in place when they are
    adjacent, else leads (NumPy's rule)."""
    need_tensor(self)
    axes, rest, flat, shape, span, given = _linear_index(self, list(indices))
    b = math.prod(shape)
    rest_shape = [self.shape[a] for a in rest]
    if b == 0 or math.prod(rest_shape) == 0:
        lead = axes[0] if _adjacent(axes) else 0
        before = [self.shape[a] for a in rest if a < lead] if lead else []
        after = [self.shape[a] for a in rest if not (lead and a < lead)]
        return eng().full(0.0, before + shape + after, self.dtype)
    if span == 0:
        raise Unsupported("indexing an empty axis")
    x = self.permute(rest + axes).reshape(rest_shape + [span])
    picked = index_select(x, len(rest), flat)  # [rest..., b]
    picked = picked.reshape(rest_shape + shape)
    k = len(shape)
    lead = axes[0] if _adjacent(axes) else 0
    # rest axes before `lead`, then the index axes, then the remaining rest axes
    before = [r for r in range(len(rest)) if rest[r] < lead] if lead else []
    after = [r for r in range(len(rest)) if r not in before]
    perm = before + [len(rest) + j for j in range(k)] + after
    _check_advanced("aten::index", self, axes, given)
    return picked.permute(perm)


@lower("index_put.default")
def index_put(self: ET, indices: list[Any], values: Any, accumulate: bool = False) -> ET:
    """x[i, j] = v (or +=): a single bool mask with values the same for every
    selected element (one value, or one row: `x[mask] = row`) is a `where`;
    integer indices scatter into the indexed axes flattened into one."""
    need_tensor(self)
    indices = list(indices)
    if isinstance(values, ET) and values.dtype != self.dtype:
        values = values.cast(self.dtype)
    if len(indices) == 1 and isinstance(indices[0], ET) and indices[0].dtype == "bool" and not accumulate:
        mask = indices[0]
        tail = list(self.shape[len(mask.shape) :])
        if list(mask.shape) != list(self.shape[: len(mask.shape)]):
            raise Unsupported("bool-mask index_put with a mask of another shape")
        v = values
        if isinstance(v, ET):
            if math.prod(v.shape) == 1:
                v = v.reshape([])
            elif len(v.shape) == len(tail) + 1 and v.shape[0] == 1:
                v = v.reshape(list(v.shape[1:]))
            # self[mask] is [count] + tail: values that broadcast to the tail
            # alone are the same for every selected element.
            if len(v.shape) > len(tail) or any(
                a not in (1, b) for a, b in zip(reversed(v.shape), reversed(tail))
            ):
                raise Unsupported("bool-mask index_put with values per selected element")
        mask = mask.reshape(list(mask.shape) + [1] * len(tail))
        return mask.where_(v, self).cast(self.dtype)
    axes, rest, flat, shape, span, given = _linear_index(self, indices)
    b = math.prod(shape)
    if b == 0:
        return self
    if not accumulate and b * max(1, math.prod(self.shape[a] for a in rest)) > _SERIAL_LIMIT:
        raise Unsupported("index_put large enough for PyTorch to run in threads")
    rest_shape = [self.shape[a] for a in rest]
    k = len(shape)
    lead = axes[0] if _adjacent(axes) else 0
    before = [a for a in rest if a < lead] if lead else []
    after = [a for a in rest if a not in before]
    # The shape of self[indices], which values broadcast to.
    result_shape = [self.shape[a] for a in before] + shape + [self.shape[a] for a in after]
    v = (
        values
        if isinstance(values, ET)
        else eng().full(float(values) if is_float(self) else values, [], self.dtype)
    )
    if len(v.shape) > len(result_shape):
        raise Unsupported("values of a higher rank")
    v = v.expand(result_shape)
    # values as [rest..., b] in self's rest order
    nb = len(before)
    perm = list(range(nb)) + list(range(nb + k, len(result_shape))) + list(range(nb, nb + k))
    v = v.permute(perm).reshape(rest_shape + [b])
    x = self.permute(rest + axes).reshape(rest_shape + [span])
    idx = flat.reshape([1] * len(rest) + [b]).expand(rest_shape + [b])
    out = _scatter(x, len(rest), idx, v, "sum" if accumulate else "replace")
    out = out.reshape(rest_shape + [self.shape[a] for a in axes])
    order = rest + axes
    inverse = [order.index(a) for a in range(len(self.shape))]
    _check_advanced("aten::index_put", self, axes, given)
    return out.permute(inverse)
