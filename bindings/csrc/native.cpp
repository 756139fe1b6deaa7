// The hot path: one C++ kernel for each aten op the engine lowers natively
// (bindings/src/native/ops.rs lists them), registered for PrivateUse1 by
// `_tpu_bridge.install_native` once the Python package has registered its
// own kernels.
//
// The kernel reads its arguments off PyTorch's stack into the engine's C
// records (engine_api.h) and makes one call into the engine, without the
// GIL: the engine records the op in the calling thread's context and hands
// back fresh roots, which become the storages of new `tpu` tensors. When the
// engine answers NOT_HANDLED (a view it cannot read in place, a value in
// another context, a dtype it keeps on the CPU, ...), the kernel runs the
// op's Python kernel instead, which covers every case; nothing was recorded
// or written by then.

#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <array>
#include <forward_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "storage.h"

namespace deferfuse {
namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

// The records of one call, and the memory their pointers point into.
struct Marshal {
  c10::SmallVector<Arg, 8> args;
  std::forward_list<std::vector<Arg>> lists;
  std::forward_list<std::vector<int64_t>> ints;
  // Room for the results: one per tensor among the arguments, at least 4.
  size_t results = 4;
};

// A zero-dimensional CPU tensor among the operands (how PyTorch passes the
// `1.0` of `x + 1.0`) is a number, as the Python path's `_unwrap` reads it.
bool cpu_scalar(const at::Tensor& t, Arg& a) {
  const void* data = t.const_data_ptr();
  switch (t.scalar_type()) {
    case c10::ScalarType::Double:
      a.kind = arg_kind::kFloat;
      a.float_value = *static_cast<const double*>(data);
      return true;
    case c10::ScalarType::Float:
      a.kind = arg_kind::kFloat;
      a.float_value = *static_cast<const float*>(data);
      return true;
    case c10::ScalarType::Long:
      a.kind = arg_kind::kInt;
      a.int_value = *static_cast<const int64_t*>(data);
      return true;
    case c10::ScalarType::Int:
      a.kind = arg_kind::kInt;
      a.int_value = *static_cast<const int32_t*>(data);
      return true;
    case c10::ScalarType::Bool:
      a.kind = arg_kind::kBool;
      a.int_value = *static_cast<const bool*>(data) ? 1 : 0;
      return true;
    default:
      return false;
  }
}

bool tensor_arg(const at::Tensor& t, Arg& a) {
  if (!t.defined()) {
    a.kind = arg_kind::kNone;
    return true;
  }
  if (t.device().type() == c10::DeviceType::PrivateUse1) {
    Block* block = t.has_storage() ? block_of(t.storage().data_ptr()) : nullptr;
    if (block == nullptr) {
      return false;
    }
    if (block->root == nullptr) {
      // A storage PyTorch allocated itself (`empty`, then `zero_`): its
      // bytes read as zeros, so its root is made of zeros here.
      const int64_t numel = static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.itemsize());
      block->root = engine_api->root_zeros(numel, static_cast<int8_t>(t.scalar_type()));
      if (block->root == nullptr) {
        return false;
      }
    }
    a.kind = arg_kind::kTensor;
    a.dtype = static_cast<int8_t>(t.scalar_type());
    a.len = static_cast<uint32_t>(t.dim());
    a.cell = block->root;
    a.sizes = t.sizes().data();
    a.strides = t.strides().data();
    a.int_value = t.storage_offset();
    return true;
  }
  return t.device().is_cpu() && t.dim() == 0 && cpu_scalar(t, a);
}

bool scalar_arg(const c10::Scalar& s, Arg& a) {
  if (s.isBoolean()) {
    a.kind = arg_kind::kBool;
    a.int_value = s.toBool() ? 1 : 0;
  } else if (s.isIntegral(false)) {
    a.kind = arg_kind::kInt;
    a.int_value = s.toLong();
  } else if (s.isFloatingPoint()) {
    a.kind = arg_kind::kFloat;
    a.float_value = s.toDouble();
  } else {
    return false;  // complex, symbolic
  }
  return true;
}

