// Per-chip random number generator. Random ops run on a chip's stream with
// host kernels, so the chip's generator carries a host (mt19937) engine; it is
// only advanced by the stream's work, in stream order, which makes results
// reproducible after manual_seed and independent per chip.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace torch_tpu {

class TPUGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit TPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);
  // Seeding and state access wait for queued work of the chip first, so they
  // take effect between the ops the program issued before and after them.
  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  // The engine random kernels draw from (used on the stream's worker thread).
  const at::Generator& host_engine() const { return host_; }

 private:
  TPUGeneratorImpl* clone_impl() const override;
  void wait_for_chip() const;
  at::Generator host_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace torch_tpu
