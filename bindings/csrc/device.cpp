// The `tpu` device's C++ core: PrivateUse1 storage, the metadata kernels
// that make views, and the accelerator hooks (the device guard, streams and
// events are in runtime.cpp, which needs only c10's light headers).
//
// Where a `tpu` tensor's value lives:
//
//   torch.Tensor ── TensorImpl (sizes, strides, storage_offset: PyTorch's own)
//                      │
//                   StorageImpl (nbytes = the true byte size of the buffer)
//                      │
//                   DataPtr (tpu:0) ── Block: the byte count, for the accounting,
//                                      and the root: the engine's cell (Python's
//                                      `_handles.Root`), one contiguous engine
//                                      buffer of nbytes / itemsize elements
//
// Views are ordinary PyTorch views: the kernels below are PyTorch's own
// metadata kernels, so sizes, strides and storage offsets are exactly
// CPU's. The ops of the hot path run in native.cpp, straight into the
// engine; every other aten op (and a hot op with arguments the native
// lowering does not cover) reaches the Python lowerings through the
// dispatcher, which read a view as an engine strided view of its storage's value.
//
// The DataPtr points at host bytes that nothing reads: PyTorch's generic
// code (resize_ copies the old bytes to the new block) may touch them, so
// they must be real memory; pages never written cost no resident memory.

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <torch/csrc/api/include/torch/version.h>
#include <torch/library.h>

#include "storage.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <cstdlib>
#include <cstring>

namespace deferfuse {
namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kTpu, 0);

// ---- storage -------------------------------------------------------------------

// Byte and allocation counts of `tpu` storages, in PyTorch's own Stat form,
// so that `torch.accelerator.memory_allocated` and friends read them
// directly and `torch.tpu.memory_stats` reports CUDA's key names.
std::mutex stats_mutex;
c10::CachingAllocator::Stat byte_stat;
c10::CachingAllocator::Stat allocation_stat;
// Live blocks by host address (guarded by stats_mutex): PyTorch's legacy
// serializer (`pickle`, `_use_new_zipfile_serialization=False`) reads a
// storage through `at::from_blob(storage.data_ptr())`, whose DataPtr names
// only the address.
std::unordered_map<const void*, Block*> blocks_by_host;

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    byte_stat.decrease(block->nbytes);
    allocation_stat.decrease(1);
    blocks_by_host.erase(block->host);
  }
  release_root(block->root);
  std::free(block->host);
  delete block;
}

struct EngineAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    // A zero-byte storage still gets a distinct non-null pointer, as CPU's do.
    void* host = std::malloc(nbytes == 0 ? 1 : nbytes);
    TORCH_CHECK(host != nullptr, "tpu: out of host memory allocating ", nbytes, " bytes");
    auto* block = new Block{nbytes, host};
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      byte_stat.increase(nbytes);
      allocation_stat.increase(1);
      blocks_by_host.emplace(host, block);
    }
    return {host, block, &free_block, kDevice};
  }

  // No raw allocations: every `tpu` buffer is a storage with its accounting.
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool initialized() override { return true; }
  // The engine frees a buffer when its last tensor dies: nothing is cached.
  void emptyCache(c10::MempoolId_t) override {}
  // One engine order: a buffer is never in use by another stream.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    std::lock_guard<std::mutex> lock(stats_mutex);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.allocated_bytes[all] = byte_stat;
    stats.reserved_bytes[all] = byte_stat;
    stats.active_bytes[all] = byte_stat;
    stats.requested_bytes[all] = byte_stat;
    stats.allocation[all] = allocation_stat;
    stats.active[all] = allocation_stat;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {
    std::lock_guard<std::mutex> lock(stats_mutex);
    byte_stat.reset_accumulated();
    allocation_stat.reset_accumulated();
  }
  void resetPeakStats(c10::DeviceIndex) override {
    std::lock_guard<std::mutex> lock(stats_mutex);
    byte_stat.reset_peak();
    allocation_stat.reset_peak();
  }
};

EngineAllocator allocator;
}  // namespace

const EngineApi* engine_api = nullptr;

Block* block_of(const c10::DataPtr& data) {
  if (data.get_deleter() == &free_block) {
    return static_cast<Block*>(data.get_context());
  }
  if (data.device().type() != kTpu) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(stats_mutex);
  auto it = blocks_by_host.find(data.get());
  return it == blocks_by_host.end() ? nullptr : it->second;
}

namespace {

// `torch.UntypedStorage(n, device="tpu")` and PyTorch's generic code find it here.
REGISTER_ALLOCATOR(kTpu, &allocator);

void check_device(std::optional<c10::Device> device) {
  if (device.has_value()) {
    TORCH_CHECK(device->type() == kTpu, "tpu: a kernel of device tpu was asked for a tensor on ", *device);
    TORCH_CHECK(!device->has_index() || device->index() == 0, "tpu: there is one device, tpu:0; got ",
                *device);
  }
}

void check_strided(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "tpu: only strided tensors exist on tpu");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "tpu: only CPU memory can be pinned");
}

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_device(device);
  check_strided(layout, pin_memory);
  return at::detail::empty_generic(size, &allocator, kKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_device(device);
  check_strided(layout, pin_memory);
  return at::detail::empty_strided_generic(size, stride, &allocator, kKeys, c10::dtype_or_default(dtype));
}