bool value_arg(const c10::IValue& v, Arg& a, Marshal& m);

bool list_arg(c10::ArrayRef<c10::IValue> items, Arg& a, Marshal& m) {
  auto& out = m.lists.emplace_front(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!value_arg(items[i], out[i], m)) {
      return false;
    }
  }
  a.kind = arg_kind::kList;
  a.len = static_cast<uint32_t>(items.size());
  a.items = out.data();
  m.results += items.size();
  return true;
}

bool value_arg(const c10::IValue& v, Arg& a, Marshal& m) {
  if (v.isNone()) {
    a.kind = arg_kind::kNone;
  } else if (v.isTensor()) {
    return tensor_arg(v.toTensor(), a);
  } else if (v.isBool()) {
    a.kind = arg_kind::kBool;
    a.int_value = v.toBool() ? 1 : 0;
  } else if (v.isInt()) {
    a.kind = arg_kind::kInt;
    a.int_value = v.toInt();
  } else if (v.isDouble()) {
    a.kind = arg_kind::kFloat;
    a.float_value = v.toDouble();
  } else if (v.isScalar()) {
    return scalar_arg(v.toScalar(), a);
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    a.kind = arg_kind::kStr;
    a.str = s.data();
    a.len = static_cast<uint32_t>(s.size());
  } else if (v.isIntList() || v.isBoolList()) {
    auto& ints = m.ints.emplace_front();
    for (const c10::IValue& item : v.toListRef()) {
      ints.push_back(item.isBool() ? item.toBool() : item.toInt());
    }
    a.kind = arg_kind::kIntList;
    a.sizes = ints.data();
    a.len = static_cast<uint32_t>(ints.size());
  } else if (v.isList()) {
    return list_arg(v.toListRef(), a, m);
  } else {
    return false;  // devices, layouts as objects, generators, ...
  }
  return true;
}

// Raises the Python error the engine set, as the exception PyTorch's
// Python bindings turn back into it.
[[noreturn]] void throw_engine_error(void* error) {
  pybind11::gil_scoped_acquire gil;
  engine_api->raise_error(error);
  python_error e;
  e.persist();
  throw std::move(e);
}

at::Tensor result(const Out& out, c10::ArrayRef<c10::IValue> inputs) {
  if (out.cell == nullptr) {
    return out.input < 0 ? at::Tensor() : inputs.at(out.input).toTensor();
  }
  at::Tensor t = at::detail::empty_generic(c10::IntArrayRef(out.sizes, out.rank),
                                           c10::GetAllocator(c10::DeviceType::PrivateUse1), kKeys,
                                           static_cast<c10::ScalarType>(out.dtype), std::nullopt);
  block_of(t.storage().data_ptr())->root = out.cell;
  return t;
}

// An argument as a Python kernel receives it: dtypes, layouts and memory
// formats, which an IValue holds as integers, become torch objects.
pybind11::object to_python(c10::IValue value, const c10::TypePtr& declared) {
  c10::TypePtr type = declared;
  if (const auto* optional = type->castRaw<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  if (value.isInt()) {
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return pybind11::reinterpret_borrow<pybind11::object>(
            reinterpret_cast<PyObject*>(torch::getTHPDtype(value.toScalarType())));
      case c10::TypeKind::LayoutType:
        return pybind11::reinterpret_borrow<pybind11::object>(
            reinterpret_cast<PyObject*>(torch::getTHPLayout(value.toLayout())));
      case c10::TypeKind::MemoryFormatType:
        return pybind11::reinterpret_borrow<pybind11::object>(
            torch::utils::getTHPMemoryFormat(value.toMemoryFormat()));
      default:
        break;
    }
  }
  return torch::jit::toPyObject(std::move(value));
}

