// Generation table: values as published, lookups and errors.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "vtpu/spec.h"

namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(Spec, AllGenerationsPresentOnce) {
  std::set<std::string> names;
  for (const vtpu::ChipSpec& s : vtpu::all_specs()) names.insert(s.generation);
  EXPECT_EQ(names, (std::set<std::string>{"v4", "v5e", "v5p", "v6e", "tpu7x"}));
  EXPECT_EQ(vtpu::all_specs().size(), 5u);
}

TEST(Spec, PublishedNumbers) {
  const vtpu::ChipSpec& v6e = vtpu::spec_for("v6e");
  EXPECT_DOUBLE_EQ(v6e.peak_bf16_flops, 918e12);
  EXPECT_EQ(v6e.hbm_bytes, 32 * kGiB);
  EXPECT_EQ(v6e.mxu_size, 256);
  EXPECT_EQ(v6e.ici_links, 4);
  EXPECT_EQ(v6e.torus_dims, 2);
  EXPECT_EQ(v6e.device_name, "TPU v6e");

  const vtpu::ChipSpec& v5e = vtpu::spec_for("v5e");
  EXPECT_DOUBLE_EQ(v5e.peak_bf16_flops, 197e12);
  EXPECT_EQ(v5e.hbm_bytes, 16 * kGiB);
  EXPECT_DOUBLE_EQ(v5e.hbm_bandwidth, 819e9);

  const vtpu::ChipSpec& v5p = vtpu::spec_for("v5p");
  EXPECT_DOUBLE_EQ(v5p.peak_bf16_flops, 459e12);
  EXPECT_EQ(v5p.hbm_bytes, 95 * kGiB);
  EXPECT_DOUBLE_EQ(v5p.hbm_bandwidth, 2765e9);
  EXPECT_EQ(v5p.torus_dims, 3);
  EXPECT_TRUE(v5p.names_count_tensorcores);

  const vtpu::ChipSpec& v4 = vtpu::spec_for("v4");
  EXPECT_DOUBLE_EQ(v4.peak_bf16_flops, 275e12);
  EXPECT_EQ(v4.hbm_bytes, 32 * kGiB);
  EXPECT_DOUBLE_EQ(v4.hbm_bandwidth, 1200e9);

  const vtpu::ChipSpec& tpu7x = vtpu::spec_for("tpu7x");
  EXPECT_DOUBLE_EQ(tpu7x.peak_bf16_flops, 2307e12);
  EXPECT_EQ(tpu7x.hbm_bytes, 192 * kGiB);
  EXPECT_EQ(tpu7x.tensorcores_per_chip, 2);
  EXPECT_EQ(tpu7x.device_name, "TPU7x");
}

TEST(Spec, ValuesAreSane) {
  for (const vtpu::ChipSpec& s : vtpu::all_specs()) {
    SCOPED_TRACE(s.generation);
    EXPECT_GT(s.peak_bf16_flops, 1e14);
    EXPECT_GE(s.hbm_bytes, 16 * kGiB);
    EXPECT_GT(s.hbm_bandwidth, 5e11);
    EXPECT_GE(s.vmem_bytes, 16ull << 20);
    EXPECT_TRUE(s.mxu_size == 128 || s.mxu_size == 256);
    EXPECT_GE(s.mxus_per_tensorcore, 1);
    EXPECT_TRUE(s.tensorcores_per_chip == 1 || s.tensorcores_per_chip == 2);
    EXPECT_EQ(s.ici_links, 2 * s.torus_dims);
    EXPECT_GT(s.ici_link_bandwidth, 1e10);
    EXPECT_EQ(s.chips_per_host, 4);
    EXPECT_EQ(s.names_count_tensorcores, s.tensorcores_per_chip == 2);
    EXPECT_GE(s.pod_chips, 256);
    EXPECT_EQ(s.device_name.rfind("TPU", 0), 0u);
  }
}

TEST(Spec, AliasesAndCase) {
  EXPECT_EQ(&vtpu::spec_for("v5litepod"), &vtpu::spec_for("v5e"));
  EXPECT_EQ(&vtpu::spec_for("V6E"), &vtpu::spec_for("v6e"));
}

TEST(Spec, UnknownGenerationListsValidOnes) {
  try {
    vtpu::spec_for("v9z");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown TPU generation 'v9z'; valid: v4, v5e, v5p, v6e, tpu7x");
  }
}

}  // namespace
