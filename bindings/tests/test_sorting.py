"""Sorting-based ops composed from engine ops (lowerings/sorting.py): sort,
argsort, msort, nonzero, unique, topk, kthvalue, median, against CPU eager
with `torch.equal` (every result of these ops is exact: values are moved,
never computed), on NaN, ties, signed zeros, empty inputs and negative dims,
and without the CPU fallback."""

import deferfuse
import pytest
import torch
from helpers import on_tpu

NAN, INF = float("nan"), float("inf")


def same(got, want):
    """Exact equality of tensors or tuples of tensors, NaN equal to NaN, dtypes too."""
    if isinstance(want, torch.Tensor):
        want, got = (want,), (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        assert (
            torch.equal(g.nan_to_num(nan=12345.0), w.nan_to_num(nan=12345.0))
            if w.is_floating_point()
            else torch.equal(g, w)
        ), (g, w)


SORT_INPUTS = [
    torch.tensor([3.0, NAN, -1.0, 3.0, -INF, 0.0, -0.0, NAN, INF, 3.0]),
    torch.tensor([[2.0, 1.0, 2.0, 1.0], [NAN, 5.0, NAN, -5.0], [0.0, 0.0, 0.0, 0.0]]),
    torch.randn(3, 5, 4).round(),  # many ties
]


@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_with_pytorchs_nan_order(nan_mode, no_fallback, descending):
    for x in SORT_INPUTS:
        for dim in range(-x.dim(), x.dim()):
            same(
                on_tpu(torch.sort, x, dim=dim, descending=descending),
                torch.sort(x, dim=dim, descending=descending),
            )
            same(
                on_tpu(torch.sort, x, dim=dim, descending=descending, stable=True),
                torch.sort(x, dim=dim, descending=descending, stable=True),
            )
            same(
                on_tpu(torch.argsort, x, dim=dim, descending=descending),
                torch.argsort(x, dim=dim, descending=descending),
            )
    same(on_tpu(torch.msort, SORT_INPUTS[2]), torch.msort(SORT_INPUTS[2]))
    signed = torch.tensor([0.0, -0.0, 1.0, -0.0, 0.0])  # equal keys keep their order
    got, want = on_tpu(torch.sort, signed, descending=descending), torch.sort(signed, descending=descending)
    same(got, want)
    # The values compare equal, but not the sign of each zero: every mode's
    # fused sums start at +0.0, as PyTorch's own sums do (docs/numerics.md).


@pytest.mark.parametrize("n", [16, 17, 40])
def test_unstable_sort_is_stable_on_the_engine(nan_mode, no_fallback, n):
    """An unstable sort may order equal keys any way (PyTorch's CPU kernel
    has its own order past 16 elements): the engine's is the stable order,
    with the CPU's values, in every row length, without a host read."""
    ties = torch.randint(0, 4, (3, n)).float()
    distinct = torch.randperm(3 * n).float().reshape(3, n)
    for x in (ties, distinct):
        for descending in (False, True):
            stable = torch.sort(x, stable=True, descending=descending)
            same(on_tpu(torch.sort, x, descending=descending), stable)
            same(on_tpu(torch.argsort, x, descending=descending), stable.indices)
            same(on_tpu(torch.sort, x, stable=True, descending=descending), stable)
            assert torch.equal(
                on_tpu(torch.sort, x, descending=descending).values,
                torch.sort(x, descending=descending).values,
            )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.bfloat16])
def test_sort_other_dtypes(nan_mode, no_fallback, dtype):
    x = (torch.randn(4, 7) * 3).round().to(dtype)
    for descending in (False, True):
        same(
            on_tpu(torch.sort, x, dim=-1, descending=descending), torch.sort(x, dim=-1, descending=descending)
        )
        same(
            on_tpu(torch.sort, x, dim=0, descending=descending, stable=True),
            torch.sort(x, dim=0, descending=descending, stable=True),
        )


def test_sort_zero_dim_and_empty(nan_mode, no_fallback):
    for x in (torch.tensor(2.5), torch.empty(0), torch.empty(3, 0)):
        same(on_tpu(torch.sort, x), torch.sort(x))


