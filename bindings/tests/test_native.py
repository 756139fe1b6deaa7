"""The native hot path: aten ops that the C++ layer runs straight into the
engine (bindings/src/native/ops.rs), in every mode, compared with CPU eager;
arguments the native lowering leaves to Python take the op's Python kernel
and give the same values."""

from __future__ import annotations

import subprocess
import sys
import threading

import deferfuse
import pytest
import torch
from deferfuse import _dispatch

MODES = ["strict", "debug", "defer_and_fuse"]


@pytest.fixture(params=MODES)
def mode(request):
    with deferfuse.mode(request.param):
        yield request.param


@pytest.fixture
def python_path():
    """Counts the natively lowered ops that ran their Python kernel so far in the test."""
    before = _dispatch.python_path_counts.copy()
    return lambda: _dispatch.python_path_counts - before


def pair(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=g).to(dtype)
    return cpu, cpu.to("tpu")


def test_elementwise_ops_run_natively_and_match_cpu(mode, python_path):
    a, ta = pair(4, 5, seed=1)
    b, tb = pair(4, 5, seed=2)
    cases = [
        (lambda x, y: x * y, (a, b), (ta, tb)),
        (lambda x, y: x + y * 2.5, (a, b), (ta, tb)),
        (lambda x, y: torch.add(x, y, alpha=0.5), (a, b), (ta, tb)),
        (lambda x, y: x - 1, (a, b), (ta, tb)),
        (lambda x, y: (x / y).exp().tanh(), (a, b), (ta, tb)),
        (lambda x, y: torch.where(x > y, x, y.relu()), (a, b), (ta, tb)),
        (lambda x, y: torch.maximum(x, y).sigmoid().neg(), (a, b), (ta, tb)),
        (lambda x, y: torch.addcmul(x, x, y, value=0.1), (a, b), (ta, tb)),
        (lambda x, y: torch.lerp(x, y, 0.3), (a, b), (ta, tb)),
        (lambda x, y: x.sum(dim=1, keepdim=True) + x.mean(0), (a, b), (ta, tb)),
        (lambda x, y: torch.softmax(x, -1) + torch.log_softmax(y, 0), (a, b), (ta, tb)),
        (lambda x, y: x @ y.t(), (a, b), (ta, tb)),
        (lambda x, y: torch.nn.functional.linear(x, y, x[:, 0]), (a, b), (ta, tb)),
        (lambda x, y: torch.nn.functional.layer_norm(x, (5,), y[0], y[1]), (a, b), (ta, tb)),
        (lambda x, y: torch.cat([x, y.half(), y.new_zeros(0)], 1), (a, b), (ta, tb)),
        (lambda x, y: torch.cat([x, y]).pow(2) + torch.cat([y.abs().pow(1.5), x.pow(3)]), (a, b), (ta, tb)),
        (lambda x, y: ((x > 0) & (y > 0)) | ~(x > y) ^ (y < 0.5) | True, (a, b), (ta, tb)),
        (lambda x, y: 1 - x + (2.5 - y), (a, b), (ta, tb)),
        (
            lambda x, y: (x > 1).any(1, keepdim=True) ^ (y > -1).all(0, keepdim=True) | (x < 0).any(),
            (a, b),
            (ta, tb),
        ),
        (
            lambda x, y: x.argmax() + x.argmax(0) + y.argmax(-1, keepdim=True) + y.argmax(keepdim=True),
            (a, b),
            (ta, tb),
        ),
    ]
    for fn, cpu_args, tpu_args in cases:
        want = fn(*cpu_args)
        got = fn(*tpu_args).cpu()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # f32: a few ulps
    ran_python = python_path()
    # `.cpu()` copies off the device (`_copy_from` to a CPU tensor) in Python.
    assert set(ran_python) <= {"_copy_from.default"}, ran_python


def test_in_place_ops_write_the_storage_every_view_sees(mode, python_path):
    base = torch.arange(12.0).reshape(3, 4)
    t = base.to("tpu")
    view = t[1]  # a view of the same storage
    t.mul_(2.0).add_(torch.ones(3, 4, device="tpu"), alpha=3)
    base.mul_(2.0).add_(torch.ones(3, 4), alpha=3)
    assert torch.equal(t.cpu(), base)
    assert torch.equal(view.cpu(), base[1])
    t.zero_()
    t.fill_(1.5)
    assert torch.equal(view.cpu(), torch.full((4,), 1.5))
    # Python ran only the copies off the device (`.cpu()`); the fill of
    # `torch.ones`' new storage, which has no value yet, starts from zeros.
    assert set(python_path()) <= {"_copy_from.default"}, python_path()


