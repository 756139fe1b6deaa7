"""Dense linear algebra unrolled into engine ops: triangular solves,
Cholesky, LU (solve, inverse, determinants), LDL^T (Bunch-Kaufman), and
singular values / symmetric eigenvalues by Jacobi (Householder QR is in
`householder.py`).

The engine has no LAPACK: as XLA's expanders do, each factorization or solve
is written as its textbook loop over the n rows or columns of the matrix, each
step a few batched slices, products and `where`s (the engine has no gather:
a row picked per batch element, such as a pivot row, is a masked sum). The
trace grows with n, so matrices larger than `MAX_N` stay on the CPU. Where
batch elements take different paths (pivot rows, LDL's 1x1 or 2x2 blocks),
every path is computed and `where` keeps each element's own; divisors on the
paths not taken are made 1 first, so no step makes an Inf or NaN that the
result does not have.

Only float32 is lowered: PyTorch's CPU kernels refuse bfloat16 and float16,
and the fallback then raises PyTorch's own error. `check_errors=True` and
arguments PyTorch rejects go to the CPU as well, for PyTorch's own errors.

Accumulation follows the reference BLAS / LAPACK order (column-oriented
updates, one rounding per step in float32), which is within the OpInfo
tolerance of the optimized LAPACK (MKL) that PyTorch calls; pivots, info and
the LAPACK leftovers on failure (Cholesky) are LAPACK's exactly.
"""

from __future__ import annotations

import math

from .._engine import Tensor as ET
from ._registry import Unsupported, broadcast_batch, eng, lower

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
    batch = broadcast_batch(list(a.shape[:-2]), list(b.shape[:-2]))
    out_shape = batch + list(b.shape[-2:])
    if math.prod(out_shape) == 0 or n == 0:
        return _zeros(out_shape)
    a, b = _expand_batch(a, batch), _expand_batch(b, batch)
    if left:
        return _trsm_left(a, b, upper, unit)
    # X A = B  <=>  A^T X^T = B^T, and A^T's triangle is the other one.
    return _mT(_trsm_left(_mT(a), _mT(b), not upper, unit))


@lower("linalg_solve_triangular.default")
def linalg_solve_triangular(
    self: ET, B: ET, *, upper: bool, left: bool = True, unitriangular: bool = False
) -> ET:
    return _solve_triangular(self, B, upper, left, unitriangular)


