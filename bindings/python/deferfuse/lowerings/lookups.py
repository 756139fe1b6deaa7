"""Lookups as masked sums.

The engine has no gather, so a lookup is written as a masked sum: for every
candidate position, `where(index == position, value, 0)`, summed over the
positions. It is exact (one term is non-zero; `where` keeps an infinite or
NaN table entry out of the others), but costs as many elements as lookups x
candidates, so larger ones (`ONE_HOT_LIMIT`) stay on the CPU.
"""

from __future__ import annotations

import math

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, lower


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


@lower("index_select.default")
def index_select(self: ET, dim: int, index: ET) -> ET:
    if len(self.shape) == 0 or len(index.shape) > 1 or index.dtype not in ("i64", "i32") or math.prod(self.shape) == 0:
        raise Unsupported("index_select of a zero-dimensional or empty tensor")
    dim %= len(self.shape)
    n, m = self.shape[dim], math.prod(index.shape)
    rest = math.prod(self.shape) // n
    _check_size(m, n, rest)
    idx = index.reshape([m]).cast("i64")
    idx = idx.binary("lt", 0).where_(idx.binary("add", n), idx)
    x = _move_last(self, dim)  # [..., n]
    mask = _one_hot(idx, n)  # [m, n]
    picked = mask.where_(x.reshape(list(x.shape[:-1]) + [1, n]), eng().full(0.0, [], self.dtype)).reduce("sum", [-1], False)
    return _move_back(picked.cast(self.dtype), dim)


@lower("embedding.default")
def embedding(weight: ET, indices: ET, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False) -> ET:
    if len(weight.shape) != 2:
        raise Unsupported("embedding with a table that is not a matrix")
    flat = index_select(weight, 0, indices.reshape([math.prod(indices.shape)]))
    return flat.reshape(list(indices.shape) + [weight.shape[1]])


@lower("embedding_dense_backward.default")
def embedding_dense_backward(grad_output: ET, indices: ET, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> ET:
    if scale_grad_by_freq:
        raise Unsupported("scale_grad_by_freq")
    t = math.prod(indices.shape)
    d = grad_output.shape[-1]
    _check_size(t, num_weights, d)
    idx = indices.reshape([t]).cast("i64")
    g = grad_output.reshape([t, d])
    keep = idx.binary("ne", padding_idx) if padding_idx >= 0 else None
    mask = _one_hot(idx, num_weights)  # [t, V]
    if keep is not None:
        mask = mask.binary("logical_and", keep.reshape([t, 1]))
    # grad_weight[v, :] = sum over tokens with index v of g[token, :]
    contrib = mask.reshape([t, num_weights, 1]).where_(g.reshape([t, 1, d]), eng().full(0.0, [], g.dtype))
    return contrib.reduce("sum", [0], False)


@lower("gather.default")
def gather(self: ET, dim: int, index: ET, *, sparse_grad: bool = False) -> ET:
    if len(self.shape) == 0 or len(index.shape) != len(self.shape) or math.prod(index.shape) == 0:
        raise Unsupported("gather of zero-dimensional or empty tensors")
    dim %= len(self.shape)
    n = self.shape[dim]
    _check_size(math.prod(index.shape), n)
    x = self
    for axis, (size, want) in enumerate(zip(self.shape, index.shape)):
        if axis != dim and want < size:
            x = x.slice(axis, 0, want, 1)
    x = _move_last(x, dim)  # [..., n]
    idx = _move_last(index.cast("i64"), dim)  # [..., m]
    mask = _one_hot(idx, n)  # [..., m, n]
    picked = mask.where_(x.reshape(list(x.shape[:-1]) + [1, n]), eng().full(0.0, [], self.dtype)).reduce("sum", [-1], False)
    return _move_back(picked.cast(self.dtype), dim)