def test_new_storages_and_views_that_cover_their_storage_are_written_natively(mode, python_path):
    z = torch.empty(3, 4, device="tpu").zero_()  # a storage PyTorch allocated: no value yet
    assert torch.equal(z.cpu(), torch.zeros(3, 4))
    a, ta = pair(4, 6, seed=9)
    flat = ta.view(2, 12)  # every element of the storage, in order, in another shape
    flat.add_(torch.ones(12, device="tpu"))
    a.view(2, 12).add_(torch.ones(12))
    torch.testing.assert_close(ta.cpu(), a, rtol=0, atol=0)
    assert set(python_path()) <= {"_copy_from.default"}, python_path()


def test_safe_softmax_zeroes_rows_of_only_minus_infinity(mode, python_path):
    if mode == "debug":
        pytest.skip("Debug mode raises at the row maximum of -inf (TORCH_TPU_DEBUG_CHECKS)")
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(10))
    x[1] = float("-inf")
    x[2, :3] = float("-inf")
    want = torch.ops.aten._safe_softmax(x, -1)
    got = torch.ops.aten._safe_softmax(x.to("tpu"), -1).cpu()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.equal(got[1], torch.zeros(5))
    assert "_safe_softmax.default" not in python_path(), python_path()


def test_views_are_read_natively_and_match_cpu(mode, python_path):
    base = torch.randn(6, 8, 10, generator=torch.Generator().manual_seed(5))
    t = base.to("tpu")
    views = [
        lambda x: x[1:, 2:],  # a box at an offset
        lambda x: x[:, ::2, 1],  # steps and a select
        lambda x: x[2:5].transpose(0, 2),  # a box, permuted
        lambda x: x.reshape(-1)[7:47].reshape(4, 10),  # a run at an offset
        lambda x: x[:, 3:4].expand(6, 5, 10),  # broadcast
        lambda x: x.permute(2, 0, 1)[1:],
        lambda x: x.as_strided((3, 4), (8, 2), 1),
    ]
    for view in views:
        got = (view(t) * 2.0 + 1.0).cpu()
        torch.testing.assert_close(got, view(base) * 2.0 + 1.0, rtol=0, atol=0)
    # Only the copies off the device (`.cpu()`) ran in Python.
    assert set(python_path()) <= {"_copy_from.default"}, python_path()


def test_views_outside_a_box_and_writes_through_views_take_the_python_path(mode, python_path):
    a, ta = pair(6, 6, seed=3)
    odd = (6, 2), (5, 3), 1  # strides that are not multiples of each other: no box grid
    got = (ta.as_strided(*odd) * 3.0).cpu()
    torch.testing.assert_close(got, a.as_strided(*odd) * 3.0)
    s = ta[::2]
    s.mul_(0.5)  # in place through a strided view: written back into the base
    a[::2].mul_(0.5)
    torch.testing.assert_close(ta.cpu(), a)
    ran = python_path()
    assert ran["mul.Tensor"] >= 1 and ran["mul_.Tensor"] >= 1, ran


def test_in_place_casts_and_broadcasts_refused_as_on_cpu(mode):
    i = torch.arange(4, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.mul_(1.5)
    x = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError):
        x.add_(torch.ones(2, 3, device="tpu"))
    assert torch.equal(x.cpu(), torch.ones(3))  # nothing written


def test_shape_errors_name_the_op_and_shapes(mode):
    with pytest.raises(deferfuse.EngineError, match=r"(?s)mul.*\[2, 3\].*\[4\]"):
        torch.ones(2, 3, device="tpu") * torch.ones(4, device="tpu")


