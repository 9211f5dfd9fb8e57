// c10 device guard for tpu: current device, streams and events.
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "runtime/device.h"
#include "runtime/errors.h"

namespace torch_tpu {
namespace {

vtpu::Event* as_event(void* event) { return static_cast<vtpu::Event*>(event); }

struct TPUGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTPU; }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kTPU, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kTPU, "expected a tpu device, got ", d);
    set_current_device(resolve_index(d.index()));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      setDevice(d);
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    auto index = resolve_index(d.index());
    int64_t id = translate_errors([&] { return chip(index).new_stream(); });
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTPU, index), id);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool = false) const override { return getNewStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = current_stream(s.device_index());
    set_current_stream(s);
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "event device index ",
                static_cast<int>(device_index), " does not match the stream's device ", stream.device());
    if (*event == nullptr) *event = new vtpu::Event(flag == c10::EventFlag::BACKEND_DEFAULT);
    auto& s = vtpu_stream(stream);
    translate_errors([&] { as_event(*event)->record(s); });
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    auto& s = vtpu_stream(stream);
    translate_errors([&] { as_event(event)->block(s); });
  }
  bool queryEvent(void* event) const override { return event == nullptr || as_event(event)->query(); }
  void synchronizeEvent(void* event) const override {
    if (event) run_blocking([&] { as_event(event)->synchronize(); });
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete as_event(event); }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "elapsed_time: both events must be recorded first");
    return translate_errors([&] { return as_event(start)->elapsed_ms(*as_event(end)); });
  }

  bool queryStream(const c10::Stream& stream) const override { return vtpu_stream(stream).query(); }
  void synchronizeStream(const c10::Stream& stream) const override {
    auto& s = vtpu_stream(stream);
    synchronize_stream(s);
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override { synchronize_device(index); }
  // torch.accelerator.get_device_capability: every dtype tpu tensors hold and compute
  // (float64/complex on the vTPU's host path, docs/limits.md); no quantized tensors.
  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    c10::DeviceCapability cap;
    auto& t = cap.capability_data.supported_scalar_types;
    t.has_QInt8 = t.has_QUInt8 = t.has_QInt32 = t.has_QUInt4x2 = t.has_QUInt2x4 = 0;
    return cap;
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, TPUGuardImpl);

}  // namespace torch_tpu
