// Hooks a profiler installs to see the chip's work: priced ops, collectives,
// stream items and HBM usage. No torch headers (the profiler lives in runtime/).
// When no profiler records, every hook site costs one atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "vtpu/cost_model.h"

namespace vtpu {
struct CollectiveCost;  // counters.h

namespace trace {

struct Hooks {
  // An op priced for chip `chip` (local index), on the thread that issues it.
  void (*cost)(int chip, const OpCost& cost);
  // `name` (a static string, may be null) says which collective: "all_reduce", ...
  void (*collective)(int chip, const CollectiveCost& cost, const char* name);
  // Work queued on a stream; returns a token for ran(), 0 for "not traced".
  uint64_t (*enqueue)(int chip, int64_t stream, const char* name);
  // On the stream's worker, after the traced work ran (measured host time).
  void (*ran)(uint64_t token, std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end);
  // Physical bytes allocated on the chip right after an allocation or free.
  void (*hbm)(int chip, uint64_t allocated_bytes);
};

namespace detail {
extern std::atomic<const Hooks*> g_hooks;
}

// The installed hooks, or nullptr when no profiler records.
inline const Hooks* hooks() { return detail::g_hooks.load(std::memory_order_acquire); }
// nullptr uninstalls. `hooks` must outlive its installation.
void install(const Hooks* hooks);

}  // namespace trace
}  // namespace vtpu
