// The Python side of the C++ layer: `deferfuse._tpu_bridge`, three functions
// on the hot path of every op, which would cost several times more through
// PyTorch's Python API (`torch.empty` parses its arguments and dispatches;
// a storage's Python object is made on first use).
//
//   new_tensor(shape, dtype, root) -> a contiguous tpu tensor whose storage owns `root`
//   root(tensor) -> the root of a tpu tensor's storage, or None
//   set_root(tensor, root)          -> replaces it
//   whole_value(tensor, context)    -> the root's engine value if `tensor` is all of
//                                      its root, in the root's dtype, owned by `context`
//                                      (the hot path of reading an operand), else None

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

// Attribute names of `_handles.Root`, interned once.
PyObject* name_owner = nullptr;
PyObject* name_dtype = nullptr;
PyObject* name_shape = nullptr;
PyObject* name_value = nullptr;

// Borrowed-reference result of an attribute read, or null (with no error set).
struct Attr {
  explicit Attr(PyObject* obj, PyObject* name) : ref(PyObject_GetAttr(obj, name)) {
    if (ref == nullptr) {
      PyErr_Clear();
    }
  }
  ~Attr() { Py_XDECREF(ref); }
  PyObject* ref;
};

bool same_sizes(PyObject* shape, c10::IntArrayRef sizes) {
  if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != static_cast<Py_ssize_t>(sizes.size())) {
    return false;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i)) != sizes[i]) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

PyObject* whole_value(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "whole_value(tensor, context)");
    return nullptr;
  }
  Block* block = block_of_tensor(args[0]);
  if (block == nullptr || block->root == nullptr) {
    Py_RETURN_NONE;
  }
  const at::Tensor& t = THPVariable_Unpack(args[0]);
  if (t.storage_offset() != 0 || !t.is_contiguous()) {
    Py_RETURN_NONE;
  }
  auto* root = static_cast<PyObject*>(block->root);
  Attr owner(root, name_owner);
  if (owner.ref != args[1]) {
    Py_RETURN_NONE;
  }
  Attr dtype(root, name_dtype);
  if (dtype.ref == nullptr || !THPDtype_Check(dtype.ref) ||
      reinterpret_cast<THPDtype*>(dtype.ref)->scalar_type != t.scalar_type()) {
    Py_RETURN_NONE;
  }
  Attr shape(root, name_shape);
  if (shape.ref == nullptr || !same_sizes(shape.ref, t.sizes())) {
    Py_RETURN_NONE;
  }
  PyObject* value = PyObject_GetAttr(root, name_value);
  if (value == nullptr) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  return value;
}

PyMethodDef methods[] = {
    {"whole_value", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&whole_value)), METH_FASTCALL,
     "The root's value if the tensor is all of its root in the given context, else None."},
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
  deferfuse::name_owner = PyUnicode_InternFromString("owner");
  deferfuse::name_dtype = PyUnicode_InternFromString("dtype");
  deferfuse::name_shape = PyUnicode_InternFromString("shape");
  deferfuse::name_value = PyUnicode_InternFromString("value");
  return PyModule_Create(&deferfuse::module);
}
