"""Views as engine ops. A view is (sizes, strides, offset) over the row-major
elements of its root, exactly as PyTorch lays it out. Reading one lowers that
layout to engine ops on the flattened root: pad to a whole number of rows,
reshape into a "box" grid whose dimensions have the view's strides, slice the
box, permute into the view's order and expand broadcast dimensions. Writing
scatters the box back with a mask. Layouts that do not fit a box grid
(overlapping windows, strides that do not divide each other) are a gather:
the root element of each view element, `offset + sum(i_k * stride_k)`, is
computed on the engine and its rows read by a row gather. A write through
such a view keeps, for each root element, the last view element written to
it in memory order, as CPU's copy does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import _engine, _state

Spec = tuple[tuple[int, ...], tuple[int, ...], int]


@dataclass(frozen=True)
class Plan:
    padded: int  # elements of the flattened root after zero padding
    grid: list[int]  # the box grid the flat root is reshaped into
    starts: list[int]  # where the box starts along each grid dimension
    lengths: list[int]  # the box's length along each grid dimension
    box_shape: list[int]  # the box without the grid's inner remainder dimension
    perm: list[int]  # from stride order to the view's order of real dims
    real_shape: list[int]  # the view's sizes with broadcast dims set to 1
    sizes: list[int]
    broadcast: bool


def plan(numel: int, spec: Spec) -> Plan | None:
    sizes, strides, offset = spec
    real = [i for i, n in enumerate(sizes) if n > 1 and strides[i] != 0]
    order = sorted(real, key=lambda i: -strides[i])
    ss = [strides[i] for i in order]
    if len(set(ss)) != len(ss) or any(s < 0 for s in ss):
        return None
    end = offset + sum((sizes[i] - 1) * strides[i] for i in real) + 1
    if any(n == 0 for n in sizes):
        return None
    outer = ss[0] if ss else 1
    padded = max(numel, end)
    padded = -(-padded // outer) * outer
    grid = [padded // outer]
    for a, b in zip(ss, ss[1:]):
        if a % b:
            return None
        grid.append(a // b)
    inner = ss[-1] if ss else 1
    if ss:
        grid.append(inner)
    else:
        grid = [padded]
    starts, o = [], offset
    for s in ss:
        starts.append(o // s)
        o %= s
    starts.append(o)
    lengths = [sizes[i] for i in order] + [1]
    if not ss:
        starts, lengths = [offset], [1]
    if any(a + n > g for a, n, g in zip(starts, lengths, grid)):
        return None
    perm = [order.index(i) for i in real]
    real_shape = [sizes[i] if i in real else 1 for i in range(len(sizes))]
    broadcast = any(n > 1 and strides[i] == 0 for i, n in enumerate(sizes))
    return Plan(
        padded, grid, starts, lengths, [sizes[i] for i in order], perm, real_shape, list(sizes), broadcast
    )


def _flat_padded(root: _engine.Tensor, padded: int) -> _engine.Tensor:
    numel = math.prod(root.shape)
    flat = root.reshape([numel])
    if padded > numel:
        pad = _state.engine().full(0.0, [padded - numel], root.dtype)
        flat = _state.engine().cat([flat, pad], 0)
    return flat


def _is_dense(spec: Spec) -> bool:
    """The view is one row-major run of its root's elements (at any offset)."""
    sizes, strides, _ = spec
    expected, acc = [], 1
    for n in reversed(sizes):
        expected.append(acc)
        acc *= max(n, 1)
    return all(n == 1 or s == e for n, s, e in zip(sizes, strides, reversed(expected)))


def _is_reshape(numel: int, spec: Spec) -> bool:
    return spec[2] == 0 and math.prod(spec[0]) == numel and _is_dense(spec)


def read(root: _engine.Tensor, spec: Spec) -> _engine.Tensor:
    numel = math.prod(root.shape)
    if any(n == 0 for n in spec[0]):
        return _state.engine().full(0.0, list(spec[0]), root.dtype)
    if _is_reshape(numel, spec):
        return root.reshape(list(spec[0]))
    if _is_dense(spec) and spec[2] + math.prod(spec[0]) <= numel:
        # A run of the flat root (a bucket or flat-parameter view), whatever
        # the offset's alignment to the view's rows.
        offset, n = spec[2], math.prod(spec[0])
        return root.reshape([numel]).slice(0, offset, offset + n, 1).reshape(list(spec[0]))
    p = plan(numel, spec)
    if p is None:
        return _gather_read(root, spec)
    sizes, _, offset = spec
    if p.grid == [p.padded] or len(p.grid) == 1:
        v = _flat_padded(root, p.padded).slice(0, offset, offset + 1, 1)
        return v.reshape([1] * len(sizes)).expand(list(sizes))
    v = _flat_padded(root, p.padded).reshape(p.grid)
    for axis, (a, n, g) in enumerate(zip(p.starts, p.lengths, p.grid)):
        if a != 0 or n != g:
            v = v.slice(axis, a, a + n, 1)
    v = v.reshape(p.box_shape)
    if p.perm != sorted(p.perm):
        v = v.permute(p.perm)
    v = v.reshape(p.real_shape)
    if p.broadcast:
        v = v.expand(p.sizes)
    return v