// ---- views: PyTorch's own metadata kernels ---------------------------------------

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) {
    offset = storage_offset->expect_int();
  }
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Growing a storage replaces its DataPtr (a new, larger block, as CPU
// does): the value moves to the new block, and is padded when next read.
struct KeepRoot {
  explicit KeepRoot(const c10::Storage& storage) : storage_(storage) {
    if (Block* old = block_of(storage.data_ptr())) {
      root_ = old->root;
      old->root = nullptr;
    }
  }
  ~KeepRoot() {
    Block* now = block_of(storage_.data_ptr());
    if (now != nullptr && now->root == nullptr) {
      now->root = root_;
    } else {
      release_root(root_);
    }
  }

 private:
  const c10::Storage& storage_;
  const Cell* root_ = nullptr;
};

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  KeepRoot keep(self.storage());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                        c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kTpu, "tpu: set_ of a tpu tensor to a storage on ", source.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset.expect_int(),
                                      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_whole_storage(at::Tensor& self, c10::Storage source) {
  TORCH_CHECK(source.device().type() == kTpu, "tpu: set_ of a tpu tensor to a storage on ", source.device());
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(source.device().type() == kTpu, "tpu: set_ of a tpu tensor to a tensor on ", source.device());
  return at::native::set_tensor_(self, source);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", TORCH_FN(resize));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_whole_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
}

// ---- pinned host memory ------------------------------------------------------------

// `pin_memory()` and `non_blocking=True` copies ask the accelerator for a
// pinned host allocator. The engine reads host memory directly (there is no
// DMA engine to pin for), so pinned memory is ordinary host memory, tracked
// by address range so that `is_pinned()` says true for it and its views.
std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned_ranges;

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_ranges.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  std::free(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = std::malloc(nbytes == 0 ? 1 : nbytes);
    TORCH_CHECK(ptr != nullptr, "tpu: out of host memory pinning ", nbytes, " bytes");
    {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_ranges[reinterpret_cast<uintptr_t>(ptr)] = nbytes == 0 ? 1 : nbytes;
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

bool is_pinned(const void* data) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto it = pinned_ranges.upper_bound(address);
  if (it == pinned_ranges.begin()) {
    return false;
  }
  --it;
  return address < it->first + it->second;
}

// ---- generators: `torch.Generator(device="tpu")` ---------------------------------

// A generator a user creates for the device. Its state is what the default
// one's is (deferfuse/_generator.py): a 64-bit seed and a 64-bit offset that
// each random op advances by one; the random lowerings read and advance it
// through `initial_seed`/`get_offset`/`set_offset`. The state tensor is the
// same 16 bytes as `torch.tpu.get_rng_state()`'s (seed, offset; little endian).
struct TpuGenerator final : c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::empty({kStateBytes}, at::kByte);
    std::memcpy(state.data_ptr(), &seed_, 8);
    std::memcpy(static_cast<uint8_t*>(state.data_ptr()) + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == kStateBytes &&
                    state.is_contiguous() && state.device().is_cpu(),
                "tpu generator: the state is a CPU uint8 tensor of ", kStateBytes,
                " bytes (from get_state()); got ", state.dtype().name(), " of ", state.numel(), " elements");
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&offset_, bytes + 8, 8);
  }

 private:
  static constexpr int64_t kStateBytes = 16;
  // CUDA's default seed, as the default generator's (_generator.DEFAULT_SEED).
  uint64_t seed_ = 67280421310721ULL;
  uint64_t offset_ = 0;

  TpuGenerator* clone_impl() const override {
    auto* copy = new TpuGenerator(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
};

// ---- hooks: what `torch.accelerator` and PyTorch's generic code ask -------------------

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    TORCH_CHECK(index == 0, "tpu: there is one device, tpu:0; got index ", static_cast<int>(index));
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  at::Device getDeviceFromPtr(void*) const override { return kDevice; }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<TpuGenerator>(index < 0 ? 0 : index);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // resize_bytes_nocuda would call back here; the CPU routine reallocates
    // through the storage's own allocator (ours) and copies the host bytes.
    TORCH_CHECK(storage.resizable(), "tpu: trying to resize a storage that is not resizable");
    KeepRoot keep(storage);
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
};
RegisterHooks register_hooks;

}  // namespace
}  // namespace deferfuse

// ---- the C ABI the Python package reads (through ctypes) --------------------------

extern "C" {
// The torch version this library was compiled against: the package refuses
// to load it under another one.
__attribute__((visibility("default"))) const char* deferfuse_native_torch_version() { return TORCH_VERSION; }
__attribute__((visibility("default"))) int64_t deferfuse_native_live_bytes() {
  std::lock_guard<std::mutex> lock(deferfuse::stats_mutex);
  return deferfuse::byte_stat.current;
}
__attribute__((visibility("default"))) int64_t deferfuse_native_peak_bytes() {
  std::lock_guard<std::mutex> lock(deferfuse::stats_mutex);
  return deferfuse::byte_stat.peak;
}
__attribute__((visibility("default"))) int64_t deferfuse_native_allocations() {
  std::lock_guard<std::mutex> lock(deferfuse::stats_mutex);
  return deferfuse::allocation_stat.allocated;
}
__attribute__((visibility("default"))) void deferfuse_native_reset_peak_bytes() {
  deferfuse::allocator.resetPeakStats(0);
}
}
