"""The `tpu` device: PrivateUse1 renamed, with the module `torch.tpu`."""

from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import _state


class TpuModule:
    """`torch.tpu`: what PyTorch asks a device module for."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device: object) -> None:
        pass

    @staticmethod
    def synchronize(device: object = None) -> None:
        _state.sync()

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        pass

    @staticmethod
    def manual_seed(seed: int) -> None:
        pass

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]


def setup() -> None:
    if getattr(torch, "tpu", None) is TpuModule:
        return
    _setup_privateuseone_for_python_backend("tpu", backend_module=TpuModule)
