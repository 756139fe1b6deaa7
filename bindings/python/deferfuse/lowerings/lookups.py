"""Lookups: row gathers, and masked sums for the rest.

Whole rows along one dimension (`index_select`, `embedding` and its
gradient) are the engine's row gather and scatter-add, which cost what they
copy; so is `gather`, element by element, as rows of one element of the
flattened tensor. `embedding_bag` is written as a masked sum: for every
candidate position, `where(index == position, value, 0)`, summed over the
positions. It is exact (one term is non-zero; `where` keeps an infinite
or NaN table entry out of the others), but costs as many elements as
lookups x candidates, so larger ones (`ONE_HOT_LIMIT`) stay on the CPU.
"""

from __future__ import annotations

import math

from .._engine import Tensor as ET
from ._registry import Unsupported, axis, check_bounds, eng, lower

ONE_HOT_LIMIT = 1 << 22


def _one_hot(index: ET, n: int) -> ET:
    """`index[..., None] == arange(n)`: a bool mask with a trailing axis of n."""
    return index.reshape(list(index.shape) + [1]).binary("eq", eng().arange(0, n, 1, "i64"))


def _check_size(lookups: int, candidates: int, rest: int = 1) -> None:
    if lookups * candidates * rest > ONE_HOT_LIMIT:
        raise Unsupported("a lookup too large for a masked sum")


def _move_last(x: ET, dim: int) -> ET:
    rank = len(x.shape)
    perm = [a for a in range(rank) if a != dim] + [dim]
    return x if dim == rank - 1 else x.permute(perm)


def _move_back(x: ET, dim: int) -> ET:
    rank = len(x.shape)
    if dim == rank - 1:
        return x
    perm = list(range(rank - 1))
    perm.insert(dim, rank - 1)
    return x.permute(perm)


def index_select(self: ET, dim: int, index: ET) -> ET:
    """`self.index_select(dim, index)` without a bounds check, for lowerings
    whose indices are their own or checked already; negatives count from
    the end."""
    if (
        len(self.shape) == 0
        or len(index.shape) > 1
        or index.dtype not in ("i64", "i32")
        or math.prod(self.shape) == 0
    ):
        raise Unsupported("index_select of a zero-dimensional or empty tensor")
    rank = len(self.shape)
    dim = axis(dim, rank)
    n, m = self.shape[dim], math.prod(index.shape)
    idx = index.reshape([m]).cast("i64")
    idx = idx.binary("lt", 0).where_(idx.binary("add", n), idx)
    # The gathered dimension goes first and comes back after.
    front = [dim] + [a for a in range(rank) if a != dim]
    x = self if dim == 0 else self.permute(front)
    picked = x.gather_rows(idx)  # [m, ...the other dimensions]
    if dim == 0:
        return picked
    return picked.permute(list(range(1, dim + 1)) + [0] + list(range(dim + 1, rank)))


@lower("index_select.default")
def index_select_checked(self: ET, dim: int, index: ET) -> ET:
    out = index_select(self, dim, index)
    d = dim % len(self.shape)
    # PyTorch's CPU kernel takes a faster path, with its own message, for
    # dimension 1; both reject negative indices.
    kind = "indices_out_of_data" if d == 1 else "out_of_range_in_self"
    check_bounds("aten::index_select", kind, [index], [self.shape[d]], [d])
    return out


def embedding_rows(weight: ET, indices: ET) -> ET:
    """The rows of the table that the indices name (unchecked)."""
    if len(weight.shape) != 2:
        raise Unsupported("embedding with a table that is not a matrix")
    flat = index_select(weight, 0, indices.reshape([math.prod(indices.shape)]))
    return flat.reshape(list(indices.shape) + [weight.shape[1]])


@lower("embedding.default")
def embedding(
    weight: ET, indices: ET, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False
) -> ET:
    out = embedding_rows(weight, indices)
    check_bounds("aten::embedding", "out_of_range_in_self", [indices], [weight.shape[0]], [0])
    return out