// The op's Python kernel, called as PyTorch calls a kernel registered
// from Python: positional arguments by position, keyword-only ones by name.
void run_python(const c10::OperatorHandle& op, PyObject* python, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  auto arguments = torch::jit::pop(*stack, schema.arguments().size());
  pybind11::gil_scoped_acquire gil;
  pybind11::list args;
  pybind11::dict kwargs;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::Argument& a = schema.arguments()[i];
    pybind11::object value = to_python(std::move(arguments[i]), a.real_type());
    if (a.kwarg_only()) {
      kwargs[pybind11::str(a.name())] = value;
    } else {
      args.append(value);
    }
  }
  PyObject* out = PyObject_Call(python, pybind11::tuple(args).ptr(), kwargs.ptr());
  if (out == nullptr) {
    python_error e;
    e.persist();
    throw std::move(e);
  }
  auto result = pybind11::reinterpret_steal<pybind11::object>(out);
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, returns[0].type()));
  } else if (returns.size() > 1) {
    auto items = result.cast<pybind11::tuple>();
    for (size_t i = 0; i < returns.size(); ++i) {
      stack->push_back(torch::jit::toIValue(items[i], returns[i].type()));
    }
  }
}

class NativeKernel final : public c10::OperatorKernel {
 public:
  // `python`: the op's Python kernel (a new reference, kept for the process).
  NativeKernel(uint32_t id, PyObject* python) : id_(id), python_(python) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (!run_native(op, stack)) {
      run_python(op, python_, stack);
    }
  }

 private:
  bool run_native(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    if (engine_api == nullptr) {
      return false;
    }
    const size_t n = op.schema().arguments().size();
    const c10::ArrayRef<c10::IValue> inputs = torch::jit::last(*stack, n);
    Marshal m;
    m.args.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (!value_arg(inputs[i], m.args[i], m)) {
        return false;
      }
    }
    c10::SmallVector<Out, 4> outs(m.results);
    size_t count = 0;
    void* error = nullptr;
    const int32_t status = engine_api->call(id_, m.args.data(), n, outs.data(), outs.size(), &count, &error);
    if (status == kNotHandled) {
      return false;
    }
    if (status == kFailed) {
      throw_engine_error(error);
    }
    // Every fresh root is adopted by a tensor, or released if making one throws.
    size_t adopted = 0;
    try {
      c10::SmallVector<c10::IValue, 2> results;
      for (const c10::Argument& ret : op.schema().returns()) {
        if (ret.type()->kind() == c10::TypeKind::ListType) {
          std::vector<at::Tensor> list;
          for (; adopted < count; ++adopted) {
            list.push_back(result(outs[adopted], inputs));
          }
          results.emplace_back(std::move(list));
        } else {
          TORCH_CHECK(adopted < count, "deferfuse: native ", op.schema().name(), " returned too few results");
          results.emplace_back(result(outs[adopted], inputs));
          ++adopted;
        }
      }
      torch::jit::drop(*stack, n);
      for (auto& r : results) {
        stack->push_back(std::move(r));
      }
    } catch (...) {
      for (; adopted < count; ++adopted) {
        release_root(outs[adopted].cell);
      }
      throw;
    }
    return true;
  }

  uint32_t id_;
  PyObject* python_;
};

// ---- unboxed kernels ----------------------------------------------------------------

// The commonest signatures skip boxing their arguments into a stack: each
// has kSlots instances of its kernel, one per op, which find their op here.
struct Route {
  uint32_t id = 0;
  PyObject* python = nullptr;
  std::optional<c10::OperatorHandle> op;
};

enum Signature : size_t { kUnary, kBinary, kBinaryScalar, kSignatures };
constexpr size_t kSlots = 48;
std::array<std::array<Route, kSlots>, kSignatures> routes;
std::array<size_t, kSignatures> routes_used{};

bool marshal(const at::Tensor& t, Arg& a) { return tensor_arg(t, a); }
bool marshal(const c10::Scalar& s, Arg& a) { return scalar_arg(s, a); }

