"""Real storage and true strides: `tpu` tensors made by the C++ layer
(`bindings/csrc/`) report the sizes, strides, storage offsets and storage
byte counts CPU reports, views alias their base, and `.contiguous()` copies
exactly when CPU's does."""

import subprocess
import sys

import deferfuse
import pytest
import torch
from deferfuse import _native

# (name, view function) pairs: each made over the base on CPU and on tpu.
VIEWS = [
    ("t", lambda x: x.t()),
    ("transpose", lambda x: x.transpose(0, 1)),
    ("slice", lambda x: x[1:, 2:]),
    ("step_slice", lambda x: x[::2, 1::3]),
    ("select", lambda x: x[2]),
    ("column", lambda x: x[:, 3]),
    ("diagonal", lambda x: x.diagonal()),
    ("diagonal_offset", lambda x: x.diagonal(1)),
    ("unfold", lambda x: x.unfold(1, 2, 2)),
    ("as_strided", lambda x: x.as_strided((2, 3), (1, 4), 5)),
    ("view", lambda x: x.view(6, 4)),
    ("flatten_t", lambda x: x.t().reshape(-1)),
    ("permute_unsqueeze", lambda x: x.unsqueeze(0).permute(2, 0, 1)),
    ("expand", lambda x: x[:, :1].expand(4, 5)),
    ("narrow", lambda x: x.narrow(1, 1, 3)),
    ("unbind", lambda x: x.unbind(1)[2]),
    ("split", lambda x: x.split(2, dim=1)[1]),
    ("squeeze", lambda x: x[:1].squeeze(0)),
]


def _base(device):
    return torch.arange(24, dtype=torch.float32).reshape(4, 6).to(device)


@pytest.mark.parametrize("name,view", VIEWS, ids=[n for n, _ in VIEWS])
def test_view_layout_and_values_match_cpu(mode, name, view):
    cpu, tpu = view(_base("cpu")), view(_base("tpu"))
    assert tpu.shape == cpu.shape
    assert tpu.stride() == cpu.stride()
    assert tpu.storage_offset() == cpu.storage_offset()
    assert tpu.is_contiguous() == cpu.is_contiguous()
    assert tpu.untyped_storage().nbytes() == cpu.untyped_storage().nbytes() == 96
    torch.testing.assert_close(tpu.cpu(), cpu)


WRITABLE = [(n, v) for n, v in VIEWS if n not in ("expand", "flatten_t")]


@pytest.mark.parametrize("name,view", WRITABLE, ids=[n for n, _ in WRITABLE])
def test_write_through_view_updates_base_as_on_cpu(mode, name, view):
    cpu_base, tpu_base = _base("cpu"), _base("tpu")
    cpu_view, tpu_view = view(cpu_base), view(tpu_base)
    cpu_view.mul_(-2.0)
    tpu_view.mul_(-2.0)
    torch.testing.assert_close(tpu_base.cpu(), cpu_base)
    torch.testing.assert_close(tpu_view.cpu(), cpu_view)


def test_overlapping_view_write_is_refused_as_on_cpu(mode):
    for device in ("cpu", "tpu"):
        e = _base(device)[:, :1].expand(4, 5)
        with pytest.raises(RuntimeError, match="single memory location"):
            e.add_(1.0)


def test_contiguous_of_a_non_contiguous_view_is_a_copy(mode):
    x = torch.randn(4, 6).to("tpu")
    t = x.t()
    assert t.stride() == (1, 6) and not t.is_contiguous()
    c = t.contiguous()
    assert c.stride() == (4, 1)
    assert c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    before = x[0, 0].item()
    c[0, 0] = 100.0
    assert x[0, 0].item() == before
    assert c[0, 0].item() == 100.0


def test_contiguous_of_a_contiguous_tensor_is_itself(mode):
    x = torch.randn(4, 6).to("tpu")
    assert x.contiguous() is x


def test_storage_bytes_and_pointers_are_real():
    x = torch.ones(4, 6, device="tpu")
    assert x.untyped_storage().nbytes() == 96
    assert x.data_ptr() != 0
    assert x[1:].data_ptr() == x.data_ptr() + 6 * 4
    assert x.to(torch.bfloat16).untyped_storage().nbytes() == 48


def test_views_share_the_storage():
    x = torch.zeros(3, 4, device="tpu")
    v = x.view(12)
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    v[5] = 7.0
    assert x[1, 1].item() == 7.0


def test_view_of_non_contiguous_tensor_raises_pytorchs_error():
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            torch.zeros(4, 6, device=device).t().view(24)


def test_empty_and_empty_strided_have_requested_layout():
    e = torch.empty_strided((3, 4), (1, 3), device="tpu")
    assert e.stride() == (1, 3)
    assert e.untyped_storage().nbytes() == 48
    # An uninitialized storage reads as zeros and takes writes.
    e.fill_(2.0)
    assert e.sum().item() == 24.0


def test_resize_grows_the_storage_and_keeps_leading_elements():
    x = torch.arange(6, dtype=torch.float32).to("tpu")
    x.resize_(10)
    assert x.untyped_storage().nbytes() == 40
    torch.testing.assert_close(x[:6].cpu(), torch.arange(6, dtype=torch.float32))


def test_dtype_view_reinterprets_bytes_as_on_cpu():
    c = torch.tensor([1.0, -2.0, 0.5])
    t = c.to("tpu")
    assert torch.equal(t.view(torch.int32).cpu(), c.view(torch.int32))