@lower("embedding_dense_backward.default")
def embedding_dense_backward(
    grad_output: ET, indices: ET, num_weights: int, padding_idx: int, scale_grad_by_freq: bool
) -> ET:
    if scale_grad_by_freq:
        raise Unsupported("scale_grad_by_freq")
    t = math.prod(indices.shape)
    d = grad_output.shape[-1]
    idx = indices.reshape([t]).cast("i64")
    g = grad_output.reshape([t, d])
    if padding_idx >= 0:
        # The padding row gets no gradient.
        keep = idx.binary("ne", padding_idx).reshape([t, 1])
        g = keep.where_(g, eng().full(0.0, [], g.dtype))
    # grad_weight[v, :] = sum over tokens with index v of g[token, :]
    return g.scatter_add_rows(idx, num_weights)


@lower("gather.default")
def gather(self: ET, dim: int, index: ET, *, sparse_grad: bool = False) -> ET:
    """`out[i] = self[i with i[dim] replaced by index[i]]`: the linear position
    of each element, gathered from the flattened tensor as rows of one
    element, so it costs what it copies whatever the size of `dim`."""
    rank = len(self.shape)
    if index.dtype not in ("i64", "i32") or not -max(rank, 1) <= dim < max(rank, 1):
        raise Unsupported("gather with a non-integer index or a dimension out of range")  # PyTorch's error
    if math.prod(index.shape) == 0 and len(index.shape) >= rank:
        return eng().full(0, list(index.shape), self.dtype)
    if rank == 0 and len(index.shape) <= 1:
        # A scalar gathers as a one-element vector.
        out = gather(self.reshape([1]), 0, index.reshape([1]))
        return out.reshape(list(index.shape))
    if len(index.shape) != rank:
        raise Unsupported("gather with an index of another rank")  # PyTorch's error, on the CPU
    dim = axis(dim, rank)
    if any(want > size for a, (size, want) in enumerate(zip(self.shape, index.shape)) if a != dim):
        raise Unsupported("gather with an index larger than self")  # PyTorch's error, on the CPU
    strides = [math.prod(self.shape[a + 1 :]) for a in range(rank)]
    position = index.cast("i64").binary("mul", strides[dim])
    for a, size in enumerate(index.shape):
        if a != dim and size > 1:
            along = eng().arange(0, size, 1, "i64").reshape([size if b == a else 1 for b in range(rank)])
            position = position.binary("add", along.binary("mul", strides[a]))
    # An index out of range reads a neighbour here; the check below raises for it.
    flat = self.reshape([math.prod(self.shape), 1])
    picked = flat.gather_rows(position.reshape([math.prod(index.shape)])).reshape(list(index.shape))
    check_bounds("aten::gather", "gather_out_of_bounds", [index], [self.shape[dim]], [dim])
    return picked


def _bag_members(indices: ET, offsets: ET | None, include_last_offset: bool) -> tuple[ET, ET, int]:
    """[B, T] bool masks of the tokens in each bag: bag b runs from offsets[b]
    to the next bag's start, the last bag to the end. PyTorch requires
    include_last_offset's last offset to be len(indices); when it is not, its
    CPU paths disagree with each other (the max and the mean's count run to
    the end, some sums stop at the last offset): the first mask, for sums,
    stops there, the second runs to the end. A 2-d input has one bag per row."""
    t = math.prod(indices.shape)
    if len(indices.shape) == 2:
        b, length = indices.shape
        if not length:
            raise Unsupported("embedding_bag of empty rows")
        rows = eng().arange(0, t, 1, "f32").binary("mul", 1.0 / length).unary("floor")
        member = rows.reshape([1, t]).binary("eq", eng().arange(0, b, 1, "f32").reshape([b, 1]))
        return member, member, b
    if offsets is None or len(offsets.shape) != 1:
        raise Unsupported("embedding_bag without 1-d offsets")
    b = offsets.shape[0] - (1 if include_last_offset else 0)
    if b <= 0:
        raise Unsupported("embedding_bag without bags")
    off = offsets.cast("i64")
    starts = off.slice(0, 0, b, 1)
    pos = eng().arange(0, t, 1, "i64").reshape([1, t])
    after = pos.binary("ge", starts.reshape([b, 1]))

    def before(ends: ET) -> ET:
        return after.binary("logical_and", pos.binary("lt", ends.reshape([b, 1])))

    to_end = before(eng().cat([off.slice(0, 1, b, 1), eng().full(float(t), [1], "i64")], 0))
    summed = before(off.slice(0, 1, b + 1, 1)) if include_last_offset else to_end
    return summed, to_end, b


