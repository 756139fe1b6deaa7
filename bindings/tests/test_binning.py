"""Binning, segment and window ops composed from engine ops in the binding
(lowerings/windows.py): var_mean / std_mean, roll, flip, ... each against CPU
eager, including empty inputs, NaN, negative dims and both modes, and each
without the CPU fallback."""

import pytest
import torch

import deferfuse


@pytest.fixture(params=["strict", "defer_and_fuse"])
def nan_mode(request):
    """The modes without Debug's NaN/Inf check (these tests make NaN and Inf on purpose)."""
    with deferfuse.mode(request.param):
        yield request.param


@pytest.fixture
def no_fallback():
    before = deferfuse.fallback_counts()
    yield
    used = deferfuse.fallback_counts() - before
    assert not used, f"fell back to the CPU: {dict(used)}"


def on_tpu(fn, *args, **kwargs):
    moved = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = fn(*moved, **kw)
    if isinstance(out, (tuple, list)):
        return type(out)(o.cpu() if isinstance(o, torch.Tensor) else o for o in out)
    return out.cpu() if isinstance(out, torch.Tensor) else out


# ---- var_mean / std_mean ------------------------------------------------------


@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean])
def test_var_mean_std_mean(nan_mode, no_fallback, fn):
    x = torch.randn(3, 4, 5)
    x[1, 2, 3] = float("nan")
    cases = [dict(), dict(dim=1), dict(dim=(-1, 0), keepdim=True), dict(dim=2, correction=0),
             dict(dim=-2, correction=2.5), dict(dim=1, correction=7)]  # 7 > 4 elements: inf
    for kw in cases:
        want, got = fn(x, **kw), on_tpu(fn, x, **kw)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)  # float32 sums in another order
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
    assert torch.equal(on_tpu(torch.rot90, x[0], 1, (0, 1)).nan_to_num(), torch.rot90(x[0], 1, (0, 1)).nan_to_num())
