// A burst of small items through a vtpu::Stream, as bench/ops.py's 64x64 ops issue them: the
// caller works `--caller` units per item (its dispatch), the worker `--worker` units per item
// (the kernel), `--burst` items then synchronize(). Prints the best wall ns per item over
// `--repeats` bursts' medians and the process's CPU time, sleeps and preemptions per item (getrusage), which
// show how the two threads hand work over (wake-ups, mutex sleeps) independently of the load.
// Build: target stream_burst (TORCH_TPU_BUILD_TESTS=ON), or by hand:
//   g++ -O2 -std=c++17 -Icsrc bench/stream_burst.cc csrc/vtpu/stream.cc csrc/vtpu/trace.cc -lpthread
// Usage: stream_burst [--burst 20] [--caller 3000] [--worker 2000] [--bursts 2000] [--repeats 5]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "vtpu/stream.h"

namespace {
// `units` iterations of a dependent integer chain (about 1 ns each), not optimised away.
__attribute__((noinline)) uint64_t work(uint64_t units, uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t i = 0; i < units; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}
std::atomic<uint64_t> sink{0};
}  // namespace

int main(int argc, char** argv) {
  int burst = 20, bursts = 2000, repeats = 5;
  uint64_t caller = 3000, worker = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const long v = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--burst")) burst = static_cast<int>(v);
    if (!std::strcmp(argv[i], "--bursts")) bursts = static_cast<int>(v);
    if (!std::strcmp(argv[i], "--repeats")) repeats = static_cast<int>(v);
    if (!std::strcmp(argv[i], "--caller")) caller = static_cast<uint64_t>(v);
    if (!std::strcmp(argv[i], "--worker")) worker = static_cast<uint64_t>(v);
  }
  vtpu::Stream stream(0, 0);
  double best = 1e30, voluntary = 0, preempted = 0, cpu = 0;
  for (int r = 0; r < repeats; ++r) {
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    std::vector<double> per;
    for (int b = 0; b < bursts; ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < burst; ++i) {
        sink += work(caller, i);
        // A closure as large as a queued kernel's (heap-allocated by std::function).
        auto held = std::make_shared<int>(i);
        stream.enqueue_named(
            "burst", [held, worker, pad = std::array<uint64_t, 4>{}] { sink += work(worker, *held + pad[0]); }, 4096);
      }
      stream.synchronize();
      per.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / burst);
    }
    getrusage(RUSAGE_SELF, &after);
    std::nth_element(per.begin(), per.begin() + per.size() / 2, per.end());
    if (per[per.size() / 2] < best) {
      best = per[per.size() / 2];
      const double items = static_cast<double>(bursts) * burst;
      voluntary = static_cast<double>(after.ru_nvcsw - before.ru_nvcsw) / items;
      preempted = static_cast<double>(after.ru_nivcsw - before.ru_nivcsw) / items;
      auto us = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec); };
      cpu = (us(after.ru_utime) + us(after.ru_stime) - us(before.ru_utime) - us(before.ru_stime)) * 1e3 / items;
    }
  }
  std::printf(
      "burst %d caller %lu worker %lu: %.0f ns/item, process CPU %.0f ns/item, "
      "per item %.3f sleeps %.3f preemptions\n",
      burst, static_cast<unsigned long>(caller), static_cast<unsigned long>(worker), best, cpu, voluntary, preempted);
}
