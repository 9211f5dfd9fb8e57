#include "vtpu/cpu_spread.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include "vtpu/env.h"

namespace vtpu {

int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();  // glibc reads it from rseq or the vDSO: no system call
#else
  return -1;
#endif
}

void leave_cpu(int cpu) {
#if defined(__linux__)
  static const bool enabled = env_flag("TORCH_TPU_SPREAD_THREADS", true);
  if (!enabled || cpu < 0 || cpu >= CPU_SETSIZE || current_cpu() != cpu) return;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || !CPU_ISSET(cpu, &allowed) || CPU_COUNT(&allowed) < 2) {
    return;
  }
  cpu_set_t others = allowed;
  CPU_CLR(cpu, &others);
  // The first call migrates the thread before it returns; the second restores the mask without
  // moving it back.
  if (sched_setaffinity(0, sizeof others, &others) == 0) sched_setaffinity(0, sizeof allowed, &allowed);
#else
  (void)cpu;
#endif
}

}  // namespace vtpu
