"""Run-time state of the binding: one engine context per mode, the mode of each
thread, and the CPU-fallback counter.

The mode is per thread (as TorchTPU's override is): `set_mode` and
`with mode(...)` change the calling thread's mode only. A thread starts in the
process default, which `TORCH_TPU_EAGER_MODE` sets at import. Values made in
one mode stay usable in every other: the engine imports an operand of another
context (engine/src/foreign.rs).

After `os.fork()` the child drops the parent's contexts (their stream
threads did not survive the fork) and makes its own at its first op; see
`_after_fork_in_child`.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import warnings
from typing import Iterator

from . import _engine

#: The contexts made so far, by mode; each is shared by the threads in that mode.
_engines: dict[str, _engine.Engine] = {}
_lock = threading.Lock()
#: The mode a thread starts in (`TORCH_TPU_EAGER_MODE`, read by the engine at import).
_default_mode = "strict"
#: Contexts of the parent process in a forked child: kept, never dropped (see
#: `_after_fork_in_child`).
_orphans: list[_engine.Engine] = []


class _Unset:
    """Stands for "no context picked yet" in `local.current`. It is never the
    owner of a value, so the hot path's `owner is local.current` test fails
    and the slow path picks the context."""

    __slots__ = ()


_UNSET = _Unset()


class _ThreadState(threading.local):
    """The calling thread's mode and its context. `current` is what the
    Python lowerings read (one attribute of a thread-local); set it with
    `_use`, which also tells the engine, whose C++ kernels read it there."""

    def __init__(self) -> None:
        self.mode = _default_mode
        _use(self, _engines.get(_default_mode, _UNSET))


def _use(state: _ThreadState, eng: _engine.Engine | _Unset) -> None:
    state.current = eng
    _engine.set_current(eng)


local = _ThreadState()

#: How many times each aten op ran through the CPU fallback.
fallback_counts: collections.Counter[str] = collections.Counter()


def engine_for(mode: str) -> _engine.Engine:
    with _lock:
        eng = _engines.get(mode)
        if eng is None:
            eng = _engines[mode] = _engine.Engine(mode)
        return eng


def engine() -> _engine.Engine:
    """The context of the calling thread's mode (created on first use)."""
    eng = local.current
    if eng is _UNSET:
        eng = engine_for(local.mode)
        _use(local, eng)
    return eng


def init_from_env() -> None:
    """Takes the process default mode from the environment. The engine parses
    every `TORCH_TPU_*` variable; a bad value raises its EngineError, which
    names the variable and its valid values."""
    global _default_mode
    config = _engine.env_config()
    _default_mode = config["mode"]
    local.mode = _default_mode
    _use(local, _UNSET)


def config() -> dict:
    """The engine's reading of the `TORCH_TPU_*` variables."""
    return _engine.env_config()


def get_mode() -> str:
    """The calling thread's mode."""
    return local.mode


def set_mode(mode: str) -> None:
    """Switches the calling thread's eager mode. Work this thread left pending
    in the old mode is run first, so errors surface at the switch; tensors made
    in any mode stay usable in every other."""
    new = _engine.parse_mode(mode)
    if new != local.mode:
        old = local.current
        if not isinstance(old, _Unset):
            old.sync()
        local.mode = new
        _use(local, engine_for(new))


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """`with deferfuse.mode("defer_and_fuse"): ...` runs the block in that mode
    (in the calling thread)."""
    old = local.mode
    set_mode(name)
    try:
        yield
    finally:
        set_mode(old)


def sync() -> None:
    """The explicit step marker: runs everything recorded so far, in every mode."""
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


# ---- fork ------------------------------------------------------------------------


def _before_fork() -> None:
    """Finishes the work in flight, so every value the child inherits is
    computed (a value still queued on a Strict stream could never finish in
    the child, whose copy of the stream has no thread). Errors stay with their
    values and are raised where those are read."""
    for eng in list(_engines.values()):
        try:
            eng.sync()
        except Exception:  # raised again where the failed value is read
            pass


def _after_fork_in_child() -> None:
    """Gives the child an engine of its own, made at its first op. The
    parent's contexts are kept alive in `_orphans`, never dropped: their
    destructors would talk to stream threads that do not exist here. The
    child's tensors from before the fork still read through them (their
    values were computed by `_before_fork` and live in the child's copy of
    the parent's memory)."""
    global _lock
    _orphans.extend(_engines.values())
    _engines.clear()
    # A lock another thread held at the fork stays locked in the child forever.
    _lock = threading.Lock()
    # Only the forking thread exists in the child; it keeps its mode.
    _use(local, _UNSET)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
