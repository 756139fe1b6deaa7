"""Sorting-based ops as compositions: sort, argsort, msort, nonzero, unique,
topk, kthvalue, median, nanmedian, mode.

The engine has no sort, so a sort along one axis of n elements is written as
ranks: element i goes to slot rank_i = the number of elements that come
before it (a [..., n, n] comparison, summed), and slot k is filled by a
masked sum over i of `where(rank_i == k, x_i, -0.0)`. The comparison is
PyTorch's order (NaN after every number ascending, before them descending,
NaNs equal to one another) with ties broken by position: the stable sort.

Exactly one term of each masked sum is the element itself and the others are
-0.0 (`x + -0.0` is x for every x, +0.0 included), so values are exact (but
for the sign of a zero: fused sums, which every mode runs, start at +0.0 as
PyTorch's own sums do; the values still compare equal). It costs n * n
elements per row, so larger inputs (`ONE_HOT_LIMIT`) stay on the CPU.

Host reads: nonzero and the unique family read their output size back (as
PyTorch's CUDA kernels do). `sort` is always stable (an unstable sort may
order equal keys any way; the stable order is one of them). Where PyTorch's
CPU kernels pick among equal keys their own way (std::nth_element in topk
and kthvalue, a row of NaN in nanmedian, NaN in mode) one bool is read back,
and the op runs on the CPU if it is set; the CPU fallback would read the
whole input, so the flag costs less.
"""

from __future__ import annotations

import math

from .._engine import Tensor as ET
from ._registry import Unsupported, axis, eng, is_float, lower
from .lookups import ONE_HOT_LIMIT, _move_back, _move_last


def _check_square(rows: int, n: int) -> None:
    if rows * n * n > ONE_HOT_LIMIT:
        raise Unsupported("a sort too large for an n x n comparison")


def _zero(dtype: str) -> float:
    """The neutral term of a masked sum: -0.0 keeps a -0.0 element's sign
    (where the sum does not start from +0.0 itself)."""
    return -0.0 if dtype in ("f32", "bf16", "f16") else 0.0


def _read_count(count: ET) -> int:
    """The one value these data-dependent shapes need on the host (PyTorch's
    CUDA kernels synchronize for it the same way); everything else stays on
    the engine."""
    from .._handles import to_cpu_value

    return int(to_cpu_value(count).item())


def _any_last(flags: ET) -> ET:
    return flags.cast("i32").reduce("max", [-1], False).cast("bool")


def _same(a: ET, b: ET) -> ET:
    """a == b with NaN equal to NaN (equal keys for the CPU's comparators)."""
    eq = a.binary("eq", b)
    if is_float(a):
        eq = eq.binary("logical_or", a.binary("ne", a).binary("logical_and", b.binary("ne", b)))
    return eq


def _refuse_if(flag: ET, why: str) -> None:
    """Reads one bool back to the host: any set element sends the op to the CPU."""
    if flag.dtype != "bool" or math.prod(flag.shape) == 0:
        raise Unsupported("internal: a flag must be a non-empty bool")
    if _read_count(_any_last(flag.reshape([math.prod(flag.shape)])).cast("i64")):
        raise Unsupported(why)


def _before(x: ET, descending: bool) -> ET:
    """[..., j, i]: element j comes before element i in the stable order of
    the last axis (x is [..., n])."""
    n = x.shape[-1]
    xj = x.reshape(list(x.shape[:-1]) + [n, 1])
    xi = x.reshape(list(x.shape[:-1]) + [1, n])
    strict = xj.binary("gt" if descending else "lt", xi)
    if is_float(x):
        nan_j, nan_i = xj.binary("ne", xj), xi.binary("ne", xi)
        # NaN is the largest value: first descending, last ascending.
        if descending:
            strict = strict.binary("logical_or", nan_j.binary("logical_and", nan_i.unary("logical_not")))
        else:
            strict = strict.binary("logical_or", nan_i.binary("logical_and", nan_j.unary("logical_not")))
    same = _same(xj, xi)
    pos = eng().arange(0, n, 1, "i64")
    earlier = pos.reshape([n, 1]).binary("lt", pos)  # [j, i]: j < i
    return strict.binary("logical_or", same.binary("logical_and", earlier))


def _ranks(x: ET, descending: bool) -> ET:
    """[..., n] i64: each element's slot in the stable sorted order."""
    return _before(x, descending).cast("i64").reduce("sum", [-2], False)


