// What a `tpu` storage's DataPtr context is, shared by device.cpp (which
// allocates and frees it), bridge.cpp (which hands its value to the Python
// package) and native.cpp (whose kernels compute with it).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>

#include "engine_api.h"

namespace deferfuse {

// One storage: its byte count (for the accounting), the host bytes its
// DataPtr points at (never read), and its value: one reference to the
// engine's root cell, so that the value lives exactly as long as the
// storage, through every alias, `.data` swap and `set_`.
struct Block {
  size_t nbytes;
  void* host;
  const Cell* root = nullptr;  // null while the storage is uninitialized
};

// The block behind a DataPtr, or null if the DataPtr is not a `tpu` storage's.
Block* block_of(const c10::DataPtr& data);

// Drops a block's reference to its root (no GIL needed).
inline void release_root(const Cell* root) {
  if (root != nullptr && engine_api != nullptr) {
    engine_api->root_release(root);
  }
}

}  // namespace deferfuse
