"""The `tpu` device: PrivateUse1 renamed (its C++ core is `_native`), with the module `torch.tpu` (`_tpu_module`)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch._tensor_str

from . import _native, _serialization, _sharing
from . import _tpu_module as TpuModule


def _print_from_the_host(format_contents: Callable[..., str]) -> Callable[..., str]:
    """Printing formats a copy on the CPU. PyTorch's printer runs tensor ops
    (abs, masked_select, float64 min/max) on the tensor it prints, and copies
    to the CPU first only for a fixed list of lazy devices (xla, lazy, ...);
    on `tpu` those ops would be recorded, and the float64 ones would warn
    and fall back. One materialization is what printing should cost."""

    @functools.wraps(format_contents)
    def contents(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        if self.device.type == "tpu":
            self = self.cpu()
        return format_contents(self, *args, **kwargs)

    return contents


def setup() -> None:
    if getattr(torch, "tpu", None) is TpuModule:
        return
    # The C++ layer first: it registers the storage allocator, the view kernels,
    # the device guard and the hooks that PrivateUse1 needs before any tensor exists.
    _native.load()
    torch.utils.rename_privateuse1_backend("tpu")
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("tpu", TpuModule)
    _serialization.register()
    _sharing.register()
    # The printer looks `_tensor_str` up at each call, so wrapping it here
    # covers print, repr and str (the device suffix is computed elsewhere).
    torch._tensor_str._tensor_str = _print_from_the_host(torch._tensor_str._tensor_str)
