"""`torch.compile(model, backend="tpu")`: a Dynamo backend that runs the FX
graph as one DeferAndFuse trace, so the compiled path goes through the same
rewrites and three-tier cache as eager DeferAndFuse.

torch 2.15's Inductor knows the device name "tpu" and would generate Pallas
code (needing JAX) for it; a plain `torch.compile(model)` whose graph touches
`tpu` tensors is routed to our backend instead, with a one-time warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from . import _state


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        # Everything the graph does is recorded into one pending trace and
        # flushed when its outputs are read (or by deferfuse.sync()).
        with _state.mode("defer_and_fuse"):
            return gm(*args)

    return run


def _touches_tpu(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    tensors += list(gm.parameters()) + list(gm.buffers())
    return any(t.device.type == "tpu" for t in tensors)


_warned = False


def _route_inductor(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_fx(gm: torch.fx.GraphModule, example_inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        global _warned
        if _touches_tpu(gm, example_inputs):
            if not _warned:
                warnings.warn(
                    "deferfuse: Inductor cannot compile for device 'tpu' (it would generate Pallas code, "
                    'which needs JAX); this graph runs through torch.compile(backend="tpu") instead.',
                    stacklevel=2,
                )
                _warned = True
            return tpu_backend(gm, example_inputs)
        return original(gm, example_inputs, *args, **kwargs)

    compile_fx.__wrapped__ = original  # type: ignore[attr-defined]
    return compile_fx


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    _BACKENDS.pop("tpu", None)
    _COMPILER_FNS.pop("tpu", None)
    register_backend(tpu_backend, name="tpu")

    import torch._inductor.compile_fx as inductor

    if not hasattr(inductor.compile_fx, "__wrapped__"):
        inductor.compile_fx = _route_inductor(inductor.compile_fx)
