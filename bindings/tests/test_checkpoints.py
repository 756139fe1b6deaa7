"""Checkpoints of `tpu` tensors, state dicts, modules and optimizers:
torch.save/torch.load with every map_location form, pickling, deepcopy,
torch.multiprocessing, safetensors and transformers' save_pretrained /
from_pretrained, pinned host memory, and training resumed in a new process.
Real torch, safetensors and transformers throughout."""

import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap
import weakref
import zipfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import checkpoint_training as training
import deferfuse
import pytest
import torch

HERE = Path(__file__).resolve().parent
TIMEOUT = 240  # seconds for one subprocess (each imports torch)

ENGINE_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool]
#: Dtypes the engine lacks: their values live on the CPU behind the `tpu` storage.
HOST_DTYPES = [torch.float64, torch.int8, torch.uint8, torch.int16, torch.complex64]


def _sample(dtype, shape=(3, 4)):
    n = 1
    for s in shape:
        n *= s
    values = torch.arange(n).reshape(shape) % 7 - 3
    if dtype.is_complex:
        return (values + 0.5j * values).to(dtype)
    if dtype is torch.uint8:
        values = values + 3
    return values.to(dtype)


def _save(obj, **kwargs) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    buf.seek(0)
    return buf


def _roundtrip(obj, **load_kwargs):
    return torch.load(_save(obj), **load_kwargs)


