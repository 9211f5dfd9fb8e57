// Streams and events of a chip: in-order work queues run by worker threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace vtpu {

// Raised at a synchronizing call after queued work failed. The message names
// the op that failed and carries the original error's message.
class AsyncError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Stream {
 public:
  // At most this many items wait in a queue: beyond it enqueue() blocks until
  // half have run, as a CUDA launch queue does. This bounds host run-ahead and
  // the memory that queued work keeps alive.
  static constexpr size_t kMaxQueuedWork = 1024;
  // How long an idle worker polls for new work (sched_yield between polls)
  // before it sleeps.
  static constexpr int kSpinMicroseconds = 50;
  // How long synchronize() and wait_idle() poll for the queue to drain, the
  // same way, before they sleep: a waiter that sleeps leaves its core idle,
  // waking it takes a futex system call on the worker and the wake-up of an
  // idle (virtual) CPU, far longer than the last few small items.
  static constexpr int kSyncSpinMicroseconds = 20;
  // Default bound on the bytes of fresh results that queued work may hold
  // before enqueue_named(..., fresh_bytes) waits (TORCH_TPU_RUN_AHEAD_BYTES).
  // 32 MiB (four 1024x1024 fp32 results per wake-up) measured slower than 8 MiB on
  // an idle machine (ops.py 1024 geomean 1.20 vs 1.04) and raised the demo's peak
  // HBM; 64 MiB made those kernels slower still (output buffers leave the cache).
  static constexpr uint64_t kRunAheadBytes = 8ull << 20;

  Stream(int chip, int64_t id);
  ~Stream();  // drains the queue, then joins the worker
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues `work` to run after everything queued before it. Returns at once
  // unless kMaxQueuedWork items are already waiting.
  // If `work` throws, the first error is kept ("sticky") with `op_name` and
  // later work still runs in order; the error is raised by the next
  // synchronize()/check_error().
  void enqueue(std::string op_name, std::function<void()> work);
  // How failed work's exception becomes the sticky error's message (the
  // framework above knows its exception types: e.g. without C++ backtraces).
  // Called inside a catch block. Default: std::exception::what().
  using ErrorFormatter = std::string (*)(std::exception_ptr);
  static void set_error_formatter(ErrorFormatter formatter);
  // Same, for a name that outlives the work (no copy on the hot path).
  // `fresh_bytes` (kUnsized: work that may wait on other streams' events) is
  // the bytes of newly allocated results the work writes, counted while the
  // item is queued or running (see wait_run_ahead).
  static constexpr uint64_t kUnsized = UINT64_MAX;
  void enqueue_named(const char* static_op_name, std::function<void()> work, uint64_t fresh_bytes = kUnsized);
  // Host run-ahead gains nothing once queued kernels are large, and every
  // queued op keeps another result buffer alive, which its kernel then writes
  // cold (CPU eager reuses the one just freed, still in cache). So before
  // queuing sized work, callers wait while run_ahead_exceeded(): two or more
  // sized items pending, their fresh bytes plus these over run_ahead_bytes(),
  // and no kUnsized item pending. Never true on the worker thread. Callers
  // wait through their blocking runner (the GIL: queued Python kernels).
  bool run_ahead_exceeded(uint64_t fresh_bytes) const;
  // Waits, when run_ahead_exceeded(fresh_bytes), until the pending fresh bytes
  // fall to a quarter of run_ahead_bytes() (or no sized item is left, or a
  // kUnsized one is pending): one wake-up per several queued ops rather than
  // one per op. The worker then idles from the last item until the caller
  // queues the next, once per wake-up instead of being preempted once per op.
  void wait_run_ahead(uint64_t fresh_bytes);
  // Whether a caller is waiting in wait_run_ahead() now.
  bool run_ahead_waiting() const;
  // The run-ahead bound: TORCH_TPU_RUN_AHEAD_BYTES (a byte
  // count; 0 turns the bound off), default kRunAheadBytes.
  static uint64_t run_ahead_bytes();
  // Blocks until all queued work has run; throws AsyncError if any failed
  // (the error is cleared once raised, so the stream stays usable).
  void synchronize();
  bool query() const;  // true when nothing is queued or running
  // Blocks until all queued work has run, leaving a pending error for the next
  // synchronize() (global settings drain the queue this way before changing).
  void wait_idle();
  void check_error();  // throws a pending AsyncError without waiting
  int chip() const { return chip_; }
  int64_t id() const { return id_; }
  // Whether the calling thread is this stream's worker.
  bool on_worker_thread() const;
  // Whether the calling thread is any stream's worker.
  static bool on_any_worker_thread();
  // Host seconds the worker has spent running work (measured), since start
  // or the last reset_busy_seconds().
  double busy_seconds() const;
  void reset_busy_seconds();
  // Items queued since start, and items that have run (their closures
  // destroyed): work queued before the enqueued_count() read at some moment
  // has run once completed_count() reaches it. Stream-ordered frees
  // (HbmAllocator::free_after) tag blocks with these.
  uint64_t enqueued_count() const { return enqueued_.load(std::memory_order_acquire); }
  uint64_t completed_count() const { return completed_.load(std::memory_order_acquire); }

