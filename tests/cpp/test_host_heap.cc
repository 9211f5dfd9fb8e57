// The runtime's malloc settings: applied by default, left alone when the user chose.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "vtpu/host_heap.h"

namespace {

struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

#if defined(__GLIBC__)
TEST(HostHeap, TunesByDefault) { EXPECT_TRUE(vtpu::tune_host_heap()); }

TEST(HostHeap, SwitchedOff) {
  ScopedEnv off("TORCH_TPU_HOST_HEAP_TUNING", "0");
  EXPECT_FALSE(vtpu::tune_host_heap());
}

TEST(HostHeap, UserMallocSettingsWin) {
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"}) {
    ScopedEnv user(name, "1048576");
    EXPECT_FALSE(vtpu::tune_host_heap()) << name;
  }
}
#endif

}  // namespace
