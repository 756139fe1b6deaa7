"""deferfuse for PyTorch: `import deferfuse` makes the device `tpu`.

    import torch, deferfuse
    model = MyModel().to("tpu")
    print(model(x.to("tpu")).cpu())

Tensors on `tpu` are plain `torch.Tensor`s whose values live in the deferfuse
engine. `TORCH_TPU_EAGER_MODE=strict|debug|defer_and_fuse` picks the default
mode at import; `set_mode` and the `mode(...)` context manager switch the
calling thread's mode; `sync()` runs everything recorded so far.

`import torch` alone sets the device up too (PyTorch's backend autoload). A
bad `TORCH_TPU_*` value then only warns and leaves `tpu` unregistered, so
that programs which never use it still run; `import deferfuse` raises it.
"""

from __future__ import annotations

import collections
import sys

_ready = False
#: False until this module's body has run: see `_autoload`.
_imported = False


def _autoload() -> None:
    """The `torch.backends` entry point: runs during `import torch`."""
    if not _imported:
        # `import deferfuse` came first and its `import torch` got here: this
        # module's body is still running and sets the device up itself.
        return
    try:
        _setup()
    except EngineError as e:
        import warnings

        warnings.warn(
            f"deferfuse: the tpu device is not set up: {e}. `import deferfuse` raises this error.",
            RuntimeWarning,
            stacklevel=2,
        )
        # Forgotten, so that an explicit `import deferfuse` runs this module
        # again and raises the error instead of returning a half-set-up module.
        sys.modules.pop(__name__, None)


from . import _state  # noqa: E402 - after `_autoload`, which torch may call while this line runs
from ._engine import EngineError  # noqa: E402

__all__ = ["EngineError", "sync", "set_mode", "get_mode", "mode", "fallback_counts", "stats", "config"]

sync = _state.sync
set_mode = _state.set_mode
get_mode = _state.get_mode
mode = _state.mode
config = _state.config


def fallback_counts() -> collections.Counter[str]:
    """How many times each aten op ran through the CPU fallback."""
    return collections.Counter(_state.fallback_counts)


def reset_fallback_counts() -> None:
    _state.fallback_counts.clear()


def stats() -> dict:
    """Engine counters of the calling thread's mode (ops recorded, flushes, caches)."""
    return _state.engine().stats()


def _setup() -> None:
    global _ready
    if _ready:
        return
    # The environment first: a bad value raises before anything is registered.
    _state.init_from_env()
    from . import _accelerate, _compile, _device, _dispatch, distributed

    _device.setup()
    _dispatch.register()
    _compile.register()
    distributed.register()
    _accelerate.register()
    # Backward runs in the thread that calls it, in that thread's mode, as
    # its forward did: autograd's device threads would run every backward
    # op of `tpu` in the process default mode (a `with deferfuse.mode(...)`
    # block's backward too) and hand each backward over between threads.
    # The engine's flushes are asynchronous already, so a device thread
    # would overlap nothing.
    import torch

    torch.autograd.set_multithreading_enabled(False)
    _ready = True


def _torch_is_importing() -> bool:
    """True while `import torch` runs, i.e. when its autoload imports us."""
    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    return torch is not None and bool(getattr(spec, "_initializing", False))


if not _torch_is_importing():
    _setup()
# From here on `_autoload` sets up (torch calls it right after importing us).
_imported = True
