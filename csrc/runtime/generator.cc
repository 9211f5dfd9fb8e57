#include "runtime/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace torch_tpu {

RngKind parse_rng_kind(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "philox") return RngKind::kPhilox;
  if (v == "cpu") return RngKind::kCpu;
  throw std::invalid_argument(
      "TORCH_TPU_RNG must be 'philox' (the default: counter-based, as CUDA) or 'cpu' "
      "(CPU PyTorch's mt19937 stream), got '" +
      v + "'");
}

RngKind rng_kind() {
  static const char* value = std::getenv("TORCH_TPU_RNG");
  try {
    static const RngKind kind = parse_rng_kind(value);
    return kind;
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

TPUGeneratorImpl::TPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kTPU, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      kind_(rng_kind()),
      seed_(seed) {
  if (kind_ == RngKind::kCpu) host_ = at::make_generator<at::CPUGeneratorImpl>(seed);
}

// The cpu kind's engine is advanced by the stream's work: seeding and state
// access wait for queued work of the chip first, so they take effect between
// the ops the program issued before and after them. The philox kind reserves
// positions when ops are issued and needs no wait.
void TPUGeneratorImpl::wait_for_chip() const {
  if (kind_ == RngKind::kCpu) synchronize_device(device().index());
}

void TPUGeneratorImpl::set_current_seed(uint64_t seed) {
  wait_for_chip();
  if (kind_ == RngKind::kCpu) return host_.set_current_seed(seed);
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = 0;
}

void TPUGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(kind_ == RngKind::kPhilox,
              "tpu generators have no offset with TORCH_TPU_RNG=cpu (mt19937 is not counter-based); use set_state");
  TORCH_CHECK_VALUE(offset <= static_cast<uint64_t>(INT64_MAX),
                    "Generator.set_offset: offset must be in [0, 2**63), got ", offset);
  std::lock_guard<std::mutex> lock(mu_);
  offset_ = offset;
}

uint64_t TPUGeneratorImpl::get_offset() const {
  TORCH_CHECK(kind_ == RngKind::kPhilox,
              "tpu generators have no offset with TORCH_TPU_RNG=cpu (mt19937 is not counter-based); use get_state");
  std::lock_guard<std::mutex> lock(mu_);
  return offset_;
}

uint64_t TPUGeneratorImpl::current_seed() const {
  if (kind_ == RngKind::kCpu) return host_.current_seed();
  std::lock_guard<std::mutex> lock(mu_);
  return seed_;
}

uint64_t TPUGeneratorImpl::seed() {
  wait_for_chip();
  if (kind_ == RngKind::kCpu) return host_.seed();
  const uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

std::pair<uint64_t, uint64_t> TPUGeneratorImpl::reserve(uint64_t n) {
  TORCH_INTERNAL_ASSERT(kind_ == RngKind::kPhilox);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t offset = offset_;
  const uint64_t step = (n + 3) / 4 * 4;
  // get_state stores the offset as an int64, so it must stay below 2**63 to round-trip.
  TORCH_CHECK(step <= static_cast<uint64_t>(INT64_MAX) - offset, "tpu generator: drawing ", n,
              " numbers would move the Philox offset (", offset,
              ") past 2**63 - 1; reseed it with manual_seed or set_offset");
  offset_ = offset + step;
  return {seed_, offset};
}

void TPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK_TYPE(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                   "set_rng_state: new_state must be a torch.uint8 tensor (as get_rng_state returns), got ",
                   new_state.dtype());
  TORCH_CHECK_VALUE(new_state.device().is_cpu(), "set_rng_state: new_state must be a CPU tensor, got one on ",
                    new_state.device());
  wait_for_chip();
  if (kind_ == RngKind::kCpu) return host_.unsafeGetGeneratorImpl()->set_state(new_state);
  TORCH_CHECK_VALUE(new_state.numel() == 16,
                    "set_rng_state: new_state must have 16 bytes (seed and offset, as get_rng_state returns with "
                    "TORCH_TPU_RNG=philox), got ",
                    new_state.numel());
  at::Tensor t = at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(const_cast<c10::TensorImpl*>(&new_state)))
                     .contiguous();
  uint64_t seed = 0;
  int64_t offset = 0;
  std::memcpy(&seed, t.const_data_ptr<uint8_t>(), 8);
  std::memcpy(&offset, t.const_data_ptr<uint8_t>() + 8, 8);
  TORCH_CHECK_VALUE(offset >= 0, "set_rng_state: new_state holds a negative offset (", offset,
                    "); bytes 8..15 are the offset, an int64 >= 0");
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> TPUGeneratorImpl::get_state() const {
  wait_for_chip();
  if (kind_ == RngKind::kCpu) return host_.unsafeGetGeneratorImpl()->get_state();
  at::Tensor t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t offset = static_cast<int64_t>(offset_);
    std::memcpy(t.mutable_data_ptr<uint8_t>(), &seed_, 8);
    std::memcpy(t.mutable_data_ptr<uint8_t>() + 8, &offset, 8);
  }
  return t.getIntrusivePtr();
}

TPUGeneratorImpl* TPUGeneratorImpl::clone_impl() const {
  wait_for_chip();
  auto* copy = new TPUGeneratorImpl(device().index());
  if (kind_ == RngKind::kCpu) {
    copy->host_ = host_.clone();
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    copy->seed_ = seed_;
    copy->offset_ = offset_;
  }
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    const RngKind kind = rng_kind();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      // philox: the same default seed on every chip, as CUDA (same seed, same
      // stream); cpu: different default seeds keep chips' streams apart, as before.
      const uint64_t seed = c10::default_rng_seed_val + (kind == RngKind::kCpu ? i : 0);
      generators.push_back(at::make_generator<TPUGeneratorImpl>(i, seed));
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