def test_sort_too_large_falls_back_correctly(nan_mode):
    x = torch.randn(5000)
    same(on_tpu(torch.sort, x), torch.sort(x))


NONZERO_INPUTS = [
    torch.tensor([0.0, NAN, -0.0, 2.0, 0.0, -INF]),  # NaN and inf are nonzero, -0.0 is not
    torch.tensor([[0, 3, 0], [1, 0, 7]]),
    torch.tensor([[True, False], [False, True]]),
    (torch.randn(2, 3, 4) > 0.3).float(),
    torch.zeros(3, 2),
    torch.tensor(5.0),
    torch.tensor(0.0),
    torch.empty(0, 3),
]


def test_nonzero(nan_mode, no_fallback):
    for x in NONZERO_INPUTS:
        same(on_tpu(torch.nonzero, x), torch.nonzero(x))
        same(on_tpu(torch.argwhere, x), torch.argwhere(x))
        if x.dim():
            same(on_tpu(torch.nonzero, x, as_tuple=True), torch.nonzero(x, as_tuple=True))


@pytest.mark.parametrize("size", [0, 1, 3, 20])
@pytest.mark.parametrize("fill_value", [-1, 7])
def test_nonzero_static_pads_and_truncates(nan_mode, no_fallback, size, fill_value):
    for x in NONZERO_INPUTS:
        same(
            on_tpu(torch.nonzero_static, x, size=size, fill_value=fill_value),
            torch.nonzero_static(x, size=size, fill_value=fill_value),
        )


UNIQUE_INPUTS = [
    torch.tensor([3.0, 1.0, NAN, 2.0, 1.0, NAN, -0.0, 0.0, INF, -INF, 3.0]),  # NaNs stay distinct
    torch.tensor([[5, 3, 5], [1, 9, 3]]),
    torch.tensor([True, False, True]),
    torch.randint(0, 3, (4, 5)).float(),
    torch.tensor(2.0),
]


@pytest.mark.parametrize("sorted_", [False, True])
def test_unique(nan_mode, no_fallback, sorted_):
    for x in UNIQUE_INPUTS + [torch.empty(0), torch.empty(2, 0)]:
        for inverse in (False, True):
            for counts in (False, True):
                same(
                    on_tpu(torch.ops.aten._unique2, x, sorted_, inverse, counts),
                    torch.ops.aten._unique2(x, sorted_, inverse, counts),
                )
                same(
                    on_tpu(torch.unique_consecutive, x, return_inverse=inverse, return_counts=counts),
                    torch.unique_consecutive(x, return_inverse=inverse, return_counts=counts),
                )
        same(on_tpu(torch.unique, x, sorted=sorted_), torch.unique(x, sorted=sorted_))


def test_unique_along_a_dim(nan_mode, no_fallback):
    rows = torch.tensor(
        [
            [1.0, 2.0, 0.0],
            [0.0, 5.0, 1.0],
            [1.0, 2.0, 0.0],
            [0.0, 3.0, 1.0],
            [0.0, 3.0, 1.0],
            [-INF, 0.0, 0.0],
        ]
    )
    for x in (rows, rows.long(), rows > 0, torch.randint(0, 2, (3, 4, 2)).float(), torch.empty(0, 3)):
        for dim in range(-x.dim(), x.dim()):
            if x.numel() == 0 and x.shape[dim] != 0:
                continue  # PyTorch rejects an unselected empty dimension
            for inverse in (False, True):
                for counts in (False, True):
                    same(
                        on_tpu(torch.unique, x, dim=dim, return_inverse=inverse, return_counts=counts),
                        torch.unique(x, dim=dim, return_inverse=inverse, return_counts=counts),
                    )
                    same(
                        on_tpu(
                            torch.unique_consecutive, x, dim=dim, return_inverse=inverse, return_counts=counts
                        ),
                        torch.unique_consecutive(x, dim=dim, return_inverse=inverse, return_counts=counts),
                    )