def _bag_of_each_token(member: ET, b: int) -> ET:
    """[T] i64 from the [B, T] membership masks: the bag each token is in."""
    return (
        member.cast("i64")
        .binary("mul", eng().arange(0, b, 1, "i64").reshape([b, 1]))
        .reduce("sum", [0], False)
    )


@lower("_embedding_bag_forward_only.default")
def embedding_bag_forward_only(
    weight: ET,
    indices: ET,
    offsets: ET,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: ET | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[ET, ET, ET, ET]:
    """Bags as masked reductions over [B, T, D]: sum (times the per-sample
    weights), mean over the non-padding tokens, or max; empty bags give 0.
    The other three outputs (only backward reads them) have PyTorch's shapes."""
    if len(weight.shape) != 2 or weight.dtype not in ("f32", "bf16", "f16"):
        raise Unsupported("embedding_bag of a non-float table")
    if weight.dtype in ("bf16", "f16"):
        # Accumulate in float, round once.
        psw = per_sample_weights.cast("f32") if per_sample_weights is not None else None
        out, *rest = embedding_bag_forward_only(
            weight.cast("f32"),
            indices,
            offsets,
            scale_grad_by_freq,
            mode,
            sparse,
            psw,
            include_last_offset,
            padding_idx,
        )
        return (out.cast(weight.dtype), *rest)
    v, d = weight.shape
    t = math.prod(indices.shape)
    summed, member, b = _bag_members(indices, offsets, include_last_offset)
    if t == 0 or v == 0:
        raise Unsupported("embedding_bag of no tokens")
    _check_size(b * t, d)
    flat = indices.reshape([t]).cast("i64")
    rows = embedding_rows(weight, flat)  # [T, D]
    valid, valid_sum = member, summed
    if padding_idx is not None and padding_idx >= 0:
        real = flat.binary("ne", padding_idx).reshape([1, t])
        valid, valid_sum = valid.binary("logical_and", real), valid_sum.binary("logical_and", real)
    count = valid.cast("i64").reduce("sum", [1], False)  # [B]
    keep = valid.reshape([b, t, 1])
    if mode == 2:
        from .scatter import masked_extreme

        picked = masked_extreme(keep, rows.reshape([1, t, d]), "max")  # [B, D]; empty bags are replaced below
        out = count.binary("gt", 0).reshape([b, 1]).where_(picked, 0.0).cast(weight.dtype)
        # max_indices: the table row of the first maximum (what backward reads)
        hit = keep.binary("logical_and", rows.reshape([1, t, d]).binary("eq", picked.reshape([b, 1, d])))
        first = hit.where_(eng().arange(0, t, 1, "i64").reshape([1, t, 1]), t).reduce(
            "min", [1], False
        )  # [B, D]
        chosen = _one_hot(first, t).where_(flat.reshape([1, 1, t]), 0).reduce("sum", [-1], False)
        max_indices = count.binary("gt", 0).reshape([b, 1]).where_(chosen, 0).cast("i64")
    else:
        values = rows
        if per_sample_weights is not None:
            if mode != 0:
                raise Unsupported("per_sample_weights beyond mode sum")
            values = rows.binary("mul", per_sample_weights.reshape([t, 1]))
        zero = eng().full(0.0, [], weight.dtype)
        total = valid_sum.reshape([b, t, 1]).where_(values.reshape([1, t, d]), zero).reduce("sum", [1], False)
        if mode == 1:
            total = total.binary("div", count.binary("maximum", 1).cast(weight.dtype).reshape([b, 1]))
        out = total.cast(weight.dtype)
        max_indices = count if mode == 1 else eng().full(0.0, [b], "i64")
    if mode == 0 and per_sample_weights is None:
        offset2bag = eng().full(0.0, [0], "i64")
    else:  # the bag of each token
        offset2bag = _bag_of_each_token(member, b)
    bag_size = count if mode != 0 else eng().full(0.0, [b], "i64")
    # PyTorch's CPU kernel words it one way when it sums or averages without
    # a padding index, another way on its other paths.
    padded = padding_idx is not None and padding_idx >= 0
    kind = "embedding_bag" if mode in (0, 1) and not padded else "embedding_bag_idx"
    check_bounds("aten::embedding_bag", kind, [flat], [v], [0])
    return out, offset2bag, bag_size, max_indices


@lower("embedding_renorm.default")
def embedding_renorm(self: ET, indices: ET, max_norm: float, norm_type: float) -> ET:
    """Rows the indices name, scaled to max_norm / (norm + 1e-7) where their
    norm exceeds max_norm (PyTorch's formula)."""
    if len(self.shape) != 2 or self.dtype not in ("f32", "bf16", "f16"):
        raise Unsupported("embedding_renorm of a non-float or non-matrix table")
    v = self.shape[0]
    t = math.prod(indices.shape)
    if t == 0:
        return self
    _check_size(t, v)
    named = (
        _one_hot(indices.reshape([t]).cast("i64"), v).cast("i32").reduce("max", [0], False).binary("gt", 0)
    )  # [V]
    x = self.cast("f32")
    from .reductions import vector_norm  # (reductions imports this module)

    norm = vector_norm(x, norm_type, [1])
    scale = norm.binary("add", 1e-7).unary("reciprocal").binary("mul", float(max_norm))
    shrink = named.binary("logical_and", norm.binary("gt", float(max_norm)))
    return shrink.reshape([v, 1]).where_(x.binary("mul", scale.reshape([v, 1])), x).cast(self.dtype)


@lower("_embedding_bag.default")
def embedding_bag(
    weight: ET,
    indices: ET,
    offsets: ET,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: ET | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[ET, ET, ET, ET]:
    """The training form of the bag lookup: the forward-only lowering's
    results, with every token's bag (`offset2bag`) whatever the mode, which
    the backward reads."""
    out, _, bag_size, max_indices = embedding_bag_forward_only(
        weight,
        indices,
        offsets,
        scale_grad_by_freq,
        mode,
        sparse,
        per_sample_weights,
        include_last_offset,
        padding_idx,
    )
    _, member, b = _bag_members(indices, offsets, include_last_offset)
    return out, _bag_of_each_token(member, b), bag_size, max_indices


@lower("_embedding_bag_backward.default")
def embedding_bag_backward(
    grad: ET,
    indices: ET,
    offsets: ET,
    offset2bag: ET,
    bag_size: ET,
    maximum_indices: ET,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: ET | None,
    padding_idx: int = -1,
) -> ET:
    """The table's gradient for sum and mean bags: each token's bag gradient
    (scaled by its per-sample weight, or by 1 / the bag's size for a mean, as
    PyTorch's CPU kernel scales), summed into the token's row."""
    t = math.prod(indices.shape)
    if sparse or scale_grad_by_freq or mode not in (0, 1) or len(grad.shape) != 2 or t == 0:
        raise Unsupported("embedding_bag backward beyond dense sum and mean bags")
    if list(offset2bag.shape) != [t]:
        raise Unsupported("a bag per token from PyTorch's own forward")
    b, d = grad.shape
    _check_size(t, b, d)
    g = grad
    if mode == 1:
        # Empty bags have no tokens to read their (otherwise infinite) scale.
        size = bag_size.binary("maximum", 1).cast(grad.dtype)
        g = g.binary("mul", eng().full(1.0, [], grad.dtype).binary("div", size).reshape([b, 1]))
    mask = _one_hot(offset2bag.cast("i64"), b)  # [T, B]
    rows = (
        mask.reshape([t, b, 1])
        .where_(g.reshape([1, b, d]), eng().full(0.0, [], g.dtype))
        .reduce("sum", [1], False)
    )
    if per_sample_weights is not None:
        rows = rows.binary("mul", per_sample_weights.cast(g.dtype).reshape([t, 1]))
    return embedding_dense_backward(rows, indices.reshape([t]), num_weights, padding_idx, False)
