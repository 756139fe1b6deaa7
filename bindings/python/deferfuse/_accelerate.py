"""Hugging Face accelerate (and with it the transformers `Trainer`) on `tpu`.

accelerate knows its devices by name and `tpu` (a PrivateUse1 device) is
not among them: alone, it places models on the CPU while transformers puts
the inputs on `tpu`, and under `torchrun` it falls back to a
non-distributed state. Until accelerate learns the device, this module
teaches its `PartialState` two things, when `tpu` is the accelerator:

- the default device is `tpu:0`;
- a process launched by `torchrun` (`LOCAL_RANK` set) is one rank of a
  data-parallel job over `tpu_dist`. accelerate's `MULTI_CPU` type is the
  one whose DDP wrapping names no CUDA device ids, so the job takes it, with
  the device set to `tpu:0` (one device per process).

The patch is applied when `accelerate.state` is imported (or at once if it
already is), and only changes what accelerate would otherwise get wrong.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

import torch

_MODULE = "accelerate.state"


def _tpu_is_the_accelerator() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu"


def _teach(state: ModuleType) -> None:
    partial = state.PartialState
    if getattr(partial, "_deferfuse_taught", False):
        return
    kinds = state.DistributedType
    prepare_backend, set_device, default_device = (
        partial._prepare_backend,
        partial.set_device,
        partial.default_device,
    )

    def _prepare_backend(
        self: Any, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None
    ):
        chosen, kind = prepare_backend(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if kind == kinds.NO and launched and not cpu and _tpu_is_the_accelerator():
            return backend or "tpu_dist", kinds.MULTI_CPU
        return chosen, kind

    def _set_device(self: Any) -> None:
        if self.device is None and self.backend == "tpu_dist":
            self.device = torch.device("tpu", 0)
            return
        set_device(self)

    def _default_device(self: Any) -> torch.device:
        return torch.device("tpu", 0) if _tpu_is_the_accelerator() else default_device.fget(self)

    partial._prepare_backend = _prepare_backend
    partial.set_device = _set_device
    partial.default_device = property(_default_device)
    partial._deferfuse_taught = True


class _TeachOnImport(importlib.abc.MetaPathFinder):
    """Finds `accelerate.state` through the other finders and patches the
    module right after it runs."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _teach(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register() -> None:
    if _MODULE in sys.modules:
        _teach(sys.modules[_MODULE])
    elif not any(isinstance(f, _TeachOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _TeachOnImport())
