// Slice topology: names, coordinates, torus links, hops, rings and hosts.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "vtpu/topology.h"

namespace {

using vtpu::Coord;
using vtpu::Topology;

struct NameCase {
  const char* name;
  const char* generation;
  Coord shape;
  int hosts;
};

void PrintTo(const NameCase& c, std::ostream* os) { *os << c.name; }

class ParseName : public ::testing::TestWithParam<NameCase> {};

std::string case_name(const ::testing::TestParamInfo<NameCase>& info) {
  std::string out = info.param.name;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}

TEST_P(ParseName, GivesGenerationShapeAndHosts) {
  const NameCase& c = GetParam();
  const Topology t = Topology::parse(c.name);
  EXPECT_EQ(t.spec().generation, c.generation);
  EXPECT_EQ(t.shape(), c.shape);
  EXPECT_EQ(t.num_chips(), c.shape[0] * c.shape[1] * c.shape[2]);
  EXPECT_EQ(t.num_hosts(), c.hosts);
  EXPECT_EQ(t.name(), c.name);
}

INSTANTIATE_TEST_SUITE_P(
    CloudNames, ParseName,
    ::testing::Values(NameCase{"v5e-1", "v5e", {1, 1, 1}, 1}, NameCase{"v5e-4", "v5e", {2, 2, 1}, 1},
                      NameCase{"v5e-8", "v5e", {2, 4, 1}, 1}, NameCase{"v5e-16", "v5e", {4, 4, 1}, 4},
                      NameCase{"v5litepod-16", "v5e", {4, 4, 1}, 4}, NameCase{"v5e-256", "v5e", {16, 16, 1}, 64},
                      NameCase{"v6e-1", "v6e", {1, 1, 1}, 1}, NameCase{"v6e-4", "v6e", {2, 2, 1}, 1},
                      NameCase{"v6e-8", "v6e", {2, 4, 1}, 1}, NameCase{"v6e-16", "v6e", {4, 4, 1}, 4},
                      NameCase{"v6e-32", "v6e", {4, 8, 1}, 8}, NameCase{"v6e-64", "v6e", {8, 8, 1}, 16},
                      NameCase{"v6e-128", "v6e", {8, 16, 1}, 32}, NameCase{"v6e-256", "v6e", {16, 16, 1}, 64},
                      NameCase{"v4-8", "v4", {2, 2, 1}, 1}, NameCase{"v4-16", "v4", {2, 2, 2}, 2},
                      NameCase{"v4-128", "v4", {4, 4, 4}, 16}, NameCase{"v5p-8", "v5p", {2, 2, 1}, 1},
                      NameCase{"v5p-16", "v5p", {2, 2, 2}, 2}, NameCase{"v5p-32", "v5p", {2, 2, 4}, 4},
                      NameCase{"v5p-64", "v5p", {2, 4, 4}, 8}, NameCase{"v5p-128", "v5p", {4, 4, 4}, 16},
                      NameCase{"v5p-256", "v5p", {4, 4, 8}, 32}, NameCase{"v5p-512", "v5p", {4, 8, 8}, 64},
                      NameCase{"v5p-1536", "v5p", {8, 8, 12}, 192}, NameCase{"v5p-9216", "v5p", {12, 16, 24}, 1152},
                      NameCase{"v5p-17920", "v5p", {16, 20, 28}, 2240}, NameCase{"tpu7x-8", "tpu7x", {2, 2, 1}, 1},
                      NameCase{"tpu7x-16", "tpu7x", {2, 2, 2}, 2}, NameCase{"tpu7x-128", "tpu7x", {4, 4, 4}, 16}),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Shapes, ParseName,
    ::testing::Values(NameCase{"2x4", "v6e", {2, 4, 1}, 1}, NameCase{"16x16", "v6e", {16, 16, 1}, 64},
                      NameCase{"2x2x2", "v5p", {2, 2, 2}, 2}, NameCase{"v5p:4x4x4", "v5p", {4, 4, 4}, 16},
                      NameCase{"v5e:4x8", "v5e", {4, 8, 1}, 8}, NameCase{"v4:2x2x1", "v4", {2, 2, 1}, 1},
                      NameCase{"tpu7x:4x4x8", "tpu7x", {4, 4, 8}, 32}),
    case_name);

TEST(Parse, InvalidNamesListFormsAndGenerations) {
  for (const char* bad : {"", "v6e-3", "v6e-512", "v5p-9", "v5p-6", "v5p-96", "v9-8", "v6e", "2", "2x2x2x2", "0x4",
                          "v6e:2x", "v6e:32x1", "v5p:4x4", "v5e-abc", "v5p-99999999", "v6e:1x16x1x", "v6e:3x6"}) {
    SCOPED_TRACE(bad);
    try {
      Topology::parse(bad);
      ADD_FAILURE() << "expected std::invalid_argument for '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("valid generations: v4, v5e, v5p, v6e, tpu7x"), std::string::npos) << message;
      EXPECT_NE(message.find("v5p:4x4x4"), std::string::npos) << message;
    }
  }
}

TEST(Parse, ExplainsTensorCoreCounting) {
  try {
    Topology::parse("v5p-9");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("count TensorCores"), std::string::npos) << e.what();
  }
}

