// Caching allocator for one chip's HBM.
//
// Capacity is enforced on *physical* bytes (tiled layout, see layout.h); the
// host memory that backs a block is the block's physical size, reserved with
// mmap so untouched pages cost nothing. Segments are reserved from the chip's
// capacity, split into blocks, and freed blocks are coalesced with free
// neighbours and reused. Thread-safe: blocks are freed from stream workers.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

namespace vtpu {

// Thrown when a request does not fit; what() names the chip, the request
// (physical and logical bytes), capacity, bytes in use and largest free block.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MemoryStats {
  uint64_t allocated_bytes = 0;  // physical bytes in live blocks (requests
                                 // rounded up to 512 B)
  uint64_t allocated_bytes_peak = 0;
  uint64_t logical_bytes = 0;  // bytes the tensors asked for
  uint64_t logical_bytes_peak = 0;
  uint64_t reserved_bytes = 0;  // physical bytes in segments
  uint64_t reserved_bytes_peak = 0;
  uint64_t capacity_bytes = 0;
  uint64_t largest_free_block = 0;  // largest block that can be handed out now
  uint64_t num_allocs = 0;          // allocations served since start
  uint64_t num_frees = 0;
  uint64_t active_blocks = 0;
  uint64_t segments = 0;
  uint64_t num_alloc_retries = 0;  // cache flushes to satisfy a request
  uint64_t num_ooms = 0;
};

struct Block;  // opaque outside the allocator
class Stream;

// A stream whose queued work may still touch a freed block, and how many
// items it had queued when the block was freed (Stream::enqueued_count()).
struct StreamUse {
  Stream* stream;
  uint64_t enqueued;
};

class HbmAllocator {
 public:
  HbmAllocator(int chip, uint64_t capacity_bytes);
  ~HbmAllocator();
  HbmAllocator(const HbmAllocator&) = delete;
  HbmAllocator& operator=(const HbmAllocator&) = delete;

  // Returns a block of at least `physical` bytes (physical >= logical).
  // A zero-byte request returns nullptr. Throws OutOfMemoryError.
  Block* allocate(uint64_t logical, uint64_t physical);
  // For a result that only work queued next on `stream` writes first: a block
  // freed with free_after() whose pending uses are all on `stream` (its later
  // work runs after them) and whose request had the same rounded size, the
  // most recently freed first; nullptr when there is none.
  Block* reuse_on_stream(uint64_t logical, uint64_t physical, Stream& stream);
  void free(Block* block);
  // Frees `block` in stream order, as CUDA's caching allocator does: it
  // counts as free at once (stats), and returns to the free pools once every
  // use has run the work it had queued (at most kMaxStreamUses uses). Until
  // then only allocate_on_stream() hands it out again. A request that would
  // not fit otherwise first waits for those streams (see set_stream_waiter).
  static constexpr size_t kMaxStreamUses = 4;
  void free_after(Block* block, const StreamUse* uses, size_t count);
  // How allocation waits for a stream whose queued work holds freed blocks
  // (called without the allocator's lock; never on a stream's worker thread,
  // which raises OutOfMemoryError instead). Default: Stream::wait_idle().
  using StreamWaiter = void (*)(Stream&);
  static void set_stream_waiter(StreamWaiter waiter);
  static void* data(const Block* block);
  static uint64_t size(const Block* block);  // physical bytes of the block

  // Releases cached segments that hold no live block.
  void empty_cache();
  MemoryStats stats() const;
  void reset_peak_stats();
  // Whether `ptr` points into a live block of this allocator.
  bool owns(const void* ptr) const;
  int chip() const { return chip_; }
  uint64_t capacity() const { return capacity_; }

 private:
  // ... implementation detail (segments, free lists by (size, address)) ...
  struct Impl;
  Impl* impl_;
  int chip_;
  uint64_t capacity_;
};

}  // namespace vtpu
