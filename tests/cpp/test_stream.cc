// Streams and events: ordering, completion, sticky errors, cross-stream waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "vtpu/stream.h"

namespace {

using namespace std::chrono_literals;
using vtpu::AsyncError;
using vtpu::Event;
using vtpu::Stream;

TEST(Stream, RunsWorkInOrder) {
  Stream stream(0, 0);
  std::vector<int> order;  // touched only by the worker
  for (int i = 0; i < 1000; ++i) stream.enqueue("append", [&order, i] { order.push_back(i); });
  stream.synchronize();
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
}

TEST(Stream, EnqueueReturnsAtOnceAndQueryTracksWork) {
  Stream stream(0, 0);
  EXPECT_TRUE(stream.query());
  std::atomic<bool> release{false};
  const auto start = std::chrono::steady_clock::now();
  stream.enqueue("wait", [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_FALSE(stream.query());
  release = true;
  stream.synchronize();
  EXPECT_TRUE(stream.query());
}

TEST(Stream, OnWorkerThread) {
  Stream stream(0, 0);
  EXPECT_FALSE(stream.on_worker_thread());
  bool inside = false;
  stream.enqueue("probe", [&] { inside = stream.on_worker_thread(); });
  stream.synchronize();
  EXPECT_TRUE(inside);
}

TEST(Stream, SynchronizeFromOwnWorkerThrowsInsteadOfDeadlocking) {
  Stream stream(0, 0);
  stream.enqueue("self_sync", [&] { stream.synchronize(); });
  try {
    stream.synchronize();
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find("self_sync"), std::string::npos) << e.what();
  }
}

TEST(Stream, StickyErrorRaisedOnceNamingTheOp) {
  Stream stream(2, 0);
  std::atomic<int> ran_after{0};
  stream.enqueue("ok", [] {});
  stream.enqueue("aten::div", [] { throw std::runtime_error("division by zero"); });
  stream.enqueue("aten::mul", [] { throw std::runtime_error("second failure"); });
  stream.enqueue("later", [&] { ++ran_after; });
  try {
    stream.synchronize();
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_STREQ(e.what(), "error in asynchronously executed op 'aten::div' on tpu:2: division by zero");
  }
  EXPECT_EQ(ran_after.load(), 1);         // later work still ran
  EXPECT_NO_THROW(stream.synchronize());  // raised once, then cleared
  EXPECT_NO_THROW(stream.check_error());

  int value = 0;
  stream.enqueue("after_error", [&] { value = 7; });
  stream.synchronize();
  EXPECT_EQ(value, 7);
}

TEST(Stream, NonStdExceptionIsUnknownError) {
  Stream stream(0, 0);
  stream.enqueue("weird", [] { throw 42; });
  try {
    stream.synchronize();
    FAIL();
  } catch (const AsyncError& e) {
    EXPECT_STREQ(e.what(), "error in asynchronously executed op 'weird' on tpu:0: unknown error");
  }
}

TEST(Stream, CheckErrorDoesNotWait) {
  Stream stream(0, 0);
  stream.enqueue("bad", [] { throw std::runtime_error("boom"); });
  while (!stream.query()) std::this_thread::sleep_for(1ms);
  EXPECT_THROW(stream.check_error(), AsyncError);
  EXPECT_NO_THROW(stream.check_error());
}

TEST(Stream, DestructorDrainsQueue) {
  std::atomic<int> done{0};
  {
    Stream stream(0, 0);
    for (int i = 0; i < 100; ++i) {
      stream.enqueue("slow", [&] {
        std::this_thread::sleep_for(100us);
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 100);
}

TEST(Event, NeverRecordedIsComplete) {
  Event event;
  EXPECT_FALSE(event.recorded());
  EXPECT_TRUE(event.query());
  event.synchronize();  // returns at once
}

TEST(Event, RecordQuerySynchronize) {
  Stream stream(0, 0);
  std::atomic<bool> release{false};
  stream.enqueue("wait", [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  Event event;
  event.record(stream);
  EXPECT_TRUE(event.recorded());
  EXPECT_FALSE(event.query());
  release = true;
  event.synchronize();
  EXPECT_TRUE(event.query());
}

TEST(Event, ElapsedTime) {
  Stream stream(0, 0);
  Event start(true), end(true);
  start.record(stream);
  stream.enqueue("sleep", [] { std::this_thread::sleep_for(20ms); });
  end.record(stream);
  end.synchronize();
  const double ms = start.elapsed_ms(end);
  EXPECT_GE(ms, 15.0);
  EXPECT_LT(ms, 5000.0);
}

TEST(Event, ElapsedTimeNeedsTimingAndCompletion) {
  Stream stream(0, 0);
  Event untimed, timed(true), unrecorded(true);
  untimed.record(stream);
  timed.record(stream);
  stream.synchronize();
  EXPECT_THROW(untimed.elapsed_ms(timed), std::logic_error);
  EXPECT_THROW(timed.elapsed_ms(unrecorded), std::logic_error);

  std::atomic<bool> release{false};
  stream.enqueue("wait", [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  Event pending(true);
  pending.record(stream);
  try {
    timed.elapsed_ms(pending);
    ADD_FAILURE() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("completed"), std::string::npos) << e.what();
  }
  release = true;
  stream.synchronize();
  EXPECT_GE(timed.elapsed_ms(pending), 0.0);
}

TEST(Event, BlockMakesAnotherStreamWait) {
  Stream producer(0, 0), consumer(1, 0);
  std::atomic<bool> release{false};
  std::atomic<bool> produced{false};
  producer.enqueue("produce", [&] {
    while (!release) std::this_thread::sleep_for(1ms);
    produced = true;
  });
  Event ready;
  ready.record(producer);
  ready.block(consumer);
  bool saw_produced = false;
  consumer.enqueue("consume", [&] { saw_produced = produced.load(); });

  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(consumer.query());  // held back by the event
  release = true;
  consumer.synchronize();
  EXPECT_TRUE(saw_produced);
}

TEST(Event, BlockOnNeverRecordedEventDoesNotWait) {
  Stream stream(0, 0);
  Event event;
  event.block(stream);
  stream.synchronize();
  EXPECT_TRUE(stream.query());
}

}  // namespace

TEST(StreamBackpressure, EnqueueBlocksWhenQueueIsFullAndResumes) {
  vtpu::Stream stream(0, 7);
  std::atomic<bool> release{false};
  stream.enqueue("gate", [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::atomic<int> ran{0};
  std::atomic<bool> producer_done{false};
  const int total = static_cast<int>(vtpu::Stream::kMaxQueuedWork) * 2;
  std::thread producer([&] {
    for (int i = 0; i < total; ++i) stream.enqueue("inc", [&ran] { ran.fetch_add(1); });
    producer_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(producer_done.load());  // blocked: the gate holds the queue full
  EXPECT_EQ(ran.load(), 0);
  release = true;
  producer.join();
  stream.synchronize();
  EXPECT_EQ(ran.load(), total);
}

// Sized work (fresh result bytes): a third item over the run-ahead bound waits until the worker
// has finished one; with an unsized item pending (it may wait on another stream), or on the
// worker thread, nothing waits.
TEST(StreamRunAhead, ExceededOnceTwoSizedItemsPassTheBound) {
  ASSERT_EQ(vtpu::Stream::run_ahead_bytes(), vtpu::Stream::kRunAheadBytes);  // TORCH_TPU_RUN_AHEAD_BYTES unset
  vtpu::Stream stream(0, 8);
  const uint64_t big = vtpu::Stream::kRunAheadBytes;  // each item alone fills the bound
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  auto gated = [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ran.fetch_add(1);
  };
  stream.enqueue_named("sized", gated, big);
  stream.enqueue_named(
      "sized", [&ran] { ran.fetch_add(1); }, big);  // one pending item may always join
  std::atomic<bool> third_queued{false};
  EXPECT_TRUE(stream.run_ahead_exceeded(big));
  EXPECT_FALSE(stream.run_ahead_exceeded(0));  // unsized or empty results never wait
  EXPECT_FALSE(stream.run_ahead_exceeded(vtpu::Stream::kUnsized));
  std::thread producer([&] {
    stream.wait_run_ahead(big);
    stream.enqueue_named(
        "sized", [&ran] { ran.fetch_add(1); }, big);
    third_queued = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(third_queued.load());  // 2 items, 2x the bound pending: waits
  EXPECT_EQ(ran.load(), 0);
  release = true;
  producer.join();
  EXPECT_GE(ran.load(), 2);  // it went in once the worker had finished both pending items
  stream.synchronize();
  EXPECT_EQ(ran.load(), 3);

  // Small sized items never wait while their bytes stay under the bound.
  release = false;
  stream.enqueue_named("sized", gated, 1024);
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(stream.run_ahead_exceeded(1024));
    stream.enqueue_named(
        "small", [&ran] { ran.fetch_add(1); }, 1024);
  }
  EXPECT_EQ(ran.load(), 3);  // all queued behind the gate without waiting
  release = true;
  stream.synchronize();
  EXPECT_EQ(ran.load(), 104);
}

TEST(StreamRunAhead, UnsizedPendingWorkDisablesTheBound) {
  vtpu::Stream a(0, 9), b(0, 10);
  const uint64_t big = vtpu::Stream::kRunAheadBytes;
  vtpu::Event later;
  std::atomic<bool> release{false};
  b.enqueue("gate", [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  later.record(b);
  later.block(a);  // unsized: a waits for b's gate
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(a.run_ahead_exceeded(big));  // waiting could deadlock on b
    a.enqueue_named(
        "sized", [&ran] { ran.fetch_add(1); }, big);
  }
  EXPECT_EQ(ran.load(), 0);
  release = true;
  a.synchronize();
  EXPECT_EQ(ran.load(), 4);
}

TEST(StreamRunAhead, WorkQueuedFromTheWorkerNeverWaits) {
  vtpu::Stream stream(0, 11);
  const uint64_t big = vtpu::Stream::kRunAheadBytes;
  std::atomic<int> ran{0};
  stream.enqueue_named(
      "outer",
      [&] {
        for (int i = 0; i < 4; ++i) {
          if (stream.run_ahead_exceeded(big)) ran.fetch_add(100);  // never on the worker
          stream.enqueue_named(
              "inner", [&ran] { ran.fetch_add(1); }, big);
        }
      },
      big);
  stream.synchronize();
  EXPECT_EQ(ran.load(), 4);
}

// Queues `count` items of `bytes` fresh bytes each; the i-th runs once `released` > i, then counts
// itself in `ran`.
void enqueue_gated(vtpu::Stream& stream, int count, uint64_t bytes, std::atomic<int>& released, std::atomic<int>& ran) {
  for (int i = 0; i < count; ++i) {
    stream.enqueue_named(
        "gated",
        [&, i] {
          while (released.load() <= i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ran.fetch_add(1);
        },
        bytes);
  }
}

// Lets the first `k` gated items run, waits for them and a little longer (time for a waiter that
// should not go on to do so).
void release_and_settle(int k, std::atomic<int>& released, const std::atomic<int>& ran) {
  released = k;
  while (ran.load() < k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// Hysteresis: a caller that had to wait goes on only once the pending fresh bytes are down to
// a quarter of the bound (so one wake-up queues several ops), not as soon as the next op would fit.
TEST(StreamRunAhead, WaitResumesAtAQuarterOfTheBound) {
  vtpu::Stream stream(0, 12);
  const uint64_t eighth = vtpu::Stream::kRunAheadBytes / 8;
  std::atomic<int> released{0}, ran{0};
  enqueue_gated(stream, 8, eighth, released, ran);  // the bound full: eight items of an eighth each
  ASSERT_TRUE(stream.run_ahead_exceeded(eighth));
  std::atomic<bool> went_on{false};
  std::thread producer([&] {
    stream.wait_run_ahead(eighth);
    went_on = true;
  });
  while (!stream.run_ahead_waiting()) std::this_thread::yield();  // it waits before any item is done
  // Seven eighths pending: the next item would fit, but the caller waits on.
  release_and_settle(1, released, ran);
  EXPECT_FALSE(went_on.load());
  EXPECT_FALSE(stream.run_ahead_exceeded(eighth));  // a caller that was not waiting would not wait
  // Half pending: still waiting.
  release_and_settle(4, released, ran);
  EXPECT_FALSE(went_on.load());
  // A quarter pending: it goes on.
  released = 6;
  producer.join();
  EXPECT_TRUE(went_on.load());
  EXPECT_GE(ran.load(), 6);
  released = 8;
  stream.synchronize();
  EXPECT_EQ(ran.load(), 8);
}

// Results of half the bound or more: a caller that had to wait goes on once none is pending
// (one wake-up per two ops), not while one is still running.
TEST(StreamRunAhead, WaitForLargeResultsResumesWhenNoneIsPending) {
  vtpu::Stream stream(0, 15);
  const uint64_t half = vtpu::Stream::kRunAheadBytes / 2;
  std::atomic<int> released{0}, ran{0};
  enqueue_gated(stream, 2, half, released, ran);
  ASSERT_TRUE(stream.run_ahead_exceeded(half));
  std::atomic<bool> went_on{false};
  std::thread producer([&] {
    stream.wait_run_ahead(half);
    went_on = true;
  });
  while (!stream.run_ahead_waiting()) std::this_thread::yield();
  release_and_settle(1, released, ran);  // one pending: the next would fit, the caller waits on
  EXPECT_FALSE(went_on.load());
  released = 2;
  producer.join();
  EXPECT_EQ(ran.load(), 2);
  stream.synchronize();
}

// synchronize() and wait_idle() poll briefly before they sleep (Stream::kSyncSpinMicroseconds):
// the poll ends on the worker's count of pending items, the sleep on idle_cv_. Each must see
// every item's effects and the sticky error, whether the queue drains within the poll or not,
// and with other threads queuing meanwhile (no lost wake-up: the test would hang).
TEST(StreamSyncWait, ShortBurstsSeeAllTheirWork) {
  vtpu::Stream stream(0, 13);
  int total = 0;  // written by the worker only; read after each wait
  int expected = 0;
  for (int burst = 0; burst < 1000; ++burst) {
    const int n = 1 + burst % 7;
    for (int i = 0; i < n; ++i)
      stream.enqueue_named(
          "inc", [&total] { ++total; }, 64);
    expected += n;
    if (burst % 2) {
      stream.synchronize();
    } else {
      stream.wait_idle();
    }
    ASSERT_EQ(total, expected) << "burst " << burst;
    ASSERT_TRUE(stream.query());
  }
}

TEST(StreamSyncWait, WorkLongerThanThePollSleepsAndWakes) {
  vtpu::Stream stream(0, 14);
  std::atomic<int> done{0};
  for (int round = 0; round < 20; ++round) {
    // 2 ms: well past the poll, so the waiter sleeps on idle_cv_ and the worker must wake it.
    stream.enqueue("slow", [&done] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      done.fetch_add(1);
    });
    stream.synchronize();
    ASSERT_EQ(done.load(), round + 1);
  }
}

TEST(StreamSyncWait, ErrorOfTheLastItemRaisedAfterAShortWait) {
  vtpu::Stream stream(1, 15);
  for (int round = 0; round < 100; ++round) {
    stream.enqueue("ok", [] {});
    stream.enqueue("aten::bad", [] { throw std::runtime_error("bad input"); });
    try {
      stream.synchronize();
      FAIL() << "expected AsyncError in round " << round;
    } catch (const vtpu::AsyncError& e) {
      ASSERT_STREQ(e.what(), "error in asynchronously executed op 'aten::bad' on tpu:1: bad input");
    }
    ASSERT_NO_THROW(stream.check_error());
  }
}

TEST(StreamSyncWait, WaitersWhileAnotherThreadQueues) {
  vtpu::Stream stream(0, 16);
  std::atomic<int> ran{0};
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    for (int i = 0; !stop.load(); ++i) {
      stream.enqueue_named(
          "inc", [&ran] { ran.fetch_add(1); }, 64);
      if (i % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // lets the queue drain
    }
  });
  std::thread other_waiter([&] {
    for (int i = 0; i < 200; ++i) stream.wait_idle();
  });
  for (int i = 0; i < 200; ++i) {
    bool mine = false;  // this thread's own item: it has run once synchronize() returns
    stream.enqueue("mine", [&mine] { mine = true; });
    stream.synchronize();
    ASSERT_TRUE(mine) << "wait " << i;
  }
  stop = true;
  producer.join();
  other_waiter.join();
  const int queued_total = ran.load();  // the producer has stopped: what is left drains
  stream.synchronize();
  EXPECT_GE(ran.load(), queued_total);
  EXPECT_TRUE(stream.query());
}
