// Per-chip execution counters: what ran, measured host time, and the cost
// model's estimated device time on every generation.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "vtpu/cost_model.h"
#include "vtpu/spec.h"

namespace vtpu {

constexpr int kNumGenerations = 5;  // all_specs() order

struct CounterSnapshot {
  uint64_t ops = 0;
  uint64_t emulated_ops = 0;
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
  double host_seconds = 0;  // measured: time stream workers spent running work
  CostBreakdown device;     // estimated, on the chip's own generation
  std::array<double, kNumGenerations> device_seconds_by_generation{};  // all_specs() order
};

class ChipCounters {
 public:
  explicit ChipCounters(const ChipSpec& own) : own_(own) {}
  void record(const OpCost& cost);  // thread-safe
  CounterSnapshot snapshot(double host_seconds) const;
  void reset();

 private:
  const ChipSpec& own_;
  mutable std::mutex mu_;
  CounterSnapshot totals_;
};

}  // namespace vtpu
