// PrivateUse1 hooks: how ATen asks the tpu backend for generators, pinned
// memory, device of a pointer and device counts.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <mutex>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/tensor_factory.h"

namespace torch_tpu {
namespace {

struct TPUHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  void init() const override { runtime(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index = -1) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      if (chip(i).hbm().owns(data)) return c10::Device(kTPU, i);
    }
    TORCH_CHECK(false, "pointer ", data, " is not in the HBM of any tpu device");
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

}  // namespace

void TPUHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
}

void register_hooks() {
  static TPUHooks hooks;
  static std::once_flag once;  // a second registration raises in ATen
  std::call_once(once, [] { at::RegisterPrivateUse1HooksInterface(&hooks); });
}

}  // namespace torch_tpu
