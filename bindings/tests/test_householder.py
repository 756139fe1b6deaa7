"""The Householder QR family composed from engine ops (ormqr,
householder_product / orgqr, geqrf, linalg.qr): each against CPU eager (which
calls LAPACK) within float32 tolerance, on tall, square, wide, batched and
empty shapes, and each without the CPU fallback."""

import itertools

import deferfuse
import pytest
import torch
from helpers import on_tpu

# Reflector products round differently from LAPACK's (another summation
# order), so values agree to float32 rounding, not bit for bit: the
# conformance runner's float32 tolerance.
TOL = dict(rtol=1e-4, atol=1e-5)

SHAPES = [
    (5, 5),
    (5, 2),
    (2, 5),
    (1, 1),
    (3, 4, 3),
    (2, 1, 3, 3),
    (0, 3),
    (3, 0),
    (0, 0),
    (2, 0, 3),
    (0, 4, 2),
]


def close(got, want, **tol):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.shape, w.shape)
        torch.testing.assert_close(g, w, equal_nan=True, **(tol or TOL))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("left,transpose", list(itertools.product([True, False], [True, False])))
def test_ormqr_matches_lapack(mode, no_fallback, shape, left, transpose):
    factored, tau = torch.geqrf(torch.randn(shape))
    m = shape[-2]
    other = torch.randn(shape[:-2] + ((m, 4) if left else (3, m)))
    want = torch.ormqr(factored, tau, other, left, transpose)
    close(on_tpu(torch.ormqr, factored, tau, other, left, transpose), want)


@pytest.mark.parametrize("left,transpose", list(itertools.product([True, False], [True, False])))
def test_ormqr_arbitrary_reflectors(mode, no_fallback, left, transpose):
    """Any (input, tau) defines reflectors, not only geqrf's: the upper part
    of input is ignored (and so are columns past min(rows, columns))."""
    a, tau = torch.randn(2, 6, 8), torch.randn(2, 6)
    other = torch.randn(2, 6, 2) if left else torch.randn(2, 2, 6)
    close(on_tpu(torch.ormqr, a, tau, other, left, transpose), torch.ormqr(a, tau, other, left, transpose))


def test_ormqr_nan_spreads_as_in_lapack(nan_mode, no_fallback):
    factored, tau = torch.geqrf(torch.randn(4, 4))
    other = torch.randn(4, 3)
    other[1, 2] = float("nan")
    want = torch.ormqr(factored, tau, other)
    assert want[:, 2].isnan().all() and not want[:, :2].isnan().any()
    close(on_tpu(torch.ormqr, factored, tau, other), want)


def test_ormqr_out(mode, no_fallback):
    factored, tau = torch.geqrf(torch.randn(4, 3))
    other = torch.randn(4, 2)
    out = torch.empty(0, device="tpu")
    torch.ormqr(factored.to("tpu"), tau.to("tpu"), other.to("tpu"), out=out)
    close(out.cpu(), torch.ormqr(factored, tau, other))


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[-2] >= s[-1]])
def test_householder_product_and_orgqr(mode, no_fallback, shape):
    factored, tau = torch.geqrf(torch.randn(shape))
    want = torch.linalg.householder_product(factored, tau)
    close(on_tpu(torch.linalg.householder_product, factored, tau), want)
    close(on_tpu(torch.orgqr, factored, tau), want)
    if shape[-1] > 1:  # fewer reflectors than columns
        short = tau[..., :-1]
        close(
            on_tpu(torch.linalg.householder_product, factored, short),
            torch.linalg.householder_product(factored, short),
        )


def test_too_many_reflectors_stay_on_the_cpu(mode):
    """Past MAX_REFLECTORS the op runs on the CPU, still right."""
    factored, tau = torch.geqrf(torch.randn(70, 70))
    before = deferfuse.fallback_counts()
    close(
        on_tpu(torch.linalg.householder_product, factored, tau),
        torch.linalg.householder_product(factored, tau),
    )
    assert deferfuse.fallback_counts() - before


