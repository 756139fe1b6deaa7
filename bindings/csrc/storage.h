// What a `tpu` storage's DataPtr context is, shared by device.cpp (which
// allocates and frees it) and bridge.cpp (which hands its engine value to
// the Python package).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>

namespace deferfuse {

// One storage: its byte count (for the accounting), the host bytes its
// DataPtr points at (never read), and its value: a Python `_handles.Root`
// holding the engine tensor, owned (one reference) by the block, so that
// the value lives exactly as long as the storage, through every alias,
// `.data` swap and `set_`.
struct Block {
  size_t nbytes;
  void* host;
  void* root = nullptr;  // PyObject*, or null while the storage is uninitialized
};

// The block behind a DataPtr, or null if the DataPtr is not a `tpu` storage's.
Block* block_of(const c10::DataPtr& data);

// Drops a block's reference to its root (set by bridge.cpp, which knows Python).
extern void (*release_root)(void* root);

}  // namespace deferfuse
