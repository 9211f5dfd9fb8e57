// The tpu allocator: PyTorch's view of each chip's HBM caching allocator.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <string>

#include "runtime/host_alias.h"
#include "vtpu/hbm_allocator.h"

namespace at {
class Tensor;
}
namespace vtpu {
class Stream;
}

namespace torch_tpu {

// Storages whose values a dry run (dry_run.h) never computed: allocated inside one, or
// written there (priced, skipped). Reading one later raises instead of returning stale
// HBM bytes; overwriting it whole (copy_, fill_, a random fill) makes it defined again.
bool any_undefined();  // one atomic load: false unless such a storage is alive
void mark_undefined(const at::Tensor& t);
void clear_undefined_if_whole(const at::Tensor& t);
// A tensor donated to op `op` (torch.tpu.pallas donate_argnums): its values are gone, as
// on a TPU where the op reuses the buffer; reading it raises naming the op, overwriting it
// whole makes it usable again.
void mark_donated(const at::Tensor& t, const std::string& op);
// A tensor an op failed to compute after its call (a deferred op's kernel raised at the
// flush): reading it raises with `why`; overwriting it whole makes it usable again.
void mark_failed(const at::Tensor& t, const std::string& why);
// Raises RuntimeError naming `what`, the tensor's shape, dtype and device if undefined.
void check_defined(const at::Tensor& t, const std::string& what);
// For a storage swapping its buffer (resize_): carries the flag to the new one.
bool buffer_undefined(const c10::DataPtr& d);
void set_buffer_undefined(const c10::DataPtr& d);

class TPUAllocator final : public c10::DeviceAllocator {
 public:
  // Untyped request (storage resize, deserialization): accounted as u8[nbytes].
  c10::DataPtr allocate(size_t nbytes) override;
  // A tensor's storage on `device`: `physical` is its tiled size (layout.h).
  // Raises torch.OutOfMemoryError naming request, capacity, usage, free block.
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes, uint64_t physical);
  // For a result only work queued next on `stream` writes first: a block freed in stream
  // order on it (vtpu::HbmAllocator::reuse_on_stream), or an empty DataPtr when none fits.
  c10::DataPtr reuse_on(c10::DeviceIndex device, size_t nbytes, uint64_t physical, vtpu::Stream& stream);
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  // Tensor.record_stream: the block's free waits for work queued on `stream` by then, as on
  // CUDA (work torch_tpu queues records its streams itself, stream_ordered_recipe). Raises
  // RuntimeError for a stream of another device, or when four streams already use the block.
  void recordStream(const c10::DataPtr& data, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;
};

TPUAllocator& tpu_allocator();

// What work queued on `stream` keeps of `t` when the stream orders its memory's reuse: the
// bytes, not the storage (TensorRecipe::of_unowned). When the last reference to the storage
// goes, its block is freed after `stream`'s work queued by then (HbmAllocator::free_after),
// as CUDA's caching allocator frees a block on the stream it was allocated on; until then
// only later results on that stream reuse it. Falls back to TensorRecipe::of (the work holds
// the storage) for storages this allocator did not make, or used by too many streams.
// Work that holds such a recipe must not outlive its stream's order (no waits on events of
// other streams that could let a later reuse run first).
TensorRecipe stream_ordered_recipe(const at::Tensor& t, vtpu::Stream& stream);
// Pinned host memory: ATen's host allocator for PrivateUse1 (host_allocator.cc), a
// caching allocator of page-aligned host blocks that count as pinned (page-locked).
c10::Allocator& pinned_allocator();
// True if `ptr` lies in a pinned host block (in use or cached).
bool is_pinned_ptr(const void* ptr);

}  // namespace torch_tpu
