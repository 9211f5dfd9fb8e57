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
  // device_seconds_by_generation split by the unit bounding each op (bound_split): parts add up.
  std::array<CostBreakdown, kNumGenerations> bound_by_generation{};
  // Collectives (tpu_dist): estimated link time, kept apart from device_seconds.
  uint64_t collectives = 0;
  double collective_bytes = 0;  // payload: bytes of the buffers the ops were called with
  double ici_bytes = 0;         // bytes this chip sent over ICI links
  double ici_seconds = 0;       // estimated, on the chip's own generation
  std::array<double, kNumGenerations> ici_seconds_by_generation{};  // all_specs() order
  double dcn_bytes = 0;    // bytes this chip's host sent over the data-centre network
  double dcn_seconds = 0;  // estimated
};

// One collective as the cost model sees it (ring/torus formulas over the
// generation's ICI links; DCN for the part that crosses hosts).
struct CollectiveCost {
  double payload_bytes = 0;  // bytes of the op's buffer on this chip
  double ici_bytes = 0;      // bytes this chip sends over ICI, e.g. 2(n-1)/n * payload for all_reduce
  int ici_links = 1;         // links driven at once (capped at the generation's ici_links)
  int ici_steps = 0;         // ring steps: each pays kIciHopLatencySeconds
  double dcn_bytes = 0;      // bytes sent between hosts
};

// Per-step latency of an ICI transfer (link traversal and DMA setup): a
// modelling assumption, not a published figure.
constexpr double kIciHopLatencySeconds = 1e-6;
// DCN bandwidth per host, bytes/s: 100 Gb/s, a modelling assumption (Cloud TPU
// hosts have 100-200 Gb/s NICs depending on the generation).
constexpr double kDcnBandwidth = 12.5e9;
// Seconds one collective takes on `spec`: ici_bytes / (links * link bandwidth)
// + steps * hop latency + dcn_bytes / kDcnBandwidth.
double collective_seconds(const ChipSpec& spec, const CollectiveCost& cost);

// An op's cost-model estimates on its own chip's spec and on every generation: what
// record() adds up. Worked out once for a cost that repeats (a cached op signature).
struct CostEstimates {
  const ChipSpec* own = nullptr;  // the spec `device` was estimated on; null: not yet worked out
  CostBreakdown device;
  std::array<CostBreakdown, kNumGenerations> bound{};  // bound_split, all_specs() order
};

class ChipCounters {
 public:
  explicit ChipCounters(const ChipSpec& own) : own_(own) {}
  void record(const OpCost& cost) { record(cost, estimates(cost)); }  // thread-safe
  // `e` must be estimates(cost) of a counter with this spec (e.own == &spec()).
  void record(const OpCost& cost, const CostEstimates& e);  // thread-safe
  CostEstimates estimates(const OpCost& cost) const;
  const ChipSpec& spec() const { return own_; }
  void record_collective(const CollectiveCost& cost);  // thread-safe
  CounterSnapshot snapshot(double host_seconds) const;
  void reset();

 private:
  const ChipSpec& own_;
  mutable std::mutex mu_;
  CounterSnapshot totals_;
};

}  // namespace vtpu
