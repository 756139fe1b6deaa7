"""nn and indexing ops composed from engine ops (lowerings/elementwise.py,
nn.py, pooling.py, scatter.py): each against CPU eager, including NaN, signed
zeros, infinities, ties and duplicate indices, and each without the CPU
fallback."""

import copy

import deferfuse
import pytest
import torch
from helpers import on_tpu

INF, NAN = float("inf"), float("nan")
SPECIAL = torch.tensor(
    [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3.5, 0.5, -0.5, 1e-30, 1e30, -1e30, INF, -INF, NAN, 1e-3]
)


def pairs():
    a = SPECIAL.repeat_interleave(len(SPECIAL))
    b = SPECIAL.repeat(len(SPECIAL))
    return a, b


# ---- elementwise --------------------------------------------------------------


@pytest.mark.parametrize("op", [torch.copysign, torch.fmax, torch.fmin, torch.hypot])
def test_exact_binary_ops(nan_mode, no_fallback, op):
    a, b = pairs()
    want, got = op(a, b), on_tpu(op, a, b)
    # hypot: m * sqrt(1 + r^2) rounds at most a few ulp from C's hypot.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0, equal_nan=True)
    if op is not torch.hypot:
        assert torch.equal(torch.signbit(got[~got.isnan()]), torch.signbit(want[~want.isnan()]))


def test_copysign_scalar_and_integers(nan_mode, no_fallback):
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, INF])
    for other in (-1.0, 2.0, -0.0, 0.0):
        assert torch.equal(
            torch.signbit(on_tpu(torch.copysign, x, other)), torch.signbit(torch.copysign(x, other))
        )
    i = torch.tensor([3, -4, 0])
    assert torch.equal(
        on_tpu(torch.copysign, i, torch.tensor([-1, 1, -1])), torch.copysign(i, torch.tensor([-1, 1, -1]))
    )


def test_atan2_quadrants_zeros_and_infinities(nan_mode, no_fallback):
    a, b = pairs()
    want, got = torch.atan2(a, b), on_tpu(torch.atan2, a, b)
    torch.testing.assert_close(got, want, rtol=2e-7, atol=1e-7, equal_nan=True)
    assert torch.equal(torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))
    y, x = torch.randn(1000) * 10, torch.randn(1000) * 10
    torch.testing.assert_close(on_tpu(torch.atan2, y, x), torch.atan2(y, x), rtol=1e-6, atol=1e-7)
    yb, xb = y.bfloat16(), x.bfloat16()
    got = on_tpu(torch.atan2, yb, xb)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, torch.atan2(yb, xb), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", ["asin", "acos", "atan", "erf", "erfc"])
def test_inverse_trig_and_erf(nan_mode, no_fallback, name):
    """Compositions of engine ops: atan2 for the inverse trigonometry, a
    Maclaurin series and Numerical Recipes' erfc fit for erf. Tolerances:
    erfc keeps its relative error below 5e-7 down to 1e-38 (measured 4.1e-7),
    the others 3e-7 absolute (measured 2.6e-7 for acos), against float64."""
    op = getattr(torch, name)
    scale = 1.0 if name in ("asin", "acos") else 6.0
    x = torch.cat([torch.linspace(-scale, scale, 4001), SPECIAL, torch.rand(1000) * 2 - 1])
    want, got = op(x.double()), on_tpu(op, x).double()
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    if name == "erfc":
        normal = want.abs() > 1e-38
        torch.testing.assert_close(got[normal], want[normal], rtol=5e-7, atol=0)
    else:
        torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=3e-7)
    if name != "acos" and name != "erfc":  # odd functions keep the sign of zero
        zeros = want == 0
        assert torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros]))
    half = on_tpu(op, x.bfloat16())
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half, op(x.bfloat16()), rtol=1e-2, atol=1e-2, equal_nan=True)
    assert on_tpu(op, torch.tensor([0, 1, -1])).dtype == torch.float32


def test_eye(nan_mode, no_fallback):
    for args in ((3,), (2, 5), (4, 1), (0,)):
        for dtype in (None, torch.bool, torch.int32, torch.bfloat16):
            got = torch.eye(*args, dtype=dtype, device="tpu").cpu()
            assert (
                torch.equal(got, torch.eye(*args, dtype=dtype))
                and got.dtype == torch.eye(*args, dtype=dtype).dtype
            )


def test_signbit_bitwise_not(nan_mode, no_fallback):
    assert torch.equal(on_tpu(torch.signbit, SPECIAL[:-2]), torch.signbit(SPECIAL[:-2]))
    for t in (
        torch.tensor([0, 5, -7, 2**31 - 1], dtype=torch.int32),
        torch.tensor([0, -1, 2**40]),
        torch.tensor([True, False]),
    ):
        assert torch.equal(on_tpu(torch.bitwise_not, t), torch.bitwise_not(t))
        assert torch.equal(on_tpu(torch.signbit, t), torch.signbit(t))


