"""The binding against real torch: device, ops, views, in-place, modes,
errors, fallback, autograd, optimizers and torch.compile."""

import subprocess
import sys

import deferfuse
import pytest
import torch


def close(tpu, cpu, tol=1e-5):
    assert tpu.device.type == "tpu"
    got = tpu.cpu()
    assert got.dtype == cpu.dtype, (got.dtype, cpu.dtype)
    assert got.shape == cpu.shape, (got.shape, cpu.shape)
    torch.testing.assert_close(got, cpu, rtol=tol, atol=tol)


def test_plain_tensors_on_tpu():
    x = torch.randn(3, 4).to("tpu")
    assert type(x) is torch.Tensor
    assert x.device == torch.device("tpu", 0)
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1


def test_elementwise_reductions_matmul(mode):
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    ta, tb = a.to("tpu"), b.to("tpu")
    close((ta * 2 - 1).relu().exp(), (a * 2 - 1).relu().exp())
    close(ta.sum(dim=1, keepdim=True), a.sum(dim=1, keepdim=True))
    close(ta.mean(), a.mean())
    close(ta.amax(0), a.amax(0))
    close(ta.argmax(1), a.argmax(1))
    close(ta @ tb, a @ b, tol=1e-4)
    close(torch.softmax(ta, -1), torch.softmax(a, -1))
    close(torch.nn.functional.layer_norm(ta, (5,)), torch.nn.functional.layer_norm(a, (5,)), tol=1e-4)
    close(torch.where(ta > 0, ta, tb.t()[:, :5] if False else ta * 3), torch.where(a > 0, a, a * 3))
    close(ta.to(torch.bfloat16), a.to(torch.bfloat16))
    close(torch.arange(5, device="tpu"), torch.arange(5))
    close(torch.full((2, 3), 1.5, device="tpu"), torch.full((2, 3), 1.5))


def test_materialization_points(mode):
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    t = x.to("tpu")
    assert (t * 2).sum().item() == 12.0
    assert (t + 1).tolist() == [[2.0, -1.0], [4.0, 5.0]]
    assert bool((t > 0).any())
    assert (t - 1).cpu().numpy().tolist() == [[0.0, -3.0], [2.0, 3.0]]
    assert "device='tpu:0'" in repr(t.relu())
    deferfuse.sync()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_printing_reads_once_and_runs_nothing_on_the_cpu(mode, dtype):
    # PyTorch's printer computes on the tensor it prints (float64 min/max,
    # masked_select); on `tpu` it must format a host copy instead.
    x = (torch.randn(4, 5) * 1000).to(dtype)
    before = deferfuse.fallback_counts()
    text = repr(x.to("tpu") * 1)
    assert deferfuse.fallback_counts() == before
    assert "device='tpu:0'" in text

    def squash(s: str) -> str:  # the suffix moves line breaks and commas
        return "".join(s.replace(",", "").split())

    assert squash(text.replace("device='tpu:0'", "")) == squash(repr(x * 1))


def test_views_alias_their_base(mode):
    x = torch.arange(24.0).reshape(4, 6)
    t = x.to("tpu")
    close(t.t(), x.t())
    close(t[1:3, ::2], x[1:3, ::2])
    close(t[:, 2], x[:, 2])
    close(t.view(2, 12), x.view(2, 12))
    close(t.unsqueeze(0).expand(3, 4, 6), x.unsqueeze(0).expand(3, 4, 6))
    # A write through a view updates the base, and the base's other views.
    v, w = t[:, 1], x[:, 1]
    v.mul_(10)
    w.mul_(10)
    close(t, x)
    t.t()[2].zero_()
    x.t()[2].zero_()
    close(t, x)
    t[0] = 7
    x[0] = 7
    close(t, x)
    # contiguous() of a view has the right values. (Known limit: our tensors
    # report contiguous strides, so it returns the view itself, not a copy.)
    close(t.t().contiguous(), x.t().contiguous())


def test_inplace_and_out(mode):
    x = torch.randn(3, 3)
    t = x.to("tpu")
    t.add_(1.5).mul_(2)
    x.add_(1.5).mul_(2)
    close(t, x)
    out = torch.empty(3, 3, device="tpu")
    torch.add(t, t, out=out)
    close(out, x + x)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(2, dtype=torch.int64, device="tpu").add_(0.5)


def test_errors_name_op_and_shapes(mode):
    a, b = torch.ones(2, 3, device="tpu"), torch.ones(4, 5, device="tpu")
    with pytest.raises(deferfuse.EngineError, match=r"(?s)add.*\[2, 3\].*\[4, 5\]"):
        a + b
    with pytest.raises(deferfuse.EngineError, match="matmul"):
        a @ b


def test_debug_mode_reports_nan_with_op():
    with deferfuse.mode("debug"):
        with pytest.raises(deferfuse.EngineError, match="log.*NaN"):
            torch.tensor([-1.0]).to("tpu").log()


def test_fallback_warns_once_and_counts():
    deferfuse.reset_fallback_counts()
    x, toward = torch.randn(5), torch.zeros(5)
    tx, tt = x.to("tpu"), toward.to("tpu")
    # nextafter has no engine lowering (the engine has no bit-level ops).
    with pytest.warns(UserWarning, match="aten::nextafter"):
        y = torch.nextafter(tx, tt)
    assert torch.equal(y.cpu(), torch.nextafter(x, toward))
    torch.nextafter(tx, tt)
    assert deferfuse.fallback_counts()["aten::nextafter"] == 2


def test_unsupported_dtype_stays_correct():
    x = torch.randn(4, dtype=torch.float64)
    t = x.to("tpu")
    assert t.dtype == torch.float64
    close(t * 2, x * 2)


