// Streams (one worker thread each, in-order) and events (markers in a stream).
#include "vtpu/stream.h"

#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "vtpu/cpu_spread.h"
#include "vtpu/trace.h"

namespace vtpu {

Stream::Stream(int chip, int64_t id) : chip_(chip), id_(id) { worker_ = std::thread(&Stream::run, this); }

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  worker_.join();  // run() drains the queue before it returns
}

namespace {
// Polls `done` for up to `micros` microseconds, yielding the core between
// polls; whether `done` became true. A poll with the CPU's pause instruction
// instead measured slower on this 2-core VM under load (bench/stream_burst.cc):
// when the thread it waits for shares its core, a pausing poller holds the
// core until the scheduler's tick.
template <typename Done>
bool spin_until(Done done, int micros) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

thread_local bool is_worker_thread = false;

std::atomic<Stream::ErrorFormatter>& formatter_slot() {
  static std::atomic<Stream::ErrorFormatter> slot{nullptr};
  return slot;
}
Stream::ErrorFormatter error_formatter() { return formatter_slot().load(std::memory_order_acquire); }
}  // namespace

void Stream::set_error_formatter(ErrorFormatter formatter) { formatter_slot().store(formatter); }

void Stream::enqueue(std::string op_name, std::function<void()> work) {
  push(Item{nullptr, std::move(op_name), std::move(work)});
}

void Stream::enqueue_named(const char* static_op_name, std::function<void()> work, uint64_t fresh_bytes) {
  Item item{static_op_name, std::string(), std::move(work)};
  item.fresh_bytes = fresh_bytes;
  push(std::move(item));
}

uint64_t Stream::run_ahead_bytes() {
  static const uint64_t bytes = [] {
    const char* v = std::getenv("TORCH_TPU_RUN_AHEAD_BYTES");
    if (v == nullptr || *v == '\0') return kRunAheadBytes;
    char* end = nullptr;
    const unsigned long long x = std::strtoull(v, &end, 10);
    return (end != v && *end == '\0' && v[0] != '-') ? static_cast<uint64_t>(x) : kRunAheadBytes;
  }();
  return bytes;
}

bool Stream::run_ahead_exceeded(uint64_t fresh_bytes) const {
  const uint64_t limit = run_ahead_bytes();
  if (limit == 0 || fresh_bytes == 0 || fresh_bytes == kUnsized) return false;
  if (unsized_items_.load(std::memory_order_relaxed) > 0 || sized_items_.load(std::memory_order_relaxed) < 2 ||
      sized_bytes_.load(std::memory_order_relaxed) + fresh_bytes <= limit) {
    return false;
  }
  return !on_worker_thread();
}

bool Stream::run_ahead_caught_up() const {
  // With no sized item pending, sized_bytes_ is 0: results of half the bound or more go on only then.
  return unsized_items_.load(std::memory_order_relaxed) > 0 ||
         sized_bytes_.load(std::memory_order_relaxed) <= run_ahead_bytes() / 4;
}

void Stream::wait_run_ahead(uint64_t fresh_bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!run_ahead_exceeded(fresh_bytes)) return;
  // Hysteresis: wait until the queued bytes fall to a quarter of the bound (for
  // results of half the bound or more: until none is pending), so that one
  // wake-up lets the caller queue several ops instead of one per op. Every
  // wake-up takes a core from the worker's kernels on a machine as small as its
  // OpenMP team; at 4 MiB results a wake-up per two ops instead of one cut the
  // calling thread's CPU time per op for add, cat, embedding from 13-19 to 7-10
  // us (bench/README.md, 2026-12-03).
  while (!run_ahead_caught_up()) {
    run_ahead_waiter_ = true;
    caught_up_cv_.wait(lock);
  }
}

bool Stream::run_ahead_waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_ahead_waiter_;
}

void Stream::push(Item item) {
  if (const trace::Hooks* h = trace::hooks()) {
    item.trace = h->enqueue(chip_, id_, item.name ? item.name : item.owned_name.c_str());
  }
  bool wake, waited = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueuedWork) {
      if (on_worker_thread()) throw std::logic_error("a stream's own work cannot wait for its queue");
      space_cv_.wait(lock, [this] { return queue_.size() < kMaxQueuedWork / 2; });
      waited = true;
    }
    if (item.fresh_bytes == kUnsized) {
      ++unsized_items_;
    } else if (item.fresh_bytes > 0) {
      ++sized_items_;
      sized_bytes_ += item.fresh_bytes;
    }
    queue_.push_back(std::move(item));
    queued_.store(queue_.size(), std::memory_order_release);
    pending_.fetch_add(1, std::memory_order_relaxed);
    enqueued_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  if (wake) work_cv_.notify_one();  // a spinning worker needs no (costly) wake-up
  if (waited) leave_cpu(worker_cpu_.load(std::memory_order_relaxed));
}

double Stream::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_seconds_;
}

void Stream::reset_busy_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  busy_seconds_ = 0;
}

