"""Dense linear algebra unrolled into engine ops (lowerings/linalg.py):
triangular solves, Cholesky, LU and what is built on them, each against CPU
eager (LAPACK) within a stated tolerance, and each without the CPU fallback.
Integer outputs (pivots, info) must be equal."""

import deferfuse
import pytest
import torch
from helpers import on_tpu

# f32 against LAPACK: the same algorithms, other summation orders.
TOL = dict(rtol=1e-4, atol=1e-5)


def well_conditioned_triangular(*shape, upper):
    a = torch.randn(*shape) / shape[-1] ** 0.5
    a = a + torch.eye(shape[-1]) * 2  # a dominant diagonal
    return a  # the other triangle is garbage on purpose: it must not be read


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular_all_variants(nan_mode, no_fallback, upper, left, unit):
    a = well_conditioned_triangular(2, 1, 5, 5, upper=upper)
    b = torch.randn(3, 5, 4) if left else torch.randn(3, 4, 5)  # batch dims broadcast
    want = torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)
    got = on_tpu(torch.linalg.solve_triangular, a, b, upper=upper, left=left, unitriangular=unit)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("n", [1, 16, 64])
def test_solve_triangular_sizes(mode, no_fallback, n):
    a = well_conditioned_triangular(n, n, upper=False)
    b = torch.randn(n, 3)
    want = torch.linalg.solve_triangular(a, b, upper=False)
    torch.testing.assert_close(on_tpu(torch.linalg.solve_triangular, a, b, upper=False), want, **TOL)


def test_solve_triangular_empty(nan_mode, no_fallback):
    for a, b, left in [
        (torch.randn(0, 0), torch.randn(0, 3), True),
        (torch.randn(3, 3), torch.randn(3, 0), True),
        (torch.randn(2, 3, 3), torch.randn(2, 0, 3), False),
        (torch.randn(0, 2, 2), torch.randn(2, 1), True),
    ]:
        want = torch.linalg.solve_triangular(a, b, upper=True, left=left)
        got = on_tpu(torch.linalg.solve_triangular, a, b, upper=True, left=left)
        assert got.shape == want.shape and torch.equal(got, want)


def test_solve_triangular_nan_and_singular(nan_mode, no_fallback):
    a = well_conditioned_triangular(4, 4, upper=True)
    b = torch.randn(4, 2)
    b[3, 0] = float("nan")
    want = torch.linalg.solve_triangular(a, b, upper=True)
    torch.testing.assert_close(
        on_tpu(torch.linalg.solve_triangular, a, b, upper=True), want, equal_nan=True, **TOL
    )
    a[1, 1] = 0.0  # singular: division by zero gives inf/NaN as in LAPACK
    want = torch.linalg.solve_triangular(a, torch.ones(4, 1), upper=True)
    got = on_tpu(torch.linalg.solve_triangular, a, torch.ones(4, 1), upper=True)
    assert torch.equal(got.isfinite(), want.isfinite())


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_triangular_solve(nan_mode, no_fallback, upper, transpose):
    a = well_conditioned_triangular(2, 4, 4, upper=upper)
    b = torch.randn(3, 1, 4, 2)
    want = torch.triangular_solve(b, a, upper=upper, transpose=transpose)
    got = on_tpu(torch.triangular_solve, b, a, upper=upper, transpose=transpose)
    torch.testing.assert_close(got[0], want[0], **TOL)
    assert torch.equal(got[1], want[1])


def test_bfloat16_stays_pytorchs_error():
    a = torch.eye(3, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError):
        torch.linalg.solve_triangular(a.to("tpu"), a.to("tpu"), upper=True)


def spd(*shape):
    x = torch.randn(*shape)
    return x @ x.mT + shape[-1] * torch.eye(shape[-1])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex(mode, no_fallback, upper):
    a = spd(2, 3, 6, 6)
    want = torch.linalg.cholesky_ex(a, upper=upper)
    got = on_tpu(torch.linalg.cholesky_ex, a, upper=upper)
    torch.testing.assert_close(got[0], want[0], **TOL)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_reads_one_triangle(nan_mode, no_fallback, upper):
    a = spd(5, 5)
    garbage = torch.randn(5, 5) * 100
    ones = torch.ones(5, 5, dtype=torch.bool)
    unread = ones.tril(-1) if upper else ones.triu(1)
    a = torch.where(unread, garbage, a)
    want = torch.linalg.cholesky_ex(a, upper=upper)
    got = on_tpu(torch.linalg.cholesky_ex, a, upper=upper)
    torch.testing.assert_close(got[0], want[0], **TOL)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_not_positive_definite_is_lapacks(nan_mode, no_fallback, upper):
    """info is the first failing minor; L is what LAPACK leaves (factored
    columns, the failed Schur value, A's own entries after it)."""
    a = torch.stack([spd(6, 6) for _ in range(4)])
    a[0, 3, 3] -= 1000.0
    a[1, 0, 0] = -1.0
    a[2, 5, 5] = float("nan")
    want = torch.linalg.cholesky_ex(a, upper=upper)
    got = on_tpu(torch.linalg.cholesky_ex, a, upper=upper)
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    torch.testing.assert_close(got[0], want[0], equal_nan=True, **TOL)
    small = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    assert torch.equal(on_tpu(torch.linalg.cholesky_ex, small)[0], torch.linalg.cholesky_ex(small)[0])


