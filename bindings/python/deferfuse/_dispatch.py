"""Routing aten ops on `tpu` tensors: engine lowerings, views, in-place and
`out=` variants, `_foreach_*` lists, copies to and from the CPU, and the CPU
fallback for everything else."""

from __future__ import annotations

import collections
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from . import _engine, _fused_optim, _grad_scaler, _handles, _native, _rnn, _state
from . import lowerings as _lowerings
from ._engine import Tensor as ET
from ._handles import from_cpu, is_tpu, new_tensor, read, to_cpu, to_cpu_value, write
from .lowerings import LOWERINGS, Unsupported

aten = torch.ops.aten

# Identity and copy ops that PyTorch's own composite kernels handle (they end in
# `empty` and `_copy_from`, which are ours).
LEFT_TO_TORCH = {
    "_to_copy",
    "detach",
    "alias",
    "lift_fresh",
    "copy_",
    "to",
    "contiguous",
    "_copy_from",
    "_copy_from_and_resize",
    "_local_scalar_dense",
    "resize_",
    "set_",
    "_has_compatible_shallow_copy_type",
}

_libs: list[torch.library.Library] = []


_stored_root = _handles.stored_root
_whole_value = _handles.whole_value
_local = _state.local


def _unwrap(x: Any) -> Any:
    """A `tpu` tensor becomes its value; a CPU zero-dimensional tensor (how
    PyTorch passes `x + 1.0`'s scalar) a number."""
    if not isinstance(x, torch.Tensor):
        if type(x) is list or type(x) is tuple:
            return type(x)(_unwrap(v) for v in x)
        return x
    v = _whole_value(x, _local.current)
    if v is not None:
        return v  # the hot path: a whole root in the current mode (checked in C++)
    root = _stored_root(x)
    if root is None:
        if x.is_cpu:
            if x.dim() == 0:
                return x.item()
            raise Unsupported("a CPU tensor with dimensions among the operands")
        root = _handles.root_of(x)
    v = read(x, root)
    if isinstance(v, torch.Tensor):
        raise Unsupported(f"dtype {x.dtype} is kept on the CPU")
    return v


def _wrap(v: Any) -> Any:
    if isinstance(v, ET):
        return new_tensor(v)
    if isinstance(v, (tuple, list)):
        return type(v)(_wrap(x) for x in v)
    return v


def _map_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return tuple(map(_unwrap, args)), ({k: _unwrap(v) for k, v in kwargs.items()} if kwargs else kwargs)


# ---- devices -------------------------------------------------------------------

#: PyTorch's error for a CPU tensor among a device op's operands (CUDA's wording).
MIXED_DEVICES = (
    "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"
)

#: Ops whose `indices` may be CPU tensors beside a `tpu` tensor, as on CUDA
#: (`x[torch.tensor([0, 2])]`): PyTorch moves them to the device itself.
_CPU_INDICES_OK = frozenset(
    {
        "aten::index.Tensor",
        "aten::index.Tensor_out",
        "aten::index_put",
        "aten::index_put_",
        "aten::_index_put_impl_",
        "aten::_unsafe_index.Tensor",
        "aten::_unsafe_index_put",
    }
)


def _has_cpu_tensor(x: Any) -> bool:
    """A CPU tensor with dimensions (zero-dimensional ones are scalars)."""
    if isinstance(x, (list, tuple)):
        return any(_has_cpu_tensor(v) for v in x)
    return isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() != 0


def _has_tpu_tensor(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_has_tpu_tensor(v) for v in x)
    return is_tpu(x)