def test_memory_accounting_follows_storages():
    deferfuse.sync()
    before = _native.live_bytes()
    x = torch.empty(1024, device="tpu")
    assert _native.live_bytes() == before + 4096
    assert _native.peak_bytes() >= before + 4096
    del x
    assert _native.live_bytes() == before


def test_factory_for_another_device_index_is_refused():
    with pytest.raises(RuntimeError, match="one device"):
        torch.empty(3, device="tpu:1")


def test_version_mismatch_names_both_versions():
    with pytest.raises(deferfuse.EngineError, match=r"built for torch 2\.14\.0 but torch 2\.15\.0"):
        _native.check_version("2.14.0", "2.15.0")
    with pytest.raises(deferfuse.EngineError, match="not built"):
        _native.check_version(None, "2.15.0")


def test_import_under_another_torch_version_is_a_clear_error(tmp_path):
    # A fresh interpreter whose torch claims another version: importing
    # deferfuse must raise (not crash) and name both versions.
    code = (
        "import torch\n"
        "torch.__version__ = '9.9.9'\n"
        "try:\n"
        "    import deferfuse\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "9.9.9" in out.stdout and torch.__version__ in out.stdout, out.stdout


def test_value_lives_as_long_as_any_alias_of_the_storage(mode):
    base = torch.arange(12, dtype=torch.float32).to("tpu")
    view = base.view(3, 4)[1]
    del base
    torch.testing.assert_close(view.cpu(), torch.tensor([4.0, 5.0, 6.0, 7.0]))


def test_untyped_storage_resize_keeps_the_value():
    x = torch.arange(4, dtype=torch.float32).to("tpu")
    x.untyped_storage().resize_(32)
    assert x.untyped_storage().nbytes() == 32
    torch.testing.assert_close(x.cpu(), torch.arange(4, dtype=torch.float32))


def test_bridge_rejects_bad_arguments_with_exceptions():
    from deferfuse import _handles

    bridge = _native.bridge()
    with pytest.raises(TypeError):
        bridge.new_tensor([2], torch.float32, None)
    with pytest.raises(ValueError, match="negative"):
        bridge.new_tensor((-1,), torch.float32, None)
    with pytest.raises(RuntimeError, match="not a tpu tensor"):
        bridge.set_root(torch.ones(2), None)
    assert bridge.root(torch.ones(2)) is None
    assert bridge.root("not a tensor") is None
    with pytest.raises(RuntimeError, match="not a tpu tensor"):
        _handles.root_of(torch.ones(2))


def test_whole_value_is_only_for_a_whole_root_of_the_context():
    from deferfuse import _handles, _state

    x = torch.arange(6, dtype=torch.float32).to("tpu")
    ctx = _state.local.current
    whole = _handles.whole_value(x, ctx)
    assert whole is not None and torch.equal(
        _handles.to_cpu_value(whole), torch.arange(6, dtype=torch.float32)
    )
    assert _handles.whole_value(x, object()) is None  # another context's value
    assert _handles.whole_value(x[1:], ctx) is None  # an offset view
    assert _handles.whole_value(x.view(2, 3).t(), ctx) is None  # non-contiguous
    assert _handles.whole_value(x.view(2, 3), ctx) is None  # another shape than the root's
    assert _handles.whole_value(x.view(torch.int32), ctx) is None  # another dtype
    assert _handles.whole_value(torch.ones(2), ctx) is None  # a CPU tensor
    with pytest.raises(TypeError):
        _handles.whole_value(x)


def test_a_run_of_a_flat_buffer_at_an_unaligned_offset_stays_on_the_engine(no_fallback):
    # DDP's gradient buckets and FSDP's flat parameters: row-major views into
    # one flat buffer, at offsets that are not multiples of their rows.
    ref = torch.arange(40.0)
    flat = ref.to("tpu")
    view, want = flat.as_strided((3, 4), (4, 1), 5), ref.as_strided((3, 4), (4, 1), 5)
    assert torch.equal(view.cpu(), want)
    view.copy_(torch.full((3, 4), -1.0))
    want.copy_(torch.full((3, 4), -1.0))
    assert torch.equal(flat.cpu(), ref)


# Layouts that are no box grid: windows that overlap, and strides that do
# not divide each other. Each as (sizes, strides, offset) over the 24
# elements of the base.
GATHERED = [
    ("windows", ((3, 4), (2, 1), 0)),
    ("windows_offset", ((5, 6), (3, 1), 2)),
    ("windows_transposed", ((4, 3), (1, 2), 1)),
    ("coprime_strides", ((3, 3), (5, 2), 1)),
    ("sliding_3d", ((2, 3, 4), (6, 3, 1), 0)),
]


@pytest.mark.parametrize("name,spec", GATHERED, ids=[n for n, _ in GATHERED])
def test_views_outside_a_box_grid_read_and_write_as_on_cpu_on_the_engine(mode, name, spec):
    deferfuse.reset_fallback_counts()
    cpu_base, tpu_base = _base("cpu"), _base("tpu")
    cpu_view, tpu_view = cpu_base.as_strided(*spec), tpu_base.as_strided(*spec)
    torch.testing.assert_close(tpu_view.cpu(), cpu_view)
    torch.testing.assert_close((tpu_view * 2).cpu(), cpu_view * 2)
    # A copy into the view: where view elements share a base element, the
    # last in memory order wins, as CPU's copy.
    src = torch.arange(100, 100 + cpu_view.numel(), dtype=torch.float32).reshape(cpu_view.shape)
    cpu_view.copy_(src)
    tpu_view.copy_(src.to("tpu"))
    torch.testing.assert_close(tpu_base.cpu(), cpu_base)
    assert not deferfuse.fallback_counts(), deferfuse.fallback_counts()