def test_cholesky_empty(nan_mode, no_fallback):
    for shape in [(0, 0), (2, 0, 0), (0, 3, 3)]:
        want = torch.linalg.cholesky_ex(torch.randn(shape))
        got = on_tpu(torch.linalg.cholesky_ex, torch.randn(shape))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(mode, no_fallback, upper):
    a = spd(2, 5, 5)
    factor = torch.linalg.cholesky(a, upper=upper)
    b = torch.randn(3, 1, 5, 2)
    torch.testing.assert_close(
        on_tpu(torch.cholesky_solve, b, factor, upper=upper),
        torch.cholesky_solve(b, factor, upper=upper),
        **TOL,
    )
    torch.testing.assert_close(
        on_tpu(torch.cholesky_inverse, factor, upper=upper),
        torch.cholesky_inverse(factor, upper=upper),
        **TOL,
    )


def test_linalg_cholesky_of_batches(mode, no_fallback):
    a = spd(3, 4, 4)
    torch.testing.assert_close(on_tpu(torch.linalg.cholesky, a), torch.linalg.cholesky(a), **TOL)


@pytest.mark.parametrize("shape", [(5, 5), (3, 4, 6), (2, 7, 4), (1, 1)])
def test_lu_factor_ex(mode, no_fallback, shape):
    a = torch.randn(*shape)
    want = torch.linalg.lu_factor_ex(a)
    got = on_tpu(torch.linalg.lu_factor_ex, a)
    assert torch.equal(got.pivots, want.pivots) and got.pivots.dtype == torch.int32
    assert torch.equal(got.info, want.info)
    torch.testing.assert_close(got.LU, want.LU, **TOL)


def test_lu_pivot_ties_take_the_first_row(nan_mode, no_fallback):
    a = torch.tensor([[1.0, 2.0, 0.0], [-3.0, 1.0, 1.0], [3.0, 0.0, 2.0]])  # |-3| == |3|
    want = torch.linalg.lu_factor_ex(a)
    got = on_tpu(torch.linalg.lu_factor_ex, a)
    assert torch.equal(got.pivots, want.pivots)
    torch.testing.assert_close(got.LU, want.LU, **TOL)


def test_lu_singular_info(nan_mode, no_fallback):
    a = torch.tensor(
        [
            [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 1.0, 1.0]],
            [[0.0, 1.0, 2.0], [0.0, 3.0, 4.0], [0.0, 5.0, 6.0]],
        ]
    )
    want = torch.linalg.lu_factor_ex(a)
    got = on_tpu(torch.linalg.lu_factor_ex, a)
    assert torch.equal(got.info, want.info) and torch.equal(got.pivots, want.pivots), (got, want)
    torch.testing.assert_close(got.LU, want.LU, **TOL)


def test_lu_empty(nan_mode, no_fallback):
    for shape in [(0, 0), (2, 0, 3), (0, 3, 3), (3, 0)]:
        want = torch.linalg.lu_factor_ex(torch.randn(shape))
        got = on_tpu(torch.linalg.lu_factor_ex, torch.randn(shape))
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype


@pytest.mark.parametrize("shape", [(5, 5), (3, 4, 6), (2, 6, 4)])
def test_linalg_lu_and_unpack(mode, no_fallback, shape):
    a = torch.randn(*shape)
    want = torch.linalg.lu(a)
    got = on_tpu(torch.linalg.lu, a)
    assert torch.equal(got.P, want.P)
    torch.testing.assert_close(got.L, want.L, **TOL)
    torch.testing.assert_close(got.U, want.U, **TOL)
    lu, piv = torch.linalg.lu_factor(a)
    for g, w in zip(on_tpu(torch.lu_unpack, lu, piv), torch.lu_unpack(lu, piv)):
        assert torch.equal(g, w)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(nan_mode, no_fallback, left, adjoint):
    lu, piv = torch.linalg.lu_factor(torch.randn(2, 1, 4, 4) + 3 * torch.eye(4))
    b = torch.randn(3, 4, 2) if left else torch.randn(3, 2, 4)
    want = torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)
    torch.testing.assert_close(
        on_tpu(torch.linalg.lu_solve, lu, piv, b, left=left, adjoint=adjoint), want, **TOL
    )