def _same_storage(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# ---- torch.save / torch.load ------------------------------------------------------


@pytest.mark.parametrize("dtype", ENGINE_DTYPES + HOST_DTYPES, ids=str)
def test_every_dtype_round_trips(mode, dtype):
    cpu = _sample(dtype)
    back = _roundtrip(cpu.to("tpu"))
    assert back.device == torch.device("tpu", 0) and back.dtype is dtype
    assert torch.equal(back.cpu(), cpu)
    # Loaded tensors compute: their bytes took the dtype they are read as.
    if dtype is torch.bool:
        assert torch.equal((back & back).cpu(), cpu)
    else:
        assert torch.equal((back + back).cpu(), cpu + cpu)


def _tpu_storage(storage, location):
    return storage.to(device=torch.device("tpu"))


@pytest.mark.parametrize(
    ("map_location", "device"),
    [
        (None, "tpu"),
        ("cpu", "cpu"),
        ("tpu", "tpu"),
        ("tpu:0", "tpu"),
        (torch.device("cpu"), "cpu"),
        (torch.device("tpu"), "tpu"),
        (torch.device("tpu", 0), "tpu"),
        ({"tpu:0": "cpu"}, "cpu"),
        (lambda storage, location: storage, "cpu"),  # PyTorch's idiom for "to the CPU"
        (lambda storage, location: None, "tpu"),  # None: the default restore
        (_tpu_storage, "tpu"),
    ],
    ids=[
        "none",
        "cpu",
        "tpu",
        "tpu:0",
        "device-cpu",
        "device-tpu",
        "device-tpu:0",
        "dict",
        "callable-cpu",
        "callable-none",
        "callable-tpu",
    ],
)
def test_map_location_forms(map_location, device):
    state = {"w": torch.randn(3, 2).to("tpu"), "step": 7}
    back = _roundtrip(state, map_location=map_location)
    assert back["w"].device.type == device and back["step"] == 7
    assert torch.equal(back["w"].cpu(), state["w"].cpu())


@pytest.mark.parametrize("map_location", ["tpu", "tpu:0", torch.device("tpu"), {"cpu": "tpu"}], ids=str)
def test_a_cpu_checkpoint_loads_onto_tpu(map_location):
    state = {"w": torch.randn(4, 3), "i": torch.arange(5)}
    back = _roundtrip(state, map_location=map_location, weights_only=True)
    assert {t.device.type for t in back.values()} == {"tpu"}
    assert all(torch.equal(back[k].cpu(), state[k]) for k in state)


def test_a_device_that_does_not_exist_is_refused():
    with pytest.raises(RuntimeError, match="device_count"):
        _roundtrip(torch.ones(2, device="tpu"), map_location="tpu:1")


def test_views_keep_one_storage_saved_once(mode):
    base = torch.arange(12.0, device="tpu")
    views = [base, base[2:], base.view(3, 4).t(), base.view(3, 4)[:, 1]]
    buf = _save(views)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        assert sum("/data/" in n for n in z.namelist()) == 1  # one storage record, as on CPU
    back = torch.load(buf)
    assert all(_same_storage(back[0], v) for v in back[1:])
    assert [v.stride() for v in back] == [v.stride() for v in views]
    assert [v.storage_offset() for v in back] == [v.storage_offset() for v in views]
    back[0][5] = 100.0  # one storage: every view sees the write
    assert back[1][3].item() == 100.0 and back[2][1, 1].item() == 100.0 and back[3][1].item() == 100.0


def test_a_slice_saves_its_whole_storage_as_on_cpu():
    base = torch.arange(10.0)
    back = _roundtrip(base.to("tpu")[7:])
    assert back.untyped_storage().nbytes() == base.untyped_storage().nbytes()
    assert back.storage_offset() == 7 and back.tolist() == [7.0, 8.0, 9.0]


def test_tensors_still_pending_are_saved_with_their_values():
    with deferfuse.mode("defer_and_fuse"):
        x = torch.randn(5, 6)
        t = x.to("tpu")
        pending = [torch.relu(t * 2 + 1), (t @ t.T).sum(0), t.exp()[1:, ::2]]
        back = _roundtrip(pending)
    expected = [torch.relu(x * 2 + 1), (x @ x.T).sum(0), x.exp()[1:, ::2]]
    for b, e in zip(back, expected):
        torch.testing.assert_close(b.cpu(), e)


def test_saving_and_loading_run_no_op_on_the_cpu(no_fallback):
    state = torch.nn.Linear(6, 3).to("tpu").state_dict()
    back = _roundtrip(state)
    out = torch.nn.functional.linear(torch.ones(2, 6, device="tpu"), back["weight"], back["bias"])
    assert out.cpu().shape == (2, 3)


def test_a_storage_that_resize_grew_saves_its_bytes():
    x = torch.ones(2, device="tpu")
    x.resize_(5)
    x[2:] = 3.0
    assert _roundtrip(x).tolist() == [1.0, 1.0, 3.0, 3.0, 3.0]
    y = torch.ones(2, device="tpu")
    y.resize_(4)
    back = _roundtrip(y[:2])  # the storage holds 4 floats, the root only 2
    assert back.tolist() == [1.0, 1.0] and back.untyped_storage().nbytes() == 16


def test_weights_only_loading():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("tpu")
    back = _roundtrip(model.state_dict(), weights_only=True)
    assert back.keys() == model.state_dict().keys()
    for k, v in model.state_dict().items():
        assert back[k].device == v.device and torch.equal(back[k].cpu(), v.cpu())


def test_a_whole_module_round_trips():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).to("tpu")
    back = _roundtrip(model, weights_only=False)
    assert isinstance(back, torch.nn.Sequential) and back[0].weight.device.type == "tpu"
    assert isinstance(back[0].weight, torch.nn.Parameter)
    x = torch.randn(2, 4, device="tpu")
    assert torch.equal(back(x).cpu(), model(x).cpu())


def test_the_legacy_format_round_trips():
    t = torch.arange(6.0, device="tpu").view(2, 3)
    back = _roundtrip([t, t[1]], weights_only=False, map_location=None)
    legacy = torch.load(_save([t, t[1]], _use_new_zipfile_serialization=False), weights_only=False)
    for b in (back, legacy):
        assert b[0].device.type == "tpu" and torch.equal(b[0].cpu(), t.cpu()) and _same_storage(*b)


def test_saving_through_pinned_host_memory():
    from torch.utils.serialization import config

    t = torch.randn(3, 5, device="tpu")
    config.save.use_pinned_memory_for_d2h = True
    try:
        buf = _save(t)
    finally:
        config.save.use_pinned_memory_for_d2h = False
    assert torch.equal(torch.load(buf).cpu(), t.cpu())


