// Per-chip random number generator.
//
// Default (TORCH_TPU_RNG=philox): counter-based, as PyTorch's CUDA generator.
// The state is (seed, offset); a random op of n elements takes the positions
// [offset, offset + n) of the Philox4x32-10 stream (see runtime/philox.h) when
// it is issued, in program order, and advances the offset by n rounded up to
// a multiple of 4 (CUDA's granularity, which DTensor's RNG tracker assumes).
// Its values depend only on the positions, never on when the chip runs it,
// so strict, debug, defer_and_fuse and compiled programs draw the same values.
//
// TORCH_TPU_RNG=cpu: the chip generator carries a host mt19937 engine (CPU
// PyTorch's), advanced by the stream's work in stream order: the same numbers
// as CPU PyTorch for the same seed and ops.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>
#include <utility>

namespace torch_tpu {

enum class RngKind { kPhilox, kCpu };
// TORCH_TPU_RNG, read once: "philox" (default) or "cpu"; others raise, naming the variable.
RngKind rng_kind();
// The variable's value parsed (for tests): throws std::invalid_argument for others.
RngKind parse_rng_kind(const char* value);

class TPUGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit TPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);
  void set_current_seed(uint64_t seed) override;  // the offset returns to 0
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  // philox: 16 bytes, the seed (uint64) then the offset (int64), native byte
  // order, as torch.distributed.tensor._random._PhiloxState reads them.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  RngKind kind() const { return kind_; }
  // philox: the (seed, offset) of the next `n` stream positions, reserved.
  std::pair<uint64_t, uint64_t> reserve(uint64_t n);
  // cpu: the engine random kernels draw from (used on the stream's worker thread).
  const at::Generator& host_engine() const { return host_; }

 private:
  TPUGeneratorImpl* clone_impl() const override;
  void wait_for_chip() const;
  RngKind kind_;
  at::Generator host_;  // cpu kind only
  mutable std::mutex mu_;
  uint64_t seed_ = 0, offset_ = 0;  // philox kind
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace torch_tpu
