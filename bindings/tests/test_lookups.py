"""`gather` element by element, advanced indexing and integer `remainder` on the engine: equal
to the CPU's bits for every dtype, any size along the gathered dimension
(a row gather costs what it copies, so there is no size limit), strided
views, scalars and empty indices, with no CPU fallback."""

from __future__ import annotations

import pytest
import torch

CASES = [
    ((5, 7), 1, (5, 3)),
    ((5, 7), 0, (9, 7)),
    ((4, 6, 8), 2, (3, 6, 20)),
    ((4, 6, 8), -2, (4, 2, 5)),
    ((6,), 0, (10,)),
    ((3, 50_000), 1, (3, 4_000)),  # a vocabulary-sized dimension
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("shape,dim,index_shape", CASES)
def test_gather_equals_cpu(mode, no_fallback, dtype, shape, dim, index_shape):
    x = (torch.randn(shape) * 10).to(dtype)
    index = torch.randint(0, shape[dim], index_shape)
    got = x.to("tpu").gather(dim, index.to("tpu")).cpu()
    want = x.gather(dim, index)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_gather_reads_strided_views_scalars_and_empty_indices(mode, no_fallback):
    x = torch.randn(6, 4)
    index = torch.randint(0, 6, (4, 3))
    got = x.to("tpu").t().gather(1, index.to("tpu")).cpu()
    assert torch.equal(got, x.t().gather(1, index))
    s = torch.tensor(3.5)
    for index in (torch.tensor(0), torch.tensor([0])):
        got = s.to("tpu").gather(0, index.to("tpu")).cpu()
        assert got.shape == index.shape and torch.equal(got, s.gather(0, index))
    for shape in [(0,), (2, 0)]:
        index = torch.zeros(shape, dtype=torch.long)
        got = torch.randn(5).to("tpu").gather(0, index.to("tpu")).cpu()
        assert got.shape == shape and got.dtype == torch.float32


@pytest.mark.parametrize(
    "shape,key",
    [
        ((169, 4), lambda i: (i(169, (2401,)),)),  # Swin's relative position bias table
        ((5000, 8, 3), lambda i: (i(5000, (300,)),)),  # past the old masked-sum limit
        ((40, 50, 6), lambda i: (i(40, (7, 3)), slice(None), i(6, (7, 3)))),
        ((40, 50, 6), lambda i: (slice(None), i(50, (11,)), i(6, (11,)))),
    ],
)
def test_advanced_index_of_any_size_equals_cpu(mode, no_fallback, shape, key):
    x = torch.randn(shape)
    k = key(lambda n, s: torch.randint(-n, n, s))
    got = x.to("tpu")[tuple(i.to("tpu") if isinstance(i, torch.Tensor) else i for i in k)].cpu()
    assert torch.equal(got, x[k])


def test_gather_out_of_range_raises(mode):
    index = torch.tensor([[0, 9]]).to("tpu")
    with pytest.raises(RuntimeError, match="index 9 is out of bounds"):
        torch.randn(2, 5).to("tpu").gather(1, index).cpu()


def test_gather_refuses_what_pytorch_refuses(mode):
    x = torch.randn(2, 5).to("tpu")
    with pytest.raises(RuntimeError, match="Expected dtype int32/int64 for index"):
        x.gather(1, torch.zeros(2, 1).to("tpu"))
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.gather(2, torch.zeros(0, 0, dtype=torch.long).to("tpu"))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("divisor", [7, -7, 1, -1, 3])
def test_integer_remainder_takes_the_divisors_sign(mode, no_fallback, dtype, divisor):
    a = torch.randint(-100, 100, (64,), dtype=dtype)
    assert torch.equal((a.to("tpu") % divisor).cpu(), a % divisor)
    assert torch.equal(torch.remainder(a.to("tpu"), divisor).cpu(), torch.remainder(a, divisor))


def test_take_along_dim_with_negative_indices(mode, no_fallback):
    x = torch.randn(5, 5)
    index = torch.randint(-5, 5, (5, 2))
    got = torch.take_along_dim(x.to("tpu"), index.to("tpu"), 1).cpu()
    assert torch.equal(got, torch.take_along_dim(x, index, 1))


@pytest.mark.parametrize("rounding_mode", ["floor", "trunc"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_by_a_tensor_equals_cpu(mode, no_fallback, rounding_mode, dtype):
    a = torch.randint(-1000, 1000, (6, 40), dtype=dtype)
    b = torch.randint(1, 30, (6, 40), dtype=dtype) * (torch.randint(0, 2, (6, 40), dtype=dtype) * 2 - 1)
    got = torch.div(a.to("tpu"), b.to("tpu"), rounding_mode=rounding_mode).cpu()
    want = torch.div(a, b, rounding_mode=rounding_mode)
    assert got.dtype == want.dtype and torch.equal(got, want)
    # A zero-dimensional divisor of another integer dtype keeps the dividend's dtype.
    d = torch.tensor(-7)
    got = torch.div(a.to("tpu"), d.to("tpu"), rounding_mode=rounding_mode).cpu()
    want = torch.div(a, d, rounding_mode=rounding_mode)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_integer_division_by_a_zero_tensor_raises(mode):
    a = torch.arange(6).to("tpu")
    b = torch.tensor([1, 2, 0, 3, 1, 1]).to("tpu")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.div(a, b, rounding_mode="floor").cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("divisor", [2, 3, -7, 0.5])
def test_float_division_with_rounding_by_a_number_equals_cpu(mode, no_fallback, dtype, divisor):
    # MaskFormer's sine position embedding: torch.div(dim_t, 2, rounding_mode="floor") on floats.
    x = (torch.randn(500, generator=torch.Generator().manual_seed(8)) * 50).to(dtype)
    for rounding_mode in ("floor", "trunc"):
        got = torch.div(x.to("tpu"), divisor, rounding_mode=rounding_mode).cpu()
        want = torch.div(x, divisor, rounding_mode=rounding_mode)
        assert got.dtype == want.dtype and torch.equal(got, want)
