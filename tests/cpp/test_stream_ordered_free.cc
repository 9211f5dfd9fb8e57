// HbmAllocator::free_after: blocks freed while streams' queued work may still touch them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "vtpu/hbm_allocator.h"
#include "vtpu/stream.h"

namespace {

using vtpu::Block;
using vtpu::HbmAllocator;
using vtpu::Stream;
using vtpu::StreamUse;

constexpr uint64_t MiB = 1ull << 20;

// Queues one item on `stream` that runs once `open` is set; returns the enqueued count after it.
uint64_t enqueue_gate(Stream& stream, std::atomic<bool>& open) {
  stream.enqueue_named("gate", [&open] {
    while (!open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  return stream.enqueued_count();
}

// Whether allocating `bytes` raises OutOfMemoryError (the block is freed again otherwise).
bool raises_out_of_memory(HbmAllocator& hbm, uint64_t bytes) {
  try {
    hbm.free(hbm.allocate(bytes, bytes));
  } catch (const vtpu::OutOfMemoryError&) {
    return true;
  }
  return false;
}

TEST(StreamOrderedFree, CountersTrackQueuedAndRunWork) {
  Stream stream(0, 20);
  std::atomic<bool> open{false};
  EXPECT_EQ(stream.enqueued_count(), 0u);
  enqueue_gate(stream, open);
  stream.enqueue_named("after", [] {});
  EXPECT_EQ(stream.enqueued_count(), 2u);
  EXPECT_EQ(stream.completed_count(), 0u);
  open = true;
  stream.synchronize();
  EXPECT_EQ(stream.completed_count(), 2u);
}

// While the stream's work is pending, the block counts as free but only that stream's next
// result may take it; once the work has run it is an ordinary free block again.
TEST(StreamOrderedFree, PendingBlockIsReusedOnlyOnItsStream) {
  HbmAllocator hbm(0, 64 * MiB);
  Stream s(0, 21), other(0, 22);
  std::atomic<bool> open{false};
  Block* a = hbm.allocate(4 * MiB, 4 * MiB);
  void* addr = HbmAllocator::data(a);
  StreamUse use{&s, enqueue_gate(s, open)};
  hbm.free_after(a, &use, 1);
  EXPECT_EQ(hbm.stats().allocated_bytes, 0u);
  EXPECT_EQ(hbm.stats().active_blocks, 0u);

  EXPECT_EQ(hbm.reuse_on_stream(4 * MiB, 4 * MiB, other), nullptr);
  EXPECT_EQ(hbm.reuse_on_stream(2 * MiB, 2 * MiB, s), nullptr);  // another size
  Block* plain = hbm.allocate(4 * MiB, 4 * MiB);
  EXPECT_NE(HbmAllocator::data(plain), addr);  // pending: not in the free pools
  hbm.free(plain);

  Block* again = hbm.reuse_on_stream(4 * MiB, 4 * MiB, s);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(HbmAllocator::data(again), addr);
  EXPECT_EQ(hbm.stats().allocated_bytes, 4 * MiB);

  use.enqueued = enqueue_gate(s, open);
  hbm.free_after(again, &use, 1);
  open = true;
  s.synchronize();
  EXPECT_EQ(hbm.reuse_on_stream(4 * MiB, 4 * MiB, other), nullptr);  // released: not held for streams
  Block* released = hbm.allocate(4 * MiB, 4 * MiB);
  EXPECT_TRUE(HbmAllocator::data(released) == addr || hbm.stats().segments == 2u);
  hbm.free(released);
  EXPECT_EQ(hbm.stats().allocated_bytes, 0u);
  EXPECT_EQ(hbm.stats().num_allocs, hbm.stats().num_frees);
}

TEST(StreamOrderedFree, BlockWithoutPendingWorkIsFreedAtOnce) {
  HbmAllocator hbm(0, 64 * MiB);
  Stream s(0, 23);
  Block* a = hbm.allocate(4096, 4096);
  void* addr = HbmAllocator::data(a);
  s.enqueue_named("done", [] {});
  s.synchronize();
  StreamUse use{&s, s.enqueued_count()};
  hbm.free_after(a, &use, 1);
  EXPECT_EQ(hbm.reuse_on_stream(4096, 4096, s), nullptr);
  Block* b = hbm.allocate(4096, 4096);
  EXPECT_EQ(HbmAllocator::data(b), addr);
  hbm.free(b);
}

// Uses on two streams: the block waits for both; one stream's next result may take it only
// once the other stream's work has run.
TEST(StreamOrderedFree, EveryOtherStreamMustHaveRun) {
  HbmAllocator hbm(0, 64 * MiB);
  Stream s(0, 24), t(0, 25);
  std::atomic<bool> open_s{false}, open_t{false};
  Block* a = hbm.allocate(4 * MiB, 4 * MiB);
  StreamUse uses[2] = {{&s, enqueue_gate(s, open_s)}, {&t, enqueue_gate(t, open_t)}};
  hbm.free_after(a, uses, 2);
  EXPECT_EQ(hbm.reuse_on_stream(4 * MiB, 4 * MiB, s), nullptr);
  open_t = true;
  t.synchronize();
  Block* b = hbm.reuse_on_stream(4 * MiB, 4 * MiB, s);
  EXPECT_EQ(b, a);
  hbm.free(b);
  open_s = true;
  s.synchronize();
}

TEST(StreamOrderedFree, TooManyUsesAreRejected) {
  HbmAllocator hbm(0, 64 * MiB);
  Block* a = hbm.allocate(4096, 4096);
  StreamUse uses[HbmAllocator::kMaxStreamUses + 1] = {};
  EXPECT_THROW(hbm.free_after(a, uses, HbmAllocator::kMaxStreamUses + 1), std::invalid_argument);
  hbm.free(a);
}

// A request that fits only in memory still held for a stream waits for that stream's work
// instead of raising OutOfMemoryError.
TEST(StreamOrderedFree, FullCapacityWaitsForPendingWork) {
  HbmAllocator hbm(0, 16 * MiB);
  Stream s(0, 26);
  std::atomic<bool> open{false};
  Block* a = hbm.allocate(12 * MiB, 12 * MiB);
  StreamUse use{&s, enqueue_gate(s, open)};
  hbm.free_after(a, &use, 1);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    open = true;
  });
  Block* b = hbm.allocate(10 * MiB, 10 * MiB);  // another size: only the released block fits
  EXPECT_EQ(s.completed_count(), use.enqueued);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(hbm.stats().num_ooms, 0u);
  opener.join();
  hbm.free(b);
}

// On a stream's worker the allocation does not wait for streams (that stream's work could be
// waiting on the worker's own stream): it raises as before.
TEST(StreamOrderedFree, WorkerRaisesInsteadOfWaiting) {
  HbmAllocator hbm(0, 16 * MiB);
  Stream s(0, 28), t(0, 29);
  std::atomic<bool> open{false};
  Block* a = hbm.allocate(12 * MiB, 12 * MiB);
  StreamUse use{&s, enqueue_gate(s, open)};
  hbm.free_after(a, &use, 1);
  bool raised = false;
  t.enqueue_named("allocates", [&] { raised = raises_out_of_memory(hbm, 10 * MiB); });
  t.synchronize();  // returns although s is still blocked
  EXPECT_TRUE(raised);
  open = true;
  s.synchronize();
}

TEST(StreamOrderedFree, OwnWorkerRaisesInsteadOfWaiting) {
  HbmAllocator hbm(0, 16 * MiB);
  Stream s(0, 27);
  std::atomic<bool> open{false};
  Block* a = hbm.allocate(12 * MiB, 12 * MiB);
  StreamUse use{&s, enqueue_gate(s, open)};
  bool raised = false;
  s.enqueue_named("allocates", [&] { raised = raises_out_of_memory(hbm, 10 * MiB); });
  use.enqueued = s.enqueued_count();
  hbm.free_after(a, &use, 1);
  open = true;
  s.synchronize();
  EXPECT_TRUE(raised);
  EXPECT_EQ(hbm.stats().num_ooms, 1u);
}

}  // namespace
