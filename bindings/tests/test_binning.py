"""Binning, segment and window ops composed from engine ops in the binding
(lowerings/windows.py): var_mean / std_mean, roll, flip, ... each against CPU
eager, including empty inputs, NaN, negative dims and both modes, and each
without the CPU fallback."""

import pytest
import torch
from helpers import on_tpu

# ---- var_mean / std_mean ------------------------------------------------------


@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean])
def test_var_mean_std_mean(nan_mode, no_fallback, fn):
    x = torch.randn(3, 4, 5)
    x[1, 2, 3] = float("nan")
    cases = [
        dict(),
        dict(dim=1),
        dict(dim=(-1, 0), keepdim=True),
        dict(dim=2, correction=0),
        dict(dim=-2, correction=2.5),
        dict(dim=1, correction=7),
    ]  # 7 > 4 elements: inf
    for kw in cases:
        want, got = fn(x, **kw), on_tpu(fn, x, **kw)
        for w, g in zip(want, got):
            torch.testing.assert_close(
                g, w, rtol=1e-5, atol=1e-6, equal_nan=True
            )  # float32 sums in another order
    one = torch.randn(2, 1)
    for w, g in zip(fn(one, dim=1), on_tpu(fn, one, dim=1)):  # n - correction = 0: NaN
        torch.testing.assert_close(g, w, equal_nan=True)
    empty = torch.randn(2, 0)
    for w, g in zip(fn(empty, dim=1), on_tpu(fn, empty, dim=1)):
        assert g.shape == w.shape and g.isnan().all()
    scalar = torch.tensor(3.0)
    for w, g in zip(fn(scalar, correction=0), on_tpu(fn, scalar, correction=0)):
        assert torch.equal(g, w)


# ---- roll and flip --------------------------------------------------------------


def test_roll(mode, no_fallback):
    x = torch.arange(24.0).reshape(2, 3, 4)
    for shifts, dims in [(1, 0), (-5, -1), ((2, 7), (1, 2)), (5, ()), (0, 1), ((1, 1), (2, 2))]:
        want = torch.roll(x, shifts, dims)
        assert torch.equal(on_tpu(torch.roll, x, shifts, dims), want), (shifts, dims)
    ints = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert torch.equal(on_tpu(torch.roll, ints, 1, 1), torch.roll(ints, 1, 1))
    empty = torch.randn(0, 3)
    assert torch.equal(on_tpu(torch.roll, empty, 1, 0), torch.roll(empty, 1, 0))


def test_flip_short_and_long_axes(nan_mode, no_fallback):
    x = torch.randn(3, 5, 40)  # 40 > FLIP_BY_SLICES: the one-hot path
    x[0, 0, 0] = float("nan")
    x[1, 1, 1] = float("inf")
    for d in [(0,), (-1,), (1, 2), (0, 1, 2), ()]:
        assert torch.equal(on_tpu(torch.flip, x, d).isnan(), torch.flip(x, d).isnan())
        assert torch.equal(on_tpu(torch.flip, x, d).nan_to_num(), torch.flip(x, d).nan_to_num()), d
    b = torch.rand(4, 50) > 0.5
    assert torch.equal(on_tpu(torch.flip, b, (1,)), torch.flip(b, (1,)))
    i = torch.randint(-9, 9, (6,))
    assert torch.equal(on_tpu(torch.flip, i, (0,)), torch.flip(i, (0,)))
    assert torch.equal(
        on_tpu(torch.rot90, x[0], 1, (0, 1)).nan_to_num(), torch.rot90(x[0], 1, (0, 1)).nan_to_num()
    )


# ---- histc / histogram / histogramdd ------------------------------------------------


def _edge_heavy(n=200):
    """Random values plus values on and next to the bin edges (where rounding decides the bin)."""
    x = torch.randn(n)
    edges = torch.linspace(float(x.min()), float(x.max()), 11)
    near = torch.cat(
        [edges, edges.nextafter(torch.tensor(float("inf"))), edges.nextafter(torch.tensor(-float("inf")))]
    )
    return torch.cat([x, near])


