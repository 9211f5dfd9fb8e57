// Runtime: environment parsing and per-chip streams.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "vtpu/runtime.h"

namespace {

using vtpu::AsyncError;
using vtpu::Chip;
using vtpu::Runtime;
using vtpu::Topology;

TEST(RuntimeEnv, HbmBytes) {
  EXPECT_EQ(Runtime::parse_hbm_bytes("17179869184"), 17179869184ull);
  EXPECT_EQ(Runtime::parse_hbm_bytes("16GiB"), 16ull << 30);
  EXPECT_EQ(Runtime::parse_hbm_bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(Runtime::parse_hbm_bytes(" 512 mib "), 512ull << 20);
  EXPECT_EQ(Runtime::parse_hbm_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(Runtime::parse_hbm_bytes("16GB"), 16000000000ull);
  EXPECT_EQ(Runtime::parse_hbm_bytes("4096B"), 4096ull);
  for (const char* bad : {"", "abc", "-5", "0", "12XB", "1.2.3GiB", "GiB", "1.5"}) {
    EXPECT_THROW(Runtime::parse_hbm_bytes(bad), std::invalid_argument) << bad;
  }
}

TEST(RuntimeEnv, VisibleChips) {
  EXPECT_EQ(Runtime::parse_visible_chips("0,2,3", 8), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(Runtime::parse_visible_chips(" 5 ", 8), (std::vector<int>{5}));
  EXPECT_TRUE(Runtime::parse_visible_chips("", 8).empty());
  for (const char* bad : {"8", "-1", "0,,1", "a", "1,1", "0,"}) {
    EXPECT_THROW(Runtime::parse_visible_chips(bad, 8), std::invalid_argument) << bad;
  }
}

TEST(Chip, StreamsAreCreatedLazilyWithIds) {
  const Topology topology = Topology::parse("v6e-8");
  Chip chip(0, 3, topology, 1ull << 30);
  EXPECT_EQ(chip.coords(), (vtpu::Coord{1, 1, 0}));
  EXPECT_EQ(chip.spec().generation, "v6e");
  EXPECT_EQ(chip.hbm().capacity(), 1ull << 30);
  EXPECT_EQ(chip.default_stream().id(), 0);
  EXPECT_EQ(chip.new_stream(), 1);
  EXPECT_EQ(chip.new_stream(), 2);
  EXPECT_EQ(chip.stream(2).id(), 2);
  EXPECT_THROW(chip.stream(3), std::out_of_range);
  EXPECT_THROW(chip.stream(-1), std::out_of_range);
}

TEST(Chip, SynchronizeDrainsAllStreamsAndRaisesFirstError) {
  const Topology topology = Topology::parse("v6e-8");
  Chip chip(1, 1, topology, 1ull << 30);
  const int64_t side = chip.new_stream();
  int done = 0;
  chip.stream(side).enqueue("side_ok", [&] { done = 1; });
  chip.default_stream().enqueue("bad_op", [] { throw std::runtime_error("bad"); });
  try {
    chip.synchronize();
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find("'bad_op' on tpu:1: bad"), std::string::npos) << e.what();
  }
  EXPECT_EQ(done, 1);
  EXPECT_NO_THROW(chip.synchronize());
}

// Runs with the environment this test binary was started with; the default
// topology is v6e-8 with host 0's chips.
TEST(Runtime, SingletonSeesItsChips) {
  Runtime& rt = Runtime::get();
  EXPECT_EQ(&rt, &Runtime::get());
  ASSERT_GE(rt.device_count(), 0);
  for (int i = 0; i < rt.device_count(); ++i) EXPECT_EQ(rt.chip(i).index(), i);
  EXPECT_THROW(rt.chip(rt.device_count()), std::out_of_range);
  EXPECT_THROW(rt.chip(-1), std::out_of_range);
}

}  // namespace
