// Pinned host memory for the tpu device: ATen's caching host allocator (the scheme CUDA's
// pinned memory uses) over page-aligned host blocks, registered as PrivateUse1's
// at::HostAllocator, so that torch.accelerator.empty_host_cache() and the host statistics
// reach it.
//
// A request is rounded up to a power of two; a freed block is cached for the next request
// of its size until empty_cache(). A block used by a stream (record_event) is reused only
// once a vtpu::Event recorded on that stream at free time is reached. The vTPU's chips
// read host memory directly, so "pinned" means: a block of this allocator, which a
// non_blocking copy may read or write after the copy call returns (ops_copy.cc).
#include "runtime/host_allocator.h"

#include <c10/core/impl/alloc_cpu.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "vtpu/stream.h"

namespace torch_tpu {
namespace {

// Every block the allocator holds (in use or cached): start address -> bytes.
std::mutex ranges_mu;
std::map<uintptr_t, size_t> ranges;

int64_t micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}

struct TPUHostAllocatorImpl final : public at::CachingHostAllocatorImpl<c10::Stream, vtpu::Event> {
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  bool pinned_use_background_threads() override { return false; }

  void allocate_host_memory(size_t size, void** ptr) override {
    auto t0 = std::chrono::steady_clock::now();
    *ptr = c10::alloc_cpu(size);  // throws c10::Error naming the size if the host is out of memory
    {
      std::lock_guard<std::mutex> lock(ranges_mu);
      ranges.emplace(reinterpret_cast<uintptr_t>(*ptr), size);
    }
    std::lock_guard<std::mutex> g(stats_.timing_mutex_);
    stats_.host_alloc_time.increase(micros_since(t0));
  }

  void free_block(at::HostBlock<c10::Stream>* block) override {
    auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(ranges_mu);
      ranges.erase(reinterpret_cast<uintptr_t>(block->ptr_));
    }
    c10::free_cpu(block->ptr_);
    std::lock_guard<std::mutex> g(stats_.timing_mutex_);
    stats_.host_free_time.increase(micros_since(t0));
  }

  void record_stream(std::optional<std::vector<vtpu::Event>>& events, c10::Stream stream) override {
    vtpu::Event event;
    event.record(vtpu_stream(stream));
    events->push_back(std::move(event));
  }

  bool query_event(vtpu::Event& event) override { return event.query(); }

  c10::Stream get_current_stream() const override { return current_stream(-1); }

  bool stream_is_capturing(c10::Stream) const override { return false; }  // no graph capture on tpu
};

void free_host_block(void* ctx);

struct TPUHostAllocator final : public at::CachingHostAllocatorInterface<TPUHostAllocatorImpl, free_host_block> {};

// Never destroyed: pinned tensors may outlive static destruction at interpreter exit.
TPUHostAllocator& instance() {
  static auto* allocator = new TPUHostAllocator();
  return *allocator;
}

void free_host_block(void* ctx) { instance().free(ctx); }

}  // namespace

at::HostAllocator& host_allocator() { return instance(); }

c10::Allocator& pinned_allocator() { return instance(); }

bool is_pinned_ptr(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(ranges_mu);
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return false;
  --it;
  return p < it->first + it->second;
}

REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &instance())

}  // namespace torch_tpu
