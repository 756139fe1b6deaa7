"""Dense linear-algebra solvers unrolled into engine ops.

The engine has no LAPACK: as XLA's expanders do, each factorization or solve
is written as its textbook loop over the n rows or columns of the matrix, each
step a few batched slices, products and `where`s. The trace grows with n
(n^2 for some), so matrices larger than `MAX_N` stay on the CPU. Only float32
is lowered: PyTorch's CPU kernels refuse bfloat16 and float16, and the
fallback then raises PyTorch's own error.

Accumulation follows the reference BLAS / LAPACK order (column-oriented
updates, one rounding per step in float32), which is within the OpInfo
tolerance of the optimized LAPACK that PyTorch calls.
"""

from __future__ import annotations

import math

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, lower

#: Largest matrix order that is unrolled (each algorithm is n steps of a few ops).
MAX_N = 64


# ---- shapes and masks ------------------------------------------------------------


def _check(*xs: ET) -> None:
    for x in xs:
        if not isinstance(x, ET):
            raise Unsupported("operand is not a tensor")
        if x.dtype != "f32":
            raise Unsupported(f"{x.dtype} linear algebra (PyTorch's CPU kernels take float32 and float64)")
        if len(x.shape) < 2:
            raise Unsupported("an operand with fewer than two dimensions")


def _order(a: ET) -> int:
    n = a.shape[-1]
    if a.shape[-2] != n:
        raise Unsupported("a matrix that is not square")
    if n > MAX_N:
        raise Unsupported(f"a matrix larger than {MAX_N} (unrolled traces grow with n)")
    return n


def _mT(x: ET) -> ET:
    """The transpose of the last two dimensions."""
    r = len(x.shape)
    return x.permute(list(range(r - 2)) + [r - 1, r - 2])


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if x != y and 1 not in (x, y):
            raise Unsupported("batch dimensions that do not broadcast")
        out.append(y if x == 1 else x)
    return out[::-1]


def _expand_batch(x: ET, batch: list[int]) -> ET:
    return x.expand(batch + list(x.shape[-2:]))


def _tri(n: int, upper: bool, diagonal: bool) -> ET:
    """A bool [n, n] mask of one triangle, with or without the diagonal."""
    rows = eng().arange(0, n, 1, "i64").reshape([n, 1])
    cols = eng().arange(0, n, 1, "i64")
    if upper:
        return rows.binary("le" if diagonal else "lt", cols)
    return rows.binary("ge" if diagonal else "gt", cols)


def _keep(x: ET, mask: ET) -> ET:
    """`x` where `mask`, 0 elsewhere (a `where`, so NaN outside stays out)."""
    return mask.where_(x, eng().full(0.0, [], x.dtype))


def _eye(n: int) -> ET:
    return _tri(n, True, True).binary("logical_and", _tri(n, False, True))


def _row(x: ET, i: int) -> ET:
    return x.slice(-2, i, i + 1, 1)


def _col(x: ET, j: int) -> ET:
    return x.slice(-1, j, j + 1, 1)


def _zeros(shape: list[int]) -> ET:
    return eng().full(0.0, shape, "f32")


# ---- triangular solves -----------------------------------------------------------


def _trsm_left(a: ET, b: ET, upper: bool, unit: bool) -> ET:
    """X with A X = B for a triangular A [..., n, n] and B [..., n, k] of the
    same batch shape. Reference BLAS's column-oriented substitution: once x_i
    is known, it is taken out of every later row of B (an outer product of
    A's column i with x_i). Only A's `upper` (or lower) triangle is read."""
    n = a.shape[-1]
    off = _keep(a, _tri(n, upper, False))  # the strict triangle: the diagonal is divided by
    rest = b
    solved: list[ET | None] = [None] * n
    steps = range(n - 1, -1, -1) if upper else range(n)
    for i in steps:
        x = _row(rest, i)
        if not unit:
            x = x.binary("div", _row(_col(a, i), i))
        solved[i] = x
        rest = rest.binary("sub", _col(off, i).binary("mul", x))
    return eng().cat(solved, -2) if n > 1 else solved[0]


def _solve_triangular(a: ET, b: ET, upper: bool, left: bool, unit: bool) -> ET:
    _check(a, b)
    n = _order(a)
    if b.shape[-2 if left else -1] != n:
        raise Unsupported("incompatible shapes (PyTorch raises)")
    batch = _broadcast(list(a.shape[:-2]), list(b.shape[:-2]))
    out_shape = batch + list(b.shape[-2:])
    if math.prod(out_shape) == 0 or n == 0:
        return _zeros(out_shape)
    a, b = _expand_batch(a, batch), _expand_batch(b, batch)
    if left:
        return _trsm_left(a, b, upper, unit)
    # X A = B  <=>  A^T X^T = B^T, and A^T's triangle is the other one.
    return _mT(_trsm_left(_mT(a), _mT(b), not upper, unit))


