"""Ops composed from engine ops in the binding (searchsorted, bucketize, cdist,
equal, log1p, expm1) and ops run as PyTorch's own decompositions: each against
CPU eager, including the inputs where a naive composition would differ (NaN,
unsorted sequences, values near 0, overflow), and each without the CPU
fallback."""

import math

import deferfuse
import pytest
import torch
from helpers import on_tpu


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_is_pytorchs_binary_search(nan_mode, no_fallback, right):
    seqs = [
        torch.tensor([1.0, 2.0, 2.0, 3.0, 5.0, 8.0]),
        torch.tensor([1.0, 3.0, float("nan"), float("nan"), float("nan")]),  # NaN sorted last
        torch.tensor([4.0, -1.0, 7.0, 0.0, 2.0, 9.0, -3.0]),  # unsorted: PyTorch's midpoints decide
        torch.tensor([-float("inf"), 0.0, float("inf")]),
        torch.tensor([2.0]),
    ]
    values = torch.tensor([[-5.0, 1.0, 2.0, 2.5, float("nan")], [3.0, 8.0, 9.0, float("inf"), -float("inf")]])
    for seq in seqs:
        want = torch.searchsorted(seq, values, right=right)
        got = on_tpu(torch.searchsorted, seq, values, right=right)
        assert torch.equal(got, want), (seq, got, want)
    batched = torch.randn(3, 9).sort(-1).values
    vals = torch.randn(3, 4)
    want = torch.searchsorted(batched, vals, right=right, out_int32=True)
    got = on_tpu(torch.searchsorted, batched, vals, right=right, out_int32=True)
    assert got.dtype == torch.int32 and torch.equal(got, want)
    unsorted = torch.randn(10)
    sorter = unsorted.argsort()
    want = torch.searchsorted(unsorted, vals, sorter=sorter, side="right" if right else "left")
    assert torch.equal(
        on_tpu(torch.searchsorted, unsorted, vals, sorter=sorter, side="right" if right else "left"), want
    )
    assert torch.equal(on_tpu(torch.searchsorted, seqs[0], 2), torch.searchsorted(seqs[0], 2))
    ints = torch.tensor([1, 3, 5, 7])
    assert torch.equal(
        on_tpu(torch.bucketize, torch.tensor([0, 3, 6, 9]), ints, right=right),
        torch.bucketize(torch.tensor([0, 3, 6, 9]), ints, right=right),
    )


def test_searchsorted_empty_sequence(mode, no_fallback):
    seq, vals = torch.tensor([]), torch.tensor([1.0, -1.0])
    assert torch.equal(on_tpu(torch.searchsorted, seq, vals), torch.searchsorted(seq, vals))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf")])
@pytest.mark.parametrize("rows", [(4, 5), (30, 7)])
def test_cdist_both_algorithms(mode, no_fallback, p, rows):
    x1, x2 = torch.randn(2, rows[0], 6), torch.randn(1, rows[1], 6)
    x1[0, 1] = x2[0, 2]  # a zero distance: the matmul form clamps it at 1e-30 before sqrt
    for compute_mode in (
        "use_mm_for_euclid_dist_if_necessary",
        "use_mm_for_euclid_dist",
        "donot_use_mm_for_euclid_dist",
    ):
        want = torch.cdist(x1, x2, p=p, compute_mode=compute_mode)
        got = on_tpu(torch.cdist, x1, x2, p=p, compute_mode=compute_mode)
        matmul_form = p == 2 and (
            compute_mode == "use_mm_for_euclid_dist"
            or (compute_mode.endswith("if_necessary") and max(rows) > 25)
        )
        # The matmul form's zero distance is the square root of a cancellation
        # (PyTorch's own is about 1e-3 here, in its own summation order).
        torch.testing.assert_close(got, want, rtol=1e-4, atol=3e-3 if matmul_form else 1e-4)
        if not matmul_form:
            assert got[0, 1, 2] == 0