def _place(rank: ET, value: ET, slots: int) -> ET:
    """out[..., k] = value[..., i] for the i with rank[..., i] == k, for k in
    [0, slots) (a slot no rank names gets the neutral term)."""
    n = rank.shape[-1]
    wanted = eng().arange(0, slots, 1, "i64").reshape([slots, 1])
    mask = rank.reshape(list(rank.shape[:-1]) + [1, n]).binary("eq", wanted)  # [..., k, i]
    if value.dtype == "bool":
        return _place(rank, value.cast("i32"), slots).cast("bool")
    rows = value.reshape(list(value.shape[:-1]) + [1, n])
    picked = mask.where_(rows, eng().full(_zero(value.dtype), [], value.dtype)).reduce("sum", [-1], False)
    return picked.cast(value.dtype)


def _network_order(keys: ET) -> ET:
    """[n] i64: the positions of distinct f32 keys [n] in ascending order of
    key, by a bitonic sorting network. The keys are padded to a power of two
    with a key above every key (the padding sorts last, and is cut off);
    each compare-exchange stage pairs elements `j` apart as the two halves
    of a [rows, 2, j] reshape, and a row's direction alternates every
    `k / 2j` rows in the merge of blocks of `k`. It costs n log^2 n element
    steps, not the n^2 of ranks, so large permutations stay on the engine.
    Ties would be ordered arbitrarily: only for distinct keys."""
    n = keys.shape[0]
    size = 1 << max(0, (n - 1).bit_length())
    e = eng()
    if size > n:
        keys = e.cat([keys, e.full(float(1 << 25), [size - n], keys.dtype)], 0)
    position = e.arange(0, size, 1, "i64")
    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            rows, block = size // (2 * j), k // (2 * j)
            pairs = keys.reshape([rows, 2, j])
            at = position.reshape([rows, 2, j])
            a, b = pairs.slice(1, 0, 1, 1), pairs.slice(1, 1, 2, 1)
            swap = a.binary("gt", b)
            if 2 * block <= rows:
                # Rows in odd blocks of k run descending: swap the other way.
                up = e.full(0.0, [block], "bool")
                pattern = e.cat([up, up.unary("logical_not")], 0)
                down = pattern.reshape([1, 2 * block]).expand([rows // (2 * block), 2 * block])
                swap = down.reshape([rows, 1, 1]).where_(b.binary("gt", a), swap)
            pa, pb = at.slice(1, 0, 1, 1), at.slice(1, 1, 2, 1)
            keys = e.cat([swap.where_(b, a), swap.where_(a, b)], 1).reshape([size])
            position = e.cat([swap.where_(pb, pa), swap.where_(pa, pb)], 1).reshape([size])
            j //= 2
        k *= 2
    return position.slice(0, 0, n, 1)


def _sorted_last(x: ET, descending: bool) -> tuple[ET, ET]:
    """Stable sort of the last axis: (values, indices)."""
    n = x.shape[-1]
    _check_square(math.prod(x.shape[:-1]), n)
    rank = _ranks(x, descending)
    index = eng().arange(0, n, 1, "i64").expand(list(x.shape))
    return _place(rank, x, n), _place(rank, index, n)


UNSTABLE_SORT_STABLE_UPTO = 16  # PyTorch's unstable CPU sort sorts this many by insertion (unique)


def _sort(x: ET, dim: int, descending: bool, stable: bool) -> tuple[ET, ET]:
    if not isinstance(x, ET):
        raise Unsupported("sort of a non-tensor")
    if len(x.shape) == 0:
        if dim not in (0, -1):
            raise Unsupported("sort of a zero-dimensional tensor along another dim")
        return x, eng().full(0.0, [], "i64")
    dim = axis(dim, len(x.shape))
    if math.prod(x.shape) == 0:
        return x, eng().full(0.0, list(x.shape), "i64")
    moved = _move_last(x, dim)
    _check_square(math.prod(moved.shape[:-1]), moved.shape[-1])
    # Every sort is stable here. An unstable one may order equal keys any
    # way (PyTorch's CPU kernel does its own past 16 elements, CUDA's
    # another): the stable order is one of them, costs no host read, and is
    # the same in every mode.
    values, indices = _sorted_last(moved, descending)
    return _move_back(values, dim), _move_back(indices, dim)


@lower("sort.default")
def sort(self: ET, dim: int = -1, descending: bool = False) -> tuple[ET, ET]:
    return _sort(self, dim, descending, False)


@lower("sort.stable")
def sort_stable(
    self: ET, *, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> tuple[ET, ET]:
    return _sort(self, dim, descending, bool(stable))


# ---- nonzero ------------------------------------------------------------------


def _inclusive_count(flags: ET) -> ET:
    """[N] i64: how many of flags[0..=i] are set (a masked sum over j <= i)."""
    n = flags.shape[-1]
    pos = eng().arange(0, n, 1, "i64")
    upto = pos.reshape([n, 1]).binary("ge", pos)  # [i, j]: j <= i
    hits = upto.binary("logical_and", flags.reshape(list(flags.shape[:-1]) + [1, n]))
    return hits.cast("i64").reduce("sum", [-1], False)


def _coordinates(shape: list[int]) -> ET:
    """[N, ndim] i64: the row-major coordinates of every element."""
    cols = []
    for d, size in enumerate(shape):
        view = [1] * len(shape)
        view[d] = size
        cols.append(
            eng().arange(0, size, 1, "i64").reshape(view).expand(shape).reshape([math.prod(shape), 1])
        )
    return eng().cat(cols, 1)


def _nonzero_flags(x: ET) -> ET:
    """[N] bool: which elements (row-major) are nonzero; NaN is nonzero."""
    if not isinstance(x, ET):
        raise Unsupported("nonzero of a non-tensor")
    flat = x.reshape([math.prod(x.shape)])  # a zero-dimensional x is one element
    return flat if flat.dtype == "bool" else flat.binary("ne", 0)


def _nonzero_slots(x: ET, size: int, fill_value: int) -> ET:
    """[size, ndim]: the coordinates of the first `size` nonzeros in row-major
    order, then rows of fill_value."""
    flags = _nonzero_flags(x)
    n, ndim = flags.shape[0], len(x.shape)
    if n == 0 or size == 0 or ndim == 0:
        return eng().full(float(fill_value), [size, ndim], "i64")
    _check_square(1, n)
    if size * n * ndim > ONE_HOT_LIMIT:
        raise Unsupported("a nonzero too large for masked sums")
    slot = flags.where_(_inclusive_count(flags).binary("sub", 1), -1)  # [N]; -1 never matches
    coords = _coordinates(list(x.shape)).permute([1, 0])  # [ndim, N]
    picked = _place(slot.expand([ndim, n]), coords, size).permute([1, 0])  # [size, ndim]
    filled = eng().arange(0, size, 1, "i64").binary("lt", flags.cast("i64").reduce("sum", [0], False))
    return filled.reshape([size, 1]).where_(picked, eng().full(float(fill_value), [], "i64"))


@lower("nonzero_static.default")
def nonzero_static(self: ET, *, size: int, fill_value: int = -1) -> ET:
    return _nonzero_slots(self, size, fill_value)


@lower("nonzero.default")
def nonzero(self: ET) -> ET:
    """Reads the number of nonzeros back to the host (the output's size)."""
    flags = _nonzero_flags(self)
    if flags.shape[0] == 0:
        return eng().full(0.0, [0, len(self.shape)], "i64")
    if flags.shape[0] ** 2 > ONE_HOT_LIMIT:
        raise Unsupported("a nonzero too large for masked sums")
    count = _read_count(flags.cast("i64").reduce("sum", [0], False))
    return _nonzero_slots(self, count, -1)


# ---- unique -------------------------------------------------------------------
#
# Unique elements (or slices) without a sort: element i is a representative
# when no earlier element equals it, and its group's place in the sorted
# output is the number of representatives that sort before it. Equality is
# `==`, so NaNs are all distinct, as in PyTorch's CPU kernels, and NaNs sort
# last in input order (the CPU's order up to 16 elements). The number of
# groups, the output's size, is read back to the host.


def _as_rows(x: ET, dim: int | None) -> ET:
    """[n, m]: the slices along `dim` (or every element, m = 1)."""
    if dim is None:
        return x.reshape([math.prod(x.shape), 1])
    moved = x.permute([dim] + [a for a in range(len(x.shape)) if a != dim])
    return moved.reshape([x.shape[dim], math.prod(x.shape) // max(x.shape[dim], 1)])


def _pairs(rows: ET, op: str) -> ET:
    """[n, n, m]: `op` between slice j (first axis) and slice i (second)."""
    n, m = rows.shape
    return rows.reshape([n, 1, m]).binary(op, rows.reshape([1, n, m]))


def _all_last(flags: ET) -> ET:
    return flags.cast("i32").reduce("min", [-1], False).cast("bool")


def _lex_less(rows: ET) -> ET:
    """[n, n]: slice j < slice i lexicographically (at their first difference)."""
    n, m = rows.shape
    differ = _pairs(rows, "ne")
    cols = eng().arange(0, m, 1, "i64")
    first = differ.where_(cols, m).reduce("min", [-1], True)  # [n, n, 1]; m where equal
    less_there = _pairs(rows, "lt").binary("logical_and", cols.binary("eq", first))
    return _any_last(less_there)


def _scalar_less(rows: ET) -> ET:
    """[n, n]: element j sorts before element i, NaN last and NaNs by position
    (PyTorch's sorted unique keeps each NaN, in input order, after the numbers)."""
    values = rows.reshape([rows.shape[0]])
    return _before(values, False).binary(
        "logical_and", _pairs(rows, "eq").reshape([rows.shape[0]] * 2).unary("logical_not")
    )


def _groups(rows: ET, equal: ET, less: ET) -> tuple[ET, ET]:
    """(group of each slice [n] i64, representative flags [n] bool)."""
    n = rows.shape[0]
    pos = eng().arange(0, n, 1, "i64")
    earlier = pos.reshape([n, 1]).binary("lt", pos)  # [j, i]: j < i
    rep = _any_last(equal.binary("logical_and", earlier).permute([1, 0])).unary("logical_not")
    group = less.binary("logical_and", rep.reshape([n, 1])).cast("i64").reduce("sum", [0], False)
    return group, rep


def _gather_groups(rows: ET, group: ET, rep: ET, count: int) -> tuple[ET, ET]:
    """(the representatives in group order [count, m], the group sizes [count])."""
    n, m = rows.shape
    slot = rep.where_(group, -1)
    values = _place(slot.expand([m, n]), rows.permute([1, 0]), count).permute([1, 0])
    members = group.reshape([1, n]).binary("eq", eng().arange(0, count, 1, "i64").reshape([count, 1]))
    return values, members.cast("i64").reduce("sum", [1], False)


def _unique_rows(rows: ET, lexicographic: bool, nan_limit: int | None) -> tuple[ET, ET, ET]:
    """(unique slices, inverse [n], counts) of [n, m] slices in sorted order;
    reads the number of groups back to the host. With more than `nan_limit`
    NaNs (None: no limit) the op goes to the CPU instead, whose order among
    NaNs is its sort's own; the count read then says so (-1)."""
    n, m = rows.shape
    if n * n * max(m, 1) > ONE_HOT_LIMIT:
        raise Unsupported("a unique too large for pairwise comparisons")
    equal = _all_last(_pairs(rows, "eq"))
    less = _lex_less(rows) if lexicographic else _scalar_less(rows)
    group, rep = _groups(rows, equal, less)
    total = rep.cast("i64").reduce("sum", [0], False)
    if nan_limit is not None and is_float(rows):
        nans = rows.binary("ne", rows).reshape([n * m]).cast("i64").reduce("sum", [0], False)
        total = nans.binary("gt", nan_limit).where_(-1, total)
    count = _read_count(total)
    if count < 0:
        raise Unsupported("unique with NaN ordered by PyTorch's own sort")
    values, counts = _gather_groups(rows, group, rep, count)
    return values, group, counts


def _empty_i64(shape: list[int]) -> ET:
    return eng().full(0.0, shape, "i64")


@lower("_unique2.default")
def unique2(
    self: ET, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False
) -> tuple[ET, ET, ET]:
    """torch.unique without dim. PyTorch's CPU kernel returns sorted values
    for sorted=False too, so both are the sorted result. Reads the number of
    unique values back to the host."""
    if not isinstance(self, ET):
        raise Unsupported("unique of a non-tensor")
    shape = list(self.shape)
    if math.prod(shape) == 0:
        return self.reshape([0]), _empty_i64(shape if return_inverse else [0]), _empty_i64([0])
    rows = _as_rows(self if self.dtype != "bool" else self.cast("i32"), None)
    # The CPU sorts past 16 elements without keeping NaNs in input order, which
    # shows in the inverse of two or more NaNs.
    many = return_inverse and rows.shape[0] > UNSTABLE_SORT_STABLE_UPTO
    values, group, counts = _unique_rows(rows, False, 1 if many else None)
    values = values.reshape([values.shape[0]]).cast(self.dtype)
    inverse = group.reshape(shape) if return_inverse else _empty_i64([0])
    return values, inverse, counts if return_counts else _empty_i64([0])


@lower("unique_dim.default")
def unique_dim(
    self: ET, dim: int, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False
) -> tuple[ET, ET, ET]:
    """Unique slices along `dim`, in lexicographic order (PyTorch always sorts
    them and always returns inverse and counts). Reads the number of unique
    slices back to the host."""
    if not isinstance(self, ET) or len(self.shape) == 0:
        raise Unsupported("unique_dim of a zero-dimensional tensor")
    dim = axis(dim, len(self.shape))
    if self.shape[dim] == 0:
        return self, _empty_i64([0]), _empty_i64([0])
    if math.prod(self.shape) == 0:
        raise Unsupported("unique_dim with an empty dimension it does not select (PyTorch raises)")
    x = self if self.dtype != "bool" else self.cast("i32")
    # PyTorch orders slices holding NaN by its own comparisons: leave them to it.
    values, group, counts = _unique_rows(_as_rows(x, dim), True, 0)
    return _unrows(values, self, dim).cast(self.dtype), group, counts


def _unrows(values: ET, like: ET, dim: int) -> ET:
    """[k, m] slices back into `like`'s layout with k along `dim`."""
    rest = [s for a, s in enumerate(like.shape) if a != dim]
    shaped = values.reshape([values.shape[0]] + rest)
    return _move_back(shaped.permute(list(range(1, len(rest) + 1)) + [0]), dim) if dim else shaped


@lower("unique_consecutive.default")
def unique_consecutive(
    self: ET, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None
) -> tuple[ET, ET, ET]:
    """A slice starts a group where it differs from the one before (so NaNs
    never merge); groups are numbered by an inclusive prefix count. Reads the
    number of groups back to the host."""
    if not isinstance(self, ET):
        raise Unsupported("unique_consecutive of a non-tensor")
    if dim is not None:
        if len(self.shape) == 0:
            raise Unsupported("unique_consecutive of a zero-dimensional tensor along a dim")
        dim = axis(dim, len(self.shape))
    if dim is None and math.prod(self.shape) == 0:
        return self.reshape([0]), _empty_i64(list(self.shape) if return_inverse else [0]), _empty_i64([0])
    if dim is not None and self.shape[dim] == 0:
        return self, _empty_i64([0]), _empty_i64([0])
    if math.prod(self.shape) == 0:
        raise Unsupported("unique_consecutive with an empty dimension it does not select")
    x = self if self.dtype != "bool" else self.cast("i32")
    rows = _as_rows(x, dim)
    n, m = rows.shape
    if n * n * max(m, 1) > ONE_HOT_LIMIT:
        raise Unsupported("a unique_consecutive too large for masked sums")
    starts = eng().full(1.0, [1], "bool")
    if n > 1:
        changed = _any_last(rows.slice(0, 1, n, 1).binary("ne", rows.slice(0, 0, n - 1, 1)))
        starts = eng().cat([starts, changed], 0)
    group = _inclusive_count(starts).binary("sub", 1)
    count = _read_count(starts.cast("i64").reduce("sum", [0], False))
    values, counts = _gather_groups(rows, group, starts, count)
    if dim is None:
        values = values.reshape([count]).cast(self.dtype)
        inverse = group.reshape(list(self.shape)) if return_inverse else _empty_i64([0])
        return values, inverse, counts if return_counts else _empty_i64([0])
    return _unrows(values, self, dim).cast(self.dtype), group, counts


# ---- selections: topk, kthvalue, median, mode ---------------------------------
#
# Values come from the stable order above. Indices among equal values are
# another matter: PyTorch's CPU median breaks ties by position (the stable
# order), but kthvalue and topk use std::nth_element / std::partial_sort,
# whose order among equal values is the library's own. Those two are exact
# here only when the picked values have no equal in their row; on rows long
# enough for that to matter one flag (does any picked value have an equal?)
# is read back to the host, and the op runs on the CPU if it is set. (The CPU
# fallback would read the whole input, so the flag costs less.)


def _refuse_ties(x: ET, picked: ET, why: str) -> None:
    """x [..., n], picked [..., k]: refuse when a picked value has an equal in its row."""
    n, k = x.shape[-1], picked.shape[-1]
    lead = list(x.shape[:-1])
    equal = _same(picked.reshape(lead + [k, 1]), x.reshape(lead + [1, n]))
    _refuse_if(equal.cast("i64").reduce("sum", [-1], False).binary("gt", 1), why)


def _pick(rank: ET, value: ET, slot: ET) -> ET:
    """value[..., i] for the i with rank[..., i] == slot[...] (one per row)."""
    if value.dtype == "bool":
        return _pick(rank, value.cast("i32"), slot).cast("bool")
    hit = rank.binary("eq", slot.reshape(list(slot.shape) + [1]))
    return (
        hit.where_(value, eng().full(_zero(value.dtype), [], value.dtype))
        .reduce("sum", [-1], False)
        .cast(value.dtype)
    )


def _rows_last(x: ET, dim: int) -> tuple[ET, int]:
    if len(x.shape) == 0:
        raise Unsupported("zero-dimensional")
    dim = axis(dim, len(x.shape))
    if math.prod(x.shape) == 0:
        raise Unsupported("an empty tensor")
    moved = _move_last(x, dim)
    _check_square(math.prod(moved.shape[:-1]), moved.shape[-1])
    return moved, dim


def _finish(value: ET, index: ET, dim: int, keepdim: bool) -> tuple[ET, ET]:
    """[...] results of rows back into the input's layout (dim dropped or kept as 1)."""
    if keepdim:
        value = _move_back(value.reshape(list(value.shape) + [1]), dim)
        index = _move_back(index.reshape(list(index.shape) + [1]), dim)
    return value, index


def _scalar_pair(self: ET) -> tuple[ET, ET]:
    return self, eng().full(0.0, [], "i64")


@lower("kthvalue.default")
def kthvalue(self: ET, k: int, dim: int = -1, keepdim: bool = False) -> tuple[ET, ET]:
    if not isinstance(self, ET):
        raise Unsupported("kthvalue of a non-tensor")
    if len(self.shape) == 0:
        if k != 1 or dim not in (0, -1):
            raise Unsupported("kthvalue out of range")
        return _scalar_pair(self)
    x, dim = _rows_last(self, dim)
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise Unsupported("kthvalue out of range (PyTorch raises)")
    rank = _ranks(x, False)
    slot = eng().full(float(k - 1), list(x.shape[:-1]), "i64")
    value = _pick(rank, x, slot)
    if n > 2:  # std::nth_element keeps no order among equal keys past two elements
        _refuse_ties(x, value.reshape(list(value.shape) + [1]), "kthvalue of a value with ties")
    index = _pick(rank, eng().arange(0, n, 1, "i64").expand(list(x.shape)), slot)
    return _finish(value, index, dim, keepdim)


@lower("topk.default")
def topk(self: ET, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[ET, ET]:
    if not isinstance(self, ET):
        raise Unsupported("topk of a non-tensor")
    if len(self.shape) == 0:
        if k != 1 or dim not in (0, -1):
            raise Unsupported("topk of a zero-dimensional tensor with k != 1")
        return _scalar_pair(self)
    x, dim = _rows_last(self, dim)
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise Unsupported("topk with k = 0 or out of range")
    # `sorted=False` leaves the order to the implementation (the CPU's is
    # std::nth_element's, CUDA's another): the engine gives the sorted one,
    # as MoE routers that ask for no order need nothing else.
    rank = _ranks(x, largest)
    values = _place(rank, x, k)
    if n > 3:  # up to three elements the CPU sorts by insertion, which is stable
        _refuse_ties(x, values, "topk of values with ties")
    indices = _place(rank, eng().arange(0, n, 1, "i64").expand(list(x.shape)), k)
    return _move_back(values, dim), _move_back(indices, dim)


def _half_floor(c: ET) -> ET:
    """floor((c - 1) / 2) for counts c >= 1, exact (counts are far below 2**24)."""
    return c.binary("sub", 1).cast("f32").binary("mul", 0.5).unary("floor").cast("i64")


def _median_slots(x: ET, ignore_nan: bool) -> tuple[ET, ET, ET]:
    """(ranks, the slot of each row's median, the count of numbers per row)."""
    n = x.shape[-1]
    rank = _ranks(x, False)
    numbers = (
        x.binary("eq", x).cast("i64").reduce("sum", [-1], False)
        if is_float(x)
        else eng().full(float(n), list(x.shape[:-1]), "i64")
    )
    if ignore_nan:
        # the lower median of the numbers; a row of NaN only picks its first NaN
        slot = numbers.binary("gt", 0).where_(
            _half_floor(numbers.binary("maximum", 1)), eng().full(0.0, [], "i64")
        )
    else:
        # any NaN: its first NaN, which sorts right after the numbers
        slot = numbers.binary("eq", n).where_(eng().full(float((n - 1) // 2), [], "i64"), numbers)
    return rank, slot, numbers


def _median_all(self: ET, ignore_nan: bool) -> ET:
    if not isinstance(self, ET) or math.prod(self.shape) == 0:
        raise Unsupported("median of an empty tensor")
    if self.dtype == "bool":
        raise Unsupported("median of bool")
    x = self.reshape([math.prod(self.shape)])
    _check_square(1, x.shape[0])
    rank, slot, _ = _median_slots(x, ignore_nan)
    return _pick(rank, x, slot)


def _median_dim(self: ET, dim: int, keepdim: bool, ignore_nan: bool) -> tuple[ET, ET]:
    if not isinstance(self, ET) or self.dtype == "bool":
        raise Unsupported("median of a non-tensor or bool")
    if len(self.shape) == 0:
        if dim not in (0, -1):
            raise Unsupported("median dim out of range")
        return _scalar_pair(self)
    x, dim = _rows_last(self, dim)
    n = x.shape[-1]
    rank, slot, numbers = _median_slots(x, ignore_nan)
    if ignore_nan and n > 3 and is_float(x):
        # a row of NaN: std::nth_element's pick among equal keys, the library's own
        _refuse_if(numbers.binary("eq", 0), "nanmedian of a row of NaN")
    value = _pick(rank, x, slot)
    index = _pick(rank, eng().arange(0, n, 1, "i64").expand(list(x.shape)), slot)
    return _finish(value, index, dim, keepdim)


@lower("median.default")
def median(self: ET) -> ET:
    return _median_all(self, False)


@lower("nanmedian.default")
def nanmedian(self: ET) -> ET:
    return _median_all(self, True)


@lower("median.dim")
def median_dim(self: ET, dim: int, keepdim: bool = False) -> tuple[ET, ET]:
    """PyTorch's CPU median breaks ties by position, as the stable order does."""
    return _median_dim(self, dim, keepdim, False)


@lower("nanmedian.dim")
def nanmedian_dim(self: ET, dim: int, keepdim: bool = False) -> tuple[ET, ET]:
    return _median_dim(self, dim, keepdim, True)


MODE_INSERTION_SORT = 16  # std::sort sorts this many elements by (stable) insertion


@lower("mode.default")
def mode(self: ET, dim: int = -1, keepdim: bool = False) -> tuple[ET, ET]:
    """The smallest most frequent value and its last position, which is what
    PyTorch's CPU kernel returns after std::sort while that sort is stable
    (rows of up to 16 elements without NaN; a NaN flag is read back for floats)."""
    if not isinstance(self, ET):
        raise Unsupported("mode of a non-tensor")
    if len(self.shape) == 0:
        if dim not in (0, -1):
            raise Unsupported("mode dim out of range")
        return _scalar_pair(self)
    x, dim = _rows_last(self if self.dtype != "bool" else self.cast("i32"), dim)
    n = x.shape[-1]
    if n > MODE_INSERTION_SORT:
        raise Unsupported("mode of rows longer than std::sort's insertion sort")
    if is_float(x):
        _refuse_if(x.binary("ne", x), "mode of a row with NaN")
    lead = list(x.shape[:-1])
    equal = x.reshape(lead + [n, 1]).binary("eq", x.reshape(lead + [1, n]))
    freq = equal.cast("i64").reduce("sum", [-1], False)  # [..., n]
    top = freq.binary("eq", freq.reduce("max", [-1], True))
    biggest = x.reduce("max", [-1], True)
    best = top.where_(x, biggest).reduce("min", [-1], True)  # the smallest most frequent value
    pos = eng().arange(0, n, 1, "i64").expand(list(x.shape))
    index = x.binary("eq", best).where_(pos, eng().full(-1.0, [], "i64")).reduce("max", [-1], False)
    value = _pick(pos, x, index).cast(self.dtype)
    return _finish(value, index, dim, keepdim)