// Sets or clears an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  void set(const char* value) {
    if (value) {
      ::setenv(name_, value, 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Parse, FromEnvPrefersTorchTpuTopology) {
  ScopedEnv topology("TORCH_TPU_TOPOLOGY", "v5p-16");
  ScopedEnv accelerator("TPU_ACCELERATOR_TYPE", "v5litepod-4");
  EXPECT_EQ(Topology::from_env().name(), "v5p-16");
  topology.set(nullptr);
  EXPECT_EQ(Topology::from_env().name(), "v5litepod-4");
  accelerator.set(nullptr);
  EXPECT_EQ(Topology::from_env().name(), "v6e-8");
  topology.set("v6e-7");
  try {
    Topology::from_env();
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("TORCH_TPU_TOPOLOGY: invalid TPU topology 'v6e-7'", 0), 0u) << e.what();
  }
}

TEST(Slices, FromEnvCountsSlicesAndHostsOfAllSlices) {
  ScopedEnv topology("TORCH_TPU_TOPOLOGY", "v5p-16");  // 2 hosts of 4 chips per slice
  ScopedEnv slices("TORCH_TPU_SLICES", "3");
  const Topology t = Topology::from_env();
  EXPECT_EQ(t.num_slices(), 3);
  EXPECT_EQ(t.num_chips(), 8);  // one slice's: chip ids, coordinates and hops stay per slice
  EXPECT_EQ(t.num_hosts(), 2);
  EXPECT_EQ(t.total_hosts(), 6);
  EXPECT_EQ(t.total_chips(), 24);
  for (int h = 0; h < 6; ++h) EXPECT_EQ(t.slice_of_host(h), h / 2);
  EXPECT_THROW(t.slice_of_host(6), std::out_of_range);
  EXPECT_THROW(t.slice_of_host(-1), std::out_of_range);
  slices.set(nullptr);
  EXPECT_EQ(Topology::from_env().num_slices(), 1);
  EXPECT_EQ(Topology::from_env().total_hosts(), 2);
  for (const char* bad : {"0", "-1", "two", "1.5"}) {
    slices.set(bad);
    try {
      Topology::from_env();
      FAIL() << "expected std::invalid_argument for " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string("TORCH_TPU_SLICES='") + bad + "'", 0), 0u) << e.what();
    }
  }
}

TEST(Slices, WithSlicesKeepsTheSliceAndRejectsZero) {
  const Topology one = Topology::parse("v6e-8");
  const Topology two = one.with_slices(2);
  EXPECT_EQ(one.num_slices(), 1);
  EXPECT_EQ(two.num_slices(), 2);
  EXPECT_EQ(two.shape(), one.shape());
  EXPECT_EQ(two.total_hosts(), 2);
  EXPECT_EQ(two.slice_of_host(1), 1);
  EXPECT_THROW(one.with_slices(0), std::invalid_argument);
}