def test_modes_switch_and_share_tensors():
    x = torch.randn(4, 4)
    t = x.to("tpu")
    with deferfuse.mode("defer_and_fuse"):
        assert deferfuse.get_mode() == "defer_and_fuse"
        y = (t * 2).relu().sum(0)
    assert deferfuse.get_mode() == "strict"
    close(y + 1, (x * 2).relu().sum(0) + 1)
    with pytest.raises(ValueError, match="defer_and_fuse"):
        deferfuse.set_mode("lazy")


def test_env_mode_is_read_at_import():
    code = "import torch, deferfuse; print(deferfuse.get_mode())"
    env = {"TORCH_TPU_EAGER_MODE": "DEFER_AND_FUSE", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "defer_and_fuse", out.stderr
    env["TORCH_TPU_EAGER_MODE"] = "lazy"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "strict, debug, defer_and_fuse" in bad.stderr


def test_defer_and_fuse_fuses_a_block():
    with deferfuse.mode("defer_and_fuse"):
        x = torch.randn(16, 32).to("tpu")
        w = torch.randn(64, 32).to("tpu")
        y = torch.nn.functional.gelu(torch.nn.functional.linear(x, w)).softmax(-1)
        before = deferfuse.stats()["flushes"]
        y.sum().item()
        stats = deferfuse.stats()
        assert stats["flushes"] == before + 1
        assert stats["last_flush_kernels"] < stats["last_flush_nodes"]


def test_stats_are_nested_numbers():
    with deferfuse.mode("defer_and_fuse"):
        x = torch.randn(8, 8).to("tpu")
        (x * 2 + 1).sum().item()
        before = deferfuse.stats()
        (x * 2 + 1).sum().item()
        after = deferfuse.stats()
    # The same trace again: a tier-1 hit, counted as a number a user can subtract.
    assert after["cache"]["tier1"]["hits"] == before["cache"]["tier1"]["hits"] + 1
    assert after["cache"]["tier1"]["misses"] == before["cache"]["tier1"]["misses"]
    assert after["memory"]["peak_bytes"] >= after["memory"]["live_bytes"] >= 0

    def numbers(v):
        if isinstance(v, dict):
            return all(isinstance(k, str) and numbers(x) for k, x in v.items())
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    assert numbers(after), after


def test_stats_say_where_kernel_time_went():
    with deferfuse.mode("defer_and_fuse"):
        x = torch.randn(3, 16, 32).to("tpu")
        w = torch.randn(64, 32).to("tpu")
        deferfuse.sync()
        before = deferfuse.stats()["backend"]["kernels"]
        torch.nn.functional.linear(x, w).softmax(-1).sum().item()
        after = deferfuse.stats()["backend"]["kernels"]
    # One product of 3*16 rows, depth 32, 64 columns, and at least one loop
    # (the softmax and the sum), each with its wall time.
    assert after["matmul"]["runs"] == before["matmul"]["runs"] + 1
    assert after["matmul_flops"] - before["matmul_flops"] == 2 * 3 * 16 * 32 * 64
    assert after["matmul"]["ns"] > before["matmul"]["ns"]
    assert after["loops"]["runs"] > before["loops"]["runs"]


def _model():
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.LayerNorm(16),
        torch.nn.GELU(),
        torch.nn.Linear(16, 16),
        torch.nn.SiLU(),
        torch.nn.Linear(16, 4),
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_training_steps_match_cpu(mode, optimizer):
    ref = _model()
    dev = _model()
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("tpu")
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    for m, d in ((ref, "cpu"), (dev, "tpu")):
        opt = (
            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            if optimizer == "sgd"
            else torch.optim.AdamW(m.parameters(), lr=0.01)
        )
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(m(x.to(d)), y.to(d))
            opt.zero_grad()
            loss.backward()
            opt.step()
    for p, q in zip(dev.parameters(), ref.parameters()):
        assert p.device.type == "tpu" and p.grad.device.type == "tpu"
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-4, atol=1e-5)


def test_compile_backend_tpu():
    model = _model()
    x = torch.randn(6, 8)
    expected = model(x)
    m = model.to("tpu")
    compiled = torch.compile(m, backend="tpu")
    close(compiled(x.to("tpu")).detach(), expected.detach(), tol=1e-4)
    with pytest.warns(UserWarning, match='backend="tpu"'):
        plain = torch.compile(_model().to("tpu"))(x.to("tpu"))
    assert plain.device.type == "tpu"


def test_autoload_sets_up_the_device_during_import_torch():
    code = "import torch; print(torch.ones(2, device='tpu').sum().item())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "2.0", out.stderr
    off = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": "/usr/bin:/bin"},
    )
    assert off.returncode != 0


def test_backward_runs_in_the_mode_of_the_thread_that_calls_it():
    # Autograd's device threads are off: a `with deferfuse.mode(...)`
    # block's backward is recorded in that mode, not in the process default.
    with deferfuse.mode("strict"):
        strict_before = deferfuse.stats()["ops_recorded"]
    with deferfuse.mode("defer_and_fuse"):
        x = torch.randn(8, 8, device="tpu", requires_grad=True)
        loss = (x.exp() * 2).sum()
        before = deferfuse.stats()["ops_recorded"]
        loss.backward()
        after = deferfuse.stats()["ops_recorded"]
        grad = x.grad.cpu()
    with deferfuse.mode("strict"):
        strict_after = deferfuse.stats()["ops_recorded"]
    assert after > before and strict_after == strict_before
    torch.testing.assert_close(grad, x.detach().cpu().exp() * 2)
