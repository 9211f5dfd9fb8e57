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

class HbmAllocator {
 public:
  HbmAllocator(int chip, uint64_t capacity_bytes);
  ~HbmAllocator();
  HbmAllocator(const HbmAllocator&) = delete;
  HbmAllocator& operator=(const HbmAllocator&) = delete;

  // Returns a block of at least `physical` bytes (physical >= logical).
  // A zero-byte request returns nullptr. Throws OutOfMemoryError.
  Block* allocate(uint64_t logical, uint64_t physical);
  void free(Block* block);
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
