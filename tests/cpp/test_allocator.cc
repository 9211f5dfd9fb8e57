// HBM caching allocator: reuse, split/coalesce, capacity, OOM, stats, threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "vtpu/hbm_allocator.h"
#include "vtpu/layout.h"

namespace {

using vtpu::Block;
using vtpu::HbmAllocator;
using vtpu::OutOfMemoryError;

constexpr uint64_t KiB = 1ull << 10;
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

TEST(Allocator, ZeroBytesIsNull) {
  HbmAllocator hbm(0, 64 * MiB);
  EXPECT_EQ(hbm.allocate(0, 0), nullptr);
  hbm.free(nullptr);
  EXPECT_EQ(hbm.stats().num_allocs, 0u);
}

TEST(Allocator, PhysicalBelowLogicalIsRejected) {
  HbmAllocator hbm(0, 64 * MiB);
  EXPECT_THROW(hbm.allocate(8192, 4096), std::invalid_argument);
}

TEST(Allocator, MemoryIsUsableAndOwned) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* b = hbm.allocate(60, vtpu::physical_bytes({3, 5}, 4));
  ASSERT_NE(b, nullptr);
  EXPECT_GE(HbmAllocator::size(b), 4096u);
  char* p = static_cast<char*>(HbmAllocator::data(b));
  std::memset(p, 0xab, 4096);
  EXPECT_TRUE(hbm.owns(p));
  EXPECT_TRUE(hbm.owns(p + 4095));
  int stack_value = 0;
  EXPECT_FALSE(hbm.owns(&stack_value));
  hbm.free(b);
  EXPECT_FALSE(hbm.owns(p));
}

TEST(Allocator, FreedBlockIsReused) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* a = hbm.allocate(4096, 4096);
  void* first = HbmAllocator::data(a);
  hbm.free(a);
  Block* b = hbm.allocate(4096, 4096);
  EXPECT_EQ(HbmAllocator::data(b), first);
  EXPECT_EQ(hbm.stats().segments, 1u);

  Block* large = hbm.allocate(8 * MiB, 8 * MiB);
  void* large_ptr = HbmAllocator::data(large);
  hbm.free(large);
  Block* again = hbm.allocate(7 * MiB, 7 * MiB);  // best fit: the cached 8 MiB block
  EXPECT_EQ(HbmAllocator::data(again), large_ptr);
  EXPECT_EQ(hbm.stats().segments, 2u);
  hbm.free(again);
  hbm.free(b);
}

TEST(Allocator, SmallRequestsShareOneSegment) {
  HbmAllocator hbm(0, 64 * MiB);
  std::vector<Block*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(hbm.allocate(4096, 4096));
  const vtpu::MemoryStats s = hbm.stats();
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  EXPECT_EQ(s.allocated_bytes, 16 * 4096u);
  EXPECT_EQ(s.active_blocks, 16u);
  for (Block* b : blocks) hbm.free(b);
}

TEST(Allocator, LargeSegmentsRoundUpToTwoMiB) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* b = hbm.allocate(3 * MiB, 3 * MiB);
  EXPECT_EQ(hbm.stats().reserved_bytes, 4 * MiB);
  EXPECT_EQ(hbm.stats().allocated_bytes, 3 * MiB);
  hbm.free(b);
}

// With the capacity equal to one small segment, largest_free_block shows the
// cached blocks themselves.
TEST(Allocator, SplitAndCoalesceShowInLargestFreeBlock) {
  HbmAllocator hbm(0, 2 * MiB);
  Block* a = hbm.allocate(512 * KiB, 512 * KiB);
  Block* b = hbm.allocate(512 * KiB, 512 * KiB);
  Block* c = hbm.allocate(512 * KiB, 512 * KiB);
  EXPECT_EQ(hbm.stats().segments, 1u);
  EXPECT_EQ(hbm.stats().largest_free_block, 512 * KiB);  // the split-off tail

  hbm.free(b);  // not adjacent to the free tail
  EXPECT_EQ(hbm.stats().largest_free_block, 512 * KiB);
  hbm.free(a);  // coalesces with b
  EXPECT_EQ(hbm.stats().largest_free_block, 1 * MiB);
  Block* d = hbm.allocate(1 * MiB, 1 * MiB);  // fits the coalesced block exactly
  EXPECT_EQ(HbmAllocator::data(d), HbmAllocator::data(a));
  hbm.free(d);
  hbm.free(c);  // everything coalesces back into one segment-sized block
  EXPECT_EQ(hbm.stats().largest_free_block, 2 * MiB);
  EXPECT_EQ(hbm.stats().segments, 1u);
  EXPECT_EQ(hbm.stats().active_blocks, 0u);
}

TEST(Allocator, EmptyCacheReleasesOnlyIdleSegments) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* keep = hbm.allocate(4096, 4096);
  Block* big = hbm.allocate(4 * MiB, 4 * MiB);
  hbm.free(big);
  EXPECT_EQ(hbm.stats().segments, 2u);
  hbm.empty_cache();
  EXPECT_EQ(hbm.stats().segments, 1u);
  EXPECT_EQ(hbm.stats().reserved_bytes, 2 * MiB);
  hbm.free(keep);
  hbm.empty_cache();
  EXPECT_EQ(hbm.stats().segments, 0u);
  EXPECT_EQ(hbm.stats().reserved_bytes, 0u);
}

TEST(Allocator, CachedSegmentsAreReleasedToFitARequest) {
  HbmAllocator hbm(0, 16 * MiB);
  Block* a = hbm.allocate(10 * MiB, 10 * MiB);
  hbm.free(a);  // 10 MiB cached, 6 MiB unreserved
  Block* b = hbm.allocate(12 * MiB, 12 * MiB);
  ASSERT_NE(b, nullptr);
  const vtpu::MemoryStats s = hbm.stats();
  EXPECT_EQ(s.num_alloc_retries, 1u);
  EXPECT_EQ(s.num_ooms, 0u);
  EXPECT_EQ(s.reserved_bytes, 12 * MiB);
  hbm.free(b);
}

