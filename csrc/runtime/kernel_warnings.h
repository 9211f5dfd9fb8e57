// Warnings of kernels that run on a chip's worker thread reach the thread
// that issued the op, once, through c10's warning handler of that thread
// (Python's warnings module inside a Python call).
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace torch_tpu {

// Runs `work` (on a worker thread) with a handler that collects its warnings
// instead of printing them; warnings whose message is in `known` (already
// given by the op's meta kernel at the call) are dropped. When `work` throws,
// its warnings are dropped with it (the sticky error is what the caller gets).
std::vector<c10::Warning> run_collecting_warnings(const std::function<void()>& work,
                                                  const std::vector<std::string>& known);
// The same, into `warnings`, which keeps what was collected when `work` throws.
void run_collecting_warnings(const std::function<void()>& work, const std::vector<std::string>& known,
                             std::vector<c10::Warning>& warnings);

// Keeps `warnings` for `issuer`, which receives them at its next synchronization.
void queue_warnings(std::thread::id issuer, std::vector<c10::Warning> warnings);

// Gives the calling thread's queued warnings to its warning handler (c10::warn).
void deliver_queued_warnings();

// Re-raises each of `warnings` on the calling thread.
void rewarn(const std::vector<c10::Warning>& warnings);

}  // namespace torch_tpu
