"""`tpu` tensors crossing processes through `torch.multiprocessing` (queues,
pipes, pool arguments, DataLoader workers, `spawn` arguments).

PyTorch hands a CUDA storage to another process as an IPC handle to the same
device memory, so both processes see each other's writes (Hogwild training
relies on it). A `tpu` storage's value lives in this process's engine, which
no other process can reach; so sending one moves its value into CPU shared
memory (PyTorch's own CPU sharing: a file descriptor or a file name,
whichever strategy is set), and from then on the storage, here and in every
process it reaches, lives there (`Root.share`): a read takes a snapshot of
the shared memory, a write materializes its value and copies it in. Writes
become visible to the other processes once they run, as on CUDA after a
synchronize. The price is a host copy per read and per write of a shared
storage; unshared storages are not affected. Views sent together still share
one storage on arrival. A shared storage cannot be resized, as on the CPU.

Plain `pickle` and `copy.deepcopy` need nothing here: PyTorch's storage
pickling and cloning work on `tpu` as on CUDA.

A worker that puts tensors on a queue and returns at once would, in plain
PyTorch, take their file descriptors with it before the receiver asked for
them (the receiver fails with `FileNotFoundError`). With the default
`file_descriptor` strategy a process here waits at exit, up to
`_HANDOFF_WAIT_S`, until every descriptor it offered has been taken.
"""

from __future__ import annotations

import threading
import time
from multiprocessing import resource_sharer, util
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

import torch
from torch.multiprocessing import reductions

from . import _handles
from ._engine import Root


def _reduce_storage(storage: torch.UntypedStorage) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    if storage.device.type != "tpu":
        return reductions.reduce_storage(storage)
    nbytes = storage.nbytes()
    if nbytes == 0:
        # Shared memory cannot map zero bytes (PyTorch special-cases these too).
        return (_rebuild_empty, ())
    root = _handles.root_of(torch.empty(0, dtype=torch.uint8, device="tpu").set_(storage))
    if not root.shared:
        current = _handles.to_cpu_value(_handles._current(root)).reshape(root.shape)
        root.share(current.clone().share_memory_())
    # The shared CPU tensor is pickled in turn, by PyTorch's own reducer.
    return (_rebuild_on_tpu, (root.value, nbytes))


def _rebuild_on_tpu(memory: torch.Tensor, nbytes: int) -> torch.UntypedStorage:
    """A `tpu` storage of `nbytes` whose value is the shared `memory`."""
    root = Root(memory)
    root.share(memory)
    storage = _handles._bridge.new_tensor(tuple(memory.shape), memory.dtype, root).untyped_storage()
    if storage.nbytes() != nbytes:
        raise RuntimeError(f"deferfuse: a shared tpu storage of {nbytes} bytes arrived as {storage.nbytes()}")
    return storage


def _rebuild_empty() -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device="tpu")


_HANDOFF_WAIT_S = 30.0


def _wait_for_receivers() -> None:
    """Keeps the descriptors this process offered reachable until taken."""
    deadline = time.monotonic() + _HANDOFF_WAIT_S
    # Queues are closed by now: their feeder threads pickle what is left
    # (offering its descriptors), write it and end.
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread":
            thread.join(max(0.0, deadline - time.monotonic()))
    sharer = resource_sharer._resource_sharer
    while sharer._cache and sharer._thread is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def _register_exit_wait(_: object = None) -> None:
    # After the queues are closed (exit priority 10) and before the
    # listener's socket is unlinked (0).
    util.Finalize(None, _wait_for_receivers, exitpriority=5)


def register() -> None:
    """Puts the `tpu` case in front of PyTorch's storage reducer (which
    would try to share a `tpu` storage as CPU shared memory, and fail)."""
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
    _register_exit_wait()
    util.register_after_fork(_register_exit_wait, _register_exit_wait)