@pytest.mark.parametrize("eps", [None, 0.0, 1e-6, 0.2, 0.7])
def test_logit(nan_mode, no_fallback, eps):
    x = torch.tensor([0.0, 1.0, 0.5, 0.25, 1e-7, 0.9999, -0.5, 1.5, NAN, 0.65])
    torch.testing.assert_close(
        on_tpu(torch.logit, x, eps), torch.logit(x, eps), rtol=1e-5, atol=1e-6, equal_nan=True
    )


@pytest.mark.parametrize("decimals", [0, 1, 2, -1, -2])
def test_round_half_to_even(nan_mode, no_fallback, decimals):
    x = torch.cat(
        [
            torch.arange(-6, 6) + 0.5,
            torch.tensor([0.125, 2.675, 1234.5678, -0.0, 8388609.0, INF, NAN]),
            torch.randn(200) * 100,
        ]
    )
    want = torch.round(x, decimals=decimals)
    got = on_tpu(torch.round, x, decimals=decimals)
    assert torch.equal(got.nan_to_num(), want.nan_to_num()), (
        x[got != want],
        got[got != want],
        want[got != want],
    )


# ---- losses -------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_one_sample_and_bce(nan_mode, no_fallback, reduction):
    scores = torch.randn(5).log_softmax(0)
    for target, w in ((torch.tensor(3), None), (torch.tensor(1), torch.rand(5)), (torch.tensor(-100), None)):
        want = torch.nn.functional.nll_loss(scores, target, w, reduction=reduction)
        torch.testing.assert_close(
            on_tpu(torch.nn.functional.nll_loss, scores, target, w, reduction=reduction), want, equal_nan=True
        )
    x = torch.tensor([0.0, 1.0, 0.3, 1e-8, 0.999999, 0.5])
    t = torch.tensor([0.0, 1.0, 0.7, 1.0, 0.0, 0.5])
    w = torch.rand(6)
    for weight in (None, w):
        want = torch.nn.functional.binary_cross_entropy(x, t, weight, reduction=reduction)
        got = on_tpu(torch.nn.functional.binary_cross_entropy, x, t, weight, reduction=reduction)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ---- scatters and index writes --------------------------------------------------


def _dup_index(shape, n, dim):
    g = torch.Generator().manual_seed(0)
    return torch.randint(-n, n, shape, generator=g)  # negatives wrap; many repeats


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, -1])
def test_scatter_reduce_with_repeats_and_nan(nan_mode, no_fallback, reduce, include_self, dim):
    x = torch.randn(4, 5)
    src = torch.randn(6, 7)
    src[1, 2] = NAN
    index = _dup_index((3, 4), 5 if dim == -1 else 4, dim).clamp(min=0)
    want = x.scatter_reduce(dim, index, src, reduce, include_self=include_self)
    got = on_tpu(torch.Tensor.scatter_reduce, x, dim, index, src, reduce, include_self=include_self)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    ints = torch.randint(-5, 5, (4, 5))
    if reduce != "mean":
        w = ints.scatter_reduce(dim, index, ints[:3, :4] * 3, reduce, include_self=include_self)
        assert torch.equal(
            on_tpu(
                torch.Tensor.scatter_reduce,
                ints,
                dim,
                index,
                ints[:3, :4] * 3,
                reduce,
                include_self=include_self,
            ),
            w,
        )


def test_scatter_last_write_value_and_legacy_reduce(nan_mode, no_fallback):
    x = torch.randn(3, 6)
    index = torch.tensor([[0, 0, 2, 2, 0], [5, 1, 5, 5, 1]])
    src = torch.randn(2, 5)
    assert torch.equal(
        on_tpu(torch.scatter, x, 1, index, src), torch.scatter(x, 1, index, src)
    )  # last write wins
    assert torch.equal(on_tpu(torch.scatter, x, 1, index, 2.5), torch.scatter(x, 1, index, 2.5))
    for reduce in ("add", "multiply"):
        torch.testing.assert_close(
            on_tpu(torch.scatter, x, 1, index, src, reduce=reduce),
            torch.scatter(x, 1, index, src, reduce=reduce),
        )
    torch.testing.assert_close(
        on_tpu(torch.scatter_add, x, 0, index[:, :3] % 3, src), torch.scatter_add(x, 0, index[:, :3] % 3, src)
    )
    s = torch.tensor(1.5)
    assert torch.equal(
        on_tpu(torch.scatter, s, 0, torch.tensor(0), torch.tensor(4.0)),
        torch.scatter(s, 0, torch.tensor(0), torch.tensor(4.0)),
    )
    e = torch.empty(0, 6, dtype=torch.long)
    assert torch.equal(on_tpu(torch.scatter_add, x, 1, e, src), x)
    t = x.to("tpu")
    t.scatter_(1, index.to("tpu"), src.to("tpu"))
    assert torch.equal(t.cpu(), x.clone().scatter_(1, index, src))


