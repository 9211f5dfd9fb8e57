// Keeps the calling (user's) thread from starting an OpenMP team for work
// torch_tpu does on it.
#pragma once

namespace torch_tpu {

// While alive, ATen kernels on this thread run on this thread alone.
//
// Why: the stream worker's kernels already own an OpenMP team. A parallel
// region on a second thread starts a second team, and once libgomp manages
// more threads than there are CPUs it throttles spin-waiting, so every
// parallel region of either thread then pays a futex wake-up (CPU `exp` on
// 64x64 float32: 2.5 us with one team, 68 us with two, on 2 cores).
class SerialOnCallingThread {
 public:
  SerialOnCallingThread();
  ~SerialOnCallingThread();
  SerialOnCallingThread(const SerialOnCallingThread&) = delete;
  SerialOnCallingThread& operator=(const SerialOnCallingThread&) = delete;

 private:
  int previous_threads_;
};

}  // namespace torch_tpu