@lower("linalg_solve_triangular.default")
def linalg_solve_triangular(self: ET, B: ET, *, upper: bool, left: bool = True, unitriangular: bool = False) -> ET:
    return _solve_triangular(self, B, upper, left, unitriangular)


@lower("triangular_solve.default")
def triangular_solve(self: ET, A: ET, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> tuple[ET, ET]:
    """The older API: solves A X = b (or A^T X = b) and returns a copy of A
    broadcast to the batch shape alongside."""
    _check(self, A)
    a = _mT(A) if transpose else A
    x = _solve_triangular(a, self, upper != transpose, True, unitriangular)
    batch = list(x.shape[:-2])
    return x, _expand_batch(A, batch)


# ---- Cholesky --------------------------------------------------------------------


def _int_full(value: int, shape: list[int]) -> ET:
    return eng().full(float(value), shape, "i32")


def _cholesky_lower(a: ET) -> tuple[ET, ET]:
    """L (lower) and LAPACK's info for [..., n, n], reading A's lower triangle.

    Right-looking: column j of the running Schur complement S gives
    d = S_jj, L_jj = sqrt(d) and L_ij = S_ij / L_jj below it; then
    S -= l l^T. Where d is not positive (or NaN) the matrix is not positive
    definite and info = j + 1 for the first such j; the output then is what
    LAPACK's potf2 (and MKL, as measured) leaves: the columns before j
    factored, d on the diagonal at j, and A's own lower triangle below it and
    in the later columns. sqrt only ever sees positive values, so no step
    makes a NaN that the result does not have."""
    n = a.shape[-1]
    batch = list(a.shape[:-2])
    rows = eng().arange(0, n, 1, "i64").reshape([n, 1])
    s = a
    info = _int_full(0, batch + [1, 1])
    failed = eng().full(0.0, batch + [1, 1], "bool")
    columns = []
    for j in range(n):
        col = _col(s, j)  # [..., n, 1]
        d = _row(col, j)  # [..., 1, 1]
        ok = d.binary("gt", 0.0)
        root = ok.where_(d, 1.0).unary("sqrt")
        below = rows.binary("gt", j)
        at = rows.binary("eq", j)
        l = _keep(col.binary("div", root), below)
        l = at.where_(root, l)
        fails_here = ok.unary("logical_not").binary("logical_and", failed.unary("logical_not"))
        info = fails_here.where_(_int_full(j + 1, []), info)
        # potf2's leftovers: A's column from the failed one on, d on the failed diagonal.
        original = _keep(_col(a, j), rows.binary("ge", j))
        leftover = fails_here.binary("logical_and", at).where_(d, original)
        failed = failed.binary("logical_or", fails_here)
        columns.append(failed.where_(leftover, l))
        if j + 1 < n:
            s = s.binary("sub", l.binary("mul", _mT(l)))
    out = eng().cat(columns, -1) if n > 1 else columns[0]
    return out, info.reshape(batch)


def _cholesky(a: ET, upper: bool) -> tuple[ET, ET]:
    _check(a)
    n = _order(a)
    batch = list(a.shape[:-2])
    if math.prod(a.shape) == 0:
        return _zeros(list(a.shape)), _int_full(0, batch)
    if upper:
        # The upper factor of A is the transposed lower factor of A^T (whose
        # lower triangle is A's upper one).
        low, info = _cholesky_lower(_mT(a))
        return _mT(low), info
    return _cholesky_lower(a)


@lower("linalg_cholesky_ex.default")
def linalg_cholesky_ex(self: ET, *, upper: bool = False, check_errors: bool = False) -> tuple[ET, ET]:
    if check_errors:
        raise Unsupported("check_errors (raising needs info on the host)")
    return _cholesky(self, upper)


def _cholesky_solve(b: ET, factor: ET, upper: bool) -> ET:
    """X with A X = B for A = L L^T (or U^T U): two triangular solves."""
    if upper:
        y = _solve_triangular(_mT(factor), b, False, True, False)
        return _solve_triangular(factor, y, True, True, False)
    y = _solve_triangular(factor, b, False, True, False)
    return _solve_triangular(_mT(factor), y, True, True, False)


@lower("_cholesky_solve_helper.default")
def cholesky_solve_helper(self: ET, A: ET, upper: bool) -> ET:
    _check(self, A)
    return _cholesky_solve(self, A, upper)


@lower("cholesky_inverse.default")
def cholesky_inverse(self: ET, upper: bool = False) -> ET:
    """(L L^T)^-1 as the solve with the identity."""
    _check(self)
    n = _order(self)
    if math.prod(self.shape) == 0:
        return _zeros(list(self.shape))
    eye = _eye(n).where_(1.0, 0.0).cast("f32").expand(list(self.shape))
    return _cholesky_solve(eye, self, upper)
