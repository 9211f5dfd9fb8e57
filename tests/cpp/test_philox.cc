// Philox4x32-10 (runtime/philox.h) against Random123's published known-answer
// vectors: the "philox4x32 10" lines of tests/kat_vectors in
// https://github.com/DEShawResearch/random123 (release v1.14.0): counter words
// 0-3, key words 0-1, expected output words 0-3.
#include <gtest/gtest.h>

#include <set>

#include "runtime/philox.h"

namespace {

using torch_tpu::philox4x32;
using torch_tpu::PhiloxCounter;
using torch_tpu::PhiloxKey;

TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter out;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(philox4x32(k.ctr, k.key), k.out);
}

// The stream position is the counter's low 64 bits and the seed the key.
TEST(Philox, BlockMapsPositionAndSeed) {
  EXPECT_EQ(torch_tpu::philox_block(0, 0), (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(torch_tpu::philox_block(0xffffffffffffffffull, 0xffffffffull),
            philox4x32({0xffffffff, 0, 0, 0}, {0xffffffff, 0xffffffff}));
  EXPECT_EQ(torch_tpu::philox_block(0x0000000200000001ull, 0x0000000400000003ull), philox4x32({3, 4, 0, 0}, {1, 2}));
  std::set<PhiloxCounter> seen;
  for (uint64_t p = 0; p < 1000; ++p) seen.insert(torch_tpu::philox_block(42, p));
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(Philox, UniformRanges) {
  EXPECT_EQ(torch_tpu::philox_uniform24(0), 0.0f);
  EXPECT_LT(torch_tpu::philox_uniform24(0xffffffffu), 1.0f);
  EXPECT_EQ(torch_tpu::philox_uniform24(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(torch_tpu::philox_uniform53(0, 0), 0.0);
  EXPECT_LT(torch_tpu::philox_uniform53(0xffffffffu, 0xffffffffu), 1.0);
  EXPECT_EQ(torch_tpu::philox_uniform53(0x80000000u, 0), 0.5);
}

}  // namespace
