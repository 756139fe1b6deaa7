"""How a `tpu` tensor holds its value.

Tensors on `tpu` are plain strided `torch.Tensor`s with real storage (made by
the C++ layer, `_native`): PyTorch keeps their sizes, strides and storage
offset, and views share their base's storage. The value of a storage lives
in the storage's C++ block (its DataPtr context, which owns it and lives
exactly as long as the storage) as a `Root`: one engine tensor, or a CPU
tensor for dtypes the engine lacks, whose row-major elements are the
storage's elements (`_native.bridge` reads and sets it). Reading a tensor reads its
(sizes, strides, offset) layout out of the root; writing scatters into the
root, so every alias of the storage sees it, as on CPU.
"""

from __future__ import annotations

import ctypes
import math
from typing import Union

import torch

from . import _engine, _native, _state, _views

TO_ENGINE: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "bool",
}
TO_TORCH: dict[str, torch.dtype] = {v: k for k, v in TO_ENGINE.items()}

Value = Union[_engine.Tensor, torch.Tensor]
Spec = tuple[tuple[int, ...], tuple[int, ...], int]

_bridge = _native.bridge()
#: The root of a tpu tensor's storage, or None (also for tensors of other devices).
stored_root = _bridge.root
#: `t`'s root's value if `t` is all of its root, in its dtype, of the given engine's context; else None.
whole_value = _bridge.whole_value
#: The calling thread's mode and context (`_local.current` is the hot path's read).
_local = _state.local


#: The value of one storage (the Rust class `deferfuse._engine.Root`): an
#: engine tensor, or a CPU tensor for dtypes the engine does not have
#: (float64, int8, complex, ...), with its `shape` and `dtype`;
#: `owned_by(engine)` says whether the value is an engine tensor of that
#: engine's context. `set(value, shape=None)` replaces it. The C++ kernels
#: of the hot path read and replace the same value without Python.
Root = _engine.Root


def root_of(t: torch.Tensor) -> Root:
    """The root of `t`'s storage. A storage that PyTorch allocated itself (an
    `empty`, `empty_strided` or `resize_` in its C++ code) has none yet: its
    bytes are uninitialized, and read as zeros."""
    root = stored_root(t)
    if root is None:
        if t.device.type != "tpu":
            raise RuntimeError(f"deferfuse: a tensor on {t.device} is not a tpu tensor")
        numel = t.untyped_storage().nbytes() // t.element_size()
        root = Root(_zeros(numel, t.dtype))
        _bridge.set_root(t, root)
    return root


def _zeros(numel: int, dtype: torch.dtype) -> Value:
    if dtype in TO_ENGINE:
        return _state.engine().full(0.0, [numel], TO_ENGINE[dtype])
    return torch.zeros(numel, dtype=dtype)


def new_tensor(
    value: Value, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A fresh contiguous `tpu` tensor owning `value`."""
    shape = tuple(value.shape)
    dtype = TO_TORCH[value.dtype] if type(value) is _engine.Tensor else value.dtype
    return _bridge.new_tensor(shape, dtype, Root(value, shape))


def _is_whole(t: torch.Tensor, root: Root) -> bool:
    """`t` is its root, element for element, in the root's dtype."""
    return t.dtype is root.dtype and t.shape == root.shape and t.storage_offset() == 0 and t.is_contiguous()


def _covers(t: torch.Tensor, root: Root) -> bool:
    """`t` is every element of its root in row-major order, in the root's dtype."""
    return (
        t.dtype is root.dtype
        and t.storage_offset() == 0
        and t.is_contiguous()
        and t.numel() == math.prod(root.shape)
    )


def _current(root: Root) -> Value:
    """The root's value, moved into the current mode's context if needed."""
    eng = _state.engine()
    value = root.value
    if type(value) is _engine.Tensor:
        if not root.owned_by(eng):
            value = eng.adopt(value)
            root.set(value, root.shape)
    elif root.shared and value.dtype in TO_ENGINE:
        # Memory that other processes write too: each read takes what it holds now.
        return from_cpu_value(value)
    return value


def spec_of(t: torch.Tensor) -> Spec:
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset())


