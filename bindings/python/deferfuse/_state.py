"""Run-time state of the binding: one engine context per mode, the current
mode, and the CPU-fallback counter."""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import warnings
from typing import Iterator

from . import _engine

MODES = ("strict", "debug", "defer_and_fuse")

_engines: dict[str, _engine.Engine] = {}
_lock = threading.Lock()
_mode = "strict"
#: The context of the current mode (read directly on the hot path).
current: _engine.Engine | None = None

#: How many times each aten op ran through the CPU fallback.
fallback_counts: collections.Counter[str] = collections.Counter()


def _normalize(mode: str) -> str:
    name = str(mode).strip().lower()
    if name not in MODES:
        raise ValueError(f"deferfuse: unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    return name


def engine_for(mode: str) -> _engine.Engine:
    with _lock:
        eng = _engines.get(mode)
        if eng is None:
            eng = _engines[mode] = _engine.Engine(mode)
        return eng


def engine() -> _engine.Engine:
    """The context of the current mode (created on first use)."""
    return current if current is not None else engine_for(_mode)


def init_from_env() -> None:
    """Picks the mode named by TORCH_TPU_EAGER_MODE (strict by default).
    The engine validates the variable and lists the valid values."""
    global _mode, current
    raw = os.environ.get("TORCH_TPU_EAGER_MODE", "strict")
    try:
        _mode = _normalize(raw)
    except ValueError:
        raise _engine.EngineError(
            f"TORCH_TPU_EAGER_MODE={raw!r} is not valid; valid values: strict, debug, defer_and_fuse (case-insensitive)"
        ) from None
    current = engine_for(_mode)


def get_mode() -> str:
    return _mode


def set_mode(mode: str) -> None:
    """Switches the eager mode. Work pending in the old mode is run first, so
    values keep their order; tensors made in any mode stay usable."""
    global _mode, current
    new = _normalize(mode)
    if new != _mode:
        sync()
        _mode = new
        current = engine_for(new)


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """`with deferfuse.mode("defer_and_fuse"): ...` runs the block in that mode."""
    old = _mode
    set_mode(name)
    try:
        yield
    finally:
        set_mode(old)


def sync() -> None:
    """The explicit step marker: runs everything recorded so far."""
    for eng in list(_engines.values()):
        eng.sync()


def count_fallback(name: str, why: str = "no engine lowering yet") -> None:
    if name not in fallback_counts:
        warnings.warn(
            f"deferfuse: aten op {name} runs on the CPU ({why}); its inputs are materialized and "
            "copied. deferfuse.fallback_counts() counts these.",
            stacklevel=4,
        )
    fallback_counts[name] += 1