def test_loading_with_mmap(tmp_path):
    path = tmp_path / "state.pt"
    state = {"w": torch.randn(8, 8).to("tpu")}
    torch.save(state, path)
    for map_location in (None, "tpu", "cpu"):
        back = torch.load(path, mmap=True, map_location=map_location, weights_only=True)
        assert torch.equal(back["w"].cpu(), state["w"].cpu())


def test_an_mmap_load_outlives_its_file(tmp_path):
    """Loaded onto tpu, the values stay in the file's pages until first read
    (no second host copy); the mapping keeps them after the file is gone."""
    path = tmp_path / "state.pt"
    state = {"w": torch.randn(16, 16), "i": torch.arange(9, dtype=torch.int64)}
    torch.save(state, path)
    back = torch.load(path, mmap=True, map_location="tpu", weights_only=True)
    path.unlink()
    assert torch.equal((back["w"] * 1).cpu(), state["w"]) and torch.equal(back["i"].cpu(), state["i"])


def test_restoring_to_tpu_keeps_the_loaded_bytes_instead_of_copying_them():
    from torch.multiprocessing.reductions import StorageWeakRef

    storage = torch.arange(4, dtype=torch.float32).untyped_storage()
    with pytest.raises(RuntimeError, match="device_count"):
        torch.serialization.default_restore_location(storage, "tpu:3")
    restored = torch.serialization.default_restore_location(storage, "tpu:0")
    assert restored.device == torch.device("tpu", 0) and restored.nbytes() == 16
    loaded = StorageWeakRef(storage)
    del storage
    assert not loaded.expired()  # the tpu storage holds the loaded bytes: no host copy
    on_tpu = torch.empty(0, device="tpu").set_(restored)
    assert (on_tpu * 2).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert loaded.expired()  # read once, the value is the engine's and the bytes are gone


# ---- optimizers ------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", sorted(training.OPTIMIZERS))
def test_a_model_with_its_optimizer_round_trips(mode, optimizer):
    model, opt = training.make(optimizer)
    training.train(model, opt, 0, 2)
    back = _roundtrip(training.checkpoint(model, opt, optimizer, 2), weights_only=True)
    for state in back["optimizer"]["state"].values():
        for name, value in state.items():
            # PyTorch keeps Adam's `step` on the CPU unless capturable; the moments follow the parameters.
            assert value.device.type == ("cpu" if name == "step" else "tpu"), name

    model2, opt2 = training.make(optimizer)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optimizer"])
    for a, b in zip(opt.state.values(), opt2.state.values()):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)
    # One more step each: the same parameters, bit for bit.
    torch.tpu.manual_seed(3)
    training.train(model, opt, 2, 3)
    torch.tpu.manual_seed(3)
    training.train(model2, opt2, 2, 3)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p.cpu(), q.cpu())


def _uninterrupted(optimizer):
    model, opt = training.make(optimizer)
    training.train(model, opt, 0, training.STEPS)
    return {k: v.cpu() for k, v in model.state_dict().items()}


def _first_half(optimizer, path):
    model, opt = training.make(optimizer)
    training.train(model, opt, 0, 5)
    torch.save(training.checkpoint(model, opt, optimizer, 5), path)


def _equal_states(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k].cpu()) for k in a)


@pytest.mark.parametrize("optimizer", sorted(training.OPTIMIZERS))
def test_resumed_training_continues_bit_for_bit(mode, optimizer, tmp_path):
    path = tmp_path / "step5.pt"
    _first_half(optimizer, path)
    resumed = {k: v.cpu() for k, v in training.resume(path).state_dict().items()}
    assert _equal_states(_uninterrupted(optimizer), resumed)


def test_resuming_without_the_optimizer_state_differs(tmp_path):
    """The comparison above sees a state that is not restored."""
    path = tmp_path / "step5.pt"
    _first_half("adamw", path)
    ckpt = torch.load(path, weights_only=True)
    model, opt = training.make("adamw")  # a fresh optimizer: no moments
    model.load_state_dict(ckpt["model"])
    torch.tpu.set_rng_state(ckpt["tpu_rng"])
    training.train(model, opt, 5, training.STEPS)
    assert not _equal_states(_uninterrupted("adamw"), model.state_dict())


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    env["TORCH_TPU_CACHE_DIR"] = "off"
    env.update(extra)
    return env