def write(root: _engine.Tensor, spec: Spec, value: _engine.Tensor) -> _engine.Tensor:
    """The root after writing `value` (of the view's shape) through the view."""
    shape = list(root.shape)
    numel = math.prod(shape)
    if _is_reshape(numel, spec):
        return value.cast(root.dtype).reshape(shape)
    if _is_dense(spec) and spec[2] + math.prod(spec[0]) <= numel:
        return _scatter_flat(root, spec[2], value.reshape([math.prod(spec[0])]))
    p = plan(numel, spec)
    if p is None or p.broadcast:
        if p is not None and p.broadcast:
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers to a single "
                "memory location. Please clone() the tensor before performing the operation."
            )
        return _gather_write(root, spec, value)
    eng = _state.engine()
    if len(p.grid) == 1:
        # One element of the flat root.
        return _scatter_flat(root, spec[2], value.reshape([1]))
    inverse = [p.perm.index(i) for i in range(len(p.perm))]
    box = value.reshape([n for n in p.real_shape if n > 1] or [1])
    if p.perm != sorted(p.perm):
        box = box.permute(inverse)
    box = box.reshape(p.lengths)
    # Embed the box into the grid: zeros around it, and a mask of where it is.
    mask = eng.full(1.0, p.lengths, "bool")
    for axis, (a, n, g) in enumerate(zip(p.starts, p.lengths, p.grid)):
        if n == g:
            continue
        parts_v, parts_m = [], []
        before, after = a, g - a - n
        for width, piece_v, piece_m in ((before, None, None), (None, box, mask), (after, None, None)):
            if piece_v is not None:
                parts_v.append(piece_v)
                parts_m.append(piece_m)
            elif width:
                pad_shape = list(box.shape)
                pad_shape[axis] = width
                parts_v.append(eng.full(0.0, pad_shape, box.dtype))
                parts_m.append(eng.full(0.0, pad_shape, "bool"))
        box, mask = eng.cat(parts_v, axis), eng.cat(parts_m, axis)
    grid_root = _flat_padded(root, p.padded).reshape(p.grid)
    merged = mask.where_(box.cast(root.dtype), grid_root)
    return merged.reshape([p.padded]).slice(0, 0, numel, 1).reshape(shape)


def _scatter_flat(root: _engine.Tensor, offset: int, flat_value: _engine.Tensor) -> _engine.Tensor:
    shape = list(root.shape)
    numel = math.prod(shape)
    flat = root.reshape([numel])
    n = flat_value.shape[0]
    parts = []
    if offset:
        parts.append(flat.slice(0, 0, offset, 1))
    parts.append(flat_value.cast(root.dtype))
    if offset + n < numel:
        parts.append(flat.slice(0, offset + n, numel, 1))
    return _state.engine().cat(parts, 0).reshape(shape)


def _gather_read(root: _engine.Tensor, spec: Spec) -> _engine.Tensor:
    """The view as a row gather of the flat root; the indices are computed on
    the engine from the geometry, so they cost no upload and fuse."""
    sizes, strides, offset = spec
    eng = _state.engine()
    index = eng.full(float(offset), [1] * len(sizes), "i64")
    for d, (n, stride) in enumerate(zip(sizes, strides)):
        if n > 1 and stride:
            shape = [1] * len(sizes)
            shape[d] = n
            index = index.binary("add", eng.arange(0, n * stride, stride, "i64").reshape(shape))
    count = math.prod(sizes)
    index = index.expand(list(sizes)).reshape([count])
    return root.reshape([math.prod(root.shape)]).gather_rows(index).reshape(list(sizes))


@functools.lru_cache(maxsize=64)
def _last_writers(numel: int, spec: Spec) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """For a write through the view: the order of its dimensions in memory
    (largest stride first, the order CPU's copy runs in), and for each root
    element whether the view covers it and which element, in that order,
    writes it last."""
    sizes, strides, offset = spec
    order = sorted(range(len(sizes)), key=lambda d: -strides[d])
    index = torch.arange(numel).as_strided(sizes, strides, offset).permute(order).reshape(-1)
    last = torch.full((numel,), -1, dtype=torch.int64)
    last.scatter_reduce_(0, index, torch.arange(index.numel()), "amax")
    return order, last.ge(0), last.clamp(min=0)


def _gather_write(root: _engine.Tensor, spec: Spec, value: _engine.Tensor) -> _engine.Tensor:
    from . import _handles

    shape = list(root.shape)
    numel = math.prod(shape)
    order, covered, source = _last_writers(numel, spec)
    flat = value.cast(root.dtype)
    if order != sorted(order):
        flat = flat.permute(order)
    flat = flat.reshape([math.prod(spec[0])])
    written = flat.gather_rows(_handles.from_cpu_value(source))
    kept = root.reshape([numel])
    return _handles.from_cpu_value(covered).where_(written, kept).reshape(shape)
