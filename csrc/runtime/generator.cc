#include "runtime/generator.h"

#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <mutex>
#include <vector>

#include "runtime/device.h"

namespace torch_tpu {

TPUGeneratorImpl::TPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kTPU, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      host_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void TPUGeneratorImpl::wait_for_chip() const { synchronize_device(device().index()); }

void TPUGeneratorImpl::set_current_seed(uint64_t seed) {
  wait_for_chip();
  host_.set_current_seed(seed);
}

void TPUGeneratorImpl::set_offset(uint64_t) {
  TORCH_CHECK(false, "tpu generators have no offset (they are not counter-based); use set_state");
}

uint64_t TPUGeneratorImpl::get_offset() const {
  TORCH_CHECK(false, "tpu generators have no offset (they are not counter-based); use get_state");
}

uint64_t TPUGeneratorImpl::current_seed() const { return host_.current_seed(); }

uint64_t TPUGeneratorImpl::seed() {
  wait_for_chip();
  return host_.seed();
}

void TPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  wait_for_chip();
  host_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> TPUGeneratorImpl::get_state() const {
  wait_for_chip();
  return host_.unsafeGetGeneratorImpl()->get_state();
}

TPUGeneratorImpl* TPUGeneratorImpl::clone_impl() const {
  wait_for_chip();
  auto* copy = new TPUGeneratorImpl(device().index());
  copy->host_ = host_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      // Different default seeds keep chips' streams of random numbers apart.
      generators.push_back(at::make_generator<TPUGeneratorImpl>(i, c10::default_rng_seed_val + i));
    }
  });
  auto index = resolve_index(device);
  chip(index);  // validates
  return generators[index];
}

at::Generator new_generator(c10::DeviceIndex device) {
  auto index = resolve_index(device);
  chip(index);
  return at::make_generator<TPUGeneratorImpl>(index);
}

}  // namespace torch_tpu
