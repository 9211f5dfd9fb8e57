#include "vtpu/host_heap.h"

#include "vtpu/env.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vtpu {

bool tune_host_heap() {
#if defined(__GLIBC__)
  if (!env_flag("TORCH_TPU_HOST_HEAP_TUNING", true)) return false;
  for (const char* user_choice :
       {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"}) {
    if (env(user_choice)) return false;
  }
  constexpr int kMmapThresholdBytes = 32 << 20;  // DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc
  constexpr int kTrimThresholdBytes = 64 << 20;
  return mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes) == 1;
#else
  return false;
#endif
}

}  // namespace vtpu
