"""deferfuse for PyTorch: `import deferfuse` makes the device `tpu`.

    import torch, deferfuse
    model = MyModel().to("tpu")
    print(model(x.to("tpu")).cpu())

Tensors on `tpu` are plain `torch.Tensor`s whose values live in the deferfuse
engine. `TORCH_TPU_EAGER_MODE=strict|debug|defer_and_fuse` picks the mode at
import; `set_mode` and the `mode(...)` context manager switch it; `sync()`
runs everything recorded so far.
"""

from __future__ import annotations

import collections

from . import _state
from ._engine import EngineError

__all__ = ["EngineError", "sync", "set_mode", "get_mode", "mode", "fallback_counts", "stats"]

sync = _state.sync
set_mode = _state.set_mode
get_mode = _state.get_mode
mode = _state.mode


def fallback_counts() -> collections.Counter[str]:
    """How many times each aten op ran through the CPU fallback."""
    return collections.Counter(_state.fallback_counts)


def reset_fallback_counts() -> None:
    _state.fallback_counts.clear()


def stats() -> dict:
    """Engine counters of the current mode (ops recorded, flushes, caches)."""
    return _state.engine().stats()


_ready = False


def _setup() -> None:
    global _ready
    if _ready:
        return
    from . import _compile, _device, _dispatch

    _state.init_from_env()
    _device.setup()
    _dispatch.register()
    _compile.register()
    _ready = True


def _autoload() -> None:
    """The `torch.backends` entry point: runs during `import torch`."""
    _setup()


_setup()
