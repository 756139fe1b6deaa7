"""Nothing lost, nobody in: bad views and mixed devices, against real torch."""

import deferfuse  # noqa: F401 - sets up the device
import pytest
import torch

# ---- views -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        lambda x: x.view(-1, 7),
        lambda x: x.view(3, 4),
        lambda x: x.view(-1, -1),
        lambda x: x.view(-2, 5),
        lambda x: x.reshape(-1, 7),
        lambda x: x.reshape(4, -1),
        lambda x: x.view(2, 5)[:, :4].view(-1, 3),
        lambda x: x.view(2, 5).t().reshape(3, 3),
        lambda x: x.unflatten(0, (3, -1)),
    ],
)
def test_invalid_views_raise_pytorchs_error(mode, how):
    x = torch.arange(10.0)
    with pytest.raises(RuntimeError) as expected:
        how(x)
    with pytest.raises(RuntimeError) as got:
        how(x.to("tpu"))
    assert str(got.value) == str(expected.value)


def test_a_view_that_needs_a_copy_still_works(mode):
    x = torch.arange(12.0).view(3, 4)
    assert torch.equal(x.to("tpu").t().reshape(-1, 2).cpu(), x.t().reshape(-1, 2))


# ---- device mixing --------------------------------------------------------------------

MIXED = "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"


@pytest.mark.parametrize(
    "op",
    [
        lambda t, c: t + c,
        lambda t, c: c * t,
        lambda t, c: t.add_(c),
        lambda t, c: torch.add(t, t, out=c),
        lambda t, c: torch.maximum(t, c),
        lambda t, c: torch.where(t > 0, t, c),
        lambda t, c: t @ c.t(),
        lambda t, c: torch.mm(t, c.t()),
        lambda t, c: torch.nn.functional.linear(t, c),
        lambda t, c: torch.cat([t, c]),
        lambda t, c: torch.stack([c, t]),
        lambda t, c: t.index_select(0, c[0].long()),
        lambda t, c: t.gather(1, c.long()),
        lambda t, c: torch.nn.functional.embedding(c.long(), t),
        lambda t, c: torch.nextafter(t, c),  # no lowering: the fallback itself checks
        lambda t, c: t.float().double() + c.double(),  # a dtype the engine lacks
    ],
)
def test_cpu_tensors_with_dimensions_are_refused(mode, op):
    t, c = torch.ones(3, 3, device="tpu"), torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match=MIXED):
        op(t, c)


def test_zero_dimensional_cpu_tensors_and_cpu_indices_are_allowed(mode):
    x = torch.arange(6.0).view(2, 3)
    t = x.to("tpu")
    assert torch.equal((t + torch.tensor(2.0)).cpu(), x + 2)
    assert torch.equal(torch.where(t > 2, t, torch.tensor(-1.0)).cpu(), torch.where(x > 2, x, -1.0))
    # As on CUDA, indexing takes CPU index tensors.
    idx = torch.tensor([1, 0])
    assert torch.equal(t[idx].cpu(), x[idx])
    u = t.clone()
    u[idx] = torch.tensor(5.0)
    assert torch.equal(u.cpu(), torch.full((2, 3), 5.0))
    # Copies between the devices are what `.to` is for.
    assert torch.equal(t.copy_(torch.ones(2, 3)).cpu(), torch.ones(2, 3))
