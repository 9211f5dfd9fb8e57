#include "runtime/device.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "defer/defer.h"
#include "runtime/dry_run.h"
#include "runtime/errors.h"
#include "runtime/kernel_warnings.h"

namespace torch_tpu {
namespace {

thread_local c10::DeviceIndex tls_device = 0;
// Current stream id per device for this thread; 0 is the default stream.
thread_local std::vector<int64_t> tls_streams;

}  // namespace

namespace {
std::atomic<BlockingRunner> blocking_runner{nullptr};

// Sticky errors keep the failing kernel's message without its C++ backtrace.
std::string format_async_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}
}  // namespace

vtpu::Runtime& runtime() {
  static std::once_flag once;
  std::call_once(once, [] { vtpu::Stream::set_error_formatter(&format_async_error); });
  return translate_errors([]() -> vtpu::Runtime& { return vtpu::Runtime::get(); });
}

c10::DeviceIndex device_count() { return static_cast<c10::DeviceIndex>(runtime().device_count()); }

vtpu::Chip& chip(c10::DeviceIndex index) {
  return translate_errors([&]() -> vtpu::Chip& { return runtime().chip(index); });
}

c10::DeviceIndex resolve_index(c10::DeviceIndex index) { return index < 0 ? tls_device : index; }

c10::DeviceIndex current_device() { return tls_device; }

void set_current_device(c10::DeviceIndex index) {
  chip(index);  // validates
  tls_device = index;
}

c10::Stream current_stream(c10::DeviceIndex index) {
  index = resolve_index(index);
  chip(index);
  int64_t id = index < static_cast<int64_t>(tls_streams.size()) ? tls_streams[index] : 0;
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTPU, index), id);
}

c10::Stream default_stream(c10::DeviceIndex index) {
  index = resolve_index(index);
  chip(index);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTPU, index), 0);
}

void set_current_stream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kTPU, "expected a tpu stream, got ", stream);
  translate_errors([&] { chip(stream.device_index()).stream(stream.id()); });  // validates
  auto index = stream.device_index();
  if (static_cast<int64_t>(tls_streams.size()) <= index) tls_streams.resize(index + 1, 0);
  tls_streams[index] = stream.id();
}

vtpu::Stream& vtpu_stream(const c10::Stream& stream) {
  auto& c = chip(stream.device_index());
  defer_before_stream_use(stream.device_index());  // deferred work is issued before other stream use
  return translate_errors([&]() -> vtpu::Stream& { return c.stream(stream.id()); });
}

void set_blocking_runner(BlockingRunner runner) { blocking_runner.store(runner); }

void run_blocking(const std::function<void()>& wait) {
  BlockingRunner runner = blocking_runner.load();
  if (runner) {
    runner(wait);
  } else {
    wait();
  }
}

// Waits; then the calling thread gets the warnings of the work it queued.
template <typename Wait>
void wait_then_warn(Wait&& wait) {
  try {
    translate_errors([&] { run_blocking(wait); });
  } catch (...) {
    deliver_queued_warnings();
    throw;
  }
  deliver_queued_warnings();
}

void synchronize_device(c10::DeviceIndex index) {
  auto& c = chip(resolve_index(index));
  defer_flush_device(resolve_index(index));
  wait_then_warn([&] { c.synchronize(); });
}

void wait_all_chips_idle() {
  vtpu::Runtime* rt;
  try {
    rt = &runtime();
  } catch (...) {
    return;  // no runtime: nothing queued
  }
  for (int i = 0; i < rt->device_count(); ++i) {
    defer_flush_device(static_cast<c10::DeviceIndex>(i));
    auto& c = rt->chip(i);
    run_blocking([&] { c.wait_idle(); });
  }
}

void wait_run_ahead_before_allocating(vtpu::Stream& stream, uint64_t fresh_bytes) {
  if (stream.run_ahead_exceeded(fresh_bytes)) run_blocking([&] { stream.wait_run_ahead(fresh_bytes); });
}

vtpu::Stream& current_vtpu_stream_unflushed(c10::DeviceIndex index) {
  auto& c = chip(index);
  const int64_t id = current_stream(index).id();
  return translate_errors([&]() -> vtpu::Stream& { return c.stream(id); });
}

void wait_run_ahead_before_allocating(c10::DeviceIndex device, uint64_t fresh_bytes) {
  if (fresh_bytes == 0 || dry_run()) return;
  wait_run_ahead_before_allocating(current_vtpu_stream_unflushed(device), fresh_bytes);
}

void enqueue_sized(vtpu::Stream& stream, const char* static_name, std::function<void()> work, uint64_t fresh_bytes) {
  wait_run_ahead_before_allocating(stream, fresh_bytes);
  stream.enqueue_named(static_name, std::move(work), fresh_bytes);
}

void wait_stream_idle(vtpu::Stream& stream) {
  defer_flush_device(static_cast<c10::DeviceIndex>(stream.chip()));
  translate_errors([&] { run_blocking([&] { stream.wait_idle(); }); });
}

void synchronize_stream(vtpu::Stream& stream) {
  defer_flush_device(static_cast<c10::DeviceIndex>(stream.chip()));
  wait_then_warn([&] { stream.synchronize(); });
}

}  // namespace torch_tpu