@pytest.mark.parametrize("left", [False, True])
def test_solve_and_inverse(mode, no_fallback, left):
    a = torch.randn(2, 5, 5) + 3 * torch.eye(5)
    rhs = [torch.randn(2, 5, 3), torch.randn(2, 5), torch.randn(5)] if left else [torch.randn(2, 3, 5)]
    for b in rhs:
        want = torch.linalg.solve_ex(a, b, left=left)
        got = on_tpu(torch.linalg.solve_ex, a, b, left=left)
        torch.testing.assert_close(got.result, want.result, **TOL)
        assert torch.equal(got.info, want.info)
    want = torch.linalg.inv_ex(a)
    got = on_tpu(torch.linalg.inv_ex, a)
    torch.testing.assert_close(got.inverse, want.inverse, **TOL)
    assert torch.equal(got.info, want.info)
    torch.testing.assert_close(
        on_tpu(torch.linalg.solve, a, torch.ones(5)), torch.linalg.solve(a, torch.ones(5)), **TOL
    )


def test_singular_solve_reports_info(nan_mode, no_fallback):
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    want = torch.linalg.inv_ex(a)
    got = on_tpu(torch.linalg.inv_ex, a)
    assert torch.equal(got.info, want.info) and int(got.info) > 0


def test_errors_stay_pytorchs():
    """Arguments PyTorch rejects go to the CPU, which raises its own error."""
    a = torch.randn(5, 5)
    with pytest.raises(RuntimeError):
        torch.linalg.solve(a.to("tpu"), torch.ones(5).to("tpu"), left=False)
    with pytest.raises(RuntimeError):
        torch.linalg.solve_triangular(a.to("tpu"), torch.ones(4, 2).to("tpu"), upper=True)


def test_det_and_slogdet(mode, no_fallback):
    a = torch.randn(3, 5, 5)
    a[1] = a[1][[1, 0, 2, 3, 4]]  # flips the sign of one determinant
    torch.testing.assert_close(on_tpu(torch.linalg.det, a), torch.linalg.det(a), **TOL)
    got, want = on_tpu(torch.linalg.slogdet, a), torch.linalg.slogdet(a)
    assert torch.equal(got.sign, want.sign)
    torch.testing.assert_close(got.logabsdet, want.logabsdet, **TOL)
    one = torch.tensor([[-2.5]])
    assert torch.equal(on_tpu(torch.linalg.det, one), torch.linalg.det(one))


def test_det_singular_and_empty(nan_mode, no_fallback):
    singular = torch.tensor(
        [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    )  # exactly: no rounding residue
    zero = torch.zeros(3, 3)
    for a in (singular, zero):
        got, want = on_tpu(torch.linalg.slogdet, a), torch.linalg.slogdet(a)
        assert torch.equal(got.sign, want.sign) and torch.equal(got.logabsdet, want.logabsdet), (got, want)
        torch.testing.assert_close(on_tpu(torch.linalg.det, a), torch.linalg.det(a), **TOL)
    for shape in [(0, 0), (2, 0, 0), (0, 3, 3)]:
        a = torch.randn(shape)
        assert torch.equal(on_tpu(torch.linalg.det, a), torch.linalg.det(a))
        got, want = on_tpu(torch.linalg.slogdet, a), torch.linalg.slogdet(a)
        assert torch.equal(got.sign, want.sign) and torch.equal(got.logabsdet, want.logabsdet)


@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 3), (3, 4), (1, 1)])
def test_geqrf_and_qr(mode, no_fallback, shape):
    a = torch.randn(*shape)
    got, want = on_tpu(torch.geqrf, a), torch.geqrf(a)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    for qr_mode in ("reduced", "complete", "r"):
        got, want = on_tpu(torch.linalg.qr, a, mode=qr_mode), torch.linalg.qr(a, mode=qr_mode)
        assert got.Q.shape == want.Q.shape
        torch.testing.assert_close(got.Q, want.Q, **TOL)
        torch.testing.assert_close(got.R, want.R, **TOL)