@lower("triangular_solve.default")
def triangular_solve(
    self: ET, A: ET, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> tuple[ET, ET]:
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
    _order(a)  # square and small enough, else the CPU
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


# ---- LU with partial pivoting ------------------------------------------------------


def _swap_rows(x: ET, i: int, other: ET) -> ET:
    """Rows i and `other` ([..., 1, 1] i64, per batch) of x swapped, with
    `where` masks (a row is picked by a masked sum: the engine has no gather)."""
    rows = eng().arange(0, x.shape[-2], 1, "i64").reshape([x.shape[-2], 1])
    at_other = rows.binary("eq", other)  # [..., m, 1]
    row_i = _row(x, i)
    row_other = _keep(x, at_other).reduce("sum", [-2], True)
    return rows.binary("eq", i).where_(row_other, at_other.where_(row_i, x))


def _lu_factor(a: ET) -> tuple[ET, ET, ET]:
    """getrf: LU (L unit lower below the diagonal, U on and above it),
    1-based int32 pivots and info for [..., m, n], right-looking.

    At step j the pivot is the first row at or below j with the largest
    |value| in column j (LAPACK's i?amax and the engine's argmax both take the
    first of ties), the whole rows j and pivot are swapped, the column below
    the diagonal is divided by the pivot and the trailing block gets the
    rank-1 update. A zero pivot leaves its column unscaled (it is all zeros)
    and sets info to the first such step, as getrf does."""
    m, n = a.shape[-2], a.shape[-1]
    batch = list(a.shape[:-2])
    rows = eng().arange(0, m, 1, "i64").reshape([m, 1])
    cols = eng().arange(0, n, 1, "i64")
    s = a
    info = _int_full(0, batch + [1, 1])
    pivots = []
    for j in range(min(m, n)):
        size = _keep(_col(s, j).unary("abs"), rows.binary("ge", j))
        size = rows.binary("ge", j).where_(size, -1.0)  # rows above j never win
        p = size.arg_reduce("argmax", -2, True)  # [..., 1, 1] i64
        pivots.append(p)
        s = _swap_rows(s, j, p)
        pivot = _row(_col(s, j), j)
        nonzero = pivot.binary("ne", 0.0)
        info = (
            nonzero.unary("logical_not")
            .binary("logical_and", info.binary("eq", 0))
            .where_(_int_full(j + 1, []), info)
        )
        below = rows.binary("gt", j)
        l = _keep(nonzero.where_(_col(s, j).binary("div", nonzero.where_(pivot, 1.0)), _col(s, j)), below)
        u = _keep(_row(s, j), cols.binary("gt", j))
        s = s.binary("sub", l.binary("mul", u))
        s = below.binary("logical_and", cols.binary("eq", j)).where_(l, s)
    if pivots:
        piv = (eng().cat(pivots, -1) if len(pivots) > 1 else pivots[0]).reshape(batch + [len(pivots)])
        piv = piv.binary("add", 1).cast("i32")
    else:
        piv = _int_full(0, batch + [0])
    return s, piv, info.reshape(batch)


def _lu_factor_checked(a: ET) -> tuple[ET, ET, ET]:
    _check(a)
    m, n = a.shape[-2], a.shape[-1]
    if max(m, n) > MAX_N:
        raise Unsupported(f"a matrix larger than {MAX_N} (unrolled traces grow with n)")
    batch = list(a.shape[:-2])
    if math.prod(a.shape) == 0:
        # PyTorch's pivots for an empty factorization: 1, 2, ... (no swaps).
        k = min(m, n)
        piv = eng().arange(1, k + 1, 1, "i64").cast("i32") if k else _int_full(0, [0])
        return _zeros(list(a.shape)), piv.expand(batch + [k]), _int_full(0, batch)
    return _lu_factor(a)


@lower("linalg_lu_factor_ex.default")
def linalg_lu_factor_ex(A: ET, *, pivot: bool = True, check_errors: bool = False) -> tuple[ET, ET, ET]:
    if not pivot or check_errors:
        raise Unsupported("LU without pivoting (PyTorch's CPU refuses it) or check_errors")
    return _lu_factor_checked(A)


def _apply_pivots(b: ET, piv: ET, reverse: bool) -> ET:
    """P^T B (the swaps in order) or P B (reversed) for getrf pivots [..., k]."""
    k = piv.shape[-1]
    order = range(k - 1, -1, -1) if reverse else range(k)
    target = piv.cast("i64").binary("sub", 1)
    for i in order:
        b = _swap_rows(b, i, target.slice(-1, i, i + 1, 1).reshape(list(piv.shape[:-1]) + [1, 1]))
    return b


def _lu_solve_left(lu: ET, piv: ET, b: ET, adjoint: bool) -> ET:
    """A X = B (or A^T X = B) for A = P L U with matching batch shapes."""
    if not adjoint:
        y = _trsm_left(lu, _apply_pivots(b, piv, False), False, True)
        return _trsm_left(lu, y, True, False)
    lu_t = _mT(lu)  # U^T is lower (non-unit), L^T upper (unit)
    z = _trsm_left(lu_t, b, False, False)
    w = _trsm_left(lu_t, z, True, True)
    return _apply_pivots(w, piv, True)


def _lu_solve(lu: ET, piv: ET, b: ET, left: bool, adjoint: bool) -> ET:
    _check(lu, b)
    n = _order(lu)
    if piv.dtype != "i32" or list(piv.shape[-1:]) != [n] or b.shape[-2 if left else -1] != n:
        raise Unsupported("pivots or right-hand side of another shape or dtype (PyTorch raises)")
    batch = broadcast_batch(broadcast_batch(list(lu.shape[:-2]), list(piv.shape[:-1])), list(b.shape[:-2]))
    out_shape = batch + list(b.shape[-2:])
    if math.prod(out_shape) == 0 or n == 0:
        return _zeros(out_shape)
    lu, b = _expand_batch(lu, batch), _expand_batch(b, batch)
    piv = piv.expand(batch + [n])
    if left:
        return _lu_solve_left(lu, piv, b, adjoint)
    # X A = B <=> A^T X^T = B^T; X A^T = B <=> A X^T = B^T.
    return _mT(_lu_solve_left(lu, piv, _mT(b), not adjoint))


@lower("linalg_lu_solve.default")
def linalg_lu_solve(LU: ET, pivots: ET, B: ET, *, left: bool = True, adjoint: bool = False) -> ET:
    return _lu_solve(LU, pivots, B, left, adjoint)


def _unpack_pivots(piv: ET, m: int) -> ET:
    """P ([..., m, m], f32) with A = P L U: the row order the swaps make,
    as a one-hot matrix (P[r, c] = 1 where original row r went to place c)."""
    batch = list(piv.shape[:-1])
    order = eng().arange(0, m, 1, "f32").reshape([m, 1]).expand(batch + [m, 1])
    order = _apply_pivots(order, piv, False).reshape(batch + [1, m])
    return order.binary("eq", eng().arange(0, m, 1, "f32").reshape([m, 1])).cast("f32")


def _unpack_data(lu: ET) -> tuple[ET, ET]:
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    l = _keep(lu, _tri(max(m, n), False, False).slice(0, 0, m, 1).slice(1, 0, n, 1)).slice(-1, 0, k, 1)
    eye = _eye(max(m, n)).slice(0, 0, m, 1).slice(1, 0, k, 1)
    l = eye.where_(1.0, l)
    u = _keep(lu, _tri(max(m, n), True, True).slice(0, 0, m, 1).slice(1, 0, n, 1)).slice(-2, 0, k, 1)
    return l, u


@lower("lu_unpack.default")
def lu_unpack(
    LU_data: ET, LU_pivots: ET, unpack_data: bool = True, unpack_pivots: bool = True
) -> tuple[ET, ET, ET]:
    _check(LU_data)
    m, n = LU_data.shape[-2], LU_data.shape[-1]
    if not (unpack_data and unpack_pivots) or max(m, n) > MAX_N or LU_pivots.dtype != "i32":
        raise Unsupported("partial unpacking, a large matrix or non-int32 pivots")
    if list(LU_pivots.shape) != list(LU_data.shape[:-2]) + [min(m, n)]:
        raise Unsupported("pivots of another shape (PyTorch raises)")
    batch = list(LU_data.shape[:-2])
    k = min(m, n)
    if math.prod(LU_data.shape) == 0:
        # No swaps were recorded: P is the identity (or itself empty).
        p = (
            _eye(m).where_(1.0, 0.0).cast("f32").expand(batch + [m, m])
            if m * math.prod(batch)
            else _zeros(batch + [m, m])
        )
        return p, _zeros(batch + [m, k]), _zeros(batch + [k, n])
    l, u = _unpack_data(LU_data)
    return _unpack_pivots(LU_pivots, m), l, u


@lower("linalg_lu.default")
def linalg_lu(A: ET, *, pivot: bool = True) -> tuple[ET, ET, ET]:
    if not pivot:
        raise Unsupported("LU without pivoting (PyTorch's CPU refuses it)")
    lu, piv, _ = _lu_factor_checked(A)
    return lu_unpack(lu, piv)


# ---- solve, inverse --------------------------------------------------------------


def _is_vector_rhs(a: ET, b: ET) -> bool:
    """PyTorch's rule: B is a batch of vectors when it is 1-D or has exactly
    A's shape without the last dimension."""
    return len(b.shape) == 1 or (len(b.shape) == len(a.shape) - 1 and list(b.shape) == list(a.shape[:-1]))


@lower("_linalg_solve_ex.default")
def linalg_solve_ex(A: ET, B: ET, *, left: bool = True, check_errors: bool = False) -> tuple[ET, ET, ET, ET]:
    """LU of A, then the LU solve; LU, pivots and info are returned as
    PyTorch's CPU kernel returns them (measured: of A itself, unlike det's)."""
    if check_errors:
        raise Unsupported("check_errors (raising needs info on the host)")
    _check(A)
    if not isinstance(B, ET) or B.dtype != "f32":
        raise Unsupported("a right-hand side that is not float32")
    vector = _is_vector_rhs(A, B)
    if vector and not left:
        raise Unsupported("a vector right-hand side with left=False (PyTorch raises)")
    b = B.reshape(list(B.shape) + [1]) if vector else B
    _check(b)
    _order(A)
    lu, piv, info = _lu_factor_checked(A)
    x = _lu_solve(lu, piv, b, left, False)
    if vector:
        x = x.reshape(list(x.shape[:-1]))
    return x, lu, piv, info


@lower("linalg_inv_ex.default")
def linalg_inv_ex(A: ET, *, check_errors: bool = False) -> tuple[ET, ET]:
    """The solve with the identity, as PyTorch does."""
    if check_errors:
        raise Unsupported("check_errors (raising needs info on the host)")
    _check(A)
    n = _order(A)
    eye = _eye(n).where_(1.0, 0.0).cast("f32") if n else _zeros([0, 0])
    x, _, _, info = linalg_solve_ex(A, eye.expand(list(A.shape)))
    return x, info


# ---- determinants ----------------------------------------------------------------


def _lu_of_transpose(a: ET) -> tuple[ET, ET, ET, ET]:
    """LU of A^T (as PyTorch factors a contiguous A for det and slogdet), its
    pivots, U's diagonal [..., n] and the permutation's sign [...] (f32)."""
    _check(a)
    n = _order(a)
    lu, piv, _ = _lu_factor_checked(_mT(a))
    batch = list(a.shape[:-2])
    diag = _keep(lu, _eye(n)).reduce("sum", [-1], False)
    swaps = piv.binary("ne", eng().arange(1, n + 1, 1, "i32")).cast("f32").reduce("sum", [-1], False)
    odd = swaps.binary("sub", swaps.binary("mul", 0.5).unary("floor").binary("mul", 2.0))
    sign = odd.binary("mul", -2.0).binary("add", 1.0)
    return lu, piv, diag, sign.reshape(batch)


def _empty_det(a: ET) -> bool:
    return math.prod(a.shape) == 0


@lower("_linalg_det.default")
def linalg_det(A: ET) -> tuple[ET, ET, ET]:
    _check(A)
    n = _order(A)
    batch = list(A.shape[:-2])
    if _empty_det(A):
        return eng().full(1.0, batch, "f32"), _zeros(list(A.shape)), _int_full(0, batch + [n])
    lu, piv, diag, sign = _lu_of_transpose(A)
    return diag.reduce("prod", [-1], False).binary("mul", sign), lu, piv


@lower("_linalg_slogdet.default")
def linalg_slogdet(A: ET) -> tuple[ET, ET, ET, ET]:
    """sign(det) and log|det| from U's diagonal: a zero on it gives sign 0
    and -inf, as in PyTorch."""
    _check(A)
    n = _order(A)
    batch = list(A.shape[:-2])
    if _empty_det(A):
        return (
            eng().full(1.0, batch, "f32"),
            _zeros(batch),
            _zeros(list(A.shape)),
            _int_full(0, batch + [n]),
        )
    lu, piv, diag, sign = _lu_of_transpose(A)
    sgn = diag.unary("sign").reduce("prod", [-1], False).binary("mul", sign)
    logabs = diag.unary("abs").unary("log").reduce("sum", [-1], False)
    return sgn, logabs, lu, piv


# ---- singular values (one-sided Jacobi) --------------------------------------------

#: svdvals runs JACOBI_SWEEPS sweeps over all column pairs: the trace has
#: sweeps * k(k-1)/2 rotations, so k = min(m, n) is kept small.
MAX_SVD_K = 8
JACOBI_SWEEPS = 10


def _rotate(cp: ET, cq: ET) -> tuple[ET, ET]:
    """One Hestenes rotation making columns p and q orthogonal. Pairs that
    are already orthogonal to working precision are left alone (which also
    keeps zeta finite)."""
    alpha = cp.binary("mul", cp).reduce("sum", [-2], True)
    beta = cq.binary("mul", cq).reduce("sum", [-2], True)
    gamma = cp.binary("mul", cq).reduce("sum", [-2], True)
    skip = gamma.unary("abs").binary("le", alpha.binary("mul", beta).unary("sqrt").binary("mul", 1e-9))
    two_gamma = skip.where_(1.0, gamma.binary("mul", 2.0))
    zeta = skip.where_(0.0, beta.binary("sub", alpha).binary("div", two_gamma))
    sign = zeta.binary("ge", 0.0).where_(1.0, -1.0)
    t = sign.binary(
        "div", zeta.unary("abs").binary("add", zeta.binary("mul", zeta).binary("add", 1.0).unary("sqrt"))
    )
    t = skip.where_(0.0, t)
    c = t.binary("mul", t).binary("add", 1.0).unary("rsqrt")
    s = c.binary("mul", t)
    return c.binary("mul", cp).binary("sub", s.binary("mul", cq)), s.binary("mul", cp).binary(
        "add", c.binary("mul", cq)
    )


def _descending(values: ET) -> ET:
    """values [..., k] sorted from largest to smallest: each value's rank is
    the count of larger ones (earlier ones on ties), then a one-hot sum."""
    k = values.shape[-1]
    col = values.reshape(list(values.shape) + [1])  # [..., k, 1]: value i
    row = values.reshape(list(values.shape[:-1]) + [1, k])  # [..., 1, k]: value j
    idx = eng().arange(0, k, 1, "i64")
    earlier = idx.binary("lt", idx.reshape([k, 1]))  # [i, j]: j < i
    ahead = row.binary("gt", col).binary("logical_or", row.binary("eq", col).binary("logical_and", earlier))
    rank = ahead.cast("f32").reduce("sum", [-1], False)  # [..., k]
    picked = rank.reshape(list(rank.shape) + [1]).binary("eq", eng().arange(0, k, 1, "f32"))  # [..., i, r]
    return _keep(col.expand(list(values.shape) + [k]), picked).reduce("sum", [-2], False)


def _all_finite(a: ET) -> bool:
    """Reads one bool back to the host, as PyTorch's own check does."""
    from .._handles import to_cpu_value

    finite = a.binary("eq", a).binary("logical_and", a.unary("abs").binary("lt", float("inf")))
    return bool(to_cpu_value(finite.cast("i32").reduce("min", list(range(len(a.shape))), False)).item())


@lower("_linalg_svd.default")
def linalg_svd(
    A: ET, full_matrices: bool = False, compute_uv: bool = True, *, driver: str | None = None
) -> tuple[ET, ET, ET]:
    """Singular values only (compute_uv=False, as svdvals, matrix norms and
    cond ask): singular vectors are unique only up to sign, and LAPACK's
    signs cannot be reproduced, so those stay on the CPU. PyTorch raises for
    non-finite input; one bool is read back to the host to send that case to
    the CPU too (PyTorch's own CUDA kernels synchronize for it likewise)."""
    if compute_uv or driver is not None:
        raise Unsupported("singular vectors (their signs are LAPACK's choice)")
    _check(A)
    m, n = A.shape[-2], A.shape[-1]
    k = min(m, n)
    batch = list(A.shape[:-2])
    if k > MAX_SVD_K or max(m, n) > MAX_N:
        raise Unsupported(f"svdvals of more than {MAX_SVD_K} singular values")
    empty = _zeros([0])
    if math.prod(A.shape) == 0:
        return empty, _zeros(batch + [k]), empty
    if not _all_finite(A):
        raise Unsupported("non-finite input (PyTorch raises)")
    a = A if m >= n else _mT(A)  # k columns to orthogonalize
    columns = [_col(a, j) for j in range(k)]
    for _ in range(JACOBI_SWEEPS if k > 1 else 0):
        for p in range(k):
            for q in range(p + 1, k):
                columns[p], columns[q] = _rotate(columns[p], columns[q])
        # Run each sweep before tracing the next: DeferAndFuse's compile time
        # grows faster than the trace, and every sweep after the first has
        # the same shape of graph, so it is compiled once and reused.
        eng().sync()
    norms = [c.binary("mul", c).reduce("sum", [-2], False).unary("sqrt") for c in columns]  # [..., 1] each
    values = eng().cat(norms, -1) if k > 1 else norms[0]
    return empty, _descending(values), empty


# ---- symmetric eigenvalues (cyclic Jacobi) -----------------------------------------


def _symmetric_from(a: ET, upper: bool) -> ET:
    """The symmetric matrix that A's `upper` (or lower) triangle describes."""
    n = a.shape[-1]
    part = _keep(a, _tri(n, upper, True))
    strict = _keep(a, _tri(n, upper, False))
    return part.binary("add", _mT(strict))


def _jacobi_rotation(s: ET, p: int, q: int) -> ET:
    """J^T S J with the plane rotation J that zeroes S_pq (skipped where S_pq
    is already negligible next to the diagonal, which keeps zeta finite)."""
    n = s.shape[-1]
    app, aqq, apq = _row(_col(s, p), p), _row(_col(s, q), q), _row(_col(s, q), p)
    skip = apq.unary("abs").binary(
        "le", app.unary("abs").binary("add", aqq.unary("abs")).binary("mul", 1e-10)
    )
    skip = skip.binary("logical_or", apq.binary("eq", 0.0))
    zeta = skip.where_(0.0, aqq.binary("sub", app).binary("div", skip.where_(1.0, apq.binary("mul", 2.0))))
    sign = zeta.binary("ge", 0.0).where_(1.0, -1.0)
    t = skip.where_(
        0.0,
        sign.binary(
            "div", zeta.unary("abs").binary("add", zeta.binary("mul", zeta).binary("add", 1.0).unary("sqrt"))
        ),
    )
    c = t.binary("mul", t).binary("add", 1.0).unary("rsqrt")
    sn = c.binary("mul", t)
    idx = eng().arange(0, n, 1, "i64")
    r, k = idx.reshape([n, 1]), idx
    eye = _eye(n)
    # J: identity except J_pp = J_qq = c, J_pq = s, J_qp = -s.
    on_pq = r.binary("eq", p).binary("logical_and", k.binary("eq", q))
    on_qp = r.binary("eq", q).binary("logical_and", k.binary("eq", p))
    diag_pq = eye.binary("logical_and", r.binary("eq", p).binary("logical_or", r.binary("eq", q)))
    j = eye.where_(1.0, 0.0).cast("f32")
    j = diag_pq.where_(c, j)
    j = on_pq.where_(sn, j)
    j = on_qp.where_(sn.unary("neg"), j)
    return _mT(j).matmul(s).matmul(j)


@lower("_linalg_eigh.default")
def linalg_eigh(A: ET, UPLO: str = "L", compute_v: bool = True) -> tuple[ET, ET]:
    """Eigenvalues only (compute_v=False, as eigvalsh asks), ascending:
    eigenvectors are unique only up to sign, so those stay on the CPU. One
    bool is read back to send non-finite input (PyTorch raises) to the CPU."""
    if compute_v or UPLO not in ("L", "U"):
        raise Unsupported("eigenvectors (their signs are LAPACK's choice)")
    _check(A)
    n = _order(A)
    batch = list(A.shape[:-2])
    if n > MAX_SVD_K:
        raise Unsupported(f"eigvalsh of more than {MAX_SVD_K} eigenvalues")
    if math.prod(A.shape) == 0:
        return _zeros(batch + [n]), _zeros([0])
    if not _all_finite(A):
        raise Unsupported("non-finite input (PyTorch raises)")
    s = _symmetric_from(A, UPLO == "U")
    for _ in range(JACOBI_SWEEPS if n > 1 else 0):
        for p in range(n):
            for q in range(p + 1, n):
                s = _jacobi_rotation(s, p, q)
        eng().sync()  # one sweep per compiled graph, as in svdvals
    diag = _keep(s, _eye(n)).reduce("sum", [-1], False)
    return _descending(diag.unary("neg")).unary("neg"), _zeros([0])


# ---- LDL^T (Bunch-Kaufman) ---------------------------------------------------------

_BK_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _pick_rows(x: ET, at: ET) -> ET:
    """Row `at` ([..., 1, 1] i64, per batch) of x as [..., 1, n]: a masked sum."""
    rows = eng().arange(0, x.shape[-2], 1, "i64").reshape([x.shape[-2], 1])
    return _keep(x, rows.binary("eq", at)).reduce("sum", [-2], True)


def _swap_any(x: ET, a: ET, b: ET) -> ET:
    """Rows a and b ([..., 1, 1] i64 each, per batch) of x swapped."""
    rows = eng().arange(0, x.shape[-2], 1, "i64").reshape([x.shape[-2], 1])
    row_a, row_b = _pick_rows(x, a), _pick_rows(x, b)
    return rows.binary("eq", a).where_(row_b, rows.binary("eq", b).where_(row_a, x))


def _ldl_factor(a: ET) -> tuple[ET, ET, ET]:
    """sytf2 (lower) with Bunch-Kaufman pivoting, over a batch whose elements
    may choose 1x1 or 2x2 pivots at different steps: at step k an element
    either starts a block (both kinds are computed and one is kept with
    `where`) or is inside the 2x2 block it started at k - 1 and only writes
    that block's second column. T is the trailing matrix kept symmetric in
    full, so a symmetric interchange is a row swap and a column swap."""
    n = a.shape[-1]
    batch = list(a.shape[:-2])
    rows = eng().arange(0, n, 1, "i64").reshape([n, 1])
    cols = eng().arange(0, n, 1, "i64")
    t = _symmetric_from(a, False)
    second = eng().full(0.0, batch + [1, 1], "bool")
    pending = _zeros(batch + [n, 1])
    info = _int_full(0, batch + [1, 1])
    out_cols, pivs = [], []
    for k in range(n):
        col = _col(t, k)
        akk = _row(col, k)
        absakk = akk.unary("abs")
        below = rows.binary("gt", k)
        size = below.where_(col.unary("abs"), -1.0)
        if k + 1 < n:
            imax = size.arg_reduce("argmax", -2, True)
            colmax = size.reduce("max", [-2], True)
        else:
            imax = eng().full(float(k), batch + [1, 1], "i64")
            colmax = _zeros(batch + [1, 1])
        zero = absakk.binary("maximum", colmax).binary("eq", 0.0).binary("logical_or", akk.binary("ne", akk))
        row_imax = _pick_rows(t, imax)  # [..., 1, n]
        off = cols.binary("ge", k).binary("logical_and", cols.binary("ne", imax))
        rowmax = off.where_(row_imax.unary("abs"), -1.0).reduce("max", [-1], True).binary("maximum", 0.0)
        aimax = _keep(row_imax, cols.binary("eq", imax)).reduce("sum", [-1], True).unary("abs")
        no_swap = absakk.binary("ge", colmax.binary("mul", _BK_ALPHA))
        safe_rowmax = rowmax.binary("eq", 0.0).where_(1.0, rowmax)
        no_swap = no_swap.binary(
            "logical_or",
            absakk.binary(
                "ge", colmax.binary("mul", _BK_ALPHA).binary("mul", colmax.binary("div", safe_rowmax))
            ),
        )
        one_swap = no_swap.unary("logical_not").binary(
            "logical_and", aimax.binary("ge", rowmax.binary("mul", _BK_ALPHA))
        )
        two = no_swap.binary("logical_or", one_swap).binary("logical_or", zero).unary("logical_not")
        if k + 1 >= n:
            two = eng().full(0.0, batch + [1, 1], "bool")
        starts = second.unary("logical_not")
        two = two.binary("logical_and", starts)
        kp = no_swap.binary("logical_or", zero).where_(eng().full(float(k), [], "i64"), imax)
        kk = two.where_(eng().full(float(k + 1), [], "i64"), eng().full(float(k), [], "i64"))
        swapped = _swap_any(t, kk, kp)
        swapped = _mT(_swap_any(_mT(swapped), kk, kp))
        # 1x1: D = t_kk, L's column = t[k+1:, k] / t_kk, rank-1 update.
        c1 = _col(swapped, k)
        d = _row(c1, k)
        safe_d = d.binary("eq", 0.0).where_(1.0, d)
        x = _keep(c1, below)
        l1 = x.binary("div", safe_d)
        upd1 = swapped.binary("sub", l1.binary("mul", _mT(x)))
        col1 = rows.binary("eq", k).where_(d, l1)
        # 2x2 on rows/columns k, k+1 (only where it is chosen; made finite elsewhere).
        if k + 1 < n:
            c2 = _col(swapped, k + 1)
            d21 = _row(c1, k + 1)
            safe21 = d21.binary("eq", 0.0).where_(1.0, d21)
            d11 = _row(c2, k + 1).binary("div", safe21)
            d22 = d.binary("div", safe21)
            den = d11.binary("mul", d22).binary("sub", 1.0)
            tt = den.binary("eq", 0.0).where_(1.0, den).unary("reciprocal")
            d21s = tt.binary("div", safe21)
            rest = rows.binary("gt", k + 1)
            ak, ak1 = _keep(c1, rest), _keep(c2, rest)
            wk = d21s.binary("mul", d11.binary("mul", ak).binary("sub", ak1))
            wk1 = d21s.binary("mul", d22.binary("mul", ak1).binary("sub", ak))
            upd2 = swapped.binary("sub", ak.binary("mul", _mT(wk)).binary("add", ak1.binary("mul", _mT(wk1))))
            col2a = rows.binary("eq", k).where_(d, rows.binary("eq", k + 1).where_(d21, wk))
            col2b = rows.binary("eq", k + 1).where_(_row(c2, k + 1), wk1)
        else:
            upd2, col2a, col2b = upd1, col1, pending
        keep_t = second.binary("logical_or", zero)
        new_t = keep_t.where_(t, two.where_(upd2, upd1))
        column = second.where_(
            pending, zero.where_(_keep(col, rows.binary("ge", k)), two.where_(col2a, col1))
        )
        out_cols.append(column)
        pending = col2b
        fails = zero.binary("logical_and", starts).binary("logical_and", info.binary("eq", 0))
        info = fails.where_(_int_full(k + 1, []), info)
        kp1 = kp.binary("add", 1).cast("i32")
        piv = two.where_(kp1.unary("neg"), kp1)
        piv = second.where_(pivs[-1] if pivs else piv, piv)
        pivs.append(piv)
        t = new_t
        second = two
    ld = eng().cat(out_cols, -1) if n > 1 else out_cols[0]
    piv = (eng().cat(pivs, -1) if n > 1 else pivs[0]).reshape(batch + [n])
    return _keep(ld, _tri(n, False, True)), piv, info.reshape(batch)


@lower("linalg_ldl_factor_ex.default")
def linalg_ldl_factor_ex(
    self: ET, *, hermitian: bool = False, check_errors: bool = False
) -> tuple[ET, ET, ET]:
    """sytrf (lower), as PyTorch calls it; for real matrices `hermitian`
    changes nothing."""
    if check_errors:
        raise Unsupported("check_errors (raising needs info on the host)")
    _check(self)
    n = _order(self)
    batch = list(self.shape[:-2])
    if math.prod(self.shape) == 0:
        return _zeros(list(self.shape)), _int_full(0, batch + [n]), _int_full(0, batch)
    return _ldl_factor(self)


def _set_row(x: ET, i: int, value: ET) -> ET:
    rows = eng().arange(0, x.shape[-2], 1, "i64").reshape([x.shape[-2], 1])
    return rows.binary("eq", i).where_(value, x)


def _ldl_solve(ld: ET, piv: ET, b: ET) -> ET:
    """sytrs (lower): L D L^T X = B with sytrf's interchanges, the forward
    pass then the backward one. Which positions start a 2x2 block follows
    from the signs of the pivots, per batch element."""
    n = ld.shape[-1]
    batch = list(piv.shape[:-1])
    rows = eng().arange(0, n, 1, "i64").reshape([n, 1])
    p = piv.cast("i64")
    neg, target = [], []
    for k in range(n):
        v = p.slice(-1, k, k + 1, 1).reshape(batch + [1, 1])
        neg.append(v.binary("lt", 0))
        target.append(v.binary("lt", 0).where_(v.unary("neg"), v).binary("sub", 1))
    first, second = [], []
    after = eng().full(0.0, batch + [1, 1], "bool")
    for k in range(n):
        first.append(neg[k].binary("logical_and", after.unary("logical_not")))
        second.append(after)
        after = first[k]
    # Forward: L D Y = P^T B.
    for k in range(n):
        one = neg[k].unary("logical_not")
        lk = _col(ld, k)
        b1 = _swap_any(b, eng().full(float(k), [], "i64"), target[k])
        b1 = b1.binary("sub", _keep(lk, rows.binary("gt", k)).binary("mul", _row(b1, k)))
        b1 = _set_row(b1, k, _row(b1, k).binary("div", _row(lk, k)))
        b2 = b
        if k + 1 < n:
            b2 = _swap_any(b, eng().full(float(k + 1), [], "i64"), target[k])
            rest = rows.binary("gt", k + 1)
            lk1 = _col(ld, k + 1)
            b2 = b2.binary("sub", _keep(lk, rest).binary("mul", _row(b2, k)))
            b2 = b2.binary("sub", _keep(lk1, rest).binary("mul", _row(b2, k + 1)))
            akm1k = _row(lk, k + 1)
            safe = akm1k.binary("eq", 0.0).where_(1.0, akm1k)
            akm1 = _row(lk, k).binary("div", safe)
            ak = _row(lk1, k + 1).binary("div", safe)
            denom = akm1.binary("mul", ak).binary("sub", 1.0)
            denom = denom.binary("eq", 0.0).where_(1.0, denom)
            bkm1 = _row(b2, k).binary("div", safe)
            bk = _row(b2, k + 1).binary("div", safe)
            b2 = _set_row(b2, k, ak.binary("mul", bkm1).binary("sub", bk).binary("div", denom))
            b2 = _set_row(b2, k + 1, akm1.binary("mul", bk).binary("sub", bkm1).binary("div", denom))
        b = one.where_(b1, first[k].where_(b2, b))
    # Backward: L^T X = Y, then the interchanges in reverse.
    for k in range(n - 1, -1, -1):
        one = neg[k].unary("logical_not")
        later = rows.binary("gt", k)
        dot_k = _keep(_col(ld, k), later).binary("mul", b).reduce("sum", [-2], True)
        bb = _set_row(b, k, _row(b, k).binary("sub", dot_k))
        if k > 0:
            dot_km1 = _keep(_col(ld, k - 1), later).binary("mul", b).reduce("sum", [-2], True)
            b2 = _set_row(bb, k - 1, _row(bb, k - 1).binary("sub", dot_km1))
        else:
            b2 = bb
        swap_to = target[k]
        b1 = _swap_any(bb, eng().full(float(k), [], "i64"), swap_to)
        b2 = _swap_any(b2, eng().full(float(k), [], "i64"), swap_to)
        b = one.where_(b1, second[k].where_(b2, b))
    return b


@lower("linalg_ldl_solve.default")
def linalg_ldl_solve(LD: ET, pivots: ET, B: ET, *, hermitian: bool = False) -> ET:
    _check(LD, B)
    n = _order(LD)
    if (
        not isinstance(pivots, ET)
        or pivots.dtype != "i32"
        or list(pivots.shape) != list(LD.shape[:-1])
        or B.shape[-2] != n
    ):
        raise Unsupported("ldl_solve arguments PyTorch rejects")
    batch = broadcast_batch(list(LD.shape[:-2]), list(B.shape[:-2]))
    out_shape = batch + list(B.shape[-2:])
    if math.prod(out_shape) == 0 or n == 0:
        return _zeros(out_shape)
    ld, b = _expand_batch(LD, batch), _expand_batch(B, batch)
    return _ldl_solve(ld, pivots.expand(batch + [n]), b)
