// Cost model against hand-computed answers.
#include <gtest/gtest.h>

#include "vtpu/cost_model.h"
#include "vtpu/spec.h"

namespace {

vtpu::OpCost matmul_bf16(int64_t m, int64_t k, int64_t n) {
  vtpu::OpCost c;
  c.mxu = true;
  c.m = m;
  c.k = k;
  c.n = n;
  c.flops = 2.0 * m * k * n;
  c.bytes_read = 2.0 * (m * k + k * n);
  c.bytes_written = 2.0 * m * n;
  return c;
}

class EveryGeneration : public ::testing::TestWithParam<const char*> {};

TEST_P(EveryGeneration, LargeBf16MatmulIsComputeBound) {
  const auto& spec = vtpu::spec_for(GetParam());
  // 8192^3: dimensions are multiples of both MXU sizes, so efficiency is 1; the MXU runs at
  // the generation's measured sustained fraction of the peak.
  const auto cost = matmul_bf16(8192, 8192, 8192);
  const auto t = vtpu::estimate(spec, cost);
  const double flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
  EXPECT_DOUBLE_EQ(t.mxu_seconds, flops / (spec.peak_bf16_flops * spec.mxu_sustained_fraction));
  EXPECT_DOUBLE_EQ(t.hbm_seconds, 3.0 * 8192 * 8192 * 2 / (spec.hbm_bandwidth * spec.hbm_sustained_fraction));
  EXPECT_GT(t.mxu_seconds, t.hbm_seconds);
  EXPECT_DOUBLE_EQ(t.total_seconds, t.mxu_seconds + vtpu::kLaunchOverheadSeconds);
}

TEST_P(EveryGeneration, SkinnyBf16MatmulIsBandwidthBound) {
  const auto& spec = vtpu::spec_for(GetParam());
  // 8 tokens through an 8192x8192 weight: reading the weight dominates.
  const auto cost = matmul_bf16(8, 8192, 8192);
  const auto t = vtpu::estimate(spec, cost);
  const double bytes = 2.0 * (8 * 8192 + 8192.0 * 8192) + 2.0 * 8 * 8192;
  EXPECT_DOUBLE_EQ(t.hbm_seconds, bytes / (spec.hbm_bandwidth * spec.hbm_sustained_fraction));
  // M = 8 pads to one MXU height: efficiency 8 / mxu_size.
  EXPECT_DOUBLE_EQ(t.mxu_seconds,
                   cost.flops / (spec.peak_bf16_flops * 8.0 / spec.mxu_size * spec.mxu_sustained_fraction));
  EXPECT_GT(t.hbm_seconds, t.mxu_seconds);
  EXPECT_DOUBLE_EQ(t.total_seconds, t.hbm_seconds + vtpu::kLaunchOverheadSeconds);
}

TEST_P(EveryGeneration, ElementwiseRunsAtBytesOverBandwidth) {
  const auto& spec = vtpu::spec_for(GetParam());
  vtpu::OpCost add;  // f32[1024,1024] + f32[1024,1024]
  add.flops = 1024.0 * 1024;
  add.bytes_read = 2 * 4.0 * 1024 * 1024;
  add.bytes_written = 4.0 * 1024 * 1024;
  const auto t = vtpu::estimate(spec, add);
  EXPECT_EQ(t.mxu_seconds, 0);
  EXPECT_DOUBLE_EQ(t.total_seconds, 12.0 * 1024 * 1024 / (spec.hbm_bandwidth * spec.hbm_sustained_fraction) +
                                        vtpu::kLaunchOverheadSeconds);
}

INSTANTIATE_TEST_SUITE_P(Generations, EveryGeneration, ::testing::Values("v4", "v5e", "v5p", "v6e", "tpu7x"));

TEST(MxuEfficiency, KOf64OnA128WideMxuIsHalf) {
  EXPECT_DOUBLE_EQ(vtpu::mxu_efficiency(1024, 64, 1024, 128), 0.5);
  const auto& v5e = vtpu::spec_for("v5e");
  ASSERT_EQ(v5e.mxu_size, 128);
  auto cost = matmul_bf16(4096, 64, 4096);
  cost.bytes_read = cost.bytes_written = 0;  // compute only
  EXPECT_DOUBLE_EQ(vtpu::estimate(v5e, cost).mxu_seconds, cost.flops / (v5e.peak_bf16_flops * 0.5));
}

TEST(MxuSustainedFraction, Tpu7xRunsAtTheMeasuredGemmRate) {
  // accelerator-microbenchmarks' TPU7x GEMM table: 956.3824592 TFLOP/s per device (one of two
  // TensorCores) at m=n=k=32768, of 2307 / 2 TFLOP/s; no other generation has a published figure.
  const auto& tpu7x = vtpu::spec_for("tpu7x");
  EXPECT_DOUBLE_EQ(tpu7x.mxu_sustained_fraction, 956.3824592e12 / 1153.5e12);
  EXPECT_NEAR(tpu7x.mxu_sustained_fraction, 0.8291, 1e-4);
  auto cost = matmul_bf16(32768, 32768, 32768);
  cost.bytes_read = cost.bytes_written = 0;
  // The chip's two devices together: 2 x 956.38 TFLOP/s.
  EXPECT_DOUBLE_EQ(vtpu::estimate(tpu7x, cost).mxu_seconds, cost.flops / (2 * 956.3824592e12));
  for (const char* g : {"v4", "v5e", "v5p", "v6e"}) EXPECT_EQ(vtpu::spec_for(g).mxu_sustained_fraction, 1.0) << g;
}

TEST(HbmSustainedFraction, Tpu7xCopiesAtTheMeasuredRate) {
  // accelerator-microbenchmarks' TPU7x HBM copy table: 6420.961823 GB/s per chip (read + write)
  // for 8 GiB, of the 7380 GB/s the Cloud page gives.
  const auto& tpu7x = vtpu::spec_for("tpu7x");
  EXPECT_DOUBLE_EQ(tpu7x.hbm_sustained_fraction, 6420.961823e9 / 7380e9);
  vtpu::OpCost copy;  // 8 GiB read, 8 GiB written
  copy.bytes_read = copy.bytes_written = 8.0 * (1ull << 30);
  EXPECT_DOUBLE_EQ(vtpu::estimate(tpu7x, copy).hbm_seconds, 16.0 * (1ull << 30) / 6420.961823e9);
  for (const char* g : {"v4", "v5e", "v5p", "v6e"}) EXPECT_EQ(vtpu::spec_for(g).hbm_sustained_fraction, 1.0) << g;
}

TEST(MxuEfficiency, PaddingAllThreeDimensions) {
  EXPECT_DOUBLE_EQ(vtpu::mxu_efficiency(128, 128, 128, 128), 1.0);
  EXPECT_DOUBLE_EQ(vtpu::mxu_efficiency(129, 128, 128, 128), 129.0 / 256);
  EXPECT_DOUBLE_EQ(vtpu::mxu_efficiency(100, 200, 300, 256), (100.0 / 256) * (200.0 / 256) * (300.0 / 512));
}

TEST(Passes, Float32HighestCostsSixBf16Passes) {
  const auto& spec = vtpu::spec_for("v6e");
  auto cost = matmul_bf16(4096, 4096, 4096);
  cost.bytes_read = cost.bytes_written = 0;
  const double one = vtpu::estimate(spec, cost).mxu_seconds;
  cost.passes = 6;
  EXPECT_DOUBLE_EQ(vtpu::estimate(spec, cost).mxu_seconds, 6 * one);
  cost.passes = 3;
  EXPECT_DOUBLE_EQ(vtpu::estimate(spec, cost).mxu_seconds, 3 * one);
}

TEST(Clock, ImpliedByPeak) {
  // v5e: 197 TFLOP/s = 2 x 128^2 cells x 4 MXUs x 1 core x 1.503 GHz.
  EXPECT_NEAR(vtpu::mxu_clock_hz(vtpu::spec_for("v5e")), 1.503e9, 1e6);
  EXPECT_NEAR(vtpu::vpu_flops(vtpu::spec_for("v5e")), 1.503e9 * 4096, 1e10);
}

}  // namespace
