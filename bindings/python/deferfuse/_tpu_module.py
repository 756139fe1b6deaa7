"""`torch.tpu`: what CUDA users call on `torch.cuda`, for the one `tpu` device.

Streams and events are PyTorch's own (`torch.Stream`, `torch.Event`) over
the C++ device guard (`bindings/csrc/runtime.cpp`): the engine runs work in
the order it is recorded, so every stream names that one order, waits
between streams need no action, and waiting for completion runs the engine
(`deferfuse.sync()`). Memory figures are the byte counts of live `tpu`
storages, kept by the C++ allocator.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from . import _generator, _native, _state

_DEVICE = torch.device("privateuseone", 0)  # named "tpu" once _device.setup() ran


def _check_device(device: Any) -> None:
    if device is None:
        return
    d = torch.device(device) if not isinstance(device, int) else torch.device("tpu", device)
    if d.type != "tpu" or (d.index is not None and d.index != 0):
        raise ValueError(f"torch.tpu: there is one device, tpu:0; got {device!r}")


class Stream(torch.Stream):
    """A `tpu` stream (`torch.tpu.Stream(priority=...)`, as `torch.cuda.Stream`)."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        _check_device(device)
        return super().__new__(cls, device=_DEVICE, priority=priority, **kwargs)

    def wait_stream(self, stream: torch.Stream) -> None:
        # One engine order: work recorded after this call already runs after `stream`'s.
        self.wait_event(stream.record_event())


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
    """A `tpu` event (`torch.tpu.Event(enable_timing=True)`, as `torch.cuda.Event`):
    a plain `torch.Event` (PyTorch's event methods accept no subclass). Recording
    a timing event runs the work recorded before it, so that its timestamp is
    when that work was done."""
    return torch.Event(device=_DEVICE, enable_timing=enable_timing)


def _as_tpu_stream(s: torch.Stream) -> Stream:
    return torch.Stream.__new__(
        Stream, stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type
    )


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current `tpu` stream (the default stream unless
    `torch.tpu.stream(s)` or `set_stream(s)` picked another)."""
    _check_device(device)
    return _as_tpu_stream(torch.accelerator.current_stream(0))


def default_stream(device: Any = None) -> Stream:
    _check_device(device)
    current = torch.accelerator.current_stream(0)
    return torch.Stream.__new__(Stream, stream_id=0, device_index=0, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


class StreamContext:
    """`with torch.tpu.stream(s):` makes `s` the current stream inside."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.previous: torch.Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self.previous = torch.accelerator.current_stream(0)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            torch.accelerator.set_stream(self.previous)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def synchronize(device: Any = None) -> None:
    """Runs everything recorded so far (every stream is the engine's one order)."""
    _check_device(device)
    _native.raise_deferred()
    _state.sync()


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device: Any) -> None:
    _check_device(device)


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def get_device_name(device: Any = None) -> str:
    _check_device(device)
    return "deferfuse"


def get_device_properties(device: Any = None) -> Any:
    _check_device(device)
    from types import SimpleNamespace

    return SimpleNamespace(name=get_device_name(), type="tpu", index=0, total_memory=_host_memory()[1])


# ---- memory ---------------------------------------------------------------------


def memory_allocated(device: Any = None) -> int:
    _check_device(device)
    return _native.live_bytes()


def max_memory_allocated(device: Any = None) -> int:
    _check_device(device)
    return _native.peak_bytes()


def reset_peak_memory_stats(device: Any = None) -> None:
    _check_device(device)
    _native.reset_peak_bytes()


def memory_stats(device: Any = None) -> dict[str, Any]:
    """CUDA's key names (`allocated_bytes.all.current`, ...), from the C++ allocator."""
    _check_device(device)
    return dict(torch.accelerator.memory_stats(0))


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of the host, where the engine's buffers live."""
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def mem_get_info(device: Any = None) -> tuple[int, int]:
    _check_device(device)
    return _host_memory()


def empty_cache() -> None:
    """The engine frees a buffer when its last tensor dies: nothing is cached."""


@contextlib.contextmanager
def device(device: Any) -> Iterator[None]:
    _check_device(device)
    yield


# ---- random numbers: the device generator (`_generator`) ----------------------------


def manual_seed(seed: int) -> None:
    _generator.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    _generator.manual_seed(seed)


def seed() -> None:
    _generator.seed()


def seed_all() -> None:
    _generator.seed()


def initial_seed() -> int:
    return _generator.initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    _check_device(device)
    return _generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    _check_device(device)
    _generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    set_rng_state(new_states[0])