def test_bfloat16_stays_on_the_cpu(mode):
    """PyTorch's CPU has no bfloat16 Householder kernels: the same error."""
    a = torch.randn(3, 3, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.geqrf(a.to("tpu"))
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.ormqr(a.to("tpu"), a[0].to("tpu"), a.to("tpu"))


def test_rejected_arguments_raise_pytorchs_error(mode):
    a, other = torch.randn(6, 4), torch.randn(6, 2)
    with pytest.raises(RuntimeError, match="tau.shape"):
        torch.ormqr(a.to("tpu"), torch.randn(3).to("tpu"), other.to("tpu"))
    with pytest.raises(RuntimeError):
        torch.linalg.householder_product(torch.randn(3, 4).to("tpu"), torch.randn(3).to("tpu"))


@pytest.mark.parametrize("shape", SHAPES + [(33, 33), (2, 12, 7), (7, 12)])
def test_geqrf_matches_lapack(mode, no_fallback, shape):
    a = torch.randn(shape)
    close(on_tpu(torch.geqrf, a), torch.geqrf(a))


def special_matrices():
    """Inputs where slarfg's branches matter: an all-zero column below the
    diagonal (H = I, tau = 0), a zero diagonal (sign(0) = +, also for -0), negative and
    positive identities, triangular input, and magnitudes whose squares would
    overflow or underflow float32 without snrm2's scaling."""
    zero_below = torch.randn(5, 4)
    zero_below[2:, 0] = 0
    zero_below[3:, 2] = 0
    zero_diag = torch.randn(4, 3)
    zero_diag[0, 0] = 0
    zero_diag[1, 1] = 0
    negative_zero = torch.randn(4, 3)
    negative_zero[0, 0] = -0.0  # MKL's slarfg takes sign(-0) = + too
    return [
        zero_below,
        zero_diag,
        negative_zero,
        torch.zeros(4, 4),
        torch.eye(4),
        -torch.eye(3, 5),
        torch.randn(4, 4).triu(),
        torch.randn(5, 3) * 1e-25,
        torch.randn(3, 5) * 1e25,
        torch.tensor([[0.0], [0.0], [3.0]]),
    ]


@pytest.mark.parametrize("index", range(10))
def test_geqrf_lapack_branches(mode, no_fallback, index):
    a = special_matrices()[index]
    got, want = on_tpu(torch.geqrf, a), torch.geqrf(a)
    scale = a.abs().max().item() or 1.0
    close(got, want, rtol=1e-4, atol=1e-5 * scale)


def test_geqrf_rank_deficient_is_a_valid_factorization(mode, no_fallback):
    """Dependent columns make QR non-unique (the later columns are rounding
    residue in LAPACK as here): the columns before the dependence match
    LAPACK, and the result factors A."""
    a = torch.randn(2, 6, 4)
    a[..., 2] = a[..., 0] * 2 - a[..., 1]
    factored, tau = on_tpu(torch.geqrf, a)
    want_factored, want_tau = torch.geqrf(a)
    close((factored[..., :2], tau[..., :2]), (want_factored[..., :2], want_tau[..., :2]))
    q = torch.linalg.householder_product(factored, tau)
    torch.testing.assert_close(q.mT @ q, torch.eye(4).expand(2, 4, 4), rtol=0, atol=1e-5)
    q_full = torch.ormqr(factored, tau, torch.eye(6).expand(2, 6, 6).contiguous())
    torch.testing.assert_close(q_full @ factored.triu(), a, rtol=0, atol=1e-5)


def test_geqrf_nan_stays_nan(nan_mode, no_fallback):
    a = torch.randn(4, 3)
    a[2, 1] = float("nan")
    factored, tau = on_tpu(torch.geqrf, a)
    want_factored, want_tau = torch.geqrf(a)
    close((factored[:, 0], tau[0]), (want_factored[:, 0], want_tau[0]))
    assert factored[:, 1:].isnan().any() and tau[1:].isnan().any()


def test_geqrf_out(mode, no_fallback):
    a = torch.randn(3, 5, 3)
    out = (torch.empty(0, device="tpu"), torch.empty(0, device="tpu"))
    torch.geqrf(a.to("tpu"), out=out)
    close(tuple(o.cpu() for o in out), torch.geqrf(a))


@pytest.mark.parametrize("shape", SHAPES + [(2, 12, 7), (7, 12)])
@pytest.mark.parametrize("qr_mode", ["reduced", "complete", "r"])
def test_linalg_qr_matches_lapack(mode, no_fallback, shape, qr_mode):
    """Same signs as the CPU (both build Q from geqrf's reflectors); `r`
    gives an empty Q as PyTorch does."""
    a = torch.randn(shape)
    got, want = on_tpu(torch.linalg.qr, a, mode=qr_mode), torch.linalg.qr(a, mode=qr_mode)
    close(got, want)


@pytest.mark.parametrize("index", range(10))
def test_linalg_qr_lapack_branches(mode, no_fallback, index):
    a = special_matrices()[index]
    scale = a.abs().max().item() or 1.0
    for qr_mode in ("reduced", "complete"):
        q, r = on_tpu(torch.linalg.qr, a, mode=qr_mode)
        want_q, want_r = torch.linalg.qr(a, mode=qr_mode)
        close(q, want_q)
        close(r, want_r, rtol=1e-4, atol=1e-5 * scale)


def test_linalg_qr_out_and_nan(nan_mode, no_fallback):
    a = torch.randn(4, 3)
    out = (torch.empty(0, device="tpu"), torch.empty(0, device="tpu"))
    torch.linalg.qr(a.to("tpu"), out=out)
    close(tuple(o.cpu() for o in out), torch.linalg.qr(a))
    # NaN spreads through Q and R as in LAPACK, except that this CPU's
    # LAPACK (MKL) drops a NaN diagonal inside slapy2 (R[0, 0] finite there,
    # NaN here): NaN handling differs between LAPACK builds.
    a[0, 0] = float("nan")
    q, r = on_tpu(torch.linalg.qr, a)
    want_q, want_r = torch.linalg.qr(a)
    assert q.isnan().all() and want_q.isnan().all()
    assert r[:, 1:].triu().isnan().equal(want_r[:, 1:].triu().isnan()) and r[0].isnan().all()
