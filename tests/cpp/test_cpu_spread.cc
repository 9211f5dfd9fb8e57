// vtpu::leave_cpu: moves the calling thread off the named CPU when it runs there and may run
// elsewhere, and leaves its affinity mask as it found it.
#include <gtest/gtest.h>
#include <sched.h>

#include "vtpu/cpu_spread.h"

namespace {

cpu_set_t mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return set;
}

// Restores the calling thread's mask at the end of a test.
struct MaskGuard {
  cpu_set_t saved = mask();
  ~MaskGuard() { sched_setaffinity(0, sizeof saved, &saved); }
};

TEST(CpuSpread, CurrentCpuIsInTheMask) {
  const cpu_set_t allowed = mask();
  const int cpu = vtpu::current_cpu();
  ASSERT_GE(cpu, 0);
  EXPECT_TRUE(CPU_ISSET(cpu, &allowed));
}

TEST(CpuSpread, LeavesTheNamedCpuAndRestoresTheMask) {
  MaskGuard guard;
  if (CPU_COUNT(&guard.saved) < 2) GTEST_SKIP() << "one CPU allowed";
  // Once the mask is restored the scheduler may move the thread back before the check, now and
  // then on a loaded machine: count the tries that found it on the named CPU.
  int stayed = 0;
  for (int round = 0; round < 20; ++round) {
    const int here = vtpu::current_cpu();
    vtpu::leave_cpu(here);
    if (vtpu::current_cpu() == here) ++stayed;
    const cpu_set_t after = mask();
    EXPECT_TRUE(CPU_EQUAL(&after, &guard.saved));
  }
  EXPECT_LE(stayed, 2);
}

TEST(CpuSpread, StaysWhenTheNamedCpuIsAnother) {
  MaskGuard guard;
  if (CPU_COUNT(&guard.saved) < 2) GTEST_SKIP() << "one CPU allowed";
  // Two CPUs allowed, the other one named: leave_cpu must not move the thread. The scheduler
  // may still migrate it between two reads now and then on a loaded machine, so the test
  // counts moves over many tries (a leave_cpu that moved would move on every one).
  const int here = vtpu::current_cpu();
  int other = -1;
  for (int c = 0; c < CPU_SETSIZE && other < 0; ++c) {
    if (c != here && CPU_ISSET(c, &guard.saved)) other = c;
  }
  cpu_set_t two;
  CPU_ZERO(&two);
  CPU_SET(here, &two);
  CPU_SET(other, &two);
  ASSERT_EQ(sched_setaffinity(0, sizeof two, &two), 0);
  int moved = 0;
  for (int round = 0; round < 40; ++round) {
    const int now = vtpu::current_cpu();
    vtpu::leave_cpu(now == here ? other : here);
    vtpu::leave_cpu(-1);
    vtpu::leave_cpu(CPU_SETSIZE + 5);
    if (vtpu::current_cpu() != now) ++moved;
    const cpu_set_t after = mask();
    EXPECT_TRUE(CPU_EQUAL(&after, &two));
  }
  EXPECT_LE(moved, 4);
}

TEST(CpuSpread, StaysWhenOnlyOneCpuIsAllowed) {
  MaskGuard guard;
  const int here = vtpu::current_cpu();
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(here, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  vtpu::leave_cpu(here);
  EXPECT_EQ(vtpu::current_cpu(), here);
  const cpu_set_t after = mask();
  EXPECT_TRUE(CPU_EQUAL(&after, &one));
}

}  // namespace