def test_training_resumed_in_a_new_process_equals_an_uninterrupted_run(mode, tmp_path):
    ckpt, out = tmp_path / "step5.pt", tmp_path / "step10.pt"
    _first_half("adamw", ckpt)
    run = subprocess.run(
        [sys.executable, str(HERE / "checkpoint_training.py"), str(ckpt), str(out)],
        env=_env(TORCH_TPU_EAGER_MODE=mode),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stderr
    assert _equal_states(_uninterrupted("adamw"), torch.load(out, map_location="cpu", weights_only=True))


_WITHOUT_DEFERFUSE = """
    import sys
    sys.modules["deferfuse"] = None  # not installed: importing it fails
    import torch
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    state = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
    print(state["w"].device, state["w"].tolist(), state["b"].dtype)
    try:
        torch.load(sys.argv[1], weights_only=True)
    except RuntimeError as e:
        print("refused:", e)
"""


def test_a_tpu_checkpoint_loads_where_deferfuse_is_not_installed(tmp_path):
    path = tmp_path / "state.pt"
    torch.save(
        {"w": torch.arange(4.0, device="tpu"), "b": torch.ones(2, dtype=torch.bfloat16, device="tpu")}, path
    )
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_DEFERFUSE), str(path)],
        env=_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "cpu [0.0, 1.0, 2.0, 3.0] torch.bfloat16"
    # Without map_location, PyTorch's own error names the location it cannot restore.
    assert lines[1].startswith("refused:") and "tpu:0" in lines[1]


# ---- bad files -------------------------------------------------------------------