def test_index_ops(nan_mode, no_fallback):
    x = torch.randn(5, 4)
    index = torch.tensor([4, 0, 4, -1 + 5, 2])
    source = torch.randn(5, 4)
    torch.testing.assert_close(
        on_tpu(torch.index_add, x, 0, index, source, alpha=2.0),
        torch.index_add(x, 0, index, source, alpha=2.0),
    )
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            torch.testing.assert_close(
                on_tpu(torch.index_reduce, x, 0, index, source, reduce, include_self=include_self),
                torch.index_reduce(x, 0, index, source, reduce, include_self=include_self),
            )
    unique = torch.tensor([3, 0, 1])
    assert torch.equal(
        on_tpu(torch.index_copy, x, -1, unique, source[:, :3]), torch.index_copy(x, -1, unique, source[:, :3])
    )
    assert torch.equal(
        on_tpu(torch.index_fill, x, 1, torch.tensor([-1, 0, 0]), NAN).isnan(),
        torch.index_fill(x, 1, torch.tensor([-1, 0, 0]), NAN).isnan(),
    )
    t = x.to("tpu")
    t.index_fill_(0, torch.tensor([1]).to("tpu"), -3.0)
    assert torch.equal(t.cpu(), x.clone().index_fill_(0, torch.tensor([1]), -3.0))


def test_put_take(nan_mode, no_fallback):
    x = torch.randn(3, 4)
    index = torch.tensor([[0, -1], [5, 0], [11, 5]])
    source = torch.randn(3, 2)
    for accumulate in (False, True):
        torch.testing.assert_close(
            on_tpu(torch.Tensor.put, x, index, source, accumulate), x.put(index, source, accumulate)
        )
    assert torch.equal(on_tpu(torch.take, x, index), torch.take(x, index))
    assert on_tpu(torch.take, x, torch.empty(0, 2, dtype=torch.long)).shape == (0, 2)


@pytest.mark.parametrize(
    "key",
    [
        lambda i, j: (i,),
        lambda i, j: (slice(None), i),
        lambda i, j: (i, j),
        lambda i, j: (i, slice(None), j),
        lambda i, j: (slice(None), i, j),
        lambda i, j: (Ellipsis, j),
        lambda i, j: (slice(1, 3), i.reshape(2, 2)),
    ],
)
def test_advanced_indexing(nan_mode, no_fallback, key):
    x = torch.randn(3, 4, 4)
    i, j = torch.tensor([0, -1, 2, 0]), torch.tensor([3, 1, -4, 3])
    k = key(i % 3, j)
    assert torch.equal(
        on_tpu(lambda t: t[tuple(a.to("tpu") if isinstance(a, torch.Tensor) else a for a in k)], x), x[k]
    )
    v = torch.arange(float(x[k].numel())).reshape(x[k].shape)
    for accumulate in (False, True):
        want = (
            x.index_put(tuple(a if isinstance(a, torch.Tensor) else None for a in k), v, accumulate)
            if all(isinstance(a, torch.Tensor) for a in k)
            else None
        )
        if want is not None:
            got = on_tpu(
                lambda t, w, acc=accumulate: t.index_put(tuple(a.to("tpu") for a in k), w, acc), x, v
            )
            torch.testing.assert_close(got, want)
    t = x.to("tpu")
    t[tuple(a.to("tpu") if isinstance(a, torch.Tensor) else a for a in k)] = v.to("tpu")
    y = x.clone()
    y[k] = v
    assert torch.equal(t.cpu(), y)


def test_bool_mask_assignment(nan_mode, no_fallback):
    x = torch.randn(4, 3)
    t = x.to("tpu")
    t[(x > 0).to("tpu")] = 0.0
    assert torch.equal(t.cpu(), x.masked_fill(x > 0, 0.0))


def test_bool_mask_assignment_of_one_row(nan_mode, no_fallback):
    """`x[mask] = row` (T5Gemma2's image-token embedding): every selected
    element gets the same values, broadcast from the row."""
    x, mask = torch.randn(2, 5, 4), torch.rand(2, 5) > 0.5
    for value in (torch.randn(4), torch.randn(1, 4), torch.randn(1), torch.randn(2, 1, 4)[0], 2.5):
        want = x.clone()
        want[mask] = value
        got = x.to("tpu")
        got[mask.to("tpu")] = value.to("tpu") if isinstance(value, torch.Tensor) else value
        assert torch.equal(got.cpu(), want)


def test_bool_mask_assignment_that_cannot_broadcast_raises(nan_mode):
    x, mask = torch.randn(2, 5, 4), torch.rand(2, 5) > 0.5
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x[mask] = torch.randn(3)
    t = x.to("tpu")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        t[mask.to("tpu")] = torch.randn(3).to("tpu")
        t.cpu()


# ---- pooling --------------------------------------------------------------------


F = torch.nn.functional


@pytest.mark.parametrize("out", [(3, 5), (1, 1), (7, 4), (2, 7)])
def test_adaptive_pools_2d(nan_mode, no_fallback, out):
    x = torch.randn(2, 3, 7, 5)
    torch.testing.assert_close(
        on_tpu(F.adaptive_avg_pool2d, x, out), F.adaptive_avg_pool2d(x, out), rtol=1e-5, atol=1e-6
    )
    x[0, 0, 1, 1] = NAN
    x[0, 0, 2, 2] = NAN  # the last NaN of a window is the index
    x[1, 2] = 1.0  # ties: the first maximum
    x[1, 1] = -INF
    got, want = (
        on_tpu(F.adaptive_max_pool2d, x, out, return_indices=True),
        F.adaptive_max_pool2d(x, out, return_indices=True),
    )
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=0, atol=0)


