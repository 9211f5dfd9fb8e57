// This process's tpu devices: chip lookup, current device and current stream
// (both thread-local, as CUDA's are).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <functional>

#include "vtpu/runtime.h"

namespace torch_tpu {

constexpr c10::DeviceType kTPU = c10::DeviceType::PrivateUse1;

vtpu::Runtime& runtime();  // raises ValueError for a bad topology environment
c10::DeviceIndex device_count();
// The chip behind tpu:<index>; raises IndexError naming the valid range.
vtpu::Chip& chip(c10::DeviceIndex index);
// -1 means the current device.
c10::DeviceIndex resolve_index(c10::DeviceIndex index);

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);  // raises IndexError

c10::Stream current_stream(c10::DeviceIndex index = -1);
c10::Stream default_stream(c10::DeviceIndex index = -1);
void set_current_stream(const c10::Stream& stream);
vtpu::Stream& vtpu_stream(const c10::Stream& stream);
inline vtpu::Stream& current_vtpu_stream(c10::DeviceIndex index) { return vtpu_stream(current_stream(index)); }
// The same stream without issuing deferred work first (allocating is no reason to flush).
vtpu::Stream& current_vtpu_stream_unflushed(c10::DeviceIndex index);

// Waits for every stream of the chip; raises RuntimeError for failed work.
void synchronize_device(c10::DeviceIndex index = -1);
// Waits for the queued work of every chip without raising its errors: global
// settings a CPU kernel reads at run time (default dtype, deterministic
// algorithms, matmul precision) drain the queues before they change, so queued
// work runs with the values of its call.
void wait_all_chips_idle();
// Queues work that never waits on other streams, writing `fresh_bytes` of newly allocated
// results: first waits (through run_blocking) while the stream's run-ahead bound is exceeded
// (vtpu::Stream::run_ahead_exceeded). `static_name` outlives the work.
void enqueue_sized(vtpu::Stream& stream, const char* static_name, std::function<void()> work, uint64_t fresh_bytes);
// The run-ahead wait of enqueue_sized() on `device`'s current stream, for callers to take before
// they allocate `fresh_bytes` of results: the work it waits for frees the blocks of results the
// caller dropped, and these reuse them. No-op in a dry run; flushes no deferred work.
void wait_run_ahead_before_allocating(c10::DeviceIndex device, uint64_t fresh_bytes);
// The same on a stream the caller already holds.
void wait_run_ahead_before_allocating(vtpu::Stream& stream, uint64_t fresh_bytes);
// Waits for one stream, leaving earlier failures pending for the next synchronization.
void wait_stream_idle(vtpu::Stream& stream);
// Waits for one stream; raises RuntimeError for failed work.
void synchronize_stream(vtpu::Stream& stream);

// Every wait for a chip goes through run_blocking(): the Python bindings
// install a runner that releases the GIL meanwhile, so queued work that needs
// it (Python kernels) cannot deadlock against a waiting Python thread.
using BlockingRunner = void (*)(const std::function<void()>& wait);
void set_blocking_runner(BlockingRunner runner);
void run_blocking(const std::function<void()>& wait);

}  // namespace torch_tpu
