// The Philox normals (runtime/philox.h, philox_normal_lanes) compiled here for AVX-512, AVX2 and
// the baseline x86-64, with the executor's floating-point flags (set for this file in
// CMakeLists.txt, as random_ops.cc's): the three give the same bits, and each is within a few
// ulp of Box-Muller in double on the same words.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/philox.h"

namespace {

using torch_tpu::kPhiloxLanes;

// Forced inline: each wrapper below compiles the loop for its own instruction set.
inline __attribute__((always_inline)) void fill(uint64_t seed, uint64_t start, int64_t blocks, float* z) {
  for (int64_t k = 0; k < blocks; ++k)
    torch_tpu::philox_normal_lanes(seed, start + k * kPhiloxLanes, z + k * kPhiloxLanes);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHILOX_TEST_X86 1
__attribute__((noinline, target("arch=x86-64-v4"))) void fill_v4(uint64_t s, uint64_t a, int64_t b, float* z) {
  fill(s, a, b, z);
}
__attribute__((noinline, target("arch=x86-64-v3"))) void fill_v3(uint64_t s, uint64_t a, int64_t b, float* z) {
  fill(s, a, b, z);
}
#endif
__attribute__((noinline)) void fill_base(uint64_t s, uint64_t a, int64_t b, float* z) { fill(s, a, b, z); }

constexpr int64_t kBlocks = 2048;  // 131072 normals

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(PhiloxLanes, NormalsMatchDoubleBoxMuller) {
  const uint64_t seed = 0x243F6A8885A308D3ull, start = (1ull << 32) - 1000;  // crosses the low word
  std::vector<float> z(kBlocks * kPhiloxLanes);
  fill_base(seed, start, kBlocks, z.data());
  double worst = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(z.size()); ++i) {
    const auto b = torch_tpu::philox_block(seed, start + static_cast<uint64_t>(i));
    const double u1 = 1.0 - static_cast<double>(b[0] >> 8) / 16777216.0;
    const double u2 = static_cast<double>(b[1] >> 8) / 16777216.0;
    const double expected = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    ASSERT_TRUE(std::isfinite(z[i])) << i;
    worst = std::max(worst, std::abs(z[i] - expected));
  }
  // float rounding of u2 * 2 pi near |cos| = 1 and of the radius: a few 1e-7 absolute.
  EXPECT_LT(worst, 4e-6);
}

#ifdef PHILOX_TEST_X86
TEST(PhiloxLanes, SameBitsOnEveryInstructionSet) {
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!v3) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<float> base(kBlocks * kPhiloxLanes), other(base.size());
  fill_base(7, 123, kBlocks, base.data());
  fill_v3(7, 123, kBlocks, other.data());
  for (size_t i = 0; i < base.size(); ++i) ASSERT_EQ(bits(base[i]), bits(other[i])) << "AVX2, element " << i;
  if (!v4) return;
  fill_v4(7, 123, kBlocks, other.data());
  for (size_t i = 0; i < base.size(); ++i) ASSERT_EQ(bits(base[i]), bits(other[i])) << "AVX-512, element " << i;
}
#endif

}  // namespace
