// Built with -fopenmp: omp_* resolve to the libgomp that libtorch_cpu loads.
#include "runtime/calling_thread.h"

#include <ATen/Parallel.h>
#include <omp.h>

namespace torch_tpu {

SerialOnCallingThread::SerialOnCallingThread() {
  // at::get_num_threads() first: ATen sets a thread's OpenMP thread count
  // lazily on its first parallel call, which would undo ours.
  previous_threads_ = at::get_num_threads();
  omp_set_num_threads(1);  // this thread's nthreads ICV only
}

SerialOnCallingThread::~SerialOnCallingThread() { omp_set_num_threads(previous_threads_); }

}  // namespace torch_tpu
