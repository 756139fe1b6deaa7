"""The Householder QR family as compositions: ormqr, householder_product
(orgqr), geqrf and linalg.qr.

LAPACK stores an orthogonal Q = H_1 H_2 ... H_k as reflectors
H_i = I - tau_i v_i v_i^T, where v_i is 1 at row i, zero above it, and the
strictly-lower part of column i of the factored matrix below it. Every op here
applies such reflectors one at a time as rank-1 updates
(C - tau_i v_i (v_i^T C)), unrolled in Python over the reflectors, with the
same conventions (and so the same signs) as LAPACK's sgeqr2 / slarfg / sorm2r /
sorg2r, which PyTorch's CPU kernels call. The unrolled graph grows with the
reflector count, so more than `MAX_REFLECTORS` (or more than `WORK_LIMIT`
multiply-adds) stay on the CPU. Only float32: PyTorch's CPU has no bfloat16 or
float16 kernels for these ops (the CPU then raises PyTorch's own error).

Where a matrix's first min(m, n) columns are linearly dependent, its QR
factorization is not unique (PyTorch's docs say so): the columns past the
dependence come from rounding residues, which differ between any two
implementations (LAPACK builds, or PyTorch's CUDA and CPU kernels) and differ
here too. Such results are still a valid factorization (Q R = A, Q
orthogonal); the columns before the dependence, and exact zeros in the input,
match LAPACK within float32 rounding. NaN input gives NaN output, though
not always in the same entries as MKL's LAPACK (its slapy2 drops a NaN).
"""

from __future__ import annotations

import math

from .._engine import Tensor as ET
from ._registry import Unsupported, eng, lower

MAX_REFLECTORS = 64
WORK_LIMIT = 1 << 22


def _check_f32(*xs: object) -> None:
    for x in xs:
        if not isinstance(x, ET) or x.dtype != "f32":
            raise Unsupported("Householder ops on non-float32 operands")


def _check_work(batch: list[int], reflectors: int, rows: int, cols: int) -> None:
    if reflectors > MAX_REFLECTORS:
        raise Unsupported(f"more than {MAX_REFLECTORS} Householder reflectors")
    if math.prod(batch) * reflectors * rows * cols > WORK_LIMIT:
        raise Unsupported("a Householder product too large to unroll")


def _const(value: float) -> ET:
    return eng().full(value, [], "f32")


def _index_grid(rows: int, cols: int) -> tuple[ET, ET]:
    """Row indices [rows, 1] and column indices [1, cols], for masks."""
    r = eng().arange(0, rows, 1, "i64").reshape([rows, 1])
    c = eng().arange(0, cols, 1, "i64").reshape([1, cols])
    return r, c


def _reflectors(a: ET, k: int) -> ET:
    """V [..., rows, k]: column i is v_i, built from the first k columns of a
    (1 on the diagonal, a's strictly-lower part below, zeros above)."""
    rank = len(a.shape)
    rows = a.shape[-2]
    cols = a.slice(rank - 1, 0, k, 1)
    r, c = _index_grid(rows, k)
    unit = r.binary("eq", c).where_(_const(1.0), _const(0.0))
    return r.binary("gt", c).where_(cols, unit)


def _identity(batch: list[int], rows: int, cols: int) -> ET:
    r, c = _index_grid(rows, cols)
    eye = r.binary("eq", c).where_(_const(1.0), _const(0.0))
    return eye.expand(batch + [rows, cols])


def _apply_left(c: ET, v: ET, tau: ET) -> ET:
    """H c = c - tau v (v^T c); v is [..., rows, 1], tau [..., 1, 1]."""
    rank = len(c.shape)
    w = v.binary("mul", c).reduce("sum", [rank - 2], True)  # [..., 1, cols]
    return c.binary("sub", tau.binary("mul", v).binary("mul", w))


def _apply_right(c: ET, v: ET, tau: ET) -> ET:
    """c H = c - tau (c v) v^T; v is [..., 1, cols], tau [..., 1, 1]."""
    rank = len(c.shape)
    w = c.binary("mul", v).reduce("sum", [rank - 1], True)  # [..., rows, 1]
    return c.binary("sub", w.binary("mul", tau.binary("mul", v)))