TEST(Coords, RowMajorXFastest) {
  const Topology t = Topology::parse("v5p:4x4x4");
  EXPECT_EQ(t.coords(0), (Coord{0, 0, 0}));
  EXPECT_EQ(t.coords(1), (Coord{1, 0, 0}));
  EXPECT_EQ(t.coords(4), (Coord{0, 1, 0}));
  EXPECT_EQ(t.coords(16), (Coord{0, 0, 1}));
  EXPECT_EQ(t.coords(63), (Coord{3, 3, 3}));
}

TEST(Coords, RoundTripEverySlice) {
  for (const char* name : {"v6e-8", "v6e-128", "v5p-64", "v5p-256", "2x2x2", "v5e-1"}) {
    const Topology t = Topology::parse(name);
    for (int chip = 0; chip < t.num_chips(); ++chip) {
      ASSERT_EQ(t.chip_at(t.coords(chip)), chip) << name;
    }
  }
}

TEST(Coords, OutOfRangeThrows) {
  const Topology t = Topology::parse("v6e-8");
  EXPECT_THROW(t.coords(8), std::out_of_range);
  EXPECT_THROW(t.coords(-1), std::out_of_range);
  EXPECT_THROW(t.chip_at({2, 0, 0}), std::out_of_range);
  EXPECT_THROW(t.chip_at({0, 0, 1}), std::out_of_range);
  EXPECT_THROW(t.neighbours(8), std::out_of_range);
  EXPECT_THROW(t.hops(0, 8), std::out_of_range);
  EXPECT_THROW(t.host_of(8), std::out_of_range);
  EXPECT_THROW(t.chips_of_host(1), std::out_of_range);
  EXPECT_THROW(t.ring(0, 3), std::out_of_range);
  try {
    t.coords(8);
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("valid ids 0..7"), std::string::npos) << e.what();
  }
}

TEST(Neighbours, MeshWithoutWrap) {
  const Topology t = Topology::parse("v5e-8");  // 2x4
  for (int a = 0; a < 3; ++a) EXPECT_FALSE(t.wraps(a));
  EXPECT_EQ(t.neighbours(0), (std::vector<int>{1, 2}));
  EXPECT_EQ(t.neighbours(3), (std::vector<int>{1, 2, 5}));  // (1,1)
  EXPECT_EQ(t.neighbours(7), (std::vector<int>{5, 6}));
}

TEST(Neighbours, FullCubeWraps) {
  const Topology t = Topology::parse("v5p:4x4x4");
  for (int a = 0; a < 3; ++a) EXPECT_TRUE(t.wraps(a));
  EXPECT_EQ(t.neighbours(0), (std::vector<int>{1, 3, 4, 12, 16, 48}));
  for (int chip = 0; chip < t.num_chips(); ++chip) EXPECT_EQ(t.neighbours(chip).size(), 6u);
}

TEST(Neighbours, SubCubeSlicesDoNotWrap) {
  const Topology t = Topology::parse("v5p-64");  // 2x4x4
  for (int a = 0; a < 3; ++a) EXPECT_FALSE(t.wraps(a));
  EXPECT_EQ(t.neighbours(0), (std::vector<int>{1, 2, 8}));
}

TEST(Neighbours, FullPodEdgeWrapsIn2D) {
  const Topology pod = Topology::parse("v6e-256");
  EXPECT_TRUE(pod.wraps(0));
  EXPECT_TRUE(pod.wraps(1));
  EXPECT_FALSE(pod.wraps(2));
  EXPECT_EQ(pod.neighbours(0), (std::vector<int>{1, 15, 16, 240}));

  const Topology half = Topology::parse("v6e-128");  // 8x16: only y spans the pod
  EXPECT_FALSE(half.wraps(0));
  EXPECT_TRUE(half.wraps(1));
  EXPECT_EQ(half.neighbours(0), (std::vector<int>{1, 8, 120}));
}

TEST(Neighbours, TwoChipAxisCountsOnce) {
  const Topology t = Topology::parse("v6e-4");  // 2x2
  EXPECT_EQ(t.neighbours(0), (std::vector<int>{1, 2}));
  EXPECT_TRUE(Topology::parse("v6e-1").neighbours(0).empty());
}

