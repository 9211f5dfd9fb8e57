// Keeps a stream's worker and the thread that feeds it on different CPUs. No torch headers.
#pragma once

namespace vtpu {

// The CPU the calling thread runs on now; -1 where the system does not say.
int current_cpu();

// Moves the calling thread to another CPU of its affinity mask when it runs on `cpu`, then
// restores the mask. Called by a thread that waited for room in a stream's full queue, with the
// worker's CPU: on a 2-vCPU KVM guest the scheduler placed a thread woken after a few
// milliseconds idle on its waker's CPU, and the two then shared that CPU for whole seconds while
// the other stayed idle (`perf sched timehist`: main thread and worker alternating on CPU 1;
// both always "cache hot", so the load balancer never split them): 5000 queued `gather`s took
// 3.9 us each instead of 2.9. The worker itself never moves: the other CPU may be its OpenMP
// team's. Does nothing when `cpu` is -1, the calling thread runs elsewhere, its mask allows one
// CPU, or TORCH_TPU_SPREAD_THREADS=0.
void leave_cpu(int cpu);

}  // namespace vtpu