def test_unique_dim_with_nan_runs_on_the_cpu(nan_mode):
    x = torch.tensor([[1.0, NAN], [1.0, NAN], [0.0, 2.0]])
    same(
        on_tpu(torch.unique, x, dim=0, return_inverse=True, return_counts=True),
        torch.unique(x, dim=0, return_inverse=True, return_counts=True),
    )
    same(
        on_tpu(torch.unique_consecutive, x, dim=0, return_counts=True),
        torch.unique_consecutive(x, dim=0, return_counts=True),
    )


DISTINCT = [
    torch.randperm(24).float().reshape(2, 3, 4) - 11.5,
    torch.tensor([2.0, -INF, NAN, 0.5, INF, -3.0]),
]


@pytest.mark.parametrize("largest", [False, True])
def test_topk_and_kthvalue_without_ties(nan_mode, no_fallback, largest):
    for x in DISTINCT:
        for dim in range(-x.dim(), x.dim()):
            for k in range(1, x.shape[dim] + 1):
                same(
                    on_tpu(torch.topk, x, k, dim=dim, largest=largest),
                    torch.topk(x, k, dim=dim, largest=largest),
                )
                same(on_tpu(torch.kthvalue, x, k, dim, True), torch.kthvalue(x, k, dim, True))
                same(on_tpu(torch.kthvalue, x, k, dim), torch.kthvalue(x, k, dim))
    scalar = torch.tensor(1.5)
    same(on_tpu(torch.topk, scalar, 1), torch.topk(scalar, 1))
    same(on_tpu(torch.kthvalue, scalar, 1), torch.kthvalue(scalar, 1))


def test_unsorted_topk_picks_what_cpu_picks_in_sorted_order(mode, no_fallback):
    # `sorted=False` leaves the order open (CPU's is std::nth_element's): the
    # same elements, in the order `sorted=True` gives. A MoE router's call.
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(3))
    for k in (1, 2, 8):
        values, indices = on_tpu(torch.topk, logits, k, sorted=False)
        want = torch.topk(logits, k, sorted=True)
        same((values, indices), tuple(want))
        cpu = torch.topk(logits, k, sorted=False)
        assert torch.equal(cpu.indices.sort(-1).values, indices.sort(-1).values)


def test_topk_and_kthvalue_with_ties_stay_exact(nan_mode):
    """Ties in short rows are the CPU's insertion sort (stable); longer rows
    with a picked value that has an equal run on the CPU."""
    for x in (
        torch.tensor([[1.0, 1.0, 0.0], [NAN, 2.0, NAN]]),
        torch.randint(0, 3, (4, 9)).float(),
        torch.tensor([[NAN, NAN, 1.0, 2.0, 5.0, 5.0]]),
    ):
        for k in range(1, x.shape[-1] + 1):
            for largest in (False, True):
                same(on_tpu(torch.topk, x, k, largest=largest), torch.topk(x, k, largest=largest))
            same(on_tpu(torch.kthvalue, x, k), torch.kthvalue(x, k))
    x = torch.tensor([[5.0, 1.0, 1.0, 9.0, 7.0]])  # ties that topk(2) does not pick
    before = deferfuse.fallback_counts()
    same(on_tpu(torch.topk, x, 2), torch.topk(x, 2))
    assert not deferfuse.fallback_counts() - before


def test_median_breaks_ties_by_position(nan_mode, no_fallback):
    inputs = [
        torch.randint(0, 3, (5, 8)).float(),
        torch.randint(0, 3, (4, 7)),
        torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [4.0, 4.0, 1.0, 1.0, 0.0]]),
        torch.randn(3, 2, 1, 2),
        torch.tensor(7.0),
        torch.tensor([[NAN, NAN, NAN], [NAN, 1.0, NAN]]),
    ]
    for x in inputs:
        same(on_tpu(torch.median, x), torch.median(x))
        same(on_tpu(torch.nanmedian, x), torch.nanmedian(x))
        for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
            for keepdim in (False, True):
                same(on_tpu(torch.median, x, dim, keepdim), torch.median(x, dim, keepdim))
                same(on_tpu(torch.nanmedian, x, dim, keepdim), torch.nanmedian(x, dim, keepdim))


