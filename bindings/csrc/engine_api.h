// The engine's C ABI, as the Rust extension `deferfuse._engine` exports it
// (bindings/src/native/abi.rs, which this mirrors field for field): a table
// of functions read once from the capsule `deferfuse._engine._native_api`.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace deferfuse {

// A storage's value (a Rust `Arc<Cell>`): opaque here.
struct Cell;

namespace arg_kind {
constexpr uint8_t kNone = 0;
constexpr uint8_t kTensor = 1;
constexpr uint8_t kInt = 2;
constexpr uint8_t kFloat = 3;
constexpr uint8_t kBool = 4;
constexpr uint8_t kIntList = 5;
constexpr uint8_t kList = 6;
constexpr uint8_t kStr = 7;
}  // namespace arg_kind

struct Arg {
  uint8_t kind = arg_kind::kNone;
  int8_t dtype = 0;        // tensors: the ScalarType code
  uint32_t len = 0;        // tensors: the rank; lists and strings: the length
  const Cell* cell = nullptr;
  const int64_t* sizes = nullptr;  // tensors: sizes; int lists: the values
  const int64_t* strides = nullptr;
  int64_t int_value = 0;   // tensors: the storage offset; ints and bools: the value
  double float_value = 0;
  const Arg* items = nullptr;
  const char* str = nullptr;
};

constexpr size_t kMaxRank = 12;

struct Out {
  const Cell* cell;  // a fresh value, owned by the caller; or null, and then `input`
                     // (>= 0) or an undefined tensor (-1)
  int32_t input;
  int8_t dtype;
  uint32_t rank;
  int64_t sizes[kMaxRank];
};

constexpr int32_t kDone = 0;
constexpr int32_t kNotHandled = 1;
constexpr int32_t kFailed = 2;
constexpr uint32_t kApiVersion = 2;

struct EngineApi {
  uint32_t version;
  void (*root_release)(const Cell*);
  const Cell* (*root_from_py)(PyObject*);
  PyObject* (*root_to_py)(const Cell*);
  PyObject* (*whole_value)(const Cell*, PyObject* engine, const int64_t* sizes, uint32_t rank, int8_t dtype);
  int32_t (*call)(uint32_t op, const Arg* args, size_t nargs, Out* outs, size_t cap, size_t* nouts, void** error);
  void (*raise_error)(void* error);
  const Cell* (*root_zeros)(int64_t numel, int8_t dtype);
};

// The table, once `_tpu_bridge.install` has read it (null before).
extern const EngineApi* engine_api;

}  // namespace deferfuse
