"""Mixed precision on `tpu`: `torch.autocast` with PyTorch's own policy
(the one CUDA uses; docs/amp.md), and `GradScaler`, against CPU autocast."""

from __future__ import annotations

import deferfuse
import pytest
import torch

MODES = ["strict", "debug", "defer_and_fuse"]
LOW = [torch.bfloat16, torch.float16]


@pytest.fixture(params=MODES)
def mode(request):
    with deferfuse.mode(request.param):
        yield request.param


@pytest.mark.parametrize("low", LOW)
def test_each_policy_class_runs_in_its_dtype(mode, low):
    x = torch.randn(4, 8).to("tpu")
    w = torch.randn(8, 8).to("tpu")
    with torch.autocast("tpu", dtype=low):
        assert torch.get_autocast_dtype("tpu") == low
        y = torch.nn.functional.linear(x, w)  # lower precision
        assert y.dtype == low
        assert (x @ w).dtype == low and torch.mm(x, w).dtype == low
        assert torch.softmax(y, -1).dtype == torch.float32  # fp32
        assert torch.nn.functional.layer_norm(y, (8,)).dtype == torch.float32
        assert torch.exp(y).dtype == torch.float32 and torch.log_softmax(y, 0).dtype == torch.float32
        assert y.sum(0).dtype == torch.float32  # fp32 unless a dtype is given
        assert y.sum(0, dtype=low).dtype == low
        assert torch.addcmul(x, y, y).dtype == torch.float32  # promote: the widest input
        assert torch.relu(y).dtype == low  # not listed: falls through
        with torch.autocast("tpu", enabled=False):
            assert (x @ w).dtype == torch.float32


def test_casts_of_weights_are_cached_within_a_region():
    m = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(2, 8).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        a = m(x)
        b = m(x)
    torch.testing.assert_close(a.float().cpu(), b.float().cpu(), rtol=0, atol=0)


def _train(device: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Embedding(40, 32), torch.nn.TransformerEncoder(layer, 2), torch.nn.Linear(32, 40)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 40, (4, 17), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 40), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_bf16_autocast_training_matches_cpu_autocast():
    # bf16 keeps 8 significant bits (relative rounding 2^-9, about 2e-3 per
    # op); five steps of a 2-layer transformer stay within 2e-2 of CPU's.
    cpu, tpu = _train("cpu", 5), _train("tpu", 5)
    for a, b in zip(cpu, tpu):
        assert abs(a - b) <= 2e-2 * abs(a), (cpu, tpu)


def test_grad_scaler_skips_an_overflowing_step_and_lowers_the_scale_as_on_cpu():
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
        x = torch.randn(3, 4).to(device)
        trace = []
        for step in range(4):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                loss = m(x).float().sum() * (1e30 if step == 1 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            trace.append((scaler.get_scale(), m.weight.detach().cpu().clone()))
        results[device] = trace
    for (cpu_scale, cpu_w), (tpu_scale, tpu_w) in zip(results["cpu"], results["tpu"]):
        assert cpu_scale == tpu_scale
        torch.testing.assert_close(tpu_w, cpu_w, rtol=1e-6, atol=1e-6)
    assert results["tpu"][1][0] == results["tpu"][0][0] / 2  # the overflow halved the scale
    assert torch.equal(results["tpu"][1][1], results["tpu"][0][1])  # and skipped the step


AMP_OPS = {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}


def _amp_fallbacks():
    return {k: v for k, v in deferfuse.fallback_counts().items() if k in AMP_OPS}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("poison", [None, float("inf"), float("nan")])
def test_unscale_and_check_equal_the_cpu_kernel(nan_mode, dtype, poison):
    grads = [torch.randn(5, 3).to(dtype) * 1000, torch.randn(7).to(dtype)]
    if poison is not None:
        grads[1][4] = poison
    inv_scale = torch.tensor(1.0 / 3.0)
    results = {}
    for device in ("cpu", "tpu"):
        gs = [g.clone().to(device) for g in grads]
        found = torch.zeros(1).to(device)
        before = _amp_fallbacks()
        torch._amp_foreach_non_finite_check_and_unscale_(gs, found, inv_scale.to(device))
        assert _amp_fallbacks() == before
        results[device] = ([g.cpu() for g in gs], found.cpu())
    (cpu_grads, cpu_found), (tpu_grads, tpu_found) = results["cpu"], results["tpu"]
    assert torch.equal(tpu_found, cpu_found) and cpu_found.item() == (poison is not None)
    for a, b in zip(cpu_grads, tpu_grads):
        assert b.dtype == a.dtype
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)


def test_scale_updates_equal_the_cpu_kernel(mode):
    # Steps with and without overflow, growth every 3 clean steps, a growth
    # that would overflow float32 (kept back) and a backoff.
    found_seq = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    results = {}
    for device in ("cpu", "tpu"):
        scale = torch.tensor([2.0**126]).to(device)
        tracker = torch.zeros(1, dtype=torch.int32).to(device)
        trace = []
        for f in found_seq:
            found = torch.tensor([float(f)]).to(device)
            out = torch._amp_update_scale_(scale, tracker, found, 4.0, 0.25, 3)
            assert out is scale
            trace.append((scale.item(), tracker.item()))
        results[device] = trace
    assert results["tpu"] == results["cpu"]
    assert _amp_fallbacks() == {}


def test_a_scaler_step_reads_no_gradient_back(mode):
    # Float16 training with growth every step: the engine runs the scaler's
    # bookkeeping; the step reads only the found_inf flag.
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=1)
        x = torch.randn(4, 8).to(device)
        losses = []
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                loss = m(x).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append((loss.item(), scaler.get_scale()))
        results[device] = losses
    for (cl, cs), (tl, ts) in zip(results["cpu"], results["tpu"]):
        assert cs == ts
        assert abs(cl - tl) <= 1e-3 * abs(cl), results
    assert _amp_fallbacks() == {}