def test_selections_in_bfloat16(nan_mode):
    x = torch.randn(3, 7).to(torch.bfloat16)
    same(on_tpu(torch.topk, x, 3), torch.topk(x, 3))
    same(on_tpu(torch.kthvalue, x, 2), torch.kthvalue(x, 2))
    same(on_tpu(torch.median, x, 1), torch.median(x, 1))
    same(on_tpu(torch.sort, x, 0), torch.sort(x, 0))


def test_nanmedian_of_a_long_row_of_nan_runs_on_the_cpu(nan_mode):
    x = torch.tensor([[NAN] * 6, [NAN, 1.0, 2.0, NAN, 3.0, 0.0]])
    same(on_tpu(torch.nanmedian, x, 1), torch.nanmedian(x, 1))
    same(on_tpu(torch.nanmedian, x), torch.nanmedian(x))


def test_mode(nan_mode, no_fallback):
    for x in (
        torch.randint(0, 3, (4, 6)).float(),
        torch.tensor([[-0.0, 0.0, 2.0, 2.0, 0.0]]),
        torch.randint(-2, 2, (3, 5, 4)),
        torch.tensor([[True, False, True]]),
        torch.tensor(3.0),
    ):
        for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
            for keepdim in (False, True):
                want = torch.mode(x, dim, keepdim)
                got = on_tpu(torch.mode, x, dim, keepdim)
                same(got, want)
                if x.is_floating_point() and nan_mode == "strict":
                    assert torch.equal(got[0].signbit(), want[0].signbit())


def test_mode_of_long_rows_or_nan_runs_on_the_cpu(nan_mode):
    for x in (torch.randint(0, 5, (3000,)).float(), torch.tensor([NAN, 1.0, NAN, 1.0])):
        same(on_tpu(torch.mode, x), torch.mode(x))


def test_every_op_in_every_mode_on_finite_inputs(mode, no_fallback):
    """Debug mode checks each op's output for NaN and Inf: none of the
    compositions makes either from finite inputs."""
    x = torch.tensor([[3.0, -1.0, 0.0, 2.5, 3.0], [1.0, 1.0, -2.0, 7.0, 0.0]])
    same(on_tpu(torch.sort, x, 1, True), torch.sort(x, 1, True))
    same(on_tpu(torch.nonzero, x), torch.nonzero(x))
    same(on_tpu(torch.nonzero_static, x, size=4), torch.nonzero_static(x, size=4))
    same(
        on_tpu(torch.unique, x, return_inverse=True, return_counts=True),
        torch.unique(x, return_inverse=True, return_counts=True),
    )
    same(on_tpu(torch.unique, x, dim=1, return_inverse=True), torch.unique(x, dim=1, return_inverse=True))
    same(
        on_tpu(torch.unique_consecutive, x, return_counts=True),
        torch.unique_consecutive(x, return_counts=True),
    )
    distinct = torch.tensor([[3.0, -1.0, 0.0, 2.5, 4.0], [1.0, 6.0, -2.0, 7.0, 0.5]])
    same(on_tpu(torch.topk, distinct, 2), torch.topk(distinct, 2))
    same(on_tpu(torch.kthvalue, distinct, 3), torch.kthvalue(distinct, 3))
    same(on_tpu(torch.median, x, 1), torch.median(x, 1))
    same(on_tpu(torch.nanmedian, x, 0), torch.nanmedian(x, 0))
    same(on_tpu(torch.mode, x, 1), torch.mode(x, 1))


def test_unique_inverse_of_many_nans_past_16_elements(nan_mode):
    """Past 16 elements the CPU's sort does not keep NaNs in input order, which
    shows in the inverse: those run on the CPU; without the inverse, or with
    one NaN, they stay on the engine."""
    x = torch.randint(-2, 3, (3, 7)).float()
    x[0, 0], x[2, 4] = NAN, NAN
    same(on_tpu(torch.ops.aten._unique2, x, True, True, True), torch.ops.aten._unique2(x, True, True, True))
    before = deferfuse.fallback_counts()
    same(on_tpu(torch.ops.aten._unique2, x, True, False, True), torch.ops.aten._unique2(x, True, False, True))
    x[2, 4] = 1.0
    same(on_tpu(torch.ops.aten._unique2, x, True, True, True), torch.ops.aten._unique2(x, True, True, True))
    assert not deferfuse.fallback_counts() - before