def test_adaptive_pools_3d_and_unbatched(nan_mode, no_fallback):
    x = torch.randn(2, 5, 4, 6)
    for out in ((2, 3, 4), (5, 1, 6)):
        torch.testing.assert_close(
            on_tpu(F.adaptive_avg_pool3d, x, out), F.adaptive_avg_pool3d(x, out), rtol=1e-5, atol=1e-6
        )
        got, want = (
            on_tpu(F.adaptive_max_pool3d, x, out, return_indices=True),
            F.adaptive_max_pool3d(x, out, return_indices=True),
        )
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    empty = torch.randn(0, 2, 4, 4)
    assert on_tpu(F.adaptive_avg_pool2d, empty, 2).shape == (0, 2, 2, 2)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("divisor_override", [None, 3])
def test_avg_pool(nan_mode, no_fallback, ceil_mode, count_include_pad, divisor_override):
    x = torch.randn(2, 3, 8, 7)
    for k, s, p in ((3, 2, 1), ((2, 3), (1, 2), (1, 0)), (2, None, 0), (3, 3, 1)):
        want = F.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor_override)
        got = on_tpu(F.avg_pool2d, x, k, s, p, ceil_mode, count_include_pad, divisor_override)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    y = torch.randn(1, 5, 6, 7)
    want = F.avg_pool3d(y, 3, 2, 1, ceil_mode, count_include_pad, divisor_override)
    torch.testing.assert_close(
        on_tpu(F.avg_pool3d, y, 3, 2, 1, ceil_mode, count_include_pad, divisor_override),
        want,
        rtol=1e-5,
        atol=1e-6,
    )


# ---- interpolation --------------------------------------------------------------


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize(
    "mode,shape,size",
    [
        ("linear", (2, 3, 7), (12,)),
        ("linear", (2, 3, 7), (3,)),
        ("bilinear", (2, 3, 5, 6), (9, 4)),
        ("bicubic", (2, 3, 5, 6), (11, 3)),
        ("bicubic", (1, 1, 4, 4), (1, 1)),
        ("trilinear", (1, 2, 3, 4, 5), (6, 2, 5)),
    ],
)
def test_interpolate_sizes(nan_mode, no_fallback, align_corners, mode, shape, size):
    x = torch.randn(shape)
    want = F.interpolate(x, size=size, mode=mode, align_corners=align_corners)
    torch.testing.assert_close(
        on_tpu(F.interpolate, x, size=size, mode=mode, align_corners=align_corners),
        want,
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_scale_factors_and_infinities(nan_mode, no_fallback, mode):
    x = torch.randn(1, 2, 5, 7)
    for factor in (1.7, 0.6, 2.0):
        for recompute in (False, True):
            want = F.interpolate(x, scale_factor=factor, mode=mode, recompute_scale_factor=recompute)
            got = on_tpu(F.interpolate, x, scale_factor=factor, mode=mode, recompute_scale_factor=recompute)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    x[0, 0, 2, 3] = NAN  # NaN spreads to the outputs that weigh it, as in PyTorch
    want = F.interpolate(x, size=(7, 9), mode=mode)
    torch.testing.assert_close(
        on_tpu(F.interpolate, x, size=(7, 9), mode=mode), want, equal_nan=True, rtol=1e-5, atol=1e-5
    )


# ---- embedding_bag --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(nan_mode, no_fallback, mode, include_last_offset):
    weight = torch.randn(10, 4)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
    # An empty bag in the middle; with include_last_offset the last offset is
    # len(indices), as PyTorch requires (its CPU paths disagree otherwise).
    offsets = torch.tensor([0, 4, 4, 7, 9] if include_last_offset else [0, 4, 4, 7])
    for padding_idx in (None, 4):
        want = F.embedding_bag(
            indices,
            weight,
            offsets,
            mode=mode,
            include_last_offset=include_last_offset,
            padding_idx=padding_idx,
        )
        got = on_tpu(
            F.embedding_bag,
            indices,
            weight,
            offsets,
            mode=mode,
            include_last_offset=include_last_offset,
            padding_idx=padding_idx,
        )
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    rows = indices[:8].reshape(2, 4)
    torch.testing.assert_close(
        on_tpu(F.embedding_bag, rows, weight, mode=mode), F.embedding_bag(rows, weight, mode=mode)
    )
    if mode == "sum":
        psw = torch.rand(9)
        torch.testing.assert_close(
            on_tpu(F.embedding_bag, indices, weight, offsets, mode="sum", per_sample_weights=psw),
            F.embedding_bag(indices, weight, offsets, mode="sum", per_sample_weights=psw),
        )


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0])
def test_embedding_max_norm_renormalizes_named_rows(nan_mode, no_fallback, norm_type):
    weight = torch.randn(8, 3) * 3
    indices = torch.tensor([[1, 5, 1], [7, 0, 5]])
    want_w = weight.clone()
    want = F.embedding(indices, want_w, max_norm=1.5, norm_type=norm_type)
    w = weight.to("tpu")
    got = F.embedding(indices.to("tpu"), w, max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.cpu(), want_w, rtol=1e-5, atol=1e-6)


