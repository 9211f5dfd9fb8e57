// vmath's exp and tanh (exec/vmath.h) against double-precision libm over a
// sweep of float32 inputs (every 4099th bit pattern, dense ranges around the
// branch points and range limits, special values, subnormals), and the
// promise that the kernels' AVX-512, AVX2 + FMA and baseline clones give the
// same bits: the loops are compiled here for each ISA (with the executor's
// floating-point flags, set for this file in CMakeLists.txt) and compared with
// each other and with the executor's own dispatched entry point.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "exec/tile_ops.h"
#include "exec/vmath.h"

namespace {

using namespace torch_tpu;
namespace vmath = exec::vmath;

enum class Fn { kExp, kTanh };

template <Fn F>
inline __attribute__((always_inline)) void loop(float* __restrict__ d, const float* __restrict__ a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = F == Fn::kExp ? vmath::exp(a[i]) : vmath::tanh(a[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VMATH_TEST_X86 1
template <Fn F>
__attribute__((noinline, target("arch=x86-64-v4"))) void loop_v4(float* d, const float* a, int64_t n) {
  loop<F>(d, a, n);
}
template <Fn F>
__attribute__((noinline, target("arch=x86-64-v3"))) void loop_v3(float* d, const float* a, int64_t n) {
  loop<F>(d, a, n);
}
#endif
template <Fn F>
__attribute__((noinline)) void loop_base(float* d, const float* a, int64_t n) {
  loop<F>(d, a, n);
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> sweep_inputs() {
  std::vector<float> v;
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) v.push_back(from_bits(static_cast<uint32_t>(u)));
  auto dense = [&](float lo, float hi, int count) {
    for (int k = 0; k <= count; ++k) v.push_back(lo + (hi - lo) * static_cast<float>(k) / static_cast<float>(count));
  };
  dense(-12.0f, 12.0f, 200000);  // tanh's range; gelu's arguments
  dense(0.6f, 0.65f, 20000);     // tanh's branch point (0.625)
  dense(-0.65f, -0.6f, 20000);
  dense(8.9f, 9.6f, 20000);  // tanh rounding to 1, the clamp of 2|x| at 19
  dense(-9.6f, -8.9f, 20000);
  dense(87.0f, 89.0f, 20000);            // exp overflow
  dense(-105.0f, -86.0f, 40000);         // exp's subnormal results
  for (uint32_t u = 1; u < 5000; ++u) {  // subnormals and the smallest normals, both signs
    v.push_back(from_bits(u));
    v.push_back(from_bits(u | 0x80000000u));
    v.push_back(from_bits(0x00800000u + u));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.0f,
                  -0.0f,
                  inf,
                  -inf,
                  std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(),
                  0.625f,
                  -0.625f,
                  9.5f,
                  -9.5f,
                  88.72283f,
                  88.72284f,
                  -103.97208f,
                  -103.97209f,
                  -87.33655f,
                  100.0f,
                  -110.0f,
                  1e-20f,
                  -1e-20f})
    v.push_back(s);
  return v;
}

// |got - ref| in units of the float spacing at ref (2^-149 below the normal
// range; a float infinity counts as 2^128, the next power of two after the
// largest float); NaN and an infinite ref must match exactly, a ref that
// rounds to infinity is met by infinity.
double ulp_error(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0.0 : 1e30;
  if (std::isinf(ref)) return static_cast<double>(got) == ref ? 0.0 : 1e30;
  if (std::isnan(got)) return 1e30;
  if (std::isinf(static_cast<float>(ref)) && std::isinf(got) && (got > 0) == (ref > 0)) return 0.0;  // overflow
  const double g = std::isinf(got) ? std::copysign(std::ldexp(1.0, 128), got) : static_cast<double>(got);
  int e;
  std::frexp(std::fabs(ref), &e);
  const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(g - ref) / ulp;
}

double reference(Fn f, float x) {
  return f == Fn::kExp ? std::exp(static_cast<double>(x)) : std::tanh(static_cast<double>(x));
}

// The executor's own dispatched entry point (the clone for this CPU).
std::vector<float> run_executor(Fn f, const std::vector<float>& x) {
  std::vector<float> d(x.size());
  exec::tile::unary(f == Fn::kExp ? ir::OpKind::kExponential : ir::OpKind::kTanh, exec::Lane::kF32, d.data(), x.data(),
                    static_cast<int64_t>(x.size()));
  return d;
}

void expect_max_ulp(Fn f, double bound) {
  const std::vector<float> x = sweep_inputs();
  const std::vector<float> d = run_executor(f, x);
  double worst = 0.0;
  float worst_x = 0.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = ulp_error(d[i], reference(f, x[i]));
    if (e > worst) worst = e, worst_x = x[i];
  }
  std::printf("[ vmath    ] %s: max %.3f ulp at x = %a\n", f == Fn::kExp ? "exp" : "tanh", worst, worst_x);
  EXPECT_LE(worst, bound) << "at x = " << worst_x << " (bits 0x" << std::hex << bits(worst_x) << ")";
}

TEST(Vmath, ExpMaxUlp) { expect_max_ulp(Fn::kExp, 1.0); }
TEST(Vmath, TanhMaxUlp) { expect_max_ulp(Fn::kTanh, 2.0); }

TEST(Vmath, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f,         -0.0f,        inf,     -inf,     std::numeric_limits<float>::quiet_NaN(),
                                89.0f,        -104.0f,      -110.0f, -1000.0f, 1000.0f,
                                from_bits(1), -from_bits(1)};
  const std::vector<float> d = run_executor(Fn::kExp, x);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[1], 1.0f);
  EXPECT_EQ(d[2], inf);
  EXPECT_EQ(bits(d[3]), 0u);  // +0
  EXPECT_TRUE(std::isnan(d[4]));
  EXPECT_EQ(d[5], inf);
  EXPECT_EQ(d[6], static_cast<float>(std::exp(-104.0)));  // subnormal, correctly rounded
  EXPECT_EQ(bits(d[7]), 0u);
  EXPECT_EQ(bits(d[8]), 0u);
  EXPECT_EQ(d[9], inf);
  EXPECT_EQ(d[10], 1.0f);
  EXPECT_EQ(d[11], 1.0f);
}

