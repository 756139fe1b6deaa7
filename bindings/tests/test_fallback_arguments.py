"""The CPU fallback's argument passing, over OpInfo samples.

Every aten call that an OpInfo sample makes on the CPU, where the op's
schema has an optional, list or fixed-size (`bool[3]`) argument, is replayed
through `_dispatch.cpu_fallback` with `tpu` tensors: the results, and every
argument the op writes, must equal CPU's. Such arguments are where a
fallback that passes arguments along goes wrong (a `None` dropped, a list
of optional tensors moved, a keyword made positional).

Tolerance: none. The fallback runs PyTorch's own CPU kernel on the same
values, so the bits must match (NaN where CPU has NaN).
"""

from __future__ import annotations

import functools

import pytest
import torch
from deferfuse import _dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

#: Samples per OpInfo, and calls kept per aten overload.
SAMPLES, CALLS = 2, 2
#: Ops whose values are random or uninitialized (`empty`, and CTC's
#: workspace of log-alphas past each target's end).
SKIP = (
    "rand",
    "normal",
    "bernoulli",
    "dropout",
    "multinomial",
    "uniform",
    "exponential",
    "cauchy",
    "geometric",
    "rrelu",
    "empty",
    "ctc_loss",
)


def _awkward(op: torch._ops.OpOverload) -> bool:
    """The schema has an optional, list or fixed-size argument."""
    return any(
        "?" in str(a.type) or "[" in str(a.type) or "List" in str(a.type) for a in op._schema.arguments
    )


def _copy(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


class _Recorder(TorchDispatchMode):
    def __init__(self, calls: dict) -> None:
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if (
            name.startswith("aten::")
            and _awkward(func)
            and not any(s in name for s in SKIP)
            and len(self.calls.setdefault(name, [])) < CALLS
        ):
            self.calls[name].append((func, tree_map(_copy, args), tree_map(_copy, kwargs)))
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def _recorded() -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    calls: dict = {}
    for info in op_db:
        if not info.supports_dtype(torch.float32, "cpu") or any(s in info.name for s in SKIP):
            continue
        try:
            samples = list(info.sample_inputs("cpu", torch.float32))[:SAMPLES]
        except Exception:
            continue
        for sample in samples:
            try:
                with _Recorder(calls):
                    info.op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                continue
    return [call for name in sorted(calls) for call in calls[name]]


def _plain(x) -> bool:
    """A dense tensor of a dtype the fallback moves (not sparse, quantized, ...)."""
    return isinstance(x, torch.Tensor) and x.layout == torch.strided and not x.is_quantized


def _to_tpu(x):
    return x.to("tpu") if _plain(x) else x


def _same(got, want) -> bool:
    got_leaves, _ = tree_flatten(got)
    want_leaves, _ = tree_flatten(want)
    if len(got_leaves) != len(want_leaves):
        return False
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
                return False
            if not torch.equal(g.cpu(), w) and not (
                w.is_floating_point()
                and torch.equal(g.cpu().isnan(), w.isnan())
                and torch.equal(g.cpu().nan_to_num(), w.nan_to_num())
            ):
                return False
        elif g != w:
            return False
    return True


def test_the_fallback_passes_optional_list_and_fixed_size_arguments_as_cpu(mode):
    calls = _recorded()
    assert len(calls) >= 100, len(calls)
    wrong = {}
    for func, args, kwargs in calls:
        leaves, _ = tree_flatten((args, kwargs))
        if any(isinstance(x, torch.Tensor) and not _plain(x) for x in leaves):
            continue  # sparse or quantized: not a tpu tensor
        cpu_args, cpu_kwargs = tree_map(_copy, args), tree_map(_copy, kwargs)
        try:
            want = func(*cpu_args, **cpu_kwargs)
        except Exception:
            continue  # the sample's call only runs inside its composite
        if any(isinstance(x, torch.Tensor) and not _plain(x) for x in tree_flatten(want)[0]):
            continue  # a sparse result: no tpu tensor holds one
        tpu_args, tpu_kwargs = tree_map(_to_tpu, args), tree_map(_to_tpu, kwargs)
        try:
            got = _dispatch.cpu_fallback(func, *tpu_args, **tpu_kwargs)
        except Exception as e:  # noqa: BLE001 - reported below, with the op
            wrong[func.name()] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        if not _same(got, want) or not _same((tpu_args, tpu_kwargs), (cpu_args, cpu_kwargs)):
            wrong[func.name()] = "differs from CPU"
    assert not wrong, wrong


@pytest.fixture(params=["strict", "defer_and_fuse"])
def mode(request):
    import deferfuse

    with deferfuse.mode(request.param):
        yield request.param