def _apply_reflectors(v: ET, tau: ET, c: ET, left: bool, transpose: bool) -> ET:
    """op(Q) c (left) or c op(Q) (right), with Q = H_1 ... H_k from the
    columns of v [..., mn, k] and tau [..., k]. Each H_i is symmetric, so only
    the order changes: Q^T c and c Q apply H_1 first, Q c and c Q^T H_k first."""
    rank = len(c.shape)
    k = v.shape[-1]
    order = range(k) if left == transpose else range(k - 1, -1, -1)
    for i in order:
        vi = v.slice(rank - 1, i, i + 1, 1)  # [..., mn, 1]
        ti = tau.slice(rank - 2, i, i + 1, 1).reshape(list(tau.shape[:-1]) + [1, 1])
        if left:
            c = _apply_left(c, vi, ti)
        else:
            c = _apply_right(c, vi.permute(list(range(rank - 2)) + [rank - 1, rank - 2]), ti)
    return c


@lower("ormqr.default")
def ormqr(self: ET, input2: ET, input3: ET, left: bool = True, transpose: bool = False) -> ET:
    a, tau, other = self, input2, input3
    _check_f32(a, tau, other)
    rank = len(a.shape)
    if rank < 2 or len(tau.shape) != rank - 1 or len(other.shape) != rank:
        raise Unsupported("ormqr operands of unexpected ranks")
    batch = list(a.shape[:-2])
    if list(tau.shape[:-1]) != batch or list(other.shape[:-2]) != batch:
        raise Unsupported("ormqr operands with different batch dimensions")
    mn = other.shape[-2] if left else other.shape[-1]
    k = tau.shape[-1]
    if a.shape[-2] != mn or k != min(mn, a.shape[-1]):
        raise Unsupported("ormqr operands of mismatched sizes")  # the CPU raises PyTorch's error
    if math.prod(other.shape) == 0:
        return eng().full(0.0, list(other.shape), "f32")
    if k == 0:
        return other
    _check_work(batch, k, other.shape[-2], other.shape[-1])
    return _apply_reflectors(_reflectors(a, k), tau, other, left, transpose)


def _householder_q(a: ET, tau: ET, cols: int) -> ET:
    """The first `cols` columns of Q = H_1 ... H_k (k = tau's length), the
    reflectors stored in a [..., m, >= k]: Q applied to the identity's columns."""
    batch, m, k = list(a.shape[:-2]), a.shape[-2], tau.shape[-1]
    if m * cols * math.prod(batch) == 0:
        return eng().full(0.0, batch + [m, cols], "f32")
    eye = _identity(batch, m, cols)
    if k == 0:
        return eye
    _check_work(batch, k, m, cols)
    return _apply_reflectors(_reflectors(a, k), tau, eye, True, False)


@lower("linalg_householder_product.default")
def householder_product(input: ET, tau: ET) -> ET:
    _check_f32(input, tau)
    rank = len(input.shape)
    if rank < 2 or len(tau.shape) != rank - 1 or list(tau.shape[:-1]) != list(input.shape[:-2]):
        raise Unsupported("householder_product operands of unexpected shapes")
    m, n, k = input.shape[-2], input.shape[-1], tau.shape[-1]
    if not m >= n >= k:
        raise Unsupported("householder_product sizes PyTorch rejects")
    return _householder_q(input, tau, n)