TEST(Vmath, TanhSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 9.5f, -20.0f, 1e30f};
  for (uint32_t u : {1u, 2u, 0x7FFFFFu, 0x800000u, 0x39800000u})  // subnormals, smallest normal, 2^-12
    x.push_back(from_bits(u)), x.push_back(-from_bits(u));
  const std::vector<float> d = run_executor(Fn::kTanh, x);
  EXPECT_EQ(bits(d[0]), 0u);
  EXPECT_EQ(bits(d[1]), 0x80000000u);  // -0 kept
  EXPECT_EQ(d[2], 1.0f);
  EXPECT_EQ(d[3], -1.0f);
  EXPECT_TRUE(std::isnan(d[4]));
  EXPECT_EQ(d[5], 1.0f);
  EXPECT_EQ(d[6], -1.0f);
  EXPECT_EQ(d[7], 1.0f);
  for (size_t i = 8; i < x.size(); ++i) EXPECT_EQ(bits(d[i]), bits(x[i])) << "tanh(x) == x for tiny x = " << x[i];
}

// Bits of a and b equal (NaNs: both NaN; their payload is not promised).
::testing::AssertionResult same_bits(const std::vector<float>& x, const std::vector<float>& a,
                                     const std::vector<float>& b) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits(a[i]) != bits(b[i]))
      return ::testing::AssertionFailure() << "x = " << x[i] << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

template <Fn F>
void expect_clones_agree() {
  const std::vector<float> x = sweep_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> base(x.size()), other(x.size());
  loop_base<F>(base.data(), x.data(), n);
  EXPECT_TRUE(same_bits(x, base, run_executor(F, x))) << "baseline vs the executor's dispatched clone";
#ifdef VMATH_TEST_X86
  if (__builtin_cpu_supports("x86-64-v3")) {
    loop_v3<F>(other.data(), x.data(), n);
    EXPECT_TRUE(same_bits(x, base, other)) << "baseline vs x86-64-v3";
  }
  if (__builtin_cpu_supports("x86-64-v4")) {
    loop_v4<F>(other.data(), x.data(), n);
    EXPECT_TRUE(same_bits(x, base, other)) << "baseline vs x86-64-v4";
  }
#endif
}

TEST(Vmath, ExpClonesBitIdentical) { expect_clones_agree<Fn::kExp>(); }
TEST(Vmath, TanhClonesBitIdentical) { expect_clones_agree<Fn::kTanh>(); }

}  // namespace
