// The `tpu` device guard, streams and events, mapped onto the engine's
// ordering.
//
// The engine runs work in the order the host records it (Strict's queue;
// DeferAndFuse's flushes), one total order per process. Every stream is
// therefore a name for that one order: work on stream B recorded after
// work on stream A already runs after it, so `wait_stream`/`wait_event`
// need no action. Waiting for completion (`synchronize`, `Event.query`,
// timing events) runs everything recorded so far, through the engine sync
// that the Python package hands in (`deferfuse_native_set_sync`).

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace deferfuse {
namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kTpu, 0);

using SyncFn = void (*)();
std::atomic<SyncFn> engine_sync_fn{nullptr};

void engine_sync() {
  if (SyncFn fn = engine_sync_fn.load()) {
    fn();
  }
}

// Stream 0 is the default stream; others are numbered as they are made.
thread_local c10::StreamId current_stream = 0;
std::atomic<c10::StreamId> next_stream{1};

c10::Stream make_stream(c10::StreamId id) { return c10::Stream(c10::Stream::UNSAFE, kDevice, id); }

struct EventState {
  bool timing;
  bool recorded = false;
  // When the work recorded before the event had completed (timing events only).
  double done_ms = 0.0;
};

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

void check_device(c10::Device d) {
  TORCH_CHECK(d.type() == kTpu && (!d.has_index() || d.index() == 0), "tpu: there is one device, tpu:0; got ", d);
}

struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_device(d);
    return kDevice;
  }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device d) const override { check_device(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  c10::Stream getStream(c10::Device) const override { return make_stream(current_stream); }
  c10::Stream getDefaultStream(c10::Device) const override { return make_stream(0); }
  c10::Stream getNewStream(c10::Device, int /*priority*/) const override { return make_stream(next_stream++); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool /*isHighPriority*/) const override {
    return make_stream(next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::StreamId old = current_stream;
    current_stream = s.id();
    return make_stream(old);
  }
  bool queryStream(const c10::Stream&) const override {
    engine_sync();
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override { engine_sync(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { engine_sync(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag flag)
      const override {
    TORCH_CHECK(stream.device_type() == kTpu, "tpu: an event recorded on a stream of ", stream.device());
    auto* state = static_cast<EventState*>(*event);
    if (state == nullptr) {
      state = new EventState{flag == c10::EventFlag::BACKEND_DEFAULT};
      *event = state;
    }
    state->recorded = true;
    if (state->timing) {
      // A timestamp means "the work before the event is done": run it now.
      engine_sync();
      state->done_ms = now_ms();
    }
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void* event) const override {
    auto* state = static_cast<EventState*>(event);
    if (state != nullptr && state->recorded) {
      engine_sync();
    }
    return true;
  }
  void synchronizeEvent(void* event) const override { queryEvent(event); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EventState*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<EventState*>(start);
    auto* b = static_cast<EventState*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "tpu: both events must be recorded before elapsed_time");
    TORCH_CHECK(a->timing && b->timing, "tpu: both events must be created with enable_timing=True");
    return b->done_ms - a->done_ms;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

}  // namespace
}  // namespace deferfuse

extern "C" {
// The package hands in its engine sync (a ctypes callback, which takes the GIL itself).
__attribute__((visibility("default"))) void deferfuse_native_set_sync(void (*fn)()) {
  deferfuse::engine_sync_fn.store(fn);
}
}
