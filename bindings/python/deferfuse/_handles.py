"""How a `tpu` tensor holds its value.

Tensors on `tpu` are plain `torch.Tensor`s without memory of their own. Their
value lives on the tensor's `untyped_storage()` (which `detach`, `.data` and
`nn.Parameter` share), as a `Handle`: a `Root` (the value of the storage, an
engine tensor, or a CPU tensor for dtypes the engine lacks) and, for views, the
(sizes, strides, offset) of the view over the root's row-major elements.
A view is read from its root when used and writes go back to the root, so
aliasing keeps PyTorch's semantics.
"""

from __future__ import annotations

import math
from typing import Union

import torch

from . import _engine, _state, _views

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

_ATTR = "_deferfuse"
_create = torch._C._acc.create_empty_tensor
#: The calling thread's mode and context (`_local.current` is the hot path's read).
_local = _state.local


class Root:
    """The value of one storage: an engine tensor, or a CPU tensor for dtypes
    the engine does not have (float64, int8, complex, ...). `shape` and
    `owner` (the engine context of the value) are kept beside it so the hot
    path needs no call into the engine."""

    __slots__ = ("value", "shape", "owner")

    def __init__(self, value: Value, shape: tuple[int, ...] | None = None) -> None:
        self.value = value
        self.shape = tuple(value.shape) if shape is None else shape
        self.owner = _local.current if type(value) is _engine.Tensor else None

    def set(self, value: Value, shape: tuple[int, ...] | None = None) -> None:
        self.value = value
        self.shape = tuple(value.shape) if shape is None else shape
        self.owner = _local.current if type(value) is _engine.Tensor else None


class Handle:
    __slots__ = ("root", "spec")

    def __init__(self, root: Root, spec: Spec | None) -> None:
        self.root = root
        self.spec = spec


def handle(t: torch.Tensor) -> Handle:
    h = getattr(t.untyped_storage(), _ATTR, None)
    if h is None:
        raise RuntimeError(
            f"deferfuse: this tpu tensor (shape {tuple(t.shape)}, dtype {t.dtype}) has no value; "
            "it was not made by deferfuse"
        )
    return h


def new_tensor(
    value: Value, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A fresh `tpu` tensor owning `value`."""
    shape = tuple(value.shape)
    t = _create(shape, TO_TORCH[value.dtype] if type(value) is _engine.Tensor else value.dtype)
    setattr(t.untyped_storage(), _ATTR, Handle(Root(value, shape), None))
    return t


def new_view(base: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """A `tpu` tensor aliasing `base`'s root, laid out like the meta tensor."""
    h = handle(base)
    t = _create(tuple(meta.shape), base.dtype)
    spec = (tuple(meta.shape), tuple(meta.stride()), meta.storage_offset())
    root_shape = _root_shape(h.root)
    if spec == (root_shape, _contiguous_strides(root_shape), 0):
        spec = None  # the whole root, as it is
    setattr(t.untyped_storage(), _ATTR, Handle(h.root, spec))
    return t


def _root_shape(root: Root) -> tuple[int, ...]:
    return root.shape


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def meta_of(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s true layout over its root, for view arithmetic."""
    h = handle(t)
    root_shape = _root_shape(h.root)
    base = torch.empty(root_shape, dtype=t.dtype, device="meta")
    spec = _spec(t, h, root_shape)
    return base if spec is None else base.as_strided(*spec)


def _current(root: Root) -> Value:
    """The root's value, moved into the current mode's context if needed."""
    eng = _state.engine()
    if type(root.value) is _engine.Tensor and root.owner is not eng:
        root.set(eng.adopt(root.value), root.shape)
    return root.value


def _spec(t: torch.Tensor, h: Handle, root_shape: tuple[int, ...]) -> Spec | None:
    """`t`'s layout over its root: the handle's, or, for an alias that PyTorch
    made in C++ over the same storage (e.g. `_unsafe_view`), `t`'s own."""
    if h.spec is None:
        if tuple(t.shape) == root_shape:
            return None
        return (tuple(t.shape), tuple(t.stride()), t.storage_offset())
    if tuple(t.shape) != h.spec[0]:
        raise RuntimeError(
            f"deferfuse: a tensor of shape {tuple(t.shape)} aliases a view of shape {h.spec[0]}; "
            "this layout is not modelled"
        )
    return h.spec


def read(t: torch.Tensor, h: Handle | None = None) -> Value:
    """The value of `t`: an engine tensor of `t`'s shape, or a CPU tensor."""
    if h is None:
        h = handle(t)
    root = h.root
    if h.spec is None and root.owner is _local.current and t.shape == root.shape:
        return root.value  # the hot path: a whole root in the current mode
    v = _current(root)
    spec = _spec(t, h, root.shape)
    if spec is None:
        return v
    v = _grow(h.root, v, spec)
    if isinstance(v, torch.Tensor):
        return v.as_strided(*spec)
    return _views.read(v, spec)


def write(t: torch.Tensor, value: Value) -> None:
    """Makes `value` (of `t`'s shape) the new value of `t`, and so of its root."""
    h = handle(t)
    if isinstance(value, _engine.Tensor):
        want = TO_ENGINE.get(t.dtype)
        if want is None:
            value = to_cpu_value(value).to(t.dtype)
        elif value.dtype != want:
            value = value.cast(want)
    else:
        value = value.to(t.dtype)
    old = _current(h.root)
    spec = _spec(t, h, h.root.shape)
    if spec is not None:
        old = _grow(h.root, old, spec)
    if isinstance(old, torch.Tensor):
        v = value if isinstance(value, torch.Tensor) else to_cpu_value(value)
        if spec is None:
            h.root.set(v.clone().reshape(old.shape))
        else:
            new_root = old.clone()
            new_root.as_strided(*spec).copy_(v)
            h.root.set(new_root)
        return
    if isinstance(value, torch.Tensor):
        value = from_cpu_value(value)
    if spec is None:
        h.root.set(value, tuple(t.shape))
    else:
        h.root.set(_views.write(old, spec, value), h.root.shape)


def _extent(spec: Spec) -> int:
    """Elements of the root a layout reaches (0 for an empty view)."""
    sizes, strides, offset = spec
    if any(n == 0 for n in sizes):
        return 0
    return offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1


def _grow(root: Root, value: Value, spec: Spec) -> Value:
    """PyTorch's composite kernels sometimes resize a tensor in C++ (e.g. the
    empty output of `slice_scatter`), past what its root holds: the root then
    grows, flattened, with zeros (PyTorch's new memory is uninitialized)."""
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