def test_histc(nan_mode, no_fallback):
    x = _edge_heavy()
    for kw in [
        dict(),
        dict(bins=10),
        dict(bins=7, min=-1, max=1),
        dict(bins=3, min=2, max=2),
        dict(bins=1000),
    ]:
        assert torch.equal(on_tpu(torch.histc, x, **kw), torch.histc(x, **kw)), kw
    with_nan = torch.tensor(
        [0.5, float("nan"), -3.0, 0.0, 1.0, 1.0, 2.0]
    )  # NaN and out-of-range count nowhere
    assert torch.equal(on_tpu(torch.histc, with_nan, 4, 0, 1), torch.histc(with_nan, 4, 0, 1))
    same = torch.full((5,), 3.0)  # min == max: widened by 1 on each side
    assert torch.equal(on_tpu(torch.histc, same, 4), torch.histc(same, 4))
    assert torch.equal(on_tpu(torch.histc, torch.tensor([]), 4), torch.histc(torch.tensor([]), 4))
    grid = torch.linspace(-2, 3, 101)  # every element on an edge
    assert torch.equal(on_tpu(torch.histc, grid, 100), torch.histc(grid, 100))


def test_histc_non_finite_data_gives_nan(nan_mode, no_fallback):
    """PyTorch raises (the data's range is not finite); the engine, reading
    nothing back, marks every count NaN instead."""
    got = on_tpu(torch.histc, torch.tensor([1.0, float("inf")]), 3)
    assert got.isnan().all()


@pytest.mark.parametrize("density", [False, True])
def test_histogram_bin_count(nan_mode, no_fallback, density):
    x = _edge_heavy(201).reshape(2, -1)
    w = torch.rand(x.shape)
    for kw in [
        dict(bins=10),
        dict(bins=9000),
        dict(bins=5, range=(-1.0, 0.5)),
        dict(bins=3, range=(2.0, 2.0)),
        dict(bins=6, weight=w),
    ]:
        want, got = (
            torch.histogram(x, density=density, **kw),
            on_tpu(torch.histogram, x, density=density, **kw),
        )
        if density or "weight" in kw:
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)  # sums in another order
        else:
            assert torch.equal(got[0], want[0]), kw
        assert torch.equal(got[1], want[1]), kw  # the edges are PyTorch's linspace, bit for bit
    same = torch.full((4,), -2.0)  # min == max: widened by 0.5
    assert all(
        torch.equal(g, w)
        for g, w in zip(on_tpu(torch.histogram, same, bins=4), torch.histogram(same, bins=4))
    )
    empty = torch.zeros(0)
    assert all(
        torch.equal(g, w)
        for g, w in zip(on_tpu(torch.histogram, empty, bins=3), torch.histogram(empty, bins=3))
    )


def test_histogram_bin_tensor_is_upper_bound(nan_mode, no_fallback):
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("nan"), 2.5])
    for edges in [
        torch.tensor([0.0, 1.0, 2.0, 3.0]),
        torch.tensor([0.0, 0.0, 1.0, 1.0, 3.0]),
        torch.tensor([0.0, 2.0, 1.0, 3.0]),  # unsorted: std::upper_bound's steps decide
        torch.linspace(-1, 3, 700),
    ]:
        want, got = torch.histogram(x, edges), on_tpu(torch.histogram, x, edges)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), edges
    w = torch.rand(9)
    want = torch.histogram(x, torch.tensor([0.0, 1.0, 3.0]), weight=w, density=True)
    got = on_tpu(torch.histogram, x, torch.tensor([0.0, 1.0, 3.0]), weight=w, density=True)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_histogramdd(nan_mode, no_fallback):
    x = torch.randn(50, 3)
    w = torch.rand(50)
    for kw in [
        dict(bins=[3, 4, 2]),
        dict(bins=[2, 2, 2], range=[-1.0, 1.0, 0.0, 1.0, -2.0, 0.0]),
        dict(bins=[4, 1, 3], weight=w, density=True),
        dict(
            bins=[
                torch.tensor([-1.0, 0.0, 1.0]),
                torch.tensor([-3.0, 3.0]),
                torch.tensor([0.0, 0.5, 1.0, 2.0]),
            ]
        ),
    ]:
        want = torch.histogramdd(x, **kw)
        if isinstance(kw["bins"][0], torch.Tensor):
            kw = dict(kw, bins=[b.to("tpu") for b in kw["bins"]])
        got = on_tpu(torch.histogramdd, x, **kw)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)  # exact counts; density divides
        for g, e in zip(got[1], want[1]):
            assert torch.equal(g.cpu(), e)