def check_devices(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
    """Raises PyTorch's error when CPU tensors with dimensions meet `tpu`
    tensors, as CUDA does, instead of computing on the CPU. Runs where an op
    leaves the engine (the fallback), so the hot path pays nothing."""
    names = [a.name for a in op._schema.arguments]
    skip = "indices" if op.name() in _CPU_INDICES_OK else None
    named = [(names[i] if i < len(names) else None, v) for i, v in enumerate(args)]
    named.extend(kwargs.items())
    values = [v for n, v in named if n != skip]
    if any(_has_cpu_tensor(v) for v in values) and any(_has_tpu_tensor(v) for v in (*args, *kwargs.values())):
        raise RuntimeError(MIXED_DEVICES)


# ---- the CPU fallback ----------------------------------------------------------


#: Arguments that ops write although their schemas do not say so.
_UNDECLARED_WRITES = {"aten::native_batch_norm": ("running_mean", "running_var")}


def _mutated_args(
    op: torch._ops.OpOverload, args: tuple, kwargs: dict
) -> list[tuple[torch.Tensor, int | str, int | None]]:
    """The `tpu` tensors the op writes to: (tensor, position or name, index
    in the list for list arguments such as `_amp_foreach_*`'s `Tensor(a!)[]`)."""
    out = []
    undeclared = _UNDECLARED_WRITES.get(op.name(), ())
    for i, a in enumerate(op._schema.arguments):
        if (a.alias_info is None or not a.alias_info.is_write) and a.name not in undeclared:
            continue
        positional = i < len(args) and not a.kwarg_only
        value = args[i] if positional else kwargs.get(a.name)
        where = i if positional else a.name
        if isinstance(value, (list, tuple)):
            out.extend((t, where, j) for j, t in enumerate(value) if is_tpu(t))
        elif is_tpu(value):
            out.append((value, where, None))
    return out


def cpu_fallback(
    op: torch._ops.OpOverload, *args: Any, why: str = "no engine lowering yet", **kwargs: Any
) -> Any:
    name = op.name()
    check_devices(op, args, kwargs)
    _state.count_fallback(name, why)

    def to_cpu_arg(x: Any) -> Any:
        if is_tpu(x):
            return to_cpu(x)
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("cpu")
        return x

    cpu_args = tree_map(to_cpu_arg, args)
    cpu_kwargs = tree_map(to_cpu_arg, kwargs)
    if (
        "device" in cpu_kwargs
        and cpu_kwargs["device"] is not None
        and str(cpu_kwargs["device"]).startswith("tpu")
    ):
        cpu_kwargs["device"] = torch.device("cpu")
    result = op(*cpu_args, **cpu_kwargs)
    mutated = _mutated_args(op, args, kwargs)

    def cpu_value(where: int | str, index: int | None) -> Any:
        value = cpu_args[where] if isinstance(where, int) else cpu_kwargs[where]
        return value if index is None else value[index]

    for original, where, index in mutated:
        _store(original, cpu_value(where, index))
    returns = op._schema.returns
    mutated_ids = {id(cpu_value(w, j)): t for t, w, j in mutated}

    def back(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) in mutated_ids:
                return mutated_ids[id(x)]
            return from_cpu(x)
        return x

    if len(returns) == 0:
        return None
    return tree_map(back, result)


def _store(t: torch.Tensor, value: torch.Tensor) -> None:
    """Writes a CPU value into a `tpu` tensor, resizing it when the op did."""
    if tuple(value.shape) != tuple(t.shape):
        _resize(t, tuple(value.shape))
    write(t, _handles.from_cpu_value(value) if value.dtype in _handles.TO_ENGINE else value)


def _resize(t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Resizes `t` as an `out=` argument is resized: in place, over its own
    storage (grown by the C++ `resize_` when needed)."""
    if t.requires_grad:
        # resize_ refuses tensors that require grad; the op writing into
        # `t` replaces its value anyway.
        fresh = torch.empty(shape, dtype=t.dtype, device=t.device)
        with torch.no_grad():
            t.data = fresh
        return
    t.resize_(shape)


# ---- kernels -----------------------------------------------------------------


def _lower(name: str, lowering: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Runs an aten op's lowering on its `tpu` operands' values. In Strict
    the primitives that read the operands (a view's transpose or slice) and
    those of the lowering are one op group: recorded together and run as one
    program, as PyTorch runs one kernel per aten op, so `a @ w.t()` reads
    `w` in place instead of copying its transpose first."""
    if _state.local.mode != "strict":
        a, k = _map_args(args, kwargs)
        return lowering(*a, **k)
    eng = _state.engine()
    eng.begin_group(name)
    try:
        a, k = _map_args(args, kwargs)
        out = lowering(*a, **k)
        del a, k  # the operands' views are not outputs of the group's program
        return out
    finally:
        eng.end_group()


def _uploaded_indices(args: tuple) -> tuple:
    """`args` of an op of `_CPU_INDICES_OK` with its CPU index tensors (the
    second argument, a list) uploaded, as PyTorch does on CUDA."""
    if len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return args
    indices = [from_cpu(i) if isinstance(i, torch.Tensor) and i.is_cpu else i for i in args[1]]
    return (args[0], indices, *args[2:])


def functional_kernel(op: torch._ops.OpOverload, lowering: Callable[..., Any]) -> Callable[..., Any]:
    name = op.name()
    upload = name in _CPU_INDICES_OK

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            return _wrap(_lower(name, lowering, _uploaded_indices(args) if upload else args, kwargs))
        except Unsupported as e:
            return cpu_fallback(op, *args, why=f"not lowered for these arguments: {e}", **kwargs)

    return kernel


def _check_cast(op: str, value: ET, target: torch.dtype) -> None:
    src = _handles.TO_TORCH[value.dtype]
    if not torch.can_cast(src, target):
        raise RuntimeError(f"{op}: result type {src} can't be cast to the desired output type {target}")


def inplace_kernel(op: torch._ops.OpOverload, lowering: Callable[..., Any]) -> Callable[..., Any]:
    """`x.foo_(...)`: the functional lowering, written back into `x`."""
    name = op.name()
    upload = name in _CPU_INDICES_OK

    def kernel(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            full = (self,) + args
            value = _lower(name, lowering, _uploaded_indices(full) if upload else full, kwargs)
            if not isinstance(value, ET):
                raise Unsupported("non-tensor result")
        except Unsupported as e:
            return cpu_fallback(op, self, *args, why=f"not lowered for these arguments: {e}", **kwargs)
        if tuple(value.shape) != tuple(self.shape):
            if value.shape and _broadcastable(tuple(value.shape), tuple(self.shape)):
                value = value.expand(list(self.shape))
            else:
                raise RuntimeError(
                    f"{name}: output with shape {list(self.shape)} doesn't match the broadcast shape {list(value.shape)}"
                )
        _check_cast(name, value, self.dtype)
        write(self, value)
        return self

    return kernel


def _broadcastable(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    if len(src) > len(dst):
        return False
    return all(s == d or s == 1 for s, d in zip(src[::-1], dst[::-1]))


def out_kernel(
    op: torch._ops.OpOverload, lowering: Callable[..., Any], out_names: list[str]
) -> Callable[..., Any]:
    """`foo(..., out=o)`: the functional lowering, written into `o`."""
    name = op.name()

    def kernel(*args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(n) for n in out_names]
        if not all(is_tpu(o) for o in outs):
            kwargs.update(zip(out_names, outs))
            return cpu_fallback(op, *args, **kwargs)
        try:
            values = _lower(name, lowering, args, kwargs)
        except Unsupported:
            kwargs.update(zip(out_names, outs))
            return cpu_fallback(op, *args, **kwargs)
        values = values if isinstance(values, (tuple, list)) else (values,)
        for o, v in zip(outs, values):
            _check_cast(name, v, o.dtype)
            if tuple(o.shape) != tuple(v.shape):
                _resize(o, tuple(v.shape))
            write(o, v)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


def foreach_kernel(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """`_foreach_foo(lists...)`: `foo` on each element, through the dispatcher."""
    base = op._schema.name.split("::")[1][len("_foreach_") :]
    inplace = base.endswith("_")
    # `_foreach_maximum_` has no `maximum_`: the functional op, copied into self.
    copied = inplace and not hasattr(aten, base)
    single = getattr(aten, base[:-1] if copied else base)
    # `_foreach_maximum(xs, 0.5)` is `clamp_min`: `maximum` takes tensors only.
    by_number = {"maximum": aten.clamp_min, "minimum": aten.clamp_max}.get(base.rstrip("_"))
    # Foreach ops pass some scalars positionally that `foo` takes by keyword
    # (`_foreach_addcmul_(..., value)` vs `addcmul_(..., *, value)`).
    schema = getattr(single, single.overloads()[0])._schema
    positional = sum(1 for a in schema.arguments if not a.kwarg_only)
    keyword = [a.name for a in schema.arguments if a.kwarg_only]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        results = []
        for i in range(n):
            item = [a[i] if isinstance(a, (list, tuple)) and len(a) == n else a for a in args]
            extra = dict(zip(keyword, item[positional:]))
            fn = by_number if by_number is not None and not isinstance(item[1], torch.Tensor) else single
            result = fn(*item[:positional], **extra, **kwargs)
            if copied:
                item[0].copy_(result)
            results.append(result)
        return None if inplace else results

    return kernel


def with_fallback(lowering: Callable[..., Any], fallback: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            a, k = _map_args(args, kwargs)
            return _wrap(lowering(*a, **k))
        except Unsupported:
            return fallback(*args, **kwargs)

    return kernel


def cpu_twin(
    op: torch._ops.OpOverload,
    cpu_op: torch._ops.OpOverload,
    arguments: Callable[..., tuple] = lambda *args: args,
) -> Callable[..., Any]:
    """Ops PyTorch routes to an `*_overrideable` hook on other devices run
    their CPU twin (convolution for convolution_overrideable), with the
    twin's positional `arguments` made from the hook's."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        check_devices(op, args, kwargs)
        _state.count_fallback(op.name(), "not lowered for these arguments")
        cpu_args = tree_map(lambda x: to_cpu(x) if is_tpu(x) else x, arguments(*args))
        result = cpu_op(*cpu_args, **kwargs)
        return tree_map(lambda x: from_cpu(x) if isinstance(x, torch.Tensor) else x, result)

    return kernel


def _convolution_backward_arguments(
    grad_output: Any,
    input: Any,
    weight: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Any,
) -> tuple:
    """`convolution_backward`'s arguments from the overrideable hook's: it
    also takes the bias's size (the output channels), after the weight."""
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    return (
        grad_output,
        input,
        weight,
        [channels],
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        output_mask,
    )


def scatter_kernel(view: torch._ops.OpOverload) -> Callable[..., Any]:
    """`slice_scatter` and friends: a clone of `self` with `src` written
    through the view. (PyTorch's own kernels clone through the storage's byte
    size, which our storage-less tensors do not have.)"""

    def kernel(self: torch.Tensor, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _has_cpu_tensor(src):  # `copy_` below would take it
            raise RuntimeError(MIXED_DEVICES)
        out = aten.clone.default(self)
        view(out, *args, **kwargs).copy_(src)
        return out

    return kernel


# ---- PyTorch's own decompositions ------------------------------------------------

#: Ops without a lowering that run as PyTorch's own decomposition
#: (`torch._decomp.decomposition_table`) over `tpu` tensors: each op of the
#: decomposition then takes its own path (a lowering, a view, ...). Only ops
#: whose decompositions were measured to lower completely on the OpInfo samples
#: are listed (see bindings/conformance/opinfo.py); the others would trade one
#: CPU fallback for several. `TORCH_TPU_DECOMPOSE=all` (a developer knob, read
#: at import) tries every decomposition, to find new ones.
DECOMPOSED: frozenset[str] = frozenset(
    {
        "aten::_prelu_kernel",
        "aten::aminmax",
        "aten::channel_shuffle",
        "aten::clamp_max.Tensor",
        "aten::clamp_min.Tensor",
        "aten::clamp_min_.Tensor",
        "aten::count_nonzero.dim_IntList",
        "aten::cumprod",
        "aten::floor_divide",
        "aten::glu",
        "aten::hardshrink",
        "aten::heaviside",
        "aten::huber_loss",
        "aten::isin.Tensor_Tensor",
        "aten::log_sigmoid_forward",
        "aten::logaddexp",
        "aten::logaddexp2",
        "aten::mish",
        "aten::mse_loss",
        "aten::mse_loss_backward",
        "aten::multi_margin_loss",
        "aten::multilabel_margin_loss_forward",
        "aten::nan_to_num.out",
        "aten::nansum",
        "aten::narrow_copy",
        "aten::native_batch_norm",
        "aten::native_batch_norm_backward",
        "aten::_weight_norm_interface",
        "aten::native_dropout_backward",
        "aten::norm.ScalarOpt_dim",
        "aten::pixel_shuffle",
        "aten::pixel_unshuffle",
        "aten::renorm",
        "aten::sinc",
        "aten::smooth_l1_loss",
        "aten::softshrink",
        "aten::special_entr",
        "aten::special_xlog1py",
        "aten::trace",
        "aten::vdot",
        "aten::xlogy.Tensor",
    }
)

_decomposing: set[str] = set()


def _engine_operands(args: Any, kwargs: dict) -> bool:
    """Every tensor is on `tpu` with an engine dtype (or a CPU scalar), and no
    dtype argument asks for one the engine lacks."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            if not _engine_operands(x, {}):
                return False
        elif isinstance(x, torch.Tensor):
            if x.dtype not in _handles.TO_ENGINE or (x.device.type != "tpu" and x.dim() != 0):
                return False
        elif isinstance(x, torch.dtype) and x not in _handles.TO_ENGINE:
            return False
    return True


def decomposed_kernel(op: torch._ops.OpOverload, decomposition: Callable[..., Any]) -> Callable[..., Any]:
    name = op.name()
    mutable = op._schema.is_mutable

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if name in _decomposing:
            return cpu_fallback(op, *args, why="its decomposition calls the op itself", **kwargs)
        if not _engine_operands(args, kwargs):
            return cpu_fallback(op, *args, why="its decomposition needs dtypes the engine lacks", **kwargs)
        _decomposing.add(name)
        try:
            return decomposition(*args, **kwargs)
        except Exception:
            if mutable:
                raise
            # A functional op: nothing was written, so the CPU can run it
            # (and raise PyTorch's own error if the arguments are wrong).
            return cpu_fallback(op, *args, why="its decomposition failed for these arguments", **kwargs)
        finally:
            _decomposing.discard(name)

    return kernel


def _decompositions() -> dict[str, Callable[..., Any]]:
    from torch._decomp import decomposition_table

    # TORCH_TPU_DECOMPOSE, parsed (and validated) by the engine.
    every = _state.config()["decompose"] == "all"
    return {
        op.name(): fn
        for op, fn in decomposition_table.items()
        if isinstance(op, torch._ops.OpOverload) and (every or op.name() in DECOMPOSED)
    }


# ---- copies, items, empties -------------------------------------------------


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if is_tpu(dst) and is_tpu(src):
        value = read(src)
        if isinstance(value, ET) and dst.dtype in _handles.TO_ENGINE:
            value = value.cast(_handles.TO_ENGINE[dst.dtype])
        else:
            value = to_cpu_value(value).to(dst.dtype)
    elif is_tpu(dst):
        value = _upload(src, dst.dtype, non_blocking)
    else:
        cpu = to_cpu(src)
        with torch.no_grad():
            dst.copy_(cpu)
        return dst
    if tuple(value.shape) != tuple(dst.shape):
        value = value.expand(list(dst.shape)) if isinstance(value, ET) else value.expand(dst.shape)
    write(dst, value)
    return dst


def _upload(src: torch.Tensor, dtype: torch.dtype, non_blocking: bool) -> Any:
    """The engine value of the CPU tensor `src` as `dtype`. A non-blocking
    copy of pinned memory returns at once and copies on the context's stream,
    as on CUDA, where the source must not change until the copy is done."""
    engine_dtype = _handles.TO_ENGINE.get(dtype)
    if non_blocking and src.dtype == dtype and engine_dtype and src.is_contiguous() and src.is_pinned():
        return _state.engine().tensor_from_pinned(src, src.data_ptr(), list(src.shape), engine_dtype)
    return _handles.from_cpu_value(src.to(dtype))


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        if is_tpu(dst):
            _resize(dst, tuple(src.shape))
        else:
            dst.resize_(src.shape)
    return copy_from(src, dst)


def local_scalar_dense(self: torch.Tensor) -> Any:
    return to_cpu(self).item()


def compatible_shallow_copy_type(self: torch.Tensor, from_: torch.Tensor) -> bool:
    """Both are plain strided tensors (the same C++ TensorImpl), so `.data =`
    may move one between the CPU and `tpu`. `Module.to("tpu")` then keeps
    each Parameter object, and with it weight tying."""
    return (
        self.layout == torch.strided
        and from_.layout == torch.strided
        and not self.is_quantized
        and not from_.is_quantized
        and not self.is_nested
        and not from_.is_nested
    )


# ---- registration ---------------------------------------------------------------


def _has_kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:  # no such overload
        return False


def _is_view(op: torch._ops.OpOverload) -> bool:
    returns = op._schema.returns
    if not returns or op._schema.name.split("::")[1].endswith("_"):
        return False
    info = returns[0].alias_info
    if info is None or info.is_write:
        return False
    first = op._schema.arguments[0] if op._schema.arguments else None
    return first is not None and first.alias_info is not None and str(first.type) == "Tensor"


def _inplace_view_twin(packet_name: str, overload: str) -> torch._ops.OpOverload | None:
    """The view op `foo` of an in-place view op `foo_` (squeeze_, t_, ...)."""
    if not packet_name.endswith("_") or packet_name.startswith("_foreach"):
        return None
    packet = getattr(aten, packet_name[:-1], None)
    if packet is None or overload not in packet.overloads():
        return None
    view = getattr(packet, overload)
    return view if _is_view(view) else None


def _functional_twin(op: torch._ops.OpOverload) -> str | None:
    """The lowering name of an in-place (`foo_.X` → `foo.X`) or `out=` overload."""
    schema = op._schema
    base = schema.name.split("::")[1]
    overload = schema.overload_name
    if base.endswith("_") and not base.startswith("_"):
        twin = f"{base[:-1]}.{overload or 'default'}"
        return twin if twin in LOWERINGS else None
    out_args = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if not out_args or base.endswith("_"):
        return None
    want = [(a.name, str(a.type)) for a in schema.arguments if a.name not in out_args]
    packet = getattr(aten, base, None)
    if packet is None:
        return None
    for name in packet.overloads():
        other = getattr(packet, name)._schema
        if other.is_mutable:
            continue
        if [(a.name, str(a.type)) for a in other.arguments] == want:
            key = f"{base}.{name}"
            return key if key in LOWERINGS else None
    return None


def register() -> None:
    lib = torch.library.Library("aten", "IMPL")
    fallback_lib = torch.library.Library("_", "IMPL")
    _libs.extend([lib, fallback_lib])

    done: set[str] = set()
    decompositions = _decompositions()
    # Ops with a C++ kernel that runs them in the engine without Python
    # (bindings/src/native/ops.rs); their Python kernels below become what
    # that kernel runs for arguments it does not cover.
    native = {name: i for i, name in enumerate(_engine.native_ops())}
    python_kernels: dict[str, Callable[..., Any]] = {}

    def impl(name: str, fn: Callable[..., Any], how: str) -> None:
        key = name if "." in name else f"{name}.default"
        if key in native:
            python_kernels[key] = fn
        else:
            lib.impl(_short(name), fn, "PrivateUse1")
        ROUTES[key] = how
        done.add(name)

    impl("_copy_from", copy_from, "binding: _dispatch.copy_from")
    impl("_copy_from_and_resize", copy_from_and_resize, "binding: _dispatch.copy_from_and_resize")
    impl("_local_scalar_dense", local_scalar_dense, "binding: reads the value back")
    impl("_has_compatible_shallow_copy_type", compatible_shallow_copy_type, "binding: metadata")
    impl(
        "_amp_foreach_non_finite_check_and_unscale_",
        _grad_scaler.non_finite_check_and_unscale_,
        "binding: _grad_scaler.non_finite_check_and_unscale_ (engine ops)",
    )
    impl("_amp_update_scale_", _grad_scaler.update_scale_, "binding: _grad_scaler.update_scale_ (engine ops)")
    for name, step in (("_fused_adam_", _fused_optim.adam_), ("_fused_adamw_", _fused_optim.adamw_)):
        for overload in (name, f"{name}.tensor_lr"):
            impl(overload, step, f"binding: _fused_optim.{step.__name__} (engine ops)")
    for overload in ("_fused_sgd_", "_fused_sgd_.tensor_lr"):
        impl(overload, _fused_optim.sgd_, "binding: _fused_optim.sgd_ (engine ops)")
    # What `index_put_` and the backward of indexing call: `index_put`'s
    # lowering, in place (`unsafe` only skips checks the lowering makes anyway).
    impl(
        "_index_put_impl_",
        inplace_kernel(
            aten._index_put_impl_.default,
            lambda self, indices, values, accumulate=False, unsafe=False: LOWERINGS["index_put.default"](
                self, indices, values, accumulate
            ),
        ),
        f"in place: `index_put.default` ({_where(LOWERINGS['index_put.default'])})",
    )
    for scatter, view in (
        ("slice_scatter", aten.slice.Tensor),
        ("select_scatter", aten.select.int),
        ("diagonal_scatter", aten.diagonal.default),
        ("as_strided_scatter", aten.as_strided.default),
    ):
        impl(scatter, scatter_kernel(view), f"a clone written through `{view.name()}`")
    impl(
        "convolution_overrideable",
        with_fallback(
            _lowerings.convolution, cpu_twin(aten.convolution_overrideable.default, aten.convolution.default)
        ),
        f"lowering {_where(_lowerings.convolution)} (the CPU's convolution for other arguments)",
    )
    impl(
        "convolution_backward_overrideable",
        with_fallback(
            _lowerings.convolution_backward,
            cpu_twin(
                aten.convolution_backward_overrideable.default,
                aten.convolution_backward.default,
                _convolution_backward_arguments,
            ),
        ),
        f"lowering {_where(_lowerings.convolution_backward)} (the CPU's convolution_backward for other arguments)",
    )
    # Above autograd too: autograd then differentiates the cell's ops, since
    # the fused cells' backward ops have no kernel outside CUDA either.
    for name, cell in _rnn.CELLS.items():
        impl(name, cell, "binding: _rnn (the CPU's cell in torch ops, differentiated by autograd)")
        lib.impl(name, cell, "AutogradPrivateUse1")
    for name, lowering in LOWERINGS.items():
        packet, _, overload = name.partition(".")
        try:
            op = getattr(getattr(aten, packet), overload)
        except AttributeError:
            continue  # a generic table entry (e.g. `maximum.Tensor`) that this op lacks
        if (
            not _has_kernel(op.name(), "CompositeImplicitAutograd")
            and not _has_kernel(op.name(), "CPU")
            and not _has_kernel(op.name(), "CompositeExplicitAutograd")
        ):
            continue  # no such overload
        if _has_kernel(op.name(), "CompositeImplicitAutograd"):
            # A backend kernel would replace the decomposition that autograd differentiates.
            continue
        if _has_kernel(op.name(), "PrivateUse1"):
            continue  # the C++ layer's kernel (views, empty, resize_)
        impl(name, functional_kernel(op, lowering), f"lowering {_where(lowering)}")

    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        full = qualified[len("aten::") :]
        packet_name, _, overload = full.partition(".")
        key = f"{packet_name}.{overload or 'default'}"
        if key in done or packet_name in LEFT_TO_TORCH:
            continue
        packet = getattr(aten, packet_name, None)
        if packet is None:
            continue
        try:
            op = getattr(packet, overload or "default")
        except AttributeError:
            continue
        if _has_kernel(qualified, "CompositeImplicitAutograd") or _has_kernel(qualified, "PrivateUse1"):
            continue  # a decomposition, or a kernel of the C++ layer
        if _is_view(op) or _inplace_view_twin(packet_name, overload or "default") is not None:
            # Views are metadata: PyTorch's composite kernels over the C++
            # layer's as_strided/view (sizes, strides and offsets as on CPU).
            continue
        if packet_name.startswith("_foreach_"):
            single = packet_name[len("_foreach_") :]
            exists = hasattr(aten, single) or (single.endswith("_") and hasattr(aten, single[:-1]))
            if exists and not overload.startswith("out") and "out" not in overload:
                impl(key, foreach_kernel(op), f"each element through `aten::{single}`")
                continue
        twin = _functional_twin(op)
        if twin is not None:
            base = packet_name
            how = f"`{twin}` ({_where(LOWERINGS[twin])})"
            if base.endswith("_"):
                impl(key, inplace_kernel(op, LOWERINGS[twin]), f"in place: {how}")
            else:
                outs = [
                    a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write
                ]
                impl(key, out_kernel(op, LOWERINGS[twin], outs), f"out=: {how}")
            continue
        # No decomposition in C++: PyTorch's Python decomposition where it
        # lowers, else run on the CPU explicitly (the catch-all fallback below
        # would let composite kernels call `.out` variants on zero-size
        # outputs instead).
        if qualified in decompositions and not _has_kernel(qualified, "CompositeExplicitAutograd"):
            impl(key, decomposed_kernel(op, decompositions[qualified]), "PyTorch's decomposition")
            continue
        if _has_kernel(qualified, "CPU") and not _has_kernel(qualified, "CompositeExplicitAutograd"):
            impl(key, (lambda o: lambda *a, **k: cpu_fallback(o, *a, **k))(op), "CPU fallback")

    _install_native(native, python_kernels)
    fallback_lib.fallback(lambda op, *a, **k: cpu_fallback(op, *a, **k), "PrivateUse1")


#: Where each aten op registered for `tpu` runs (`bindings/conformance/routes.py`
#: writes it to docs/lowerings.md): `C++` for the native kernels, with the
#: Python route they take for other arguments.
ROUTES: dict[str, str] = {}


def _where(fn: Callable[..., Any]) -> str:
    """`elementwise.add` for a lowering of `deferfuse.lowerings.elementwise`
    (the enclosing function for a closure, the module for a lambda)."""
    module = fn.__module__.rpartition(".")[2]
    name = fn.__qualname__.split(".<locals>")[0]
    return module if name == "<lambda>" else f"{module}.{name}"


def _short(name: str) -> str:
    """`neg.default` as the dispatcher registers it: `neg`."""
    return name[: -len(".default")] if name.endswith(".default") else name


#: How many times a natively lowered op ran its Python kernel instead (for
#: arguments the native lowering leaves to Python), by op.
python_path_counts: collections.Counter[str] = collections.Counter()


def _counted(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        python_path_counts[name] += 1
        return kernel(*args, **kwargs)

    return run


def _install_native(native: dict[str, int], python_kernels: dict[str, Callable[..., Any]]) -> None:
    """Registers the C++ kernels of the natively lowered ops, each with its
    Python kernel (or the CPU fallback) for the arguments it leaves to Python."""
    ops = []
    for name, index in native.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is None or _has_kernel(op.name(), "CompositeImplicitAutograd"):
            continue  # not in this torch, or a decomposition autograd differentiates
        kernel = python_kernels.get(name) or (lambda o: lambda *a, **k: cpu_fallback(o, *a, **k))(op)
        ops.append((_short(name), index, _counted(name, kernel)))
        ROUTES[name] = f"C++; else {ROUTES.get(name, 'CPU fallback')}"
    _native.bridge().install_native(ops)
