#include "runtime/allocator.h"

#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/errors.h"
#include "runtime/host_alias.h"
#include "vtpu/layout.h"
#include "vtpu/stream.h"

namespace torch_tpu {
namespace {

struct BlockContext {
  vtpu::HbmAllocator* hbm;
  vtpu::Block* block;
  std::atomic<bool> undefined{false};  // values never computed (a dry run) or donated
  std::mutex donor_mutex;
  std::string donor;    // the op it was donated to; empty for a dry run
  std::string failure;  // why the op that should have written it did not (mark_failed)
  // Streams whose queued work reaches the block without holding its storage (stream-ordered
  // recipes): the free waits for their work in stream order. The first is read without the
  // lock; the count and the rest are written under donor_mutex.
  std::atomic<vtpu::Stream*> first_stream{nullptr};
  size_t stream_count = 0;
  std::array<vtpu::Stream*, vtpu::HbmAllocator::kMaxStreamUses> streams{};
};

// Live storages with `undefined` set: the checks cost one load while this is 0.
std::atomic<int64_t> undefined_storages{0};

void free_block(void* ctx) {
  auto* c = static_cast<BlockContext*>(ctx);
  if (c->undefined.load(std::memory_order_relaxed)) undefined_storages.fetch_sub(1);
  if (c->first_stream.load(std::memory_order_acquire) == nullptr) {
    c->hbm->free(c->block);
  } else {
    std::array<vtpu::StreamUse, vtpu::HbmAllocator::kMaxStreamUses> uses;
    size_t n;
    {
      std::lock_guard<std::mutex> lock(c->donor_mutex);
      n = c->stream_count;
      for (size_t i = 0; i < n; ++i) uses[i] = vtpu::StreamUse{c->streams[i], c->streams[i]->enqueued_count()};
    }
    c->hbm->free_after(c->block, uses.data(), n);
  }
  delete c;
}

// Notes that `stream`'s queued work will reach `c`'s block; false when that is one stream too many.
bool note_stream_use(BlockContext* c, vtpu::Stream& stream) {
  if (c->first_stream.load(std::memory_order_relaxed) == &stream) return true;
  std::lock_guard<std::mutex> lock(c->donor_mutex);
  for (size_t i = 0; i < c->stream_count; ++i) {
    if (c->streams[i] == &stream) return true;
  }
  if (c->stream_count == c->streams.size()) return false;
  c->streams[c->stream_count++] = &stream;
  if (c->stream_count == 1) c->first_stream.store(&stream, std::memory_order_release);
  return true;
}

BlockContext* context_of(const c10::DataPtr& dp) {
  if (dp.get_deleter() != &free_block) return nullptr;
  return static_cast<BlockContext*>(dp.get_context());
}

BlockContext* context_of(const c10::Storage& s) { return s ? context_of(s.data_ptr()) : nullptr; }

void set_flag(BlockContext* c, bool v) {
  if (c && c->undefined.exchange(v) != v) undefined_storages.fetch_add(v ? 1 : -1);
}

c10::DataPtr data_ptr_of(vtpu::HbmAllocator& hbm, vtpu::Block* block, c10::Device dev) {
  void* data = vtpu::HbmAllocator::data(block);
  auto* ctx = new BlockContext{&hbm, block};
  if (dry_run()) set_flag(ctx, true);
  return c10::DataPtr(data, ctx, &free_block, dev);
}

const c10::Storage* storage_of(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kTPU || !t.has_storage()) return nullptr;
  return &t.storage();
}

}  // namespace

c10::DataPtr TPUAllocator::allocate(size_t nbytes) {
  return allocate_on(current_device(), nbytes, vtpu::physical_bytes_of_buffer(nbytes));
}

