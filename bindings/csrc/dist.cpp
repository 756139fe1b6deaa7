// `tpu_dist`'s C++ face: a c10d Backend that hands each call to the Python
// object that does the work (`deferfuse/distributed.py`: staging, the
// transport, writing back).
//
// Why not a Backend written in Python alone: c10d wraps every work such a
// backend returns in a holder that forwards only `wait` and `getFuture`, so
// `Work.is_completed()` would always say False, and `dist.recv(src=None)`
// could not learn the sender (`sourceRank`). Here each work is a `TpuWork`
// that asks the Python work for all four.
//
// Registered from Python (`_tpu_bridge.install_dist`) once
// `torch.distributed` is imported: the class derives from c10d's Backend,
// whose Python type exists only from then on.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace deferfuse {
namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

// A work of the Python side (a c10d Work from the transport, or one of
// ours), asked for everything c10d and the user ask of a work.
class TpuWork : public Work {
 public:
  explicit TpuWork(py::object work) : work_(std::move(work)) {}

  ~TpuWork() override {
    py::gil_scoped_acquire gil;
    work_ = py::object();
  }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_completed")().cast<bool>();
  }

  bool wait(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    if (timeout == kNoTimeout) {
      return work_.attr("wait")().cast<bool>();
    }
    return work_.attr("wait")(timeout).cast<bool>();
  }

  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    return work_.attr("_source_rank")().cast<int>();
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire gil;
    return work_.attr("get_future")().cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }

 private:
  py::object work_;
};

WorkPtr wrap(py::object work) {
  if (work.is_none()) {
    return WorkPtr();
  }
  return c10::make_intrusive<TpuWork>(std::move(work));
}

// Calls `impl.name(args...)` with the GIL and wraps the work it returns.
template <typename... Args>
WorkPtr forward(const py::object& impl, const char* name, Args&&... args) {
  py::gil_scoped_acquire gil;
  return wrap(impl.attr(name)(std::forward<Args>(args)...));
}

class TpuBackend : public c10d::Backend {
 public:
  TpuBackend(int rank, int size, py::object impl) : Backend(rank, size), impl_(std::move(impl)) {}

  ~TpuBackend() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  const py::object& impl() const { return impl_; }

  const std::string getBackendName() const override { return "tpu_dist"; }
  bool supportsCoalescing() const override { return true; }

  // Collectives run when called, so a coalescing window buffers nothing.
  void startCoalescing() override {}
  WorkPtr endCoalescing() override { return forward(impl_, "end_coalescing"); }

  WorkPtr broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    return forward(impl_, "broadcast", tensors, opts);
  }
  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return forward(impl_, "allreduce", tensors, opts);
  }
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override {
    return forward(impl_, "allreduce_coalesced", tensors, opts);
  }
  WorkPtr reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return forward(impl_, "reduce", tensors, opts);
  }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                    const c10d::AllgatherOptions& opts) override {
    return forward(impl_, "allgather", outputs, inputs, opts);
  }
  WorkPtr all_gather_single(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override {
    return forward(impl_, "all_gather_single", output, input, opts);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                              const c10d::AllgatherOptions& opts) override {
    return forward(impl_, "allgather_coalesced", outputs, inputs, opts);
  }
  WorkPtr all_gather_single_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                      const c10d::AllgatherOptions& opts) override {
    return forward(impl_, "all_gather_single_coalesced", outputs, inputs, opts);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                 const c10d::GatherOptions& opts) override {
    return forward(impl_, "gather", outputs, inputs, opts);
  }
  WorkPtr scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                  const c10d::ScatterOptions& opts) override {
    return forward(impl_, "scatter", outputs, inputs, opts);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    return forward(impl_, "reduce_scatter", outputs, inputs, opts);
  }
  WorkPtr reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                const c10d::ReduceScatterOptions& opts) override {
    return forward(impl_, "reduce_scatter_single", output, input, opts);
  }
  WorkPtr reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    return forward(impl_, "reduce_scatter_single_coalesced", outputs, inputs, opts);
  }
  WorkPtr all_to_all_single(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                            std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override {
    return forward(impl_, "all_to_all_single", output, input, output_splits, input_splits, opts);
  }
  WorkPtr alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                   const c10d::AllToAllOptions& opts) override {
    return forward(impl_, "alltoall", outputs, inputs, opts);
  }
  WorkPtr send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return forward(impl_, "send", tensors, dst, tag);
  }
  WorkPtr recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return forward(impl_, "recv", tensors, src, tag);
  }
  WorkPtr recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return forward(impl_, "recv_anysource", tensors, tag);
  }
  WorkPtr barrier(const c10d::BarrierOptions& opts) override { return forward(impl_, "barrier", opts); }

 private:
  py::object impl_;
};

}  // namespace

// `_tpu_bridge.install_dist()`: registers `_tpu_bridge.TpuDistBackend(rank,
// size, impl)` (once) and returns the class.
PyObject* install_dist(PyObject* module) {
  try {
    py::module_ m = py::reinterpret_borrow<py::module_>(module);
    if (!py::hasattr(m, "TpuDistBackend")) {
      py::class_<TpuBackend, c10d::Backend, c10::intrusive_ptr<TpuBackend>>(m, "TpuDistBackend")
          .def(py::init<int, int, py::object>())
          .def_property_readonly("impl", &TpuBackend::impl);
    }
    py::object cls = m.attr("TpuDistBackend");
    return cls.release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

}  // namespace deferfuse