template <typename... Inputs>
at::Tensor unboxed(const Route& route, const Inputs&... inputs) {
  Arg args[sizeof...(Inputs)];
  size_t i = 0;
  if (engine_api != nullptr && (marshal(inputs, args[i++]) && ...)) {
    Out out;
    size_t count = 0;
    void* error = nullptr;
    const int32_t status = engine_api->call(route.id, args, sizeof...(Inputs), &out, 1, &count, &error);
    if (status == kFailed) {
      throw_engine_error(error);
    }
    if (status == kDone) {
      TORCH_CHECK(count == 1 && out.cell != nullptr, "deferfuse: native ", route.op->schema().name(),
                  " did not return one fresh value");
      return result(out, {});
    }
  }
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Inputs));
  (stack.emplace_back(inputs), ...);
  run_python(*route.op, route.python, &stack);
  return stack.back().toTensor();
}

template <size_t I>
at::Tensor unary_kernel(const at::Tensor& a) {
  return unboxed(routes[kUnary][I], a);
}
template <size_t I>
at::Tensor binary_kernel(const at::Tensor& a, const at::Tensor& b) {
  return unboxed(routes[kBinary][I], a, b);
}
template <size_t I>
at::Tensor binary_scalar_kernel(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha) {
  return unboxed(routes[kBinaryScalar][I], a, b, alpha);
}

template <size_t... I>
void register_unboxed(torch::Library& lib, const char* name, Signature sig, size_t slot, std::index_sequence<I...>) {
  constexpr std::array unary{&unary_kernel<I>...};
  constexpr std::array binary{&binary_kernel<I>...};
  constexpr std::array binary_scalar{&binary_scalar_kernel<I>...};
  switch (sig) {
    case kUnary:
      lib.impl(name, unary[slot]);
      break;
    case kBinary:
      lib.impl(name, binary[slot]);
      break;
    default:
      lib.impl(name, binary_scalar[slot]);
      break;
  }
}

bool plain_tensor(const c10::Argument& a) {
  return a.type()->kind() == c10::TypeKind::TensorType && a.alias_info() == nullptr;
}

// Which unboxed kernel fits a schema, or kSignatures for none.
Signature signature_of(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  if (rets.size() != 1 || !plain_tensor(rets[0]) || args.empty() || !plain_tensor(args[0])) {
    return kSignatures;
  }
  if (args.size() == 1) {
    return kUnary;
  }
  if (!plain_tensor(args[1])) {
    return kSignatures;
  }
  if (args.size() == 2) {
    return kBinary;
  }
  const bool scalar = args.size() == 3 && args[2].type()->kind() == c10::TypeKind::NumberType;
  return scalar ? kBinaryScalar : kSignatures;
}

// Registers op `name`'s kernel: unboxed when its signature has a free slot, else boxed.
void register_kernel(torch::Library& lib, const char* name, uint32_t id, PyObject* python) {
  const std::string full(name);
  const size_t dot = full.find('.');
  const auto op = c10::Dispatcher::singleton().findSchema(
      {"aten::" + full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1)});
  const Signature sig = op.has_value() ? signature_of(op->schema()) : kSignatures;
  if (sig == kSignatures || routes_used[sig] == kSlots) {
    lib.impl(name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<NativeKernel>(id, python)));
    return;
  }
  const size_t slot = routes_used[sig]++;
  routes[sig][slot] = Route{id, python, op};
  register_unboxed(lib, name, sig, slot, std::make_index_sequence<kSlots>{});
}

// The registrations live as long as the process.
std::vector<std::unique_ptr<torch::Library>> libraries;

}  // namespace

PyObject* install_native(PyObject* ops) {
  if (engine_api == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "deferfuse: _tpu_bridge.install was not called");
    return nullptr;
  }
  PyObject* items = PySequence_Fast(ops, "install_native: expected a list of (name, id, kernel)");
  if (items == nullptr) {
    return nullptr;
  }
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                __FILE__, __LINE__);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
      const char* name = nullptr;
      unsigned int id = 0;
      PyObject* kernel = nullptr;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "sIO", &name, &id, &kernel)) {
        Py_DECREF(items);
        return nullptr;
      }
      Py_INCREF(kernel);
      register_kernel(*lib, name, id, kernel);
    }
    libraries.push_back(std::move(lib));
  } catch (const std::exception& e) {
    Py_DECREF(items);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_DECREF(items);
  Py_RETURN_NONE;
}

}  // namespace deferfuse
