// The Python side of the C++ layer: `deferfuse._tpu_bridge`, three functions
// on the hot path of every op, which would cost several times more through
// PyTorch's Python API (`torch.empty` parses its arguments and dispatches;
// a storage's Python object is made on first use).
//
//   new_tensor(shape, dtype, root) -> a contiguous tpu tensor whose storage owns `root`
//   root(tensor) -> the root of a tpu tensor's storage, or None
//   set_root(tensor, root)          -> replaces it

#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "storage.h"

namespace deferfuse {
namespace {

void release(void* root) {
  // Storages die on any thread (autograd's among them) and during shutdown.
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(static_cast<PyObject*>(root));
  PyGILState_Release(gil);
}

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

PyObject* new_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !THPDtype_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(shape: tuple, dtype: torch.dtype, root)");
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
  try {
    constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
    at::Tensor t = at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::PrivateUse1), keys,
                                             reinterpret_cast<THPDtype*>(args[1])->scalar_type, std::nullopt);
    Block* block = block_of(t.storage().data_ptr());
    Py_INCREF(args[2]);
    block->root = args[2];
    return THPVariable_Wrap(std::move(t));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* root(PyObject*, PyObject* tensor) {
  Block* block = block_of_tensor(tensor);
  PyObject* r = block == nullptr || block->root == nullptr ? Py_None : static_cast<PyObject*>(block->root);
  Py_INCREF(r);
  return r;
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
  Py_INCREF(args[1]);
  PyObject* old = static_cast<PyObject*>(block->root);
  block->root = args[1];
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
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

PyMODINIT_FUNC PyInit__tpu_bridge() {
  deferfuse::release_root = &deferfuse::release;
  return PyModule_Create(&deferfuse::module);
}