def test_corrupt_and_truncated_files_raise_pytorchs_errors(tmp_path):
    state = {"w": torch.randn(64, 64, device="tpu"), "b": torch.randn(64, device="tpu")}
    path = tmp_path / "state.pt"
    torch.save(state, path)
    data = path.read_bytes()
    bad = {
        "empty": b"",
        "truncated early": data[:100],
        "truncated in the data": data[: len(data) // 2],
        "truncated at the end": data[:-10],
        "not a checkpoint": b"\x00\x01 not a zip file" * 50,
    }
    for name, content in bad.items():
        p = tmp_path / f"{name}.pt"
        p.write_bytes(content)
        for map_location in (None, "cpu"):
            with pytest.raises((RuntimeError, OSError, EOFError, pickle.UnpicklingError)):
                torch.load(p, map_location=map_location, weights_only=True)
    # The process goes on, and a good file still loads.
    back = torch.load(path, weights_only=True)
    assert torch.equal(back["w"].cpu(), state["w"].cpu())
    assert (back["b"] * 2).cpu().shape == (64,)


# ---- pickle, deepcopy, torch.multiprocessing --------------------------------------


@pytest.mark.parametrize("dtype", ENGINE_DTYPES + HOST_DTYPES, ids=str)
def test_pickle_round_trips(mode, dtype):
    cpu = _sample(dtype)
    back = pickle.loads(pickle.dumps(cpu.to("tpu")))
    assert back.device.type == "tpu" and back.dtype is dtype and torch.equal(back.cpu(), cpu)


def test_pickle_keeps_what_it_keeps_on_cpu():
    def pickled(base):
        p = torch.nn.Parameter(base[:2].clone())
        return pickle.loads(pickle.dumps([base, base[1:], p]))

    cpu, tpu = pickled(torch.arange(4.0)), pickled(torch.arange(4.0, device="tpu"))
    assert [t.tolist() for t in tpu] == [t.tolist() for t in cpu]
    assert [type(t) for t in tpu] == [type(t) for t in cpu]
    assert _same_storage(tpu[0], tpu[1]) == _same_storage(cpu[0], cpu[1])
    assert tpu[2].requires_grad


def test_deepcopy_as_on_cpu(mode):
    def copied(device):
        base = torch.arange(6.0, device=device)
        leaf = torch.ones(3, device=device, requires_grad=True)
        leaf.grad = torch.full((3,), 2.0, device=device)
        return copy.deepcopy([base, base.view(2, 3)[:, 1], leaf])

    for out in (copied("cpu"), copied("tpu")):
        base, view, leaf = out
        base[4] = 40.0  # the copies share one storage, as the originals did
        assert view.tolist() == [1.0, 40.0]
        assert leaf.requires_grad and leaf.grad.tolist() == [2.0, 2.0, 2.0]
    assert copied("tpu")[0].device.type == "tpu"
    module = torch.nn.Linear(3, 2).to("tpu")
    clone = copy.deepcopy(module)
    assert clone.weight.device.type == "tpu" and torch.equal(clone.weight.cpu(), module.weight.cpu())
    assert clone.weight.untyped_storage().data_ptr() != module.weight.untyped_storage().data_ptr()


def test_what_cuda_refuses_is_refused_alike():
    nonleaf = torch.ones(2, device="tpu", requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(nonleaf)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(nonleaf)


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_multiprocessing_pickler_round_trips(strategy):
    import torch.multiprocessing as mp

    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy(strategy)
    try:
        base = torch.arange(12.0, device="tpu").view(3, 4)
        sent = [base, base[1], torch.nn.Parameter(torch.ones(2, device="tpu")), torch.empty(0, device="tpu")]
        back = ForkingPickler.loads(bytes(ForkingPickler.dumps(sent)))
    finally:
        mp.set_sharing_strategy(old)
    assert all(t.device.type == "tpu" for t in back)
    assert torch.equal(back[0].cpu(), base.cpu()) and back[1].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert _same_storage(back[0], back[1]) and isinstance(back[2], torch.nn.Parameter)
    assert back[3].shape == (0,)
    # Shared, as CUDA shares it: writes on either side are seen on the other.
    back[0][0, 0] = 50.0
    assert base[0, 0].item() == 50.0
    base[1] += 100.0
    assert back[1].tolist() == [104.0, 105.0, 106.0, 107.0] and (back[0] * 2)[1, 0].item() == 208.0
    with pytest.raises(RuntimeError, match="shared with another process keeps its 12 elements"):
        back[0].resize_(16)
        back[0].sum().item()


_QUEUE = """
    import torch, deferfuse
    import torch.multiprocessing as mp

    def child(inbox, outbox):
        base, row, param = inbox.get()
        outbox.put((base.device.type, (base * 2).tolist(), row.tolist(),
                    base.untyped_storage().data_ptr() == row.untyped_storage().data_ptr(),
                    type(param).__name__, param.requires_grad))
        with torch.no_grad():
            param.add_(5.0)  # Hogwild-style: the sender sees the update
        torch.tpu.synchronize()
        outbox.put("updated")

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        inbox, outbox = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=child, args=(inbox, outbox))
        p.start()
        base = torch.arange(6.0, device="tpu").view(2, 3) + 1
        param = torch.nn.Parameter(torch.ones(2, device="tpu"))
        inbox.put((base, base[1], param))
        print(outbox.get(timeout=120))
        print(outbox.get(timeout=120), param.tolist())
        p.join(timeout=120)
        print(p.exitcode)
"""


def test_a_spawned_process_receives_tpu_tensors(tmp_path):
    script = tmp_path / "send_tensors.py"
    script.write_text(textwrap.dedent(_QUEUE))
    run = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert run.stdout.splitlines() == [
        "('tpu', [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]], [4.0, 5.0, 6.0], True, 'Parameter', True)",
        "updated [6.0, 6.0]",
        "0",
    ], run.stderr


# ---- safetensors and transformers ------------------------------------------------


def test_safetensors_files_from_tpu_and_back(tmp_path):
    from safetensors.torch import load_file, load_model, save_file, save_model

    state = {"a": torch.randn(3, 4).to("tpu"), "b": torch.arange(5, device="tpu")}
    save_file(state, tmp_path / "s.safetensors")
    # safetensors refuses device="tpu" itself: load to the CPU, then move.
    back = {k: v.to("tpu") for k, v in load_file(tmp_path / "s.safetensors").items()}
    assert all(back[k].device.type == "tpu" and torch.equal(back[k].cpu(), state[k].cpu()) for k in state)

    model = torch.nn.Linear(4, 3).to("tpu")
    save_model(model, tmp_path / "m.safetensors")
    other = torch.nn.Linear(4, 3).to("tpu")
    load_model(other, tmp_path / "m.safetensors")
    assert other.weight.device.type == "tpu" and torch.equal(other.weight.cpu(), model.weight.cpu())


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).to("tpu").eval()


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_bin"])
def test_save_pretrained_and_from_pretrained_on_tpu(tmp_path, safe):
    from transformers import GPT2LMHeadModel

    model = _gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    model.save_pretrained(tmp_path, safe_serialization=safe)
    if safe:
        from safetensors import safe_open

        with safe_open(tmp_path / "model.safetensors", "pt") as f:
            keys = set(f.keys())
        # The tied weight is saved once, as from the CPU.
        assert "transformer.wte.weight" in keys and "lm_head.weight" not in keys
    back = GPT2LMHeadModel.from_pretrained(tmp_path, device_map="tpu")
    assert back.lm_head.weight is back.transformer.wte.weight
    assert {p.device.type for p in back.parameters()} == {"tpu"}
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k].cpu(), theirs[k].cpu()) for k in ours)
    x = torch.arange(10, device="tpu")[None]
    assert torch.equal(back(x).logits.cpu(), model(x).logits.cpu())
    on_cpu = GPT2LMHeadModel.from_pretrained(tmp_path)  # and on a machine with no tpu
    assert torch.equal(on_cpu.transformer.wte.weight, model.transformer.wte.weight.cpu())