# ---- segment_reduce -------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(nan_mode, no_fallback, reduce, initial):
    seg = torch.segment_reduce
    data = torch.randn(6, 3)
    data[4, 1] = float("nan")  # NaN propagates through its own segment only
    lengths = torch.tensor([2, 0, 3, 1])  # an empty segment
    offsets = torch.tensor([0, 2, 2, 5, 6])
    for kw in [dict(lengths=lengths), dict(offsets=offsets), dict(lengths=lengths, unsafe=True)]:
        want = seg(data, reduce, axis=0, initial=initial, **kw)
        got = on_tpu(seg, data, reduce, axis=0, initial=initial, **kw)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)  # sums in another order
    batched = torch.tensor([[1, 2, 0], [0, 0, 3]])  # per-row lengths, axis 1, negative axis
    want = seg(data.t().reshape(2, 9)[:, :3], reduce, lengths=batched, axis=1, initial=initial)
    got = on_tpu(
        seg, data.t().reshape(2, 9)[:, :3].contiguous(), reduce, lengths=batched, axis=-1, initial=initial
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


# ---- pads, nearest upsampling, im2col -------------------------------------------------

F = torch.nn.functional


@pytest.mark.parametrize("padmode", ["reflect", "replicate"])
def test_reflection_and_replication_pads(nan_mode, no_fallback, padmode):
    x = torch.randn(2, 3, 4, 5, 6)
    x[0, 0, 0, 0, 0] = float("nan")
    x[1, 2, 3, 4, 5] = -0.0
    cases = [
        (x[0, 0, 0], (2, 3)),
        (x[0, 0], (1, 2, 3, 0)),
        (x[0], (1, 1, 2, 3, 0, 2)),
        (x[0, 0, 0], (-1, 2)),
        (x[:, :, 0], (0, 5, 3, 3)),
        (x, (3, 2, 1, 0, 2, 2)),
    ]
    for t, pad in cases:
        want, got = F.pad(t, pad, mode=padmode), on_tpu(F.pad, t, pad, mode=padmode)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), (
            pad
        )
        assert torch.equal(got.signbit(), want.signbit())
    wide = torch.randn(1, 2, 70)  # more than MAX_PIECES runs: the one-hot path
    assert torch.equal(on_tpu(F.pad, wide, (69, 69), mode=padmode), F.pad(wide, (69, 69), mode=padmode))


@pytest.mark.parametrize("interp", ["nearest", "nearest-exact"])
def test_nearest_upsampling(mode, no_fallback, interp):
    x = torch.randn(2, 3, 5, 4, 3)
    cases = [
        (x[:, :, 0, 0], dict(size=7)),
        (x[:, :, 0, 0], dict(scale_factor=2.0)),
        (x[:, :, 0, 0], dict(size=2)),
        (x[:, :, 0], dict(size=(9, 3))),
        (x[:, :, 0], dict(scale_factor=(1.7, 0.6))),
        (x, dict(size=(4, 8, 6))),
        (x, dict(scale_factor=(3.0, 1.3, 2.5))),
        (x[:, :, 0, 0], dict(size=150)),
    ]
    for t, kw in cases:
        assert torch.equal(
            on_tpu(F.interpolate, t, mode=interp, **kw), F.interpolate(t, mode=interp, **kw)
        ), kw


def test_im2col_unfold(mode, no_fallback):
    x = torch.randn(2, 3, 7, 6)
    for kw in [
        dict(kernel_size=2),
        dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 2)),
        dict(kernel_size=3, dilation=(2, 1), padding=1, stride=2),
        dict(kernel_size=(7, 6)),
    ]:
        assert torch.equal(on_tpu(F.unfold, x, **kw), F.unfold(x, **kw)), kw
        assert torch.equal(on_tpu(F.unfold, x[0], **kw), F.unfold(x[0], **kw)), kw  # unbatched
    empty = torch.randn(0, 3, 5, 5)
    assert torch.equal(on_tpu(F.unfold, empty, 2), F.unfold(empty, 2))