def test_equal_reads_one_answer(nan_mode, no_fallback):
    a = torch.randn(4, 5)
    b = a.clone()
    assert on_tpu(torch.equal, a, b) is True
    b[2, 3] += 1
    assert on_tpu(torch.equal, a, b) is False
    assert on_tpu(torch.equal, a, a[:, :4]) is False
    nan = torch.tensor([float("nan")])
    assert on_tpu(torch.equal, nan, nan) is torch.equal(nan, nan)


def test_log1p_expm1_are_accurate_near_zero(nan_mode, no_fallback):
    x = torch.tensor(
        [
            0.0,
            -0.0,
            1e-30,
            -1e-20,
            1e-10,
            3e-8,
            -3e-8,
            1e-5,
            1e-3,
            0.5,
            -0.5,
            1.0,
            -0.999999,
            20.0,
            88.0,
            89.0,
            1e30,
            -1.0,
            -2.0,
            -100.0,
            -1e30,
            float("inf"),
            -float("inf"),
            float("nan"),
        ]
    )
    for fn in (torch.log1p, torch.expm1):
        want, got = fn(x), on_tpu(fn, x)
        torch.testing.assert_close(
            got, want, rtol=4 * torch.finfo(torch.float32).eps, atol=0.0, equal_nan=True
        )
        # the sign of zero too
        assert [math.copysign(1, v) for v in got[:2].tolist()] == [
            math.copysign(1, v) for v in want[:2].tolist()
        ]
    assert on_tpu(torch.log1p, torch.tensor([3])).dtype == torch.log1p(torch.tensor([3])).dtype


def test_log1p_expm1_finite_in_debug_mode(no_fallback):
    """Debug checks every op's output: no intermediate may be Inf or NaN when
    the result is finite."""
    x = torch.tensor([0.0, 1e-30, -1e-20, 1e-10, 3e-8, 1e-3, 0.5, -0.7, 20.0, 80.0, -100.0, 1e30])
    with deferfuse.mode("debug"):
        for fn in (torch.log1p, torch.expm1):
            want = fn(x)
            ok = torch.isfinite(want)
            torch.testing.assert_close(
                on_tpu(fn, x[ok]), want[ok], rtol=4 * torch.finfo(torch.float32).eps, atol=0.0
            )


def test_mean_of_no_elements_is_nan(nan_mode):
    x = torch.ones(0, 3)
    torch.testing.assert_close(on_tpu(torch.mean, x), x.mean(), equal_nan=True)
    torch.testing.assert_close(on_tpu(lambda t: t.mean(0), x), x.mean(0), equal_nan=True)
    torch.testing.assert_close(on_tpu(lambda t: t.mean(1), x), x.mean(1), equal_nan=True)


def test_listed_decompositions_run_on_the_engine(mode, no_fallback):
    from deferfuse import _dispatch

    assert "aten::glu" in _dispatch.DECOMPOSED
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    x[0, 0] = float("nan") if mode != "debug" else 0.0
    F = torch.nn.functional
    cases = [
        (lambda a, b: F.glu(a, -1), 1e-5),
        (lambda a, b: torch.nansum(a, 1), 1e-5),
        (lambda a, b: torch.logaddexp(a, b), 1e-5),
        (lambda a, b: F.logsigmoid(b * 30), 1e-5),
        (lambda a, b: F.prelu(b, b[0, :1].abs() * 0 + 0.25), 1e-5),
        (lambda a, b: torch.count_nonzero(b > 0, 1), 0),
        (lambda a, b: torch.dist(b, b * 2, 3), 1e-4),
        (lambda a, b: F.mse_loss(b, b * 0.5), 1e-5),
        (lambda a, b: torch.trace(b[:, :4]), 1e-5),
        (lambda a, b: torch.xlogy(b.abs(), b.abs() + 1), 1e-5),
    ]
    for fn, tol in cases:
        want = fn(x, y)
        got = on_tpu(fn, x, y)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


def test_decomposition_keeps_cpu_dtypes_on_the_cpu(mode):
    x = torch.randn(4, 6, dtype=torch.float64)
    before = deferfuse.fallback_counts()
    got = torch.nn.functional.glu(x.to("tpu"), -1).cpu()
    torch.testing.assert_close(got, torch.nn.functional.glu(x, -1))
    assert (deferfuse.fallback_counts() - before)["aten::glu"] == 1