def test_foreach_adamw_step_matches_cpu(mode, python_path):
    torch.manual_seed(0)
    params = [torch.randn(8, 8) for _ in range(5)]
    grads = [torch.randn(8, 8) for _ in range(5)]
    results = []
    for device in ("cpu", "tpu"):
        ps = [torch.nn.Parameter(p.clone().to(device)) for p in params]
        for p, g in zip(ps, grads):
            p.grad = g.clone().to(device)
        opt = torch.optim.AdamW(ps, lr=0.01, foreach=True)
        for _ in range(3):
            opt.step()
        results.append([p.detach().cpu() for p in ps])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ran = python_path()
    assert not {k for k in ran if k.startswith("_foreach")}, ran


OPTIMIZERS = {
    "adam_amsgrad_foreach": lambda ps: torch.optim.Adam(
        ps, lr=0.01, amsgrad=True, weight_decay=0.1, foreach=True
    ),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, maximize=True, fused=True),
    "adamw_amsgrad_fused": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01), amsgrad=True, fused=True),
    "sgd_fused": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, fused=True
    ),
    "sgd_fused_plain": lambda ps: torch.optim.SGD(ps, lr=0.1, fused=True),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_and_amsgrad_optimizer_steps_match_cpu_on_the_engine(mode, name, no_fallback, python_path):
    # Tolerance: float32, the same formulas as the CPU kernels in another
    # order of operations (1e-5 relative).
    torch.manual_seed(0)
    params = [torch.randn(8, 8), torch.randn(5)]
    results = []
    for device in ("cpu", "tpu"):
        ps = [torch.nn.Parameter(p.clone().to(device)) for p in params]
        opt = OPTIMIZERS[name](ps)
        for step in range(3):
            for p, q in zip(ps, params):
                p.grad = (q * (step + 1.5)).sin().to(device)
            opt.step()
        results.append([p.detach().cpu() for p in ps])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ran = python_path()  # the optimizer's C++ kernels ran every step
    assert not {k for k in ran if k.startswith(("_fused", "_foreach"))}, ran


def test_a_fused_step_with_found_inf_changes_nothing_and_unscales_like_cpu(mode, no_fallback):
    start, grad = torch.randn(6), torch.randn(6) * 1024.0
    for found in (0.0, 1.0):
        results = []
        for device in ("cpu", "tpu"):
            p = torch.nn.Parameter(start.clone().to(device))
            p.grad = grad.clone().to(device)
            opt = torch.optim.AdamW([p], lr=0.1, fused=True)
            opt.grad_scale = torch.tensor(1024.0, device=device)
            opt.found_inf = torch.tensor(found, device=device)
            opt.step()
            results.append((p.detach().cpu(), p.grad.cpu(), opt.state[p]["exp_avg"].cpu()))
        for got, want in zip(*reversed(results)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_autograd_through_native_kernels(mode):
    a, ta = pair(3, 4, seed=5)
    w, tw = pair(4, 2, seed=6)
    for x, y in ((a, w), (ta, tw)):
        x.requires_grad_(True)
        y.requires_grad_(True)
        torch.softmax(x @ y, -1).mul(2.0).sum().backward()
    torch.testing.assert_close(ta.grad.cpu(), a.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tw.grad.cpu(), w.grad, rtol=1e-5, atol=1e-6)


def _layer_norm_backward(grad, x, mask):
    w, b = x[0] * 0.5, x[1]
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, (4,), w, b, 1e-5)
    return torch.ops.aten.native_layer_norm_backward(grad, x, (4,), mean, rstd, w, b, mask)


# Called as aten ops, not through `backward()`: autograd runs on a thread of
# its own, in the process default mode, not the mode the test switched to.
GRADIENTS = {
    "threshold_backward.default": lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.25),
    "sigmoid_backward.default": lambda g, x: torch.ops.aten.sigmoid_backward(g, x.sigmoid()),
    "tanh_backward.default": lambda g, x: torch.ops.aten.tanh_backward(g, x.tanh()),
    "silu_backward.default": torch.ops.aten.silu_backward,
    "gelu_backward.default": torch.ops.aten.gelu_backward,
    "gelu_backward.default tanh": lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh"),
    "native_layer_norm_backward.default": lambda g, x: _layer_norm_backward(g, x, [True, True, True]),
    "native_layer_norm_backward.default dx db": lambda g, x: _layer_norm_backward(g, x, [True, False, True]),
}


