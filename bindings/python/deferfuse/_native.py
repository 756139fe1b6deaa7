"""The C++ PrivateUse1 layer (`bindings/csrc/`, built into `libdeferfuse_tpu.so` by
`.ci/setup_torch`): loading it registers the `tpu` storage allocator, the
view kernels, the device guard and the accelerator hooks with PyTorch.

It is compiled against one torch's C++ headers, whose ABI changes between
releases, so it is loaded only under the torch it was built for."""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import torch

from . import _engine, _state
from ._engine import EngineError

_HERE = Path(__file__).resolve().parent
LIBRARY = _HERE / "libdeferfuse_tpu.so"
VERSION_FILE = _HERE / "libdeferfuse_tpu.torch_version"
_REBUILD = "run `bash .ci/setup_torch` (or `python bindings/csrc/build.py`) to rebuild it"

_lib: ctypes.CDLL | None = None
_bridge: ModuleType | None = None


#: An error of a sync that C++ asked for: it cannot cross into C++, so it is
#: kept and raised by the next `torch.tpu.synchronize()` (`raise_deferred`).
_deferred_error: BaseException | None = None


@ctypes.CFUNCTYPE(None)
def _engine_sync() -> None:
    """What the C++ streams and events call to wait for the engine (ctypes takes the GIL)."""
    global _deferred_error
    try:
        _state.sync()
    except Exception as e:  # kept, see `_deferred_error`
        _deferred_error = e


def raise_deferred() -> None:
    global _deferred_error
    error, _deferred_error = _deferred_error, None
    if error is not None:
        raise error


def built_for() -> str | None:
    """The torch version the library was built against, or None if it is missing."""
    if not LIBRARY.exists() or not VERSION_FILE.exists():
        return None
    return VERSION_FILE.read_text().strip()


def check_version(built: str | None, running: str) -> None:
    """Raises EngineError unless a library built for `built` may load under `running`."""
    if built is None:
        raise EngineError(f"the C++ layer of deferfuse ({LIBRARY.name}) is not built; {_REBUILD}")
    if built != running:
        raise EngineError(
            f"the C++ layer of deferfuse was built for torch {built} but torch {running} is "
            f"installed; {_REBUILD}"
        )


def load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    check_version(built_for(), torch.__version__)
    # torch's own libraries are loaded (by `import torch`) before ours, which links against them.
    lib = ctypes.CDLL(str(LIBRARY), mode=ctypes.RTLD_GLOBAL)
    lib.deferfuse_native_torch_version.restype = ctypes.c_char_p
    for name in ("live_bytes", "peak_bytes", "allocations"):
        getattr(lib, f"deferfuse_native_{name}").restype = ctypes.c_int64
    compiled = lib.deferfuse_native_torch_version().decode()
    # The version file and the library come from the same build; this checks the library itself.
    if not torch.__version__.startswith(compiled):
        raise EngineError(
            f"the C++ layer of deferfuse was compiled against torch {compiled} but torch "
            f"{torch.__version__} is installed; {_REBUILD}"
        )
    lib.deferfuse_native_set_sync(_engine_sync)
    _lib = lib
    return lib


def bridge() -> ModuleType:
    """The library's Python functions (`new_tensor`, `root`, `set_root`,
    `install_native`, ...), as the extension module `deferfuse._tpu_bridge`
    (the same loaded library), connected to the engine's C ABI."""
    global _bridge
    if _bridge is None:
        load()
        loader = importlib.machinery.ExtensionFileLoader("deferfuse._tpu_bridge", str(LIBRARY))
        spec = importlib.util.spec_from_file_location("deferfuse._tpu_bridge", str(LIBRARY), loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        module.install(_engine._native_api)
        _bridge = module
    return _bridge


def live_bytes() -> int:
    """Bytes of live `tpu` storages."""
    return int(load().deferfuse_native_live_bytes())


def peak_bytes() -> int:
    """The most bytes of `tpu` storages live at once since the last reset."""
    return int(load().deferfuse_native_peak_bytes())


def allocations() -> int:
    """How many `tpu` storages were ever allocated."""
    return int(load().deferfuse_native_allocations())


def reset_peak_bytes() -> None:
    load().deferfuse_native_reset_peak_bytes()
