"""`torch.load` onto `tpu` without a second host copy.

Saving needs nothing here: PyTorch tags a `tpu` storage's location "tpu:0"
itself (its PrivateUse1 tagger), and copies the storage to the CPU to write
it. Loading restores each storage from a CPU storage that `torch.load` has
just read (or mapped, with `mmap=True`). PyTorch's own restore for PrivateUse1
copies it into a new `tpu` storage; but a `tpu` storage's value lives in host
memory too, and the bytes arrive untyped (PyTorch names the dtype only in the
tensors it then sets on the storage), so that copy would be a second host copy
of the checkpoint until each tensor is first read.

The restore registered here instead makes the CPU storage itself the new
`tpu` storage's value: no copy while loading, and with `mmap=True` the bytes
stay in the file's pages until used. The first read of a tensor gives its
storage the tensor's dtype, moving the bytes into the engine once
(`_handles.read`); nothing writes the CPU storage in place, since writes to a
`tpu` storage replace its value.
"""

from __future__ import annotations

import torch
import torch.serialization

from . import _handles

#: PyTorch's restore for PrivateUse1 has priority 23; ours runs before it.
_BEFORE = 23


def _restore(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage | None:
    """The `tpu` storage for `storage` (on the CPU) restored to `location`;
    None leaves the location to PyTorch's own restores (and their errors)."""
    if not isinstance(location, str) or not location.startswith("tpu") or storage.device.type != "cpu":
        return None
    try:
        device = torch.device(location)
    except RuntimeError:
        return None
    if device.type != "tpu" or device.index not in (None, 0):
        return None  # PyTorch's restore raises its error for a device that does not exist
    as_bytes = torch.empty(0, dtype=torch.uint8).set_(storage)
    return _handles.new_tensor(as_bytes).untyped_storage()


def _no_tag(storage: object) -> None:
    """Tagging is PyTorch's (it names a `tpu` storage's location itself)."""
    return None


def register() -> None:
    taken = {entry[0] for entry in torch.serialization._package_registry}
    priority = max(p for p in range(_BEFORE) if p not in taken)
    torch.serialization.register_package(priority, _no_tag, _restore)