def test_qr_of_a_zero_column_keeps_tau_zero(nan_mode, no_fallback):
    a = torch.tensor([[2.0, 1.0], [0.0, 3.0], [0.0, -1.0]])  # the first column is already e_0 * 2
    got, want = on_tpu(torch.geqrf, a), torch.geqrf(a)
    assert torch.equal(got[1][0], want[1][0])
    torch.testing.assert_close(got[0], want[0], **TOL)
    z = torch.zeros(3, 3)
    for g, w in zip(on_tpu(torch.linalg.qr, z), torch.linalg.qr(z)):
        assert torch.equal(g, w)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_ormqr_and_householder_product(nan_mode, no_fallback, left, transpose):
    a, tau = torch.geqrf(torch.randn(2, 5, 3))
    c = torch.randn(2, 5, 4) if left else torch.randn(2, 4, 5)
    torch.testing.assert_close(
        on_tpu(torch.ormqr, a, tau, c, left=left, transpose=transpose),
        torch.ormqr(a, tau, c, left=left, transpose=transpose),
        **TOL,
    )
    torch.testing.assert_close(
        on_tpu(torch.linalg.householder_product, a, tau), torch.linalg.householder_product(a, tau), **TOL
    )


def test_qr_empty(nan_mode, no_fallback):
    for shape in [(0, 0), (3, 0), (0, 3), (2, 0, 4), (0, 3, 2)]:
        a = torch.randn(shape)
        for qr_mode in ("reduced", "complete", "r"):
            for g, w in zip(on_tpu(torch.linalg.qr, a, mode=qr_mode), torch.linalg.qr(a, mode=qr_mode)):
                assert torch.equal(g, w), (shape, qr_mode)


@pytest.mark.parametrize("shape", [(5, 5), (3, 8), (64, 8), (2, 6, 3), (1, 1), (4, 1)])
def test_svdvals(mode, no_fallback, shape):
    a = torch.randn(*shape)
    torch.testing.assert_close(on_tpu(torch.linalg.svdvals, a), torch.linalg.svdvals(a), **TOL)


def test_svdvals_ties_rank_deficiency_and_scale(nan_mode, no_fallback):
    cases = [
        torch.linalg.qr(torch.randn(6, 6)).Q,  # all singular values 1
        torch.randn(6, 2) @ torch.randn(2, 6),  # four zeros
        torch.diag(torch.tensor([1e3, 1.0, 1e-3, 1e-5, 3.0, 3.0])),
        torch.randn(7, 7) @ torch.diag(torch.logspace(0, -6, 7)),
        torch.zeros(3, 4),
    ]
    for a in cases:
        torch.testing.assert_close(on_tpu(torch.linalg.svdvals, a), torch.linalg.svdvals(a), **TOL)
    for shape in [(0, 3), (2, 0, 4), (0, 0)]:
        a = torch.randn(shape)
        assert torch.equal(on_tpu(torch.linalg.svdvals, a), torch.linalg.svdvals(a))


def test_matrix_norms_and_cond(mode, no_fallback):
    a = torch.randn(2, 4, 3)
    for ord in ("nuc", 2, -2):
        torch.testing.assert_close(
            on_tpu(torch.linalg.matrix_norm, a, ord=ord), torch.linalg.matrix_norm(a, ord=ord), **TOL
        )
    sq = torch.randn(2, 4, 4) + 3 * torch.eye(4)
    for p in (None, 1, float("inf"), "fro"):
        torch.testing.assert_close(on_tpu(torch.linalg.cond, sq, p), torch.linalg.cond(sq, p), **TOL)


def test_svd_stays_pytorchs_where_it_must():
    """Singular vectors (sign is LAPACK's choice) and non-finite input
    (PyTorch raises) go to the CPU."""
    a = torch.randn(4, 4)
    before = deferfuse.fallback_counts()
    u, s, vh = torch.linalg.svd(a.to("tpu"))
    assert (deferfuse.fallback_counts() - before)["aten::_linalg_svd"] == 1
    assert torch.equal(u.cpu(), torch.linalg.svd(a).U)
    a[1, 2] = float("nan")
    with pytest.raises(RuntimeError):
        torch.linalg.svdvals(a.to("tpu"))


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigvalsh(mode, no_fallback, uplo):
    x = torch.randn(2, 6, 6)
    a = x + x.mT
    a = (
        a + torch.randn(6, 6).triu(1) * 50 if uplo == "L" else a + torch.randn(6, 6).tril(-1) * 50
    )  # unread triangle
    torch.testing.assert_close(
        on_tpu(torch.linalg.eigvalsh, a, UPLO=uplo), torch.linalg.eigvalsh(a, UPLO=uplo), **TOL
    )