c10::DataPtr TPUAllocator::allocate_on(c10::DeviceIndex device, size_t nbytes, uint64_t physical) {
  c10::Device dev(kTPU, device);
  if (nbytes == 0) return c10::DataPtr(nullptr, dev);
  auto& hbm = chip(device).hbm();
  vtpu::Block* block = translate_errors([&] { return hbm.allocate(nbytes, physical); });
  return data_ptr_of(hbm, block, dev);
}

c10::DataPtr TPUAllocator::reuse_on(c10::DeviceIndex device, size_t nbytes, uint64_t physical, vtpu::Stream& stream) {
  c10::Device dev(kTPU, device);
  if (nbytes == 0 || dry_run()) return c10::DataPtr(nullptr, dev);
  auto& hbm = chip(device).hbm();
  vtpu::Block* block = hbm.reuse_on_stream(nbytes, physical, stream);
  return block ? data_ptr_of(hbm, block, dev) : c10::DataPtr(nullptr, dev);
}

TensorRecipe stream_ordered_recipe(const at::Tensor& t, vtpu::Stream& stream) {
  const c10::Storage& s = t.storage();
  BlockContext* c = context_of(s);
  if (c ? !note_stream_use(c, stream) : s.nbytes() != 0) return TensorRecipe::of(t);
  return TensorRecipe::of_unowned(t);
}

void TPUAllocator::recordStream(const c10::DataPtr& data, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kTPU && stream.device_index() == data.device().index(),
              "record_stream: expected a stream of ", data.device(), ", got one of ", stream.device());
  BlockContext* c = context_of(data);
  if (!c) return;  // no block of this allocator (an empty storage): nothing to order
  TORCH_CHECK(note_stream_use(c, vtpu_stream(stream)), "record_stream: the tpu storage at ", data.get(), " (",
              data.device(), ") is already used by ", vtpu::HbmAllocator::kMaxStreamUses,
              " streams, the most one block's free can wait for; synchronize one of them first");
}

bool any_undefined() { return undefined_storages.load(std::memory_order_relaxed) > 0; }

void mark_undefined(const at::Tensor& t) {
  if (const c10::Storage* s = storage_of(t)) set_flag(context_of(*s), true);
}

// Marks t's storage unreadable, with the reason `field` of its block keeps for the message.
void mark_unreadable(const at::Tensor& t, std::string BlockContext::*field, const std::string& reason) {
  const c10::Storage* s = storage_of(t);
  BlockContext* c = s ? context_of(*s) : nullptr;
  if (!c) return;
  {
    std::lock_guard<std::mutex> lock(c->donor_mutex);
    c->*field = reason;
  }
  set_flag(c, true);
}

void mark_donated(const at::Tensor& t, const std::string& op) { mark_unreadable(t, &BlockContext::donor, op); }

void mark_failed(const at::Tensor& t, const std::string& why) { mark_unreadable(t, &BlockContext::failure, why); }

void clear_undefined_if_whole(const at::Tensor& t) {
  if (!any_undefined()) return;
  const c10::Storage* s = storage_of(t);
  if (!s || !t.is_non_overlapping_and_dense()) return;
  if (static_cast<size_t>(t.numel()) * t.itemsize() != s->nbytes()) return;  // a part stays undefined
  BlockContext* c = context_of(*s);
  if (c) {
    std::lock_guard<std::mutex> lock(c->donor_mutex);
    c->donor.clear();
    c->failure.clear();
  }
  set_flag(c, false);
}

bool buffer_undefined(const c10::DataPtr& d) {
  BlockContext* c = context_of(d);
  return c && c->undefined.load(std::memory_order_relaxed);
}

void set_buffer_undefined(const c10::DataPtr& d) { set_flag(context_of(d), true); }

