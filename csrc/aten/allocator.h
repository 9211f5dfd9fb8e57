// The tpu allocator: PyTorch's view of each chip's HBM caching allocator.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>

#include "vtpu/hbm_allocator.h"

namespace torch_tpu {

class TPUAllocator final : public c10::DeviceAllocator {
 public:
  // Untyped request (storage resize, deserialization): accounted as u8[nbytes].
  c10::DataPtr allocate(size_t nbytes) override;
  // A tensor's storage on `device`: `physical` is its tiled size (layout.h).
  // Raises torch.OutOfMemoryError naming request, capacity, usage, free block.
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes, uint64_t physical);
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // work holds its storages
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;
};

TPUAllocator& tpu_allocator();
// Host allocator whose blocks count as pinned (page-locked) memory.
c10::Allocator& pinned_allocator();
bool is_pinned_ptr(const void* ptr);

}  // namespace torch_tpu