 private:
  void run();
  // Blocks until nothing is queued or running: polls (see
  // kSyncSpinMicroseconds), then sleeps on idle_cv_. Returns with mu_ held.
  void wait_drained(std::unique_lock<std::mutex>& lock);
  // Whether a run-ahead waiter may go on (see wait_run_ahead).
  bool run_ahead_caught_up() const;
  // Clears the pending error and throws it as AsyncError. Needs mu_ held.
  [[noreturn]] void raise_pending_error();
  int chip_;
  int64_t id_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_, space_cv_;
  struct Item {
    const char* name;  // static_op_name, or owned_name.c_str()
    std::string owned_name;
    std::function<void()> work;
    uint64_t trace = 0;  // profiler token (vtpu/trace.h), 0 when not traced
    uint64_t fresh_bytes = kUnsized;
  };
  void push(Item item);
  std::deque<Item> queue_;
  bool sleeping_ = false;  // worker waits on work_cv_ (guarded by mu_)
  // Where the worker ran its last item: a thread it woke moves off that CPU (cpu_spread.h).
  std::atomic<int> worker_cpu_{-1};
  std::atomic<size_t> queued_{0};  // queue_.size(), readable without mu_
  bool busy_ = false;
  // Items queued or running: written under mu_ (after an item's bookkeeping),
  // polled without it by wait_drained().
  std::atomic<size_t> pending_{0};
  std::atomic<uint64_t> enqueued_{0}, completed_{0};  // written under mu_
  // Queued or running items with fresh_bytes > 0: their count and bytes; and
  // the count of kUnsized ones (guarded by mu_).
  // Written under mu_; read without it by run_ahead_exceeded().
  std::atomic<uint64_t> sized_items_{0}, sized_bytes_{0}, unsized_items_{0};
  bool run_ahead_waiter_ = false;
  std::condition_variable caught_up_cv_;
  double busy_seconds_ = 0;
  bool stop_ = false;
  std::string error_;                  // empty when no error is pending
  std::string error_op_, error_what_;  // the parts of error_: "<op>: <what>"
  std::thread worker_;
};

// A marker in a stream's work; completes when the stream reaches it.
class Event {
 public:
  explicit Event(bool enable_timing = false) : enable_timing_(enable_timing) {}
  // Marks the point after all work queued so far on `stream`.
  void record(Stream& stream);
  bool query() const;        // true if never recorded or reached
  void synchronize() const;  // blocks the caller until reached
  // Makes `stream` wait for this event before running later work.
  void block(Stream& stream);
  // Milliseconds between this event and `end` (both recorded with timing and
  // reached). Throws std::logic_error otherwise.
  double elapsed_ms(const Event& end) const;
  bool recorded() const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::chrono::steady_clock::time_point when;
  };
  bool enable_timing_;
  std::shared_ptr<State> state_;  // the latest record()
};

}  // namespace vtpu