def _column_reflector(col: ET, alpha: ET, j: int, rows: ET) -> tuple[ET, ET, ET]:
    """LAPACK's slarfg on column j: with alpha = a[j, j] and x = a[j+1:, j],
    beta = -sign(alpha) hypot(alpha, |x|) (sign(0) = +), tau = (beta - alpha) / beta,
    v = x / (alpha - beta); when x is all zeros, H = I (tau = 0, a[j, j] kept).
    col is [..., m, 1], alpha [..., 1, 1]. Returns (v with its unit at row j
    and zeros above, tau, the new a[j, j]).

    The norm is taken of the column scaled by its largest magnitude, as
    snrm2 does, so squares neither overflow nor underflow; denominators are
    replaced where H = I, so no step makes an infinity or NaN of finite input."""
    zero_f = _const(0.0)
    below = rows.binary("gt", j)  # [m, 1]
    x = below.where_(col, zero_f)
    x_max = x.unary("abs").reduce("max", [len(col.shape) - 2], True)
    identity = x_max.binary("eq", 0.0)
    scale = x_max.binary("maximum", alpha.unary("abs"))
    scale = scale.binary("eq", 0.0).where_(_const(1.0), scale)
    xs, al = x.binary("div", scale), alpha.binary("div", scale)
    norm = xs.binary("mul", xs).reduce("sum", [len(col.shape) - 2], True).binary("add", al.binary("mul", al))
    norm = norm.unary("sqrt").binary("mul", scale)
    beta = alpha.binary("ge", 0.0).where_(norm.unary("neg"), norm)
    safe_beta = identity.where_(_const(1.0), beta)
    tau = identity.where_(zero_f, beta.binary("sub", alpha).binary("div", safe_beta))
    denom = identity.where_(_const(1.0), alpha.binary("sub", beta))
    v = rows.binary("eq", j).where_(_const(1.0), x.binary("div", denom))
    return v, tau, identity.where_(alpha, beta)


def _geqrf(a: ET) -> tuple[ET, ET]:
    """sgeqr2 column by column: reflect column j onto a multiple of e_j, store
    beta on the diagonal and v below it, and apply H_j to the columns right of j."""
    rank = len(a.shape)
    batch, m, n = list(a.shape[:-2]), a.shape[-2], a.shape[-1]
    k = min(m, n)
    rows, cols = _index_grid(m, n)
    taus = []
    for j in range(k):
        col = a.slice(rank - 1, j, j + 1, 1)  # [..., m, 1]
        alpha = col.slice(rank - 2, j, j + 1, 1)  # [..., 1, 1]
        v, tau, diag = _column_reflector(col, alpha, j, rows)
        reflected = _apply_left(a, v, tau)
        new_col = rows.binary("eq", j).where_(diag, rows.binary("gt", j).where_(v, col))
        a = cols.binary("gt", j).where_(reflected, cols.binary("eq", j).where_(new_col, a))
        taus.append(tau.reshape(batch + [1]))
    tau = eng().cat(taus, rank - 2) if len(taus) > 1 else taus[0]
    return a, tau


@lower("geqrf.default")
def geqrf(self: ET) -> tuple[ET, ET]:
    _check_f32(self)
    if len(self.shape) < 2:
        raise Unsupported("geqrf of fewer than two dimensions")  # the CPU raises PyTorch's error
    batch, m, n = list(self.shape[:-2]), self.shape[-2], self.shape[-1]
    k = min(m, n)
    if math.prod(self.shape) == 0:
        return eng().full(0.0, list(self.shape), "f32"), eng().full(0.0, batch + [k], "f32")
    _check_work(batch, k, m, n)
    return _geqrf(self)


def _triu(a: ET) -> ET:
    r, c = _index_grid(a.shape[-2], a.shape[-1])
    return r.binary("le", c).where_(a, _const(0.0))


@lower("linalg_qr.default")
def linalg_qr(A: ET, mode: str = "reduced") -> tuple[ET, ET]:
    """As PyTorch's CPU kernel: geqrf, then R from the factored matrix's upper
    triangle and Q from its reflectors (householder_product), so the signs
    are LAPACK's. Q has min(m, n) columns (`reduced`), m (`complete`), or is
    an empty tensor (`r`)."""
    _check_f32(A)
    if len(A.shape) < 2 or mode not in ("reduced", "complete", "r"):
        raise Unsupported("linalg_qr arguments PyTorch rejects")  # the CPU raises its error
    batch, m, n = list(A.shape[:-2]), A.shape[-2], A.shape[-1]
    k = min(m, n)
    r_rows = m if mode == "complete" else k
    q_cols = m if mode == "complete" else k
    if math.prod(A.shape) == 0:
        factored, tau = A, eng().full(0.0, batch + [k], "f32")
        r = eng().full(0.0, batch + [r_rows, n], "f32")
    else:
        _check_work(batch, k, m, max(n, q_cols if mode != "r" else 0))
        factored, tau = _geqrf(A)
        r = _triu(factored.slice(len(A.shape) - 2, 0, r_rows, 1))
    if mode == "r":
        return eng().full(0.0, [0], "f32"), r
    return _householder_q(factored, tau, q_cols), r