@pytest.mark.parametrize("case", GRADIENTS)
def test_activation_and_layer_norm_gradients_run_natively(mode, python_path, case):
    g, tg = pair(3, 4, seed=7)
    x, tx = pair(3, 4, seed=8)
    x[0, 0] = 0.0  # GELU's derivative at exactly 0
    tx = x.to("tpu")
    want, got = GRADIENTS[case](g, x), GRADIENTS[case](tg, tx)
    for w, t in zip(want, got) if isinstance(want, tuple) else [(want, got)]:
        if w is None:
            assert t is None
        else:
            torch.testing.assert_close(t.cpu(), w, rtol=1e-5, atol=1e-6)  # f32: a few ulps
    assert case.split()[0] not in python_path(), python_path()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_python_path_receives_dtypes_as_dtypes(mode, dtype):
    # A low-precision softmax backward takes the Python kernel, whose
    # `input_dtype` argument must arrive as a torch.dtype (an IValue holds it
    # as an integer) for the lowering to run it on the engine.
    before = deferfuse.fallback_counts()
    a, ta = pair(4, 8, dtype=dtype, seed=7)
    for x in (a, ta):
        x.requires_grad_(True)
        (torch.log_softmax(x, -1) * 3.0).sum().backward()
        (torch.softmax(x, -1) * 3.0).sum().backward()
    assert not deferfuse.fallback_counts() - before
    torch.testing.assert_close(ta.grad.cpu(), a.grad, rtol=2e-2, atol=2e-2)


def test_other_threads_compute_in_their_own_mode():
    out = {}

    def worker():
        with deferfuse.mode("strict"):
            x = torch.full((3,), 2.0, device="tpu")
            out["value"] = (x * x + 1).cpu()

    with deferfuse.mode("defer_and_fuse"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert torch.equal(out["value"], torch.full((3,), 5.0))
        assert torch.equal((torch.ones(2, device="tpu") * 3).cpu(), torch.full((2,), 3.0))


def test_values_made_in_one_mode_are_read_natively_in_another():
    with deferfuse.mode("strict"):
        x = torch.arange(4.0, device="tpu")
    with deferfuse.mode("defer_and_fuse"):
        y = x * 2  # another context's value: the Python path imports it
        assert torch.equal(y.cpu(), torch.arange(4.0) * 2)


def test_routes_name_the_native_kernels_and_their_python_route():
    from deferfuse import _engine

    for name in _engine.native_ops():
        route = _dispatch.ROUTES.get(name)
        if route is not None:  # absent: an overload this torch lacks
            assert route.startswith("C++; else "), (name, route)
    assert _dispatch.ROUTES["mul_.Tensor"] == "C++; else in place: `mul.Tensor` (elementwise._binary)"
    assert _dispatch.ROUTES["native_layer_norm.default"] == "C++; else lowering nn.native_layer_norm"
    assert _dispatch.ROUTES["nll_loss_forward.default"] == "lowering nn.nll_loss_forward"


STRICT_TRANSPOSED_PRODUCT = """
import deferfuse, torch
deferfuse.set_mode("strict")
a = torch.randn(64, 256).to("tpu")
w = torch.randn(4096, 256).to("tpu")
deferfuse.sync()
before = deferfuse.stats()["memory"]
out = {op}
deferfuse.sync()
after = deferfuse.stats()["memory"]
want = {cpu_op}
torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)
print(before["peak_bytes"], before["live_bytes"], after["peak_bytes"], out.numel() * 4)
"""


@pytest.mark.parametrize(
    "op, cpu_op",
    [
        ("a @ w.t()", "a.cpu() @ w.cpu().t()"),
        ("torch.nn.functional.linear(a, w, None)", "a.cpu() @ w.cpu().t()"),
    ],
)
def test_strict_products_read_a_transposed_operand_in_place(op, cpu_op):
    # One aten op is one program in Strict, operand reads included: the
    # product reads `w`'s transpose where it lies instead of copying it
    # first (4 MiB here). A fresh interpreter, so that the engine's peak is
    # this test's own.
    code = STRICT_TRANSPOSED_PRODUCT.format(op=op, cpu_op=cpu_op)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    peak0, live0, peak1, out_bytes = map(int, run.stdout.split()[-4:])
    assert peak1 <= max(peak0, live0 + out_bytes), (peak0, live0, peak1, out_bytes)