TEST(Hops, RingDistanceWhereWrapped) {
  const Topology mesh = Topology::parse("v6e-16");  // 4x4, no wrap
  EXPECT_EQ(mesh.hops(0, 0), 0);
  EXPECT_EQ(mesh.hops(0, 3), 3);
  EXPECT_EQ(mesh.hops(0, 15), 6);

  const Topology cube = Topology::parse("v5p:4x4x4");
  EXPECT_EQ(cube.hops(0, 3), 1);  // x wraps
  EXPECT_EQ(cube.hops(0, 2), 2);
  EXPECT_EQ(cube.hops(0, 63), 3);  // (3,3,3): one hop back on each axis
  EXPECT_EQ(cube.hops(0, 42), 6);  // (2,2,2)

  for (int a = 0; a < cube.num_chips(); ++a) {
    for (int b : cube.neighbours(a)) ASSERT_EQ(cube.hops(a, b), 1);
  }
}

TEST(Ring, FollowsLinksStartingAtChip) {
  const Topology cube = Topology::parse("v5p:4x4x4");
  EXPECT_EQ(cube.ring(0, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(cube.ring(2, 0), (std::vector<int>{2, 3, 0, 1}));
  EXPECT_EQ(cube.ring(5, 1), (std::vector<int>{5, 9, 13, 1}));
  EXPECT_EQ(cube.ring(0, 2), (std::vector<int>{0, 16, 32, 48}));
  const std::vector<int> r = cube.ring(21, 2);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(cube.hops(r[i], r[(i + 1) % r.size()]), 1);  // a closed ring of links
  }

  const Topology mesh = Topology::parse("v6e-8");  // 2x4
  EXPECT_EQ(mesh.ring(2, 1), (std::vector<int>{2, 4, 6, 0}));
  EXPECT_EQ(mesh.ring(3, 2), (std::vector<int>{3}));
}

TEST(Hosts, SingleHostSlices) {
  for (const char* name : {"v6e-8", "v5e-4", "v5p-8", "v4-8", "tpu7x-8", "v6e-1"}) {
    const Topology t = Topology::parse(name);
    EXPECT_EQ(t.num_hosts(), 1) << name;
    EXPECT_EQ(t.chips_per_host(), t.num_chips()) << name;
    std::vector<int> all(t.num_chips());
    for (int i = 0; i < t.num_chips(); ++i) all[i] = i;
    EXPECT_EQ(t.chips_of_host(0), all) << name;
  }
}

TEST(Hosts, V6e16IsFourHostsOfTwoByTwo) {
  const Topology t = Topology::parse("v6e-16");
  EXPECT_EQ(t.num_hosts(), 4);
  EXPECT_EQ(t.chips_per_host(), 4);
  EXPECT_EQ(t.chips_of_host(0), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(t.chips_of_host(1), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(t.chips_of_host(2), (std::vector<int>{8, 9, 12, 13}));
  EXPECT_EQ(t.chips_of_host(3), (std::vector<int>{10, 11, 14, 15}));
}

TEST(Hosts, V5p16IsTwoHosts) {
  const Topology t = Topology::parse("v5p-16");  // 2x2x2
  EXPECT_EQ(t.num_hosts(), 2);
  EXPECT_EQ(t.chips_of_host(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.chips_of_host(1), (std::vector<int>{4, 5, 6, 7}));
}

TEST(Hosts, HostOfAgreesWithChipsOfHost) {
  for (const char* name : {"v6e-16", "v6e-256", "v5p-16", "v5p-128", "v5p-256", "tpu7x-64"}) {
    const Topology t = Topology::parse(name);
    std::set<int> seen;
    for (int h = 0; h < t.num_hosts(); ++h) {
      const std::vector<int> chips = t.chips_of_host(h);
      ASSERT_EQ(static_cast<int>(chips.size()), t.chips_per_host()) << name;
      for (int chip : chips) {
        EXPECT_EQ(t.host_of(chip), h) << name;
        EXPECT_TRUE(seen.insert(chip).second) << name;
      }
    }
    EXPECT_EQ(static_cast<int>(seen.size()), t.num_chips()) << name;
  }
}

}  // namespace