def test_eigvalsh_ties_and_empty(nan_mode, no_fallback):
    q = torch.linalg.qr(torch.randn(5, 5)).Q
    a = q @ torch.diag(torch.tensor([2.0, 2.0, -1.0, 0.0, 2.0])) @ q.T
    torch.testing.assert_close(on_tpu(torch.linalg.eigvalsh, a), torch.linalg.eigvalsh(a), **TOL)
    for shape in [(0, 0), (2, 0, 0), (0, 3, 3)]:
        a = torch.randn(shape)
        assert torch.equal(on_tpu(torch.linalg.eigvalsh, a), torch.linalg.eigvalsh(a))


def test_ldl_factor_bunch_kaufman(mode, no_fallback):
    """Batches whose elements take 1x1 and 2x2 pivots at different steps."""
    for seed, n in [(2, 6), (4, 6), (7, 5), (9, 3), (11, 1)]:
        torch.manual_seed(seed)
        x = torch.randn(3, n, n)
        a = x + x.mT + torch.randn(n, n).triu(1) * 10  # the upper triangle is not read
        want = torch.linalg.ldl_factor_ex(a)
        got = on_tpu(torch.linalg.ldl_factor_ex, a)
        assert torch.equal(got.pivots, want.pivots) and torch.equal(got.info, want.info), (
            got.pivots,
            want.pivots,
        )
        torch.testing.assert_close(got.LD, want.LD, **TOL)


def test_ldl_factor_zero_columns_and_empty(nan_mode, no_fallback):
    a = torch.zeros(2, 4, 4)
    a[1] = torch.diag(torch.tensor([1.0, 0.0, 2.0, 0.0]))
    want, got = torch.linalg.ldl_factor_ex(a), on_tpu(torch.linalg.ldl_factor_ex, a)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    for shape in [(0, 0), (0, 2, 2), (2, 0, 0)]:
        want, got = (
            torch.linalg.ldl_factor_ex(torch.randn(shape)),
            on_tpu(torch.linalg.ldl_factor_ex, torch.randn(shape)),
        )
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype


def test_ldl_solve(mode, no_fallback):
    for seed, n in [(2, 6), (4, 6), (7, 5), (9, 3), (11, 1)]:
        torch.manual_seed(seed)
        x = torch.randn(3, n, n)
        ld, piv = torch.linalg.ldl_factor(x + x.mT)
        for b in (torch.randn(3, n, 4), torch.randn(n, 2)):  # B's batch broadcasts
            want = torch.linalg.ldl_solve(ld, piv, b)
            torch.testing.assert_close(on_tpu(torch.linalg.ldl_solve, ld, piv, b), want, **TOL)
    ld, piv = torch.linalg.ldl_factor(torch.randn(0, 2, 2))
    b = torch.randn(2, 5)
    assert torch.equal(on_tpu(torch.linalg.ldl_solve, ld, piv, b), torch.linalg.ldl_solve(ld, piv, b))


def test_aux_outputs_are_pytorchs(mode, no_fallback):
    """The LU, pivots and info that autograd reuses: solve's are of A, det's
    and slogdet's of A^T, as PyTorch's CPU kernels return them."""
    a = torch.randn(2, 4, 4) + 2 * torch.eye(4)
    for op, args in [
        (torch.ops.aten._linalg_solve_ex, (a, torch.randn(3, 2, 4, 2))),
        (torch.ops.aten._linalg_solve_ex, (a, torch.randn(2, 4))),
        (torch.ops.aten._linalg_det, (a,)),
        (torch.ops.aten._linalg_slogdet, (a,)),
    ]:
        want, got = op(*args), on_tpu(op, *args)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if w.dtype == torch.int32:
                assert torch.equal(g, w)
            else:
                torch.testing.assert_close(g, w, **TOL)


def test_solve_and_det_gradients(nan_mode, no_fallback):
    a, b = torch.randn(4, 4) + 2 * torch.eye(4), torch.randn(4, 2)
    for fn in (
        lambda m: torch.linalg.solve(m, b.to(m.device)).sum(),
        lambda m: torch.linalg.det(m),
        lambda m: torch.linalg.inv(m).sum(),
        lambda m: torch.linalg.slogdet(m)[1],
    ):
        at = a.to("tpu").requires_grad_()
        fn(at).backward()
        torch.testing.assert_close(at.grad.cpu(), torch.func.grad(fn)(a), rtol=1e-4, atol=1e-4)


def test_failures_raise_pytorchs_errors(no_fallback):
    """linalg.cholesky / inv / lu_factor check the info our kernels compute."""
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(torch.tensor([[1.0, 2.0], [2.0, 1.0]]).to("tpu"))
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]]).to("tpu")
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(singular)
    with pytest.raises(RuntimeError):
        torch.linalg.lu_factor(singular)
