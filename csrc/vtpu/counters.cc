#include "vtpu/counters.h"

#include <algorithm>

namespace vtpu {

CostEstimates ChipCounters::estimates(const OpCost& cost) const {
  CostEstimates e;
  e.own = &own_;
  e.device = estimate(own_, cost);
  const auto& specs = all_specs();
  for (size_t g = 0; g < specs.size() && g < e.bound.size(); ++g) e.bound[g] = bound_split(estimate(specs[g], cost));
  return e;
}

void ChipCounters::record(const OpCost& cost, const CostEstimates& e) {
  const CostBreakdown& own = e.device;
  const auto& bound = e.bound;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t g = 0; g < bound.size(); ++g) {
    CostBreakdown& t = totals_.bound_by_generation[g];
    t.mxu_seconds += bound[g].mxu_seconds;
    t.vpu_seconds += bound[g].vpu_seconds;
    t.hbm_seconds += bound[g].hbm_seconds;
    t.overhead_seconds += bound[g].overhead_seconds;
    t.total_seconds += bound[g].total_seconds;
  }
  totals_.ops += 1;
  totals_.emulated_ops += cost.emulated ? 1 : 0;
  totals_.flops += cost.flops;
  totals_.bytes_read += cost.bytes_read;
  totals_.bytes_written += cost.bytes_written;
  totals_.device.mxu_seconds += own.mxu_seconds;
  totals_.device.vpu_seconds += own.vpu_seconds;
  totals_.device.hbm_seconds += own.hbm_seconds;
  totals_.device.overhead_seconds += own.overhead_seconds;
  totals_.device.total_seconds += own.total_seconds;
  for (size_t g = 0; g < bound.size(); ++g) totals_.device_seconds_by_generation[g] += bound[g].total_seconds;
}

double collective_seconds(const ChipSpec& spec, const CollectiveCost& cost) {
  double seconds = cost.ici_steps * kIciHopLatencySeconds + cost.dcn_bytes / kDcnBandwidth;
  if (cost.ici_bytes > 0) {
    const int links = std::max(1, std::min(cost.ici_links, spec.ici_links));
    seconds += cost.ici_bytes / (links * spec.ici_link_bandwidth);
  }
  return seconds;
}

void ChipCounters::record_collective(const CollectiveCost& cost) {
  std::array<double, kNumGenerations> by_generation{};
  const auto& specs = all_specs();
  for (size_t g = 0; g < specs.size() && g < by_generation.size(); ++g) {
    by_generation[g] = collective_seconds(
        specs[g], CollectiveCost{cost.payload_bytes, cost.ici_bytes, cost.ici_links, cost.ici_steps, 0});
  }
  const double ici =
      collective_seconds(own_, CollectiveCost{cost.payload_bytes, cost.ici_bytes, cost.ici_links, cost.ici_steps, 0});
  std::lock_guard<std::mutex> lock(mu_);
  totals_.collectives += 1;
  totals_.collective_bytes += cost.payload_bytes;
  totals_.ici_bytes += cost.ici_bytes;
  totals_.ici_seconds += ici;
  for (size_t g = 0; g < by_generation.size(); ++g) totals_.ici_seconds_by_generation[g] += by_generation[g];
  totals_.dcn_bytes += cost.dcn_bytes;
  totals_.dcn_seconds += cost.dcn_bytes / kDcnBandwidth;
}

CounterSnapshot ChipCounters::snapshot(double host_seconds) const {
  std::lock_guard<std::mutex> lock(mu_);
  CounterSnapshot s = totals_;
  s.host_seconds = host_seconds;
  return s;
}

void ChipCounters::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  totals_ = CounterSnapshot{};
}

}  // namespace vtpu
