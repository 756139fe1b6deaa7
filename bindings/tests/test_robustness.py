"""Nothing lost, nobody in: bad environment values, bad views, mixed devices,
threads in different modes and forked processes, each against real torch.
Whatever could hang or take the interpreter down runs in a subprocess with a
timeout."""

import os
import subprocess
import sys
import textwrap
import threading

import deferfuse
import pytest
import torch
from deferfuse import _engine

TIMEOUT = 240  # seconds for one subprocess; spawned workers each import torch


def _run(code, env_extra=None, drop=(), timeout=TIMEOUT):
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCH_TPU_")}
    env["TORCH_TPU_CACHE_DIR"] = "off"
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_script(tmp_path, code, timeout=TIMEOUT):
    """A script file, for multiprocessing's spawn start method (its children
    import the main module by path)."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    env["TORCH_TPU_CACHE_DIR"] = "off"
    return subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=timeout
    )


# ---- one place parses the environment ------------------------------------------------


def test_the_engine_parses_the_environment():
    config = _engine.env_config()
    assert config["mode"] == "strict" and config["decompose"] == "default"
    assert config["cache_dir"] is None  # conftest sets TORCH_TPU_CACHE_DIR=off
    assert deferfuse.config() == config
    assert _engine.parse_mode(" Defer_And_Fuse ") == "defer_and_fuse"
    with pytest.raises(ValueError, match=r'"lazy".*strict, debug, defer_and_fuse'):
        _engine.parse_mode("lazy")
    with pytest.raises(ValueError, match=r"valid modes: strict, debug, defer_and_fuse"):
        deferfuse.set_mode("lazy")


def test_every_variable_is_validated_at_import():
    code = "import deferfuse"
    for var, value, valid in [
        ("TORCH_TPU_EAGER_MODE", "lazy", "strict, debug, defer_and_fuse"),
        ("TORCH_TPU_DECOMPOSE", "some", "all, default"),
        ("TORCH_TPU_MAX_PENDING_OPS", "0", "a positive integer"),
    ]:
        out = _run(code, {var: value})
        assert out.returncode != 0, (var, out.stderr)
        assert f'{var}="{value}" is not valid' in out.stderr and valid in out.stderr, out.stderr


def test_decompose_all_comes_through_the_engine():
    code = """
        import deferfuse
        from deferfuse import _dispatch
        print(deferfuse.config()["decompose"], len(_dispatch._decompositions()) > len(_dispatch.DECOMPOSED))
    """
    assert _run(code, {"TORCH_TPU_DECOMPOSE": "ALL"}).stdout.split() == ["all", "True"]
    # The old name is not read any more.
    old = _run(code, {"_DEFERFUSE_DECOMPOSE": "all"})
    assert old.stdout.split() == ["default", "False"], old.stderr


# ---- autoload ------------------------------------------------------------------------


def test_a_bad_variable_does_not_break_import_torch():
    code = """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        print([str(w.message) for w in caught if "deferfuse" in str(w.message)])
        try:
            torch.ones(1, device="tpu")
        except RuntimeError:
            print("no tpu")
        print(torch.ones(2).sum().item())
        import deferfuse
    """
    out = _run(code, {"TORCH_TPU_EAGER_MODE": "lazy"})
    lines = out.stdout.splitlines()
    assert 'TORCH_TPU_EAGER_MODE="lazy" is not valid' in lines[0], out
    assert "strict, debug, defer_and_fuse" in lines[0]
    assert lines[1:] == ["no tpu", "2.0"], out
    # The explicit import raises the same error as an exception.
    assert out.returncode != 0
    assert "EngineError" in out.stderr and 'TORCH_TPU_EAGER_MODE="lazy" is not valid' in out.stderr


@pytest.mark.parametrize("first", ["torch", "deferfuse"])
def test_either_import_order_sets_up_the_device(first):
    second = "deferfuse" if first == "torch" else "torch"
    out = _run(f"import {first}, {second}; print(torch.ones(2, device='tpu').sum().item())")
    assert out.returncode == 0 and out.stdout.strip() == "2.0", out.stderr


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


# ---- threads in different modes ----------------------------------------------------------


def test_modes_are_per_thread_and_threads_never_collide():
    errors = []
    stop = threading.Event()

    def work():
        try:
            for _ in range(300):
                a = torch.ones(3, device="tpu")
                assert (a * 2 + 1).sum().item() == 9.0
        except Exception as e:  # any failure fails the test
            errors.append(repr(e))

    def flip():
        i = 0
        try:
            while not stop.is_set():
                deferfuse.set_mode("strict" if i % 2 else "defer_and_fuse")
                assert (torch.ones(2, device="tpu") * 3).sum().item() == 6.0
                i += 1
        except Exception as e:
            errors.append(repr(e))
        finally:
            deferfuse.set_mode("strict")

    workers = [threading.Thread(target=work) for _ in range(4)]
    flipper = threading.Thread(target=flip)
    flipper.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    flipper.join()
    assert errors == []


def test_a_thread_starts_in_the_default_mode_and_keeps_its_own():
    seen = {}

    def other():
        seen["start"] = deferfuse.get_mode()
        with deferfuse.mode("debug"):
            seen["inside"] = deferfuse.get_mode()
            barrier.wait()  # the main thread reads its mode while this one is in debug
            barrier.wait()

    barrier = threading.Barrier(2)
    with deferfuse.mode("defer_and_fuse"):
        th = threading.Thread(target=other)
        th.start()
        barrier.wait()
        seen["main"] = deferfuse.get_mode()
        barrier.wait()
        th.join()
    assert seen == {"start": "strict", "inside": "debug", "main": "defer_and_fuse"}


def test_tensors_cross_threads_in_other_modes():
    x = torch.randn(4, 4)
    with deferfuse.mode("defer_and_fuse"):
        t = (x.to("tpu") * 2).relu()  # recorded, not run
    results = {}

    def read(mode):
        with deferfuse.mode(mode):
            results[mode] = (t @ t + t).cpu()

    threads = [threading.Thread(target=read, args=(m,)) for m in ("strict", "debug", "defer_and_fuse")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    y = (x * 2).relu()
    for got in results.values():
        torch.testing.assert_close(got, y @ y + y)


def test_engine_ops_import_operands_of_other_contexts():
    strict, lazy = _engine.Engine("strict"), _engine.Engine("defer_and_fuse")
    a = strict.full(2.0, [3], "f32")
    b = lazy.full(5.0, [3], "f32")
    # Used to raise "operands belong to different contexts".
    s = a.binary("add", b)
    assert strict.owns(s) and not lazy.owns(s)
    out = torch.empty(3)
    s.copy_to_address(out.data_ptr(), out.nbytes)
    assert out.tolist() == [7.0, 7.0, 7.0]


# ---- fork ------------------------------------------------------------------------------

_FORK_PROBE = """
    import os, signal, torch, deferfuse
    for mode in ("strict", "debug", "defer_and_fuse"):
        deferfuse.set_mode(mode)
        torch.ones(2, device="tpu").sum().item()
        big = torch.ones(1 << 22, device="tpu")  # large enough for the parallel kernels
        assert big.sum().item() == 1 << 22
        before = torch.arange(6.0, device="tpu") * 2  # made in the parent, read in the child
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)
            ok = torch.ones(2, device="tpu").sum().item() == 2.0
            ok = ok and (torch.ones(1 << 22, device="tpu") * 3).sum().item() == 3 * (1 << 22)
            ok = ok and before.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
            ok = ok and (before + 1).sum().item() == 36.0
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print(mode, os.waitstatus_to_exitcode(status), before.sum().item())
"""


def test_a_forked_child_gets_a_working_engine():
    out = _run(_FORK_PROBE)
    # 0: the child ran and read the right values; -14 is the alarm of a hung child.
    expected = [f"{m} 0 30.0" for m in ("strict", "debug", "defer_and_fuse")]
    assert out.stdout.splitlines() == expected, out.stderr


_LOADER = """
    import multiprocessing, torch, deferfuse
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __init__(self, on_tpu):
            self.on_tpu = on_tpu

        def __len__(self):
            return 8

        def __getitem__(self, i):
            if self.on_tpu:
                v = torch.full((3,), float(i), device="tpu")
                return (v * v).sum().cpu()
            return (torch.full((3,), float(i)) ** 2).sum()

    if __name__ == "__main__":
        assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0  # the parent uses tpu first
        for method in ("fork", "spawn"):
            for on_tpu in (True, False):
                loader = DataLoader(
                    Squares(on_tpu),
                    batch_size=2,
                    num_workers=2,
                    multiprocessing_context=multiprocessing.get_context(method),
                    timeout=120,
                )
                total = sum(batch.to("tpu").sum() for batch in loader)
                print(method, on_tpu, total.item())
"""


def test_dataloader_workers_under_fork_and_spawn(tmp_path):
    out = _run_script(tmp_path, _LOADER)
    expected = 3.0 * sum(i * i for i in range(8))
    lines = [f"{m} {t} {expected}" for m in ("fork", "spawn") for t in (True, False)]
    assert out.stdout.splitlines() == lines, out.stderr