def read(t: torch.Tensor, root: Root | None = None) -> Value:
    """The value of `t`: an engine tensor of `t`'s shape, or a CPU tensor."""
    if root is None:
        root = root_of(t)
    if root.owned_by(_local.current) and _is_whole(t, root):
        return root.value  # a whole root in the current mode
    v = _current(root)
    if t.dtype is not root.dtype and _untyped_bytes(root, t.dtype):
        v = _take_dtype(root, v, t.dtype)
    if t.dtype is not root.dtype:
        if _storage_copy(t):
            # A storage that `resize_` grew may hold more bytes than its root.
            v = _grow(root, v, ((-(-t.numel() // root.dtype.itemsize),), (1,), 0))
            if type(v) is _engine.Tensor:
                return _bytes_as(v, torch.uint8)[: t.numel()]  # a fresh host copy already
        else:
            _state.count_fallback("aten::view.dtype (read of a view of another dtype)")
        cpu = _bytes_as(v, t.dtype).as_strided(*spec_of(t))
        return from_cpu_value(cpu) if t.dtype in TO_ENGINE else cpu.clone()
    spec = spec_of(t)
    if spec == (root.shape, _contiguous_strides(root.shape), 0):
        return v
    v = _grow(root, v, spec)
    if isinstance(v, torch.Tensor):
        return v.as_strided(*spec)
    return _views.read(v, spec)


def write(t: torch.Tensor, value: Value) -> None:
    """Makes `value` (of `t`'s shape) the new value of `t`, and so of its root."""
    root = root_of(t)
    if isinstance(value, _engine.Tensor):
        want = TO_ENGINE.get(t.dtype)
        if want is None:
            value = to_cpu_value(value).to(t.dtype)
        elif value.dtype != want:
            value = value.cast(want)
    else:
        value = value.to(t.dtype)
        if t.dtype in TO_ENGINE:
            value = from_cpu_value(value)
    if _covers(t, root):
        # The whole storage, in order: the value becomes the root, in `t`'s
        # shape (so that reading `t` back is the hot path).
        root.set(value, tuple(t.shape))
        return
    old = _current(root)
    if t.dtype is not root.dtype:
        _write_bytes(root, old, t, value)
        return
    spec = spec_of(t)
    old = _grow(root, old, spec)
    if isinstance(old, torch.Tensor):
        v = value if isinstance(value, torch.Tensor) else to_cpu_value(value)
        new_root = old.clone()
        new_root.as_strided(*spec).copy_(v)
        root.set(new_root)
        return
    if isinstance(value, torch.Tensor):
        value = from_cpu_value(value)
    root.set(_views.write(old, spec, value), root.shape)


def _bytes_as(v: Value, dtype: torch.dtype) -> torch.Tensor:
    """A root's elements reinterpreted as `dtype` (a dtype view such as
    `view(torch.int32)` or `view_as_real`), on the CPU."""
    cpu = to_cpu_value(v).reshape(-1)
    return cpu.view(torch.uint8).view(dtype)


def _untyped_bytes(root: Root, dtype: torch.dtype) -> bool:
    """The root holds bytes that a storage copy wrote (`torch.load`,
    unpickling and `torch.multiprocessing` fill a storage untyped, and PyTorch
    names the dtype only in the tensors it then sets on it), and `dtype`
    tiles them."""
    return (
        root.dtype is torch.uint8 and dtype is not torch.uint8 and math.prod(root.shape) % dtype.itemsize == 0
    )


def _take_dtype(root: Root, v: Value, dtype: torch.dtype) -> Value:
    """Retypes an untyped root, once, as the dtype it is first read as: left
    as bytes, every later read would convert them again on the CPU."""
    if root.shared:  # the same shared memory, typed
        root.share(root.value.reshape(-1).view(dtype))
        return _current(root)
    typed = _bytes_as(v, dtype)
    root.set(from_cpu_value(typed) if dtype in TO_ENGINE else typed)
    return root.value


def _storage_copy(t: torch.Tensor) -> bool:
    """`t` is every byte of its storage: a storage copy (`storage.cpu()`,
    `torch.save`, pickling), which moves bytes and computes nothing."""
    return t.dtype is torch.uint8 and t.numel() == t.untyped_storage().nbytes() and t.is_contiguous()


def _write_bytes(root: Root, old: Value, t: torch.Tensor, value: Value) -> None:
    """Writes through a dtype view: on the CPU, as bytes of the root."""
    _state.count_fallback("aten::view.dtype (write through a view of another dtype)")
    cpu = to_cpu_value(old).reshape(-1).clone()
    as_view = cpu.view(torch.uint8).view(t.dtype)
    as_view.as_strided(*spec_of(t)).copy_(value if isinstance(value, torch.Tensor) else to_cpu_value(value))
    new = cpu.reshape(root.shape)
    root.set(from_cpu_value(new) if new.dtype in TO_ENGINE else new, root.shape)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _extent(spec: Spec) -> int:
    """Elements of the root a layout reaches (0 for an empty view)."""
    sizes, strides, offset = spec
    if any(n == 0 for n in sizes):
        return 0
    return offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1


def _grow(root: Root, value: Value, spec: Spec) -> Value:
    """`resize_` grows a storage in C++ past what its root holds: the root
    then grows, flattened, with zeros (PyTorch's new memory is uninitialized)."""
    need, numel = _extent(spec), math.prod(value.shape)
    if need <= numel:
        return value
    if isinstance(value, torch.Tensor):
        grown = torch.cat([value.reshape(-1), value.new_zeros(need - numel)])
    else:
        eng = _state.engine()
        grown = eng.cat([value.reshape([numel]), eng.full(0.0, [need - numel], value.dtype)], 0)
    root.set(grown)
    return grown


def _over(address: tuple[int, int], owner: Value, t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of `t`'s shape over `nbytes` at `addr`, which keeps
    `owner` (whose buffer that memory is) alive."""
    addr, nbytes = address
    memory = (ctypes.c_byte * nbytes).from_address(addr)
    memory.owner = owner
    return torch.frombuffer(memory, dtype=t.dtype).view(t.shape)


def _whole_engine_value(t: torch.Tensor) -> Root | None:
    """`t`'s root, when `t` is all of it and its value an engine tensor."""
    root = root_of(t)
    if not t.numel() or not _covers(t, root) or type(_current(root)) is not _engine.Tensor:
        return None
    return root


def host_view(t: torch.Tensor) -> torch.Tensor | None:
    """A CPU tensor over the engine's own host buffer of `t`, for a reader
    (a collective's transport) that only reads it: nothing is copied, and
    the CPU tensor keeps the value alive. None unless `t` is all of its
    storage and its value an engine tensor in host memory."""
    root = _whole_engine_value(t)
    if root is None:
        return None
    value = root.value
    address = value.host_address()
    return None if address is None else _over(address, value, t)


def host_alias(t: torch.Tensor) -> torch.Tensor | None:
    """A CPU tensor over the engine's own host buffer of `t`, for a transport
    (a collective) that reads and writes it in place. The buffer becomes the
    storage's alone first (a value that another tensor shares is copied), so
    writes reach `t`'s storage and nothing else; the CPU tensor keeps it
    alive. None unless `t` is all of its storage and its value an engine
    tensor in host memory (not bool)."""
    root = _whole_engine_value(t)
    if root is None:
        return None
    address = root.exclusive_host()
    return None if address is None else _over(address, root.value, t)


def to_cpu_value(v: Value) -> torch.Tensor:
    """A CPU tensor holding `v` (materializes an engine tensor)."""
    if isinstance(v, torch.Tensor):
        return v.contiguous()
    out = torch.empty(v.shape, dtype=TO_TORCH[v.dtype])
    v.copy_to_address(out.data_ptr(), out.nbytes)
    return out


def from_cpu_value(c: torch.Tensor) -> Value:
    """An engine tensor holding a copy of the CPU tensor `c` (or a CPU copy for
    dtypes the engine lacks)."""
    dtype = TO_ENGINE.get(c.dtype)
    if dtype is None:
        return c.detach().clone().contiguous()
    c = c.detach().contiguous()
    return _state.engine().tensor_from_address(c.data_ptr(), list(c.shape), dtype)


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    return to_cpu_value(read(t))


def from_cpu(c: torch.Tensor) -> torch.Tensor:
    return new_tensor(from_cpu_value(c))


def is_tpu(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"
