// The host process's malloc settings that the chip's worker threads need. No torch headers.
#pragma once

namespace vtpu {

// Kernels run on the streams' worker threads, whose malloc arenas are not the main one. With
// glibc's default dynamic thresholds such an arena hands each freed multi-MiB temporary back to
// the kernel (madvise(MADV_DONTNEED) when its heap shrinks), and the next call faults the same
// pages in again: mkldnn's convolution of a [2, 8, 256, 256] fp32 batch took 11 ms on the worker
// against 5 ms on the main thread. This keeps up to 64 MiB freed per arena (M_TRIM_THRESHOLD) and
// serves blocks up to 32 MiB, glibc's largest M_MMAP_THRESHOLD on 64-bit, from the heap, as the
// main thread's dynamic thresholds end up doing. It changes nothing when the user set
// MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_ or GLIBC_TUNABLES, when
// TORCH_TPU_HOST_HEAP_TUNING=0, or on a C library other than glibc. Called once, by the runtime;
// returns whether it changed the settings.
bool tune_host_heap();

}  // namespace vtpu