def test_constant_pad_nd(mode, no_fallback):
    x = torch.randn(2, 3, 4)
    for pad, value in [
        ((1, 2), 0.0),
        ((-1, 2, 0, 1), 1.5),
        ((2, -3, -1, -1, 1, 0), -2.0),
        ((0, 0), 0.0),
        ((-2, -2), 3.0),
    ]:
        want = torch.constant_pad_nd(x, pad, value)
        assert torch.equal(on_tpu(torch.constant_pad_nd, x, pad, value), want), pad
    ints = torch.tensor([[1, 2], [3, 4]])
    assert torch.equal(on_tpu(torch.constant_pad_nd, ints, (1, 1), 7), torch.constant_pad_nd(ints, (1, 1), 7))
    flags = torch.tensor([True, False])
    assert torch.equal(
        on_tpu(torch.constant_pad_nd, flags, (2, 0), True), torch.constant_pad_nd(flags, (2, 0), True)
    )
    empty = torch.randn(0, 3, 3)
    assert torch.equal(
        on_tpu(torch.constant_pad_nd, empty, (1, 2), 1.0), torch.constant_pad_nd(empty, (1, 2), 1.0)
    )


@pytest.mark.parametrize("align_corners", [False, True])
def test_linear_and_cubic_upsampling(mode, no_fallback, align_corners):
    x = torch.randn(2, 3, 5, 4, 6)
    cases = [
        ("linear", x[:, :, 0, 0], dict(size=11)),
        ("linear", x[:, :, 0, 0], dict(scale_factor=0.5)),
        ("linear", x[:, :, 0, 0], dict(size=1)),
        ("bilinear", x[:, :, 0], dict(size=(9, 3))),
        ("bilinear", x[:, :, 0], dict(scale_factor=(1.7, 2.0))),
        ("trilinear", x, dict(size=(4, 8, 7))),
        ("bicubic", x[:, :, 0], dict(size=(10, 5))),
        ("bicubic", x[:, :, 0], dict(scale_factor=(0.6, 3.0))),
        ("linear", torch.randn(1, 2, 90), dict(size=200)),
    ]  # many runs: the one-hot lookups
    for interp, t, kw in cases:
        want = F.interpolate(t, mode=interp, align_corners=align_corners, **kw)
        got = on_tpu(F.interpolate, t, mode=interp, align_corners=align_corners, **kw)
        # float32 weights worked out in double here and in float32 by PyTorch, summed in another order
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_histogram_many_edges_stays_right(nan_mode, no_fallback):
    """Searches over more edges than a fused kernel's tile (8192) walk their
    rows in chunks (defer_and_fuse once got these wrong)."""
    x, edges = torch.rand(2), torch.linspace(0, 1, 8193)
    want, got = torch.histogram(x, edges), on_tpu(torch.histogram, x, edges)
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bins,lo,hi", [(8, 0, 7), (4, 0, 7), (8, 2, 5), (3, 0, 10)])
def test_integer_histc_counts_as_cuda_does(mode, no_fallback, dtype, bins, lo, hi):
    # PyTorch's CPU kernel rejects integers; CUDA bins them in integer
    # arithmetic, (x - min) * bins / (max - min), the last bin closed, and
    # returns the input's dtype (transformers' MoE routing relies on it).
    x = torch.randint(-2, 12, (200,), generator=torch.Generator().manual_seed(5)).to(dtype)
    want = torch.zeros(bins, dtype=dtype)
    for v in x.tolist():
        if lo <= v <= hi:
            want[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    got = torch.histc(x.to("tpu"), bins=bins, min=lo, max=hi).cpu()
    assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [None, torch.int32, torch.int64, torch.float32])
def test_cumsum_keeps_the_dtype_asked_for(mode, no_fallback, dtype):
    x = torch.randint(0, 8, (3, 5), generator=torch.Generator().manual_seed(6)).int()
    want = torch.cumsum(x, 1, dtype=dtype)
    got = torch.cumsum(x.to("tpu"), 1, dtype=dtype).cpu()
    assert got.dtype == want.dtype and torch.equal(got, want)
