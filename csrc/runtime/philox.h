// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw,
// "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11), as published in
// Random123 (philox.h; constants and round function from the paper's
// Table 2 and section 4.2). Header-only and torch-free, so the C++ tests
// check it against Random123's known-answer vectors.
//
// The tpu generator's stream: element i of a random op issued at generator
// state (seed, offset) is a function of Philox(counter = offset + i, key =
// seed) alone (see philox_block), so any slice of a tensor can be drawn on its
// own: DTensor shards initialised apart equal the tensor initialised whole.
#pragma once

#include <array>
#include <cstdint>

#include "exec/vmath.h"

namespace torch_tpu {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multipliers
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // Weyl key increments (golden ratio, sqrt(3) - 1)
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline PhiloxCounter philox4x32_round(PhiloxCounter c, PhiloxKey k) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

// Philox4x32 with `rounds` rounds (10 is the standard, "Philox4x32-10").
inline PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k, int rounds = 10) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    c = philox4x32_round(c, k);
  }
  return c;
}

// The 128 random bits of stream position `position` (offset + element index)
// under a 64-bit seed.
inline PhiloxCounter philox_block(uint64_t seed, uint64_t position) {
  return philox4x32({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), 0u, 0u},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// Blocks of the positions start .. start + kPhiloxLanes - 1, as philox_block computes
// them, in structure-of-arrays form (out[word][lane]) so that compilers vectorize it.
constexpr int kPhiloxLanes = 64;
// Forced inline: the callers compile it once per instruction set (target_clones).
inline __attribute__((always_inline)) void philox_blocks(uint64_t seed, uint64_t start, uint32_t (*out)[kPhiloxLanes]) {
  uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
  for (int j = 0; j < kPhiloxLanes; ++j) {
    const uint64_t p = start + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(p);
    c1[j] = static_cast<uint32_t>(p >> 32);
    c2[j] = 0;
    c3[j] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    for (int j = 0; j < kPhiloxLanes; ++j) {
      const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0[j];
      const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = static_cast<uint32_t>(p1);
      c3[j] = static_cast<uint32_t>(p0);
      c0[j] = n0;
      c2[j] = n2;
    }
  }
  for (int j = 0; j < kPhiloxLanes; ++j) {
    out[0][j] = c0[j];
    out[1][j] = c1[j];
    out[2][j] = c2[j];
    out[3][j] = c3[j];
  }
}

// Uniform draws from a block: [0, 1) with 24 bits (float and narrower) or 53 bits (double).
inline float philox_uniform24(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }
inline double philox_uniform53(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

// A standard normal from a block's words 0 and 1, in float: Box-Muller's cosine branch,
// sqrt(-2 ln(1 - u0)) cos(2 pi u1) on their 24-bit uniforms, with vmath's log and cos. Built with
// the executor's floating-point flags (-ffp-contract=off), loops over it vectorize and give the
// same bits on every instruction set (tests/cpp/test_philox_lanes.cc).
inline __attribute__((always_inline)) float philox_box_muller(uint32_t w0, uint32_t w1) {
  const float u1 = 1.0f - philox_uniform24(w0);
  const float u2 = philox_uniform24(w1);
  return __builtin_sqrtf(-2.0f * exec::vmath::log(u1)) * exec::vmath::cos(6.28318530717958647692f * u2);
}

// The standard normals of positions start .. start + kPhiloxLanes - 1.
inline __attribute__((always_inline)) void philox_normal_lanes(uint64_t seed, uint64_t start, float* z) {
  uint32_t w[4][kPhiloxLanes];
  philox_blocks(seed, start, w);
  for (int j = 0; j < kPhiloxLanes; ++j) z[j] = philox_box_muller(w[0][j], w[1][j]);
}

}  // namespace torch_tpu