void check_defined(const at::Tensor& t, const std::string& what) {
  const c10::Storage* s = storage_of(t);
  if (!s || !buffer_undefined(s->data_ptr())) return;
  std::string donor, failure;
  if (BlockContext* c = context_of(*s)) {
    std::lock_guard<std::mutex> lock(c->donor_mutex);
    donor = c->donor;
    failure = c->failure;
  }
  TORCH_CHECK(failure.empty(), what, ": the tpu tensor of shape ", t.sizes(), " (", t.scalar_type(), ", ", t.device(),
              ") holds no values: ", failure);
  TORCH_CHECK(donor.empty(), what, ": the tpu tensor of shape ", t.sizes(), " (", t.scalar_type(), ", ", t.device(),
              ") was donated to ", donor,
              " (donate_argnums), which may reuse its buffer, so it holds no values now. Pass a clone to a "
              "donating op if you need the tensor afterwards, or overwrite it whole (copy_, fill_, zero_)");
  TORCH_CHECK(false, what, ": the tpu tensor of shape ", t.sizes(), " (", t.scalar_type(), ", ", t.device(),
              ") holds no values: it was written inside torch_tpu.estimate.dry_run(), which shapes, "
              "allocates and prices ops but computes nothing. Compute it again outside the dry run, or "
              "overwrite it whole (copy_, fill_, zero_) before reading it");
}

void TPUAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  // Storage-level copies are host reads/writes of device memory: wait first.
  if (dry_run()) dry_run_host_read("a storage copy");
  synchronize_device(current_device());
  std::memcpy(dest, src, count);
}

void TPUAllocator::emptyCache(c10::MempoolId_t) {
  for (c10::DeviceIndex i = 0; i < device_count(); ++i) chip(i).hbm().empty_cache();
}

c10::CachingDeviceAllocator::DeviceStats TPUAllocator::getDeviceStats(c10::DeviceIndex device) {
  auto s = chip(resolve_index(device)).hbm().stats();
  c10::CachingDeviceAllocator::DeviceStats out;
  auto set = [](c10::CachingDeviceAllocator::StatArray& a, uint64_t cur, uint64_t peak) {
    for (auto& stat : a) {
      stat.current = static_cast<int64_t>(cur);
      stat.peak = static_cast<int64_t>(peak);
    }
  };
  set(out.allocated_bytes, s.allocated_bytes, s.allocated_bytes_peak);
  set(out.active_bytes, s.allocated_bytes, s.allocated_bytes_peak);
  set(out.reserved_bytes, s.reserved_bytes, s.reserved_bytes_peak);
  set(out.requested_bytes, s.logical_bytes, s.logical_bytes_peak);
  set(out.allocation, s.active_blocks, s.active_blocks);
  set(out.active, s.active_blocks, s.active_blocks);
  set(out.segment, s.segments, s.segments);
  for (auto& stat : out.allocation) {
    stat.allocated = static_cast<int64_t>(s.num_allocs);
    stat.freed = static_cast<int64_t>(s.num_frees);
  }
  out.num_alloc_retries = static_cast<int64_t>(s.num_alloc_retries);
  out.num_ooms = static_cast<int64_t>(s.num_ooms);
  return out;
}

void TPUAllocator::resetAccumulatedStats(c10::DeviceIndex) {}

void TPUAllocator::resetPeakStats(c10::DeviceIndex device) { chip(resolve_index(device)).hbm().reset_peak_stats(); }

std::pair<size_t, size_t> TPUAllocator::getMemoryInfo(c10::DeviceIndex device) {
  auto s = chip(resolve_index(device)).hbm().stats();
  return {static_cast<size_t>(s.capacity_bytes - s.reserved_bytes), static_cast<size_t>(s.capacity_bytes)};
}

TPUAllocator& tpu_allocator() {
  static TPUAllocator allocator;
  return allocator;
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &tpu_allocator());

// An allocation that waits for streams' queued work (to reuse blocks freed in stream order)
// waits as every wait for a chip does: without the GIL, which queued Python kernels need.
const bool stream_waiter_installed = [] {
  vtpu::HbmAllocator::set_stream_waiter([](vtpu::Stream& s) { run_blocking([&] { s.wait_idle(); }); });
  return true;
}();

}  // namespace torch_tpu
