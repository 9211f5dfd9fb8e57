// Collective costs (tpu_dist): ring formulas over ICI links, per-chip counters.
#include <gtest/gtest.h>

#include "vtpu/counters.h"
#include "vtpu/spec.h"

namespace {

TEST(CollectiveCost, RingAllReduceOverTwoLinks) {
  const auto& spec = vtpu::spec_for("v5e");
  vtpu::CollectiveCost c;
  const double bytes = 64.0 * (1 << 20);
  const int n = 4;
  c.payload_bytes = bytes;
  c.ici_bytes = 2.0 * (n - 1) / n * bytes;
  c.ici_links = 2;
  c.ici_steps = 2 * (n - 1);
  const double want = c.ici_bytes / (2 * spec.ici_link_bandwidth) + 6 * vtpu::kIciHopLatencySeconds;
  EXPECT_DOUBLE_EQ(vtpu::collective_seconds(spec, c), want);
}

TEST(CollectiveCost, LinksAreCappedAtTheChipsPorts) {
  const auto& spec = vtpu::spec_for("v5e");  // 4 ICI ports
  vtpu::CollectiveCost c;
  c.ici_bytes = 1e9;
  c.ici_links = 12;
  EXPECT_DOUBLE_EQ(vtpu::collective_seconds(spec, c), 1e9 / (spec.ici_links * spec.ici_link_bandwidth));
}

TEST(CollectiveCost, DcnUsesHostBandwidth) {
  vtpu::CollectiveCost c;
  c.dcn_bytes = 1e9;
  EXPECT_DOUBLE_EQ(vtpu::collective_seconds(vtpu::spec_for("v6e"), c), 1e9 / vtpu::kDcnBandwidth);
}

TEST(CollectiveCost, CountersAccumulateAndReset) {
  const auto& spec = vtpu::spec_for("v6e");
  vtpu::ChipCounters counters(spec);
  vtpu::CollectiveCost c;
  c.payload_bytes = 1000;
  c.ici_bytes = 1500;
  c.ici_steps = 2;
  c.dcn_bytes = 10;
  counters.record_collective(c);
  counters.record_collective(c);
  auto s = counters.snapshot(0);
  EXPECT_EQ(s.collectives, 2u);
  EXPECT_DOUBLE_EQ(s.collective_bytes, 2000);
  EXPECT_DOUBLE_EQ(s.ici_bytes, 3000);
  EXPECT_DOUBLE_EQ(s.dcn_bytes, 20);
  EXPECT_GT(s.ici_seconds, 0);
  EXPECT_DOUBLE_EQ(s.dcn_seconds, 20 / vtpu::kDcnBandwidth);
  EXPECT_EQ(s.ops, 0u);  // collectives are not ops: device_seconds stays apart
  double by_gen = 0;
  for (double v : s.ici_seconds_by_generation) by_gen += v;
  EXPECT_GT(by_gen, 0);
  counters.reset();
  EXPECT_EQ(counters.snapshot(0).collectives, 0u);
}

}  // namespace