def test_any_and_all_over_no_elements(nan_mode, no_fallback):
    # any over nothing is False and all over nothing is True, as in PyTorch.
    for x in (
        torch.zeros(0, 3),
        torch.zeros(2, 0),
        torch.tensor([[True, False], [False, False]]),
        torch.tensor(0.5),
    ):
        for reduce in (torch.any, torch.all):
            assert torch.equal(on_tpu(reduce, x), reduce(x))
            if x.dim():
                for dim in range(-x.dim(), x.dim()):
                    assert torch.equal(on_tpu(reduce, x, dim, keepdim=True), reduce(x, dim, keepdim=True))


@pytest.mark.parametrize("n", [8192, 8193, 9000])
def test_searchsorted_over_rows_longer_than_a_tile(nan_mode, no_fallback, n):
    # Rows over 8192 elements run in chunks in fused kernels; the per-row
    # search bounds read after each lookup's sum were overwritten (off by one).
    torch.manual_seed(0)
    seq, values = torch.linspace(0, 1, n), torch.rand(5)
    for right in (False, True):
        assert torch.equal(
            on_tpu(torch.searchsorted, seq, values, right=right), torch.searchsorted(seq, values, right=right)
        )


def test_reductions_of_zero_dimensional_and_empty_tensors(nan_mode, no_fallback):
    # PyTorch's answers for the edge cases: index 0 of a scalar, -inf for the
    # log of an empty sum, 1 for an empty product.
    scalar, empty, grid = torch.tensor(2.5), torch.zeros(0, 3), torch.randn(3, 4)
    for fn, args in [
        (torch.argmax, (scalar,)),
        (torch.argmin, (scalar, 0)),
        (torch.argmax, (grid, None, True)),
        (torch.argmin, (grid, None, True)),
        (torch.logsumexp, (scalar, 0)),
        (torch.logsumexp, (empty, 0)),
        (torch.logsumexp, (empty, 1, True)),
        (torch.prod, (empty,)),
        (torch.prod, (empty, 0)),
    ]:
        want, got = fn(*args), on_tpu(fn, *args)
        assert got.dtype == want.dtype and torch.equal(got, want), (fn, args, got, want)
    for fn in (torch.max, torch.min):
        want, got = fn(scalar, 0), on_tpu(fn, scalar, 0)
        assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch.sort(x, dim=5),
        lambda x: torch.roll(x, 1, 7),
        lambda x: torch.flip(x, [3]),
        lambda x: torch.unique(x, dim=4),
        lambda x: torch.var_mean(x, 9),
        lambda x: torch.topk(x, 1, dim=3),
        lambda x: torch.cumsum(x, 6),
        lambda x: x.scatter(5, torch.zeros(3, 4, dtype=torch.long, device=x.device), 1.0),
        lambda x: torch.gather(x, 4, torch.zeros(3, 4, dtype=torch.long, device=x.device)),
        lambda x: torch.index_select(x, 3, torch.zeros(2, dtype=torch.long, device=x.device)),
    ],
)
def test_a_dim_out_of_range_is_pytorchs_index_error(nan_mode, call):
    # Lowerings never wrap an out-of-range dim around: PyTorch raises.
    with pytest.raises(IndexError, match="out of range"):
        call(torch.randn(3, 4))
    with pytest.raises(IndexError, match="out of range"):
        call(torch.randn(3, 4).to("tpu"))


@pytest.mark.parametrize("op", [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_bitwise_ops_of_an_integer_and_a_bool(nan_mode, no_fallback, op, dtype):
    # A decoding loop's `unfinished & ~stopped`: the bool promotes to 0 or 1.
    a = torch.randint(-9, 10, (3, 5), generator=torch.Generator().manual_seed(0), dtype=dtype)
    flags = torch.rand(3, 5, generator=torch.Generator().manual_seed(1)) > 0.5
    for x, y in ((a, flags), (flags, a), (a, flags[0]), (a, True), (a, False)):
        got = op(*(v.to("tpu") if isinstance(v, torch.Tensor) else v for v in (x, y))).cpu()
        want = op(x, y)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