TEST(Allocator, OutOfMemoryNamesRequestAndCapacity) {
  HbmAllocator hbm(3, 32 * MiB);
  Block* held = hbm.allocate(20 * MiB, 20 * MiB);
  try {
    hbm.allocate(60 * MiB, 64 * MiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tpu:3 out of HBM memory"), std::string::npos) << m;
    EXPECT_NE(m.find("tried to allocate 64.00 MiB (physical, tiled layout; 60.00 MiB logical)"), std::string::npos)
        << m;
    EXPECT_NE(m.find("capacity 32.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("20.00 MiB allocated"), std::string::npos) << m;
    EXPECT_NE(m.find("20.00 MiB reserved"), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block 12.00 MiB"), std::string::npos) << m;
  }
  EXPECT_EQ(hbm.stats().num_ooms, 1u);

  // The allocator stays usable: what fits still fits, and freeing makes room.
  Block* fits = hbm.allocate(12 * MiB, 12 * MiB);
  ASSERT_NE(fits, nullptr);
  EXPECT_THROW(hbm.allocate(1 * MiB, 1 * MiB), OutOfMemoryError);
  hbm.free(held);
  hbm.free(fits);
  Block* whole = hbm.allocate(32 * MiB, 32 * MiB);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(hbm.stats().num_ooms, 2u);
  hbm.free(whole);
}

TEST(Allocator, OutOfMemoryUsesGiBForLargeNumbers) {
  HbmAllocator hbm(0, 32 * GiB);
  Block* held = hbm.allocate(31 * GiB, 31 * GiB);
  try {
    hbm.allocate(2 * GiB, 2 * GiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tried to allocate 2.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("capacity 32.00 GiB, 31.00 GiB allocated, 31.00 GiB reserved"), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block 1.00 GiB"), std::string::npos) << m;
  }
  hbm.free(held);
}

TEST(Allocator, StatsAndPeaks) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* a = hbm.allocate(60, 4096);
  Block* b = hbm.allocate(3 * MiB, 3 * MiB + 100);  // rounded up to 512 B
  vtpu::MemoryStats s = hbm.stats();
  EXPECT_EQ(s.capacity_bytes, 64 * MiB);
  EXPECT_EQ(s.allocated_bytes, 4096 + 3 * MiB + 512);
  EXPECT_EQ(s.logical_bytes, 60 + 3 * MiB);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.active_blocks, 2u);

  hbm.free(b);
  s = hbm.stats();
  EXPECT_EQ(s.allocated_bytes, 4096u);
  EXPECT_EQ(s.allocated_bytes_peak, 4096 + 3 * MiB + 512);
  EXPECT_EQ(s.logical_bytes_peak, 60 + 3 * MiB);
  EXPECT_EQ(s.reserved_bytes_peak, 2 * MiB + 4 * MiB);
  EXPECT_EQ(s.num_frees, 1u);

  hbm.empty_cache();
  hbm.reset_peak_stats();
  s = hbm.stats();
  EXPECT_EQ(s.allocated_bytes_peak, 4096u);
  EXPECT_EQ(s.logical_bytes_peak, 60u);
  EXPECT_EQ(s.reserved_bytes_peak, 2 * MiB);
  hbm.free(a);
}

TEST(Allocator, DoubleFreeThrows) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* a = hbm.allocate(4096, 4096);
  Block* keep = hbm.allocate(4096, 4096);  // keeps `a` from being merged away
  hbm.free(a);
  EXPECT_THROW(hbm.free(a), std::invalid_argument);
  hbm.free(keep);
}

TEST(Allocator, ConcurrentAllocFreeStress) {
  HbmAllocator hbm(0, 1 * GiB);
  constexpr int kThreads = 8;
  constexpr int kIterations = 2000;
  struct Held {
    Block* block;
    uint64_t size;
    unsigned char tag;
  };
  // Tags at both ends and the middle: overlapping blocks would overwrite them.
  auto positions = [](uint64_t size) { return std::vector<uint64_t>{0, size / 2, size - 1}; };
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<Held> held;
      for (int i = 0; i < kIterations; ++i) {
        if (held.size() < 16 && (held.empty() || rng() % 3 != 0)) {
          const uint64_t size = (rng() % 4 == 0) ? (1 + rng() % 3) * MiB : 4096 * (1 + rng() % 64);
          Held h{hbm.allocate(size, size), size, static_cast<unsigned char>(rng())};
          auto* p = static_cast<unsigned char*>(HbmAllocator::data(h.block));
          for (uint64_t at : positions(size)) p[at] = h.tag;
          held.push_back(h);
        } else {
          const size_t k = rng() % held.size();
          const Held h = held[k];
          const auto* p = static_cast<const unsigned char*>(HbmAllocator::data(h.block));
          for (uint64_t at : positions(h.size)) {
            if (p[at] != h.tag) ++failures;
          }
          hbm.free(h.block);
          held.erase(held.begin() + static_cast<long>(k));
        }
      }
      for (const Held& h : held) hbm.free(h.block);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const vtpu::MemoryStats s = hbm.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.logical_bytes, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.num_allocs, s.num_frees);
  EXPECT_EQ(s.num_ooms, 0u);
  hbm.empty_cache();
  EXPECT_EQ(hbm.stats().reserved_bytes, 0u);
  EXPECT_EQ(hbm.stats().segments, 0u);
}

}  // namespace