void Stream::run() {
  is_worker_thread = true;
  std::unique_lock<std::mutex> lock(mu_);
  bool wake_waiter = false;  // a run-ahead waiter to wake once mu_ is released
  auto unlock = [&] {
    lock.unlock();
    if (wake_waiter) caught_up_cv_.notify_all();
    wake_waiter = false;
  };
  while (true) {
    if (queue_.empty() && !stop_) {
      // Ops issued back to back arrive faster than a futex wake-up: spin a
      // little before sleeping.
      unlock();
      spin_until([this] { return queued_.load(std::memory_order_acquire) != 0; }, kSpinMicroseconds);
      lock.lock();
      sleeping_ = true;
      work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      sleeping_ = false;
    }
    if (queue_.empty()) {  // stop_ and drained
      unlock();
      return;
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    queued_.store(queue_.size(), std::memory_order_release);
    std::string op_name = item.name ? std::string() : std::move(item.owned_name);
    const char* name = item.name ? item.name : op_name.c_str();
    auto work = std::move(item.work);
    const uint64_t trace_token = item.trace;
    const uint64_t fresh_bytes = item.fresh_bytes;
    if (queue_.size() == kMaxQueuedWork / 2 - 1) space_cv_.notify_all();
    busy_ = true;
    unlock();
    worker_cpu_.store(current_cpu(), std::memory_order_relaxed);

    std::string failure;
    bool failed = false;
    const auto start = std::chrono::steady_clock::now();
    try {
      work();
    } catch (const std::exception& e) {
      failed = true;
      failure = error_formatter() ? error_formatter()(std::current_exception()) : e.what();
    } catch (...) {
      failed = true;
      failure = "unknown error";
    }
    // Destroy the closure before reporting idle: it may hold the last
    // reference to memory the caller waits to see released.
    work = nullptr;

    const auto end = std::chrono::steady_clock::now();
    const std::chrono::duration<double> took = end - start;
    if (trace_token != 0) {
      if (const trace::Hooks* h = trace::hooks()) h->ran(trace_token, start, end);
    }
    lock.lock();
    if (fresh_bytes == kUnsized) {
      --unsized_items_;
    } else if (fresh_bytes > 0) {
      --sized_items_;
      sized_bytes_ -= fresh_bytes;
    }
    // Woken after mu_ is released (below), so the waiter does not wake only to
    // block on mu_ again.
    if (run_ahead_waiter_ && fresh_bytes != 0 && run_ahead_caught_up()) {
      run_ahead_waiter_ = false;
      wake_waiter = true;
    }
    busy_seconds_ += took.count();
    if (failed && error_.empty()) {
      error_op_ = name;
      error_what_ = failure;
      error_ = std::string(name) + ": " + failure;
    }
    busy_ = false;
    pending_.fetch_sub(1, std::memory_order_release);
    completed_.fetch_add(1, std::memory_order_release);
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void Stream::wait_drained(std::unique_lock<std::mutex>& lock) {
  if (pending_.load(std::memory_order_acquire) != 0) {
    lock.unlock();
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; }, kSyncSpinMicroseconds);
    lock.lock();
  }
  // The decisive check, under mu_ (the worker notifies idle_cv_ under it): a
  // poll that timed out, or work queued meanwhile by another thread, sleeps here.
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void Stream::raise_pending_error() {
  const std::string message =
      "error in asynchronously executed op '" + error_op_ + "' on tpu:" + std::to_string(chip_) + ": " + error_what_;
  error_.clear();
  error_op_.clear();
  error_what_.clear();
  throw AsyncError(message);
}

void Stream::synchronize() {
  if (on_worker_thread()) {
    throw std::logic_error("tpu:" + std::to_string(chip_) + " stream " + std::to_string(id_) +
                           ": synchronize() called from work running on the same stream "
                           "would wait for itself");
  }
  std::unique_lock<std::mutex> lock(mu_);
  wait_drained(lock);
  if (!error_.empty()) raise_pending_error();
}

void Stream::wait_idle() {
  if (on_worker_thread()) return;  // its own work: everything before it has run
  std::unique_lock<std::mutex> lock(mu_);
  wait_drained(lock);
}

bool Stream::query() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && !busy_;
}

void Stream::check_error() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) raise_pending_error();
}

bool Stream::on_worker_thread() const { return std::this_thread::get_id() == worker_.get_id(); }

bool Stream::on_any_worker_thread() { return is_worker_thread; }

void Event::record(Stream& stream) {
  auto state = std::make_shared<State>();
  stream.enqueue("event_record", [state] {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->when = std::chrono::steady_clock::now();
      state->done = true;
    }
    state->cv.notify_all();
  });
  state_ = std::move(state);
}

bool Event::query() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

void Event::synchronize() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [this] { return state_->done; });
}

void Event::block(Stream& stream) {
  if (!state_) return;  // never recorded: nothing to wait for
  std::shared_ptr<State> state = state_;
  stream.enqueue("event_wait", [state] {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&state] { return state->done; });
  });
}

double Event::elapsed_ms(const Event& end) const {
  if (!enable_timing_ || !end.enable_timing_) {
    throw std::logic_error("elapsed_ms: both events must be created with enable_timing=true");
  }
  if (!state_ || !end.state_) {
    throw std::logic_error("elapsed_ms: both events must be recorded first");
  }
  if (!query() || !end.query()) {
    throw std::logic_error("elapsed_ms: both events must have completed (synchronize one of them first)");
  }
  std::chrono::steady_clock::time_point start_time, end_time;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    start_time = state_->when;
  }
  {
    std::lock_guard<std::mutex> lock(end.state_->mu);
    end_time = end.state_->when;
  }
  return std::chrono::duration<double, std::milli>(end_time - start_time).count();
}

bool Event::recorded() const { return state_ != nullptr; }

}  // namespace vtpu