# ---- grid_sample ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(nan_mode, no_fallback, mode, padding_mode, align_corners):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 4, generator=g)
    grid = torch.rand(2, 6, 7, 2, generator=g) * 3 - 1.5  # reaches outside [-1, 1]
    grid[0, 0, 0] = torch.tensor([-1.0, 1.0])  # exact corners and a half-way point (nearest rounds to even)
    grid[0, 0, 1] = torch.tensor([0.0, -1.0 / 3.0])
    want = F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    got = on_tpu(F.grid_sample, x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if mode == "bicubic":
        return  # PyTorch has no 3-d bicubic
    v = torch.randn(1, 2, 3, 4, 3, generator=g)
    grid3 = torch.rand(1, 2, 3, 2, 3, generator=g) * 2.4 - 1.2
    want = F.grid_sample(v, grid3, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    got = on_tpu(F.grid_sample, v, grid3, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- lgamma / digamma (approximations: measured error bound stated) ---------------


@pytest.mark.parametrize("name", ["lgamma", "digamma"])
def test_lgamma_digamma_against_float64(nan_mode, no_fallback, name):
    """Within 1e-5 absolute + 1e-4 relative of float64 over [-50, 50] and
    magnitudes 1e-30 .. 1e30 (measured: lgamma <= 6e-6, digamma <= 1e-6,
    absolute below 1, relative above); poles, signed zeros, infinities and
    NaN as PyTorch."""
    x = torch.cat(
        [torch.linspace(-50, 50, 20001), torch.logspace(-30, 30, 601), -torch.logspace(-30, 6, 601)]
    )
    fn = getattr(torch, name)
    got = on_tpu(fn, x).double()
    ref = fn(x.double())
    finite = ref.isfinite()
    torch.testing.assert_close(got[finite], ref[finite], rtol=1e-4, atol=1e-5)
    special = torch.tensor([0.0, -0.0, -1.0, -7.0, INF, -INF, NAN, 1.0, 2.0])
    torch.testing.assert_close(on_tpu(fn, special), fn(special), equal_nan=True)
    ints = torch.tensor([1, 2, 5, -3, 0])
    torch.testing.assert_close(on_tpu(fn, ints), fn(ints), equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_polygamma_matches_cpu(nan_mode, no_fallback, n):
    """Cephes' zeta terms as PyTorch's CPU kernel sums them; negative x folded
    into positive arguments term by term (x just beside -k.5 is where the
    terms cancel)."""
    x = torch.cat(
        [
            torch.linspace(-9, 9, 4001),
            torch.linspace(-60, 60, 601),
            torch.logspace(-5, 6, 101),
            torch.tensor([-4.5, -4.500001, -10.5000001, 0.5]),
            torch.tensor([0.0, -0.0, -1.0, -3.0, INF, -INF, NAN]),
        ]
    )
    want = torch.polygamma(n, x)
    torch.testing.assert_close(on_tpu(torch.polygamma, n, x), want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_grid_sample_split_in_halves(nan_mode, no_fallback):
    """Between one and four times the one-hot limit, the output rows are
    sampled in halves."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 16, 16, 16, generator=g)
    grid = torch.rand(1, 12, 12, 12, 3, generator=g) * 2.2 - 1.1
    want = F.grid_sample(x, grid, align_corners=False)
    torch.testing.assert_close(
        on_tpu(F.grid_sample, x, grid, align_corners=False), want, rtol=1e-5, atol=1e-5
    )


# ---- convolution and batch norm in training -------------------------------------

CONVS = [
    # (dims, in channels, out channels, kernel, stride, padding, dilation, groups, spatial)
    (1, 3, 4, 3, 1, 0, 1, 1, 9),
    (1, 4, 6, 2, 3, 1, 2, 2, 11),
    (2, 3, 8, 3, 1, 1, 1, 1, 7),
    (2, 4, 4, 3, 2, 1, 1, 4, 8),
    (2, 6, 4, (1, 3), (2, 1), (0, 2), (1, 2), 2, 9),
    (2, 2, 3, 5, 2, 2, 1, 1, 6),
    (3, 2, 4, 2, 2, 1, 1, 2, 5),
]


def _conv_gradients(device, conv, x, mask):
    conv = copy.deepcopy(conv).to(device)
    x = x.detach().clone().to(device).requires_grad_(mask[0])
    conv.weight.requires_grad_(mask[1])
    conv.bias.requires_grad_(mask[2])
    y = conv(x)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(device)).sum().backward()
    return [t.grad.cpu() if t.grad is not None else None for t in (x, conv.weight, conv.bias)]


@pytest.mark.parametrize("case", CONVS)
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True)])
def test_convolution_backward_matches_cpu(mode, no_fallback, case, mask):
    dims, cin, cout, k, s, p, d, g, size = case
    cls = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[dims - 1]
    torch.manual_seed(0)
    conv = cls(cin, cout, k, stride=s, padding=p, dilation=d, groups=g)
    x = torch.randn([2, cin] + [size] * dims)
    want = _conv_gradients("cpu", conv, x, mask)
    got = _conv_gradients("tpu", conv, x, mask)
    for a, b in zip(want, got):
        assert (a is None) == (b is None)
        if a is not None:
            # f32 sums of up to a few hundred products, ordered differently.
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_convolution_is_one_gather_and_one_product_for_the_whole_batch():
    """A 3x3 padded convolution reads its windows with one gather and
    multiplies every sample's columns in one product: a handful of kernels,
    not a slice, reshape and concatenation per window tap (9 taps) or a
    product per sample (4 samples)."""
    x, w = torch.randn(4, 8, 10, 10), torch.randn(16, 8, 3, 3)
    with deferfuse.mode("defer_and_fuse"):
        xt, wt = x.to("tpu"), w.to("tpu")
        deferfuse.sync()
        before = deferfuse.stats()["backend"]["kernels"]
        got = torch.nn.functional.conv2d(xt, wt, padding=1).cpu()
        after = deferfuse.stats()["backend"]["kernels"]
    runs = {kind: after[kind]["runs"] - before[kind]["runs"] for kind in ("single", "loops", "matmul")}
    assert runs["matmul"] == 1
    assert runs["single"] + runs["loops"] <= 6, runs
    assert after["matmul_flops"] - before["matmul_flops"] == 2 * 16 * (8 * 9) * (4 * 10 * 10)
    torch.testing.assert_close(got, torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)


TRANSPOSED = [
    # (dims, in channels, out channels, kernel, stride, padding, output padding, dilation, groups, spatial)
    (1, 4, 6, 3, 2, 1, 1, 1, 2, 7),
    (2, 4, 6, 3, 2, 1, 0, 1, 2, 5),
    (2, 3, 4, (2, 3), (3, 1), (0, 1), (2, 0), (1, 2), 1, 6),
    (3, 2, 4, 2, 2, 0, 1, 1, 1, 4),
]


@pytest.mark.parametrize("case", TRANSPOSED)
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True)])
def test_transposed_convolution_and_its_backward_match_cpu(mode, no_fallback, case, mask):
    dims, cin, cout, k, s, p, op, d, g, size = case
    cls = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)[dims - 1]
    torch.manual_seed(0)
    conv = cls(cin, cout, k, stride=s, padding=p, output_padding=op, dilation=d, groups=g)
    x = torch.randn([2, cin] + [size] * dims)
    want = _conv_gradients("cpu", conv, x, mask)
    got = _conv_gradients("tpu", conv, x, mask)
    for a, b in zip(want, got):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
def test_bfloat16_convolutions_compute_in_float32_and_round_once(mode, no_fallback, transposed):
    # Tolerance: half a bfloat16 ulp of each output (2^-9 relative) plus
    # float32 sums, against float64 on the same bfloat16 inputs.
    torch.manual_seed(0)
    cls = torch.nn.ConvTranspose2d if transposed else torch.nn.Conv2d
    conv = cls(4, 6, 3, stride=2, padding=1).bfloat16()
    x = torch.randn(2, 4, 9, 9).bfloat16()
    want = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    ref = want(x.double(), conv.weight.double(), conv.bias.double(), stride=2, padding=1)
    got = conv.to("tpu")(x.to("tpu")).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, rtol=2.0**-8, atol=1e-6)


@pytest.mark.parametrize(
    "x_shape,w_shape,kwargs",
    [
        ((2, 192, 150, 150), (48, 192, 1, 1), dict()),  # EfficientNet's projections
        ((2, 64, 64, 64), (32, 64, 1, 1), dict(stride=2)),
        ((2, 40, 30_000), (16, 40, 1), dict()),
    ],
)
def test_pointwise_convolutions_of_any_size_run_on_the_engine(mode, no_fallback, x_shape, w_shape, kwargs):
    # A 1x1 window without padding reads its im2col columns in place, so
    # the buffer's size limit does not apply.
    g = torch.Generator().manual_seed(9)
    x, w, b = (
        torch.randn(x_shape, generator=g),
        torch.randn(w_shape, generator=g),
        torch.randn(w_shape[0], generator=g),
    )
    conv = torch.nn.functional.conv1d if len(x_shape) == 3 else torch.nn.functional.conv2d
    want = conv(x, w, b, **kwargs)
    got = conv(x.to("tpu"), w.to("tpu"), b.to("tpu"), **kwargs).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_convolution_the_engine_does_not_take_falls_back_with_its_arguments_in_place():
    # float64 stays on the CPU: the backward runs PyTorch's CPU kernel, which
    # takes one more argument than the overrideable op (the bias's size).
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2).double()
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    mask = (True, True, True)
    want, got = _conv_gradients("cpu", conv, x, mask), _conv_gradients("tpu", conv, x, mask)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batch_norm_trains_like_cpu(mode, no_fallback, train):
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 2, 1),
        ).to(device)
        model.train(train)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(1)).to(device)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        bn = model[1]
        results[device] = (losses, bn.running_mean.cpu(), bn.running_var.cpu(), bn.num_batches_tracked.cpu())
    (cl, cm, cv, cn), (tl, tm, tv, tn) = results["cpu"], results["tpu"]
    torch.testing.assert_close(torch.tensor(tl), torch.tensor(cl), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tm, cm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tv, cv, rtol=1e-5, atol=1e-6)
    assert torch.equal(tn, cn)


@pytest.mark.parametrize("groups,affine", [(1, True), (2, True), (8, True), (2, False)])
def test_group_norm_backward_matches_cpu(mode, no_fallback, groups, affine):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.GroupNorm(groups, 8, affine=affine), torch.nn.SiLU()
    )
    x = torch.randn(2, 4, 6, 6)
    grads = []
    for device in ("cpu", "tpu"):
        m, xx = copy.deepcopy(model).to(device), x.clone().to(device).requires_grad_()
        m(xx).square().sum().backward()
        norm = (m[1].weight.grad, m[1].bias.grad) if affine else ()
        grads.append([t.cpu() for t in (xx.grad, *norm, m[0].weight.grad)])
    for a, b in zip(*grads):
        # f32 sums of a few hundred terms in another order: within 1e-5 of
        # the largest gradient.
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * a.abs().max().item())


def test_group_norm_is_recorded_as_its_own_lowerings():
    """Group norm's forward and backward lower directly (statistics over the
    trailing dimensions of `[n, group, c / group, hw]`): 50 recorded ops for
    both, where PyTorch's composite forward and Python backward decomposition
    recorded 79."""
    x = torch.randn(2, 8, 5, 5)
    w, b = torch.randn(8), torch.randn(8)
    with deferfuse.mode("defer_and_fuse"):
        xt, wt, bt = (t.to("tpu").requires_grad_() for t in (x, w, b))
        deferfuse.sync()
        before = deferfuse.stats()["ops_recorded"]
        torch.nn.functional.group_norm(xt, 4, wt, bt).square().sum().backward()
        recorded = deferfuse.stats()["ops_recorded"] - before
        got = [t.grad.cpu() for t in (xt, wt, bt)]
    assert recorded <= 60, recorded
    xc, wc, bc = (t.clone().requires_grad_() for t in (x, w, b))
    torch.nn.functional.group_norm(xc, 4, wc, bc).square().sum().backward()
    for g, t in zip(got, (xc, wc, bc)):
        torch.testing.assert_close(g, t.grad, rtol=1e-5, atol=1e-5 * t.grad.abs().max().item())


@pytest.mark.parametrize(
    "dims,kernel,stride,padding,dilation,ceil_mode,shape",
    [
        (2, 3, 2, 1, 1, False, (2, 3, 9, 9)),
        (2, 2, 2, 0, 1, True, (1, 2, 7, 5)),
        (2, (3, 2), (1, 2), (1, 0), (2, 1), True, (3, 8, 6)),
        (3, 2, 1, 1, 1, False, (1, 2, 4, 5, 3)),
    ],
)
def test_max_pool_backward_matches_cpu(
    mode, no_fallback, dims, kernel, stride, padding, dilation, ceil_mode, shape
):
    # Overlapping windows add their gradients at a shared maximum; rounded
    # values make ties, where the first maximum takes the gradient.
    pool = (torch.nn.functional.max_pool2d, torch.nn.functional.max_pool3d)[dims - 2]
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 2).round()
    grads = []
    for device in ("cpu", "tpu"):
        xx = x.clone().to(device).requires_grad_()
        y = pool(xx, kernel, stride, padding, dilation, ceil_mode)
        (y * torch.arange(y.numel()).reshape(y.shape).to(device)).sum().backward()
        grads.append(xx.grad.cpu())
    assert torch.equal(grads[1], grads[0])


def test_cpu_indices_are_uploaded_as_on_cuda(mode, no_fallback):
    # CUDA accepts CPU index tensors for indexing a device tensor, reading
    # and writing, and in the backward of indexing (_index_put_impl_).
    x = torch.randn(5, 6)
    i, j = torch.tensor([0, 2, 2, 4]), torch.tensor([1, 1, 5, 0])
    t = x.to("tpu")
    assert torch.equal(t[i, j].cpu(), x[i, j]) and torch.equal(t[i].cpu(), x[i])
    xc, tc = x.clone(), t.clone()
    xc[i, j] = 7.0
    tc[i, j] = 7.0
    assert torch.equal(tc.cpu(), xc)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    xg, tg = x.clone().requires_grad_(), t.clone().requires_grad_()
    (xg[i, j] * w).sum().backward()
    (tg[i, j] * w.to("tpu")).sum().backward()
    assert torch.equal(tg.grad.cpu(), xg.grad)  # the repeated (2, 1) adds 2 + 3


@pytest.mark.parametrize("dims,factor", [(1, 3), (2, 2), (2, (1, 2)), (3, 2)])
def test_nearest_upsampling_backward_matches_cpu(mode, no_fallback, dims, factor):
    x = torch.randn([2, 3] + [4] * dims)
    grads = []
    for device in ("cpu", "tpu"):
        xx = x.clone().to(device).requires_grad_()
        y = torch.nn.functional.interpolate(xx, scale_factor=factor, mode="nearest")
        (y * torch.arange(y.numel()).reshape(y.shape).to(device)).square().mean().backward()
        grads.append(xx.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=0)


def test_mse_loss_backward_matches_cpu(mode, no_fallback):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    for reduction in ("mean", "sum", "none"):
        grads = []
        for device in ("cpu", "tpu"):
            aa = a.clone().to(device).requires_grad_()
            torch.nn.functional.mse_loss(aa, b.to(device), reduction=reduction).sum().backward()
            grads.append(aa.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_trains_like_cpu(nan_mode, mode, padding_idx, include_last_offset):
    # Repeated rows, an empty bag, the padding row; sum and mean run on the
    # engine, max's backward on the CPU.
    g = torch.Generator().manual_seed(4)
    indices = torch.tensor([1, 3, 3, 7, 0, 1, 1, 5, 9, 3])
    offsets = torch.tensor([0, 3, 3, 6] + ([10] if include_last_offset else []))
    weights = torch.rand(10, generator=g) if mode == "sum" else None
    bag = torch.nn.EmbeddingBag(
        12, 5, mode=mode, padding_idx=padding_idx, include_last_offset=include_last_offset
    )
    grads = []
    for device in ("cpu", "tpu"):
        b = copy.deepcopy(bag).to(device)
        psw = weights.to(device) if weights is not None else None
        out = b(indices.to(device), offsets.to(device), per_sample_weights=psw)
        (out * torch.arange(out.numel()).reshape(out.shape).to(device)).sum().backward()
        grads.append((out.detach().cpu(), b.weight.grad.cpu()))
    (co, cg), (to, tg) = grads
    torch.testing.assert_close(to, co, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tg, cg, rtol=1e-6, atol=1e-5)


def test_embedding_bag_training_stays_on_the_engine(mode, no_fallback):
    bag = torch.nn.EmbeddingBag(20, 4, mode="mean").to("tpu")
    out = bag(torch.tensor([1, 2, 2, 19, 5]).to("tpu"), torch.tensor([0, 2]).to("tpu"))
    out.sum().backward()
    assert bag.weight.grad.shape == (20, 4)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_by_a_number_is_exact(mode, no_fallback, dtype):
    # Large values (a float32 quotient alone would be off), both signs, every
    # remainder, both rounding modes and `//`.
    g = torch.Generator().manual_seed(0)
    hi = 2**31 - 1 if dtype == torch.int32 else 2**45
    x = torch.cat([torch.randint(-hi, hi, (500,), generator=g), torch.arange(-30, 30)]).to(dtype)
    t = x.to("tpu")
    for d in (1, -1, 3, -3, 7, 1000, -65537, 2**20 + 1):
        for rounding in ("floor", "trunc"):
            got = torch.div(t, d, rounding_mode=rounding).cpu()
            assert got.dtype == dtype and torch.equal(got, torch.div(x, d, rounding_mode=rounding))
    assert torch.equal((t // 4).cpu(), x // 4)


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_weight_norm_trains_like_cpu(mode, no_fallback, dim):
    grads = []
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        m = torch.nn.utils.weight_norm(torch.nn.Conv1d(4, 6, 3), dim=dim).to(device)
        x = torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        (m(x) * torch.arange(2 * 6 * 7).reshape(2, 6, 7).to(device)).sum().backward()
        grads.append([t.cpu() for t in (x.grad, m.weight_g.grad, m.weight_v.grad)])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * a.abs().max().item())


# ---- recurrent layers -----------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.LSTM(6, 8, num_layers=2, batch_first=True),
        lambda: torch.nn.LSTM(6, 8, bidirectional=True, proj_size=4),
        lambda: torch.nn.GRU(6, 8, num_layers=2, batch_first=True),
        lambda: torch.nn.GRU(6, 8, bias=False),
        lambda: torch.nn.LSTMCell(6, 8),
        lambda: torch.nn.GRUCell(6, 8),
    ],
    ids=["lstm", "lstm_bidirectional_proj", "gru", "gru_no_bias", "lstm_cell", "gru_cell"],
)
def test_recurrent_layers_train_as_on_cpu(mode, no_fallback, make):
    # Off the CPU, PyTorch runs these cells through fused ops that only CUDA
    # implements (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell`); on `tpu`
    # they are the CPU's cell in torch ops, differentiated by autograd.
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = (
        torch.randn(3, 5, 6)
        if not isinstance(cpu, (torch.nn.LSTMCell, torch.nn.GRUCell))
        else torch.randn(5, 6)
    )

    def loss(m, x):
        out = m(x)
        out = out[0] if isinstance(out, tuple) else out
        return (out * out).sum()

    want = loss(cpu, x)
    want.backward()
    got = loss(tpu, x.to("tpu"))
    got.backward()
    # f32: a few ulps per step of the recurrence.
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)
    with torch.inference_mode():
        torch.testing.assert_close(loss(tpu, x.to("tpu")).cpu(), want, rtol=1e-5, atol=1e-5)