# ---- pinned host memory -----------------------------------------------------------


# PyTorch now pins for the current accelerator (tpu) and calls the argument deprecated.
@pytest.mark.filterwarnings("ignore:pin_memory_device is deprecated")
def test_dataloader_pins_for_tpu(mode):
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, pin_memory_device="tpu")
    seen = []
    for x, i in loader:
        assert x.is_pinned() and i.is_pinned()
        x_tpu = x.to("tpu", non_blocking=True)
        seen.append((x_tpu * 1).cpu())
    torch.tpu.synchronize()
    assert torch.equal(torch.cat(seen), data.tensors[0])


def test_pinned_memory_comes_from_the_tpu_allocator():
    pinned = torch.randn(16).pin_memory()
    assert pinned.is_pinned() and pinned[5:].is_pinned() and pinned.untyped_storage().is_pinned()
    assert pinned.pin_memory().data_ptr() == pinned.data_ptr()  # already pinned: no copy
    assert not torch.randn(16).is_pinned()
    with pytest.raises(RuntimeError, match="only CPU memory can be pinned|cannot pin"):
        torch.ones(2, device="tpu").pin_memory()


def test_non_blocking_upload_of_pinned_memory_keeps_its_source_until_copied(mode):
    # Copied on the context's stream: the source stays alive until then, even
    # when the caller drops it at once and new pinned memory could take its place.
    want = torch.arange(24.0).reshape(4, 6)
    x = want.clone().pin_memory()
    alive = weakref.ref(x)
    y = x.to("tpu", non_blocking=True)
    del x
    others = [torch.full((4, 6), -1.0).pin_memory() for _ in range(4)]
    assert torch.equal((y * 2).cpu(), want * 2)
    torch.tpu.synchronize()
    (y + 1).cpu()  # the binding lets go of the source at its next call
    gc.collect()
    assert alive() is None, "the pinned source outlives its copy"
    assert all(o.eq(-1).all() for o in others)


def test_non_blocking_uploads_that_cannot_run_on_the_stream_copy_at_once(mode):
    pinned = torch.arange(24.0).reshape(4, 6).pin_memory()
    for src, dtype in ((pinned[:, ::2], None), (pinned, torch.float16), (torch.arange(5), None)):
        got = src.to("tpu", dtype=dtype, non_blocking=True)
        assert got.dtype == (dtype or src.dtype)
        assert torch.equal(got.cpu(), src.to(got.dtype))
