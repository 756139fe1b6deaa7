// The Python side of the C++ layer: `deferfuse._tpu_bridge`, the functions
// the Python package calls on the hot path of every op it lowers, which
// would cost several times more through PyTorch's Python API (`torch.empty`
// parses its arguments and dispatches; a storage's Python object is made on
// first use).
//
//   install(capsule)                -> reads the engine's C ABI table (once, at import)
//   new_tensor(shape, dtype, root)  -> a contiguous tpu tensor whose storage owns `root`
//   root(tensor)                    -> the root of a tpu tensor's storage, or None
//   set_root(tensor, root)          -> replaces it
//   whole_value(tensor, engine)     -> the root's engine value if `tensor` is all of
//                                      its root, in the root's dtype, of `engine`'s
//                                      context (the hot path of reading an operand), else None
//   install_native(ops)             -> registers the native kernels (native.cpp)
//   install_dist()                  -> the c10d backend class of `tpu_dist` (dist.cpp)

#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <vector>

#include "storage.h"

namespace deferfuse {

// native.cpp: registers the C++ kernels of the ops the engine lowers natively.
PyObject* install_native(PyObject* ops);
// dist.cpp: registers and returns `TpuDistBackend`.
PyObject* install_dist(PyObject* module);

namespace {

Block* block_of_tensor(PyObject* obj) {
  if (!THPVariable_Check(obj)) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || !t.has_storage()) {
    return nullptr;
  }
  return block_of(t.storage().data_ptr());
}

bool ready() {
  if (engine_api == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "deferfuse: _tpu_bridge.install was not called");
    return false;
  }
  return true;
}

// A new reference to `root`'s cell, or null with a TypeError.
const Cell* cell_of(PyObject* root) {
  const Cell* cell = engine_api->root_from_py(root);
  if (cell == nullptr) {
    PyErr_Format(PyExc_TypeError, "deferfuse: expected a Root, got %s", Py_TYPE(root)->tp_name);
  }
  return cell;
}

PyObject* install(PyObject*, PyObject* capsule) {
  auto* api = static_cast<const EngineApi*>(PyCapsule_GetPointer(capsule, "deferfuse._engine._native_api"));
  if (api == nullptr) {
    return nullptr;
  }
  if (api->version != kApiVersion) {
    PyErr_Format(PyExc_RuntimeError,
                 "deferfuse: the engine's C ABI is version %u, the C++ layer was built for %u; rebuild both "
                 "(bash .ci/setup_torch)",
                 api->version, kApiVersion);
    return nullptr;
  }
  engine_api = api;
  Py_RETURN_NONE;
}

PyObject* new_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !THPDtype_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(shape: tuple, dtype: torch.dtype, root)");
    return nullptr;
  }
  if (!ready()) {
    return nullptr;
  }
  const Py_ssize_t rank = PyTuple_GET_SIZE(args[0]);
  std::vector<int64_t> sizes(rank);
  for (Py_ssize_t i = 0; i < rank; ++i) {
    sizes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[0], i));
    if (sizes[i] == -1 && PyErr_Occurred()) {
      return nullptr;
    }
    if (sizes[i] < 0) {
      PyErr_Format(PyExc_ValueError, "new_tensor: negative size %lld", static_cast<long long>(sizes[i]));
      return nullptr;
    }
  }
  const Cell* cell = cell_of(args[2]);
  if (cell == nullptr) {
    return nullptr;
  }
  try {
    constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
    at::Tensor t = at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::PrivateUse1), keys,
                                             reinterpret_cast<THPDtype*>(args[1])->scalar_type, std::nullopt);
    block_of(t.storage().data_ptr())->root = cell;
    return THPVariable_Wrap(std::move(t));
  } catch (const std::exception& e) {
    release_root(cell);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* root(PyObject*, PyObject* tensor) {
  Block* block = block_of_tensor(tensor);
  if (block == nullptr || block->root == nullptr) {
    Py_RETURN_NONE;
  }
  return ready() ? engine_api->root_to_py(block->root) : nullptr;
}

PyObject* set_root(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "set_root(tensor, root)");
    return nullptr;
  }
  Block* block = block_of_tensor(args[0]);
  if (block == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "deferfuse: set_root of a tensor that is not a tpu tensor");
    return nullptr;
  }
  if (!ready()) {
    return nullptr;
  }
  const Cell* cell = cell_of(args[1]);
  if (cell == nullptr) {
    return nullptr;
  }
  const Cell* old = block->root;
  block->root = cell;
  release_root(old);
  Py_RETURN_NONE;
}

PyObject* whole_value(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "whole_value(tensor, engine)");
    return nullptr;
  }
  Block* block = block_of_tensor(args[0]);
  if (block == nullptr || block->root == nullptr || engine_api == nullptr) {
    Py_RETURN_NONE;
  }
  const at::Tensor& t = THPVariable_Unpack(args[0]);
  if (t.storage_offset() != 0 || !t.is_contiguous()) {
    Py_RETURN_NONE;
  }
  PyObject* value = engine_api->whole_value(block->root, args[1], t.sizes().data(),
                                            static_cast<uint32_t>(t.dim()), static_cast<int8_t>(t.scalar_type()));
  if (value == nullptr) {
    Py_RETURN_NONE;
  }
  return value;
}

PyObject* install_native_py(PyObject*, PyObject* ops) { return install_native(ops); }

PyObject* install_dist_py(PyObject* module, PyObject*) { return install_dist(module); }

PyMethodDef methods[] = {
    {"install", &install, METH_O, "Reads the engine's C ABI table from its capsule."},
    {"install_native", &install_native_py, METH_O,
     "Registers the native kernels: a list of (aten name, native op id, Python kernel)."},
    {"install_dist", &install_dist_py, METH_NOARGS,
     "The c10d backend class of tpu_dist, registered on first call (after torch.distributed is imported)."},
    {"whole_value", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&whole_value)), METH_FASTCALL,
     "The root's value if the tensor is all of its root in the given engine's context, else None."},
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&new_tensor)), METH_FASTCALL,
     "A contiguous tpu tensor whose storage owns root."},
    {"root", &root, METH_O, "The root of a tpu tensor's storage, or None."},
    {"set_root", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&set_root)), METH_FASTCALL,
     "Replaces the root of a tpu tensor's storage."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tpu_bridge", "The C++ layer's hot-path functions.", -1, methods};

}  // namespace
}  // namespace deferfuse

PyMODINIT_FUNC PyInit__tpu_bridge() { return PyModule_Create(&deferfuse::module); }
