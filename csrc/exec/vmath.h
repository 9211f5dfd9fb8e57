// float32 transcendental functions written so that loops over them
// auto-vectorize: straight-line arithmetic, selects instead of branches, no
// libm calls. IEEE arithmetic is required (no -ffast-math): the rounding
// tricks below rely on it. Special values (+-inf, NaN, +-0, subnormals)
// follow C99 Annex F. Polynomials are Cephes' single-precision ones
// (S. Moshier); erf is the rational approximation Eigen and XLA use for f32.
// Errors stay within a few ulp; sin/cos are accurate for |x| <= 8192 and the
// kernels recompute larger arguments in double.
//
// exp and tanh evaluate with explicit fused multiply-adds (vmath::fma): one
// rounding per step, the same on every CPU. The kernels' AVX-512 and AVX2
// (x86-64-v3) clones issue vfmadd; the baseline x86-64 clone, for CPUs
// without FMA (none since 2013), calls libm's exact fmaf per element: slow,
// but bit-identical (tests/cpp/test_vmath.cc checks both).
#pragma once

#include <cstdint>

#include "ir/types.h"

// Forced inline: the kernels' loops vectorize only with the body in place.
#define VMATH_INLINE inline __attribute__((always_inline))

namespace torch_tpu::exec::vmath {

using ir::f32_bits;
using ir::f32_from_bits;

constexpr float kInf = __builtin_inff();

VMATH_INLINE float select(bool c, float a, float b) { return c ? a : b; }

// a * b + c rounded once (IEEE fusedMultiplyAdd); never contracted or split.
VMATH_INLINE float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// exp's core for a clamped, non-NaN argument: e^r * 2^n with
// n = round(x / ln 2) (the 1.5 * 2^23 trick: round to nearest even) and
// r = x - n ln 2 in two parts (0.693359375 has 9 bits: n times it is exact).
VMATH_INLINE float exp_reduced(float xc, float* n_out) {
  float n = fma(xc, 1.44269504088896341f, 12582912.0f);
  n = n - 12582912.0f;
  float r = fma(n, -0.693359375f, xc);
  r = fma(n, 2.12194440e-4f, r);
  const float z = r * r;
  float p = 1.9875691500E-4f;
  p = fma(p, r, 1.3981999507E-3f);
  p = fma(p, r, 8.3334519073E-3f);
  p = fma(p, r, 4.1665795894E-2f);
  p = fma(p, r, 1.6666665459E-1f);
  p = fma(p, r, 5.0000001201E-1f);
  p = fma(p, z, r);
  *n_out = n;
  return p + 1.0f;
}

VMATH_INLINE float exp(float x) {
  // Clamp so that the exponent split below stays in range; exp(100) already
  // overflows and exp(-110) underflows to 0. NaN is restored at the end.
  float xc = x > 100.0f ? 100.0f : x;
  xc = xc < -110.0f ? -110.0f : xc;
  xc = x == x ? xc : 0.0f;
  float n;
  const float p = exp_reduced(xc, &n);
  // 2^n as two normal factors so that subnormal results round once.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = f32_from_bits(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = f32_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
  const float result = (p * s1) * s2;
  return x == x ? result : x;
}

VMATH_INLINE float log(float x) {
  const bool subnormal = x < 1.17549435e-38f;
  const float xs = subnormal ? x * 8388608.0f : x;  // 2^23
  const uint32_t b = f32_bits(xs);
  int32_t e = static_cast<int32_t>((b >> 23) & 0xFFu) - 126 - (subnormal ? 23 : 0);
  float m = f32_from_bits((b & 0x007FFFFFu) | 0x3F000000u);  // [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1 : e;
  m = low ? (m + m) - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292E-2f;
  y = y * m + -1.1514610310E-1f;
  y = y * m + 1.1676998740E-1f;
  y = y * m + -1.2420140846E-1f;
  y = y * m + 1.4249322787E-1f;
  y = y * m + -1.6668057665E-1f;
  y = y * m + 2.0000714765E-1f;
  y = y * m + -2.4999993993E-1f;
  y = y * m + 3.3333331174E-1f;
  y = (y * m) * z;
  const float fe = static_cast<float>(e);
  y = y + fe * -2.12194440e-4f;
  y = y + -0.5f * z;
  float r = m + y;
  r = r + fe * 0.693359375f;
  r = x < 0.0f ? __builtin_nanf("") : r;
  r = x == 0.0f ? -kInf : r;
  r = x == kInf ? kInf : r;
  return x == x ? r : x;
}

// log(1 + x) = log(u) * x / (u - 1) with u = 1 + x (Goldberg).
VMATH_INLINE float log1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  const float l = vmath::log(u);
  const float q = d == 0.0f ? 1.0f : x / d;
  float r = d == 0.0f ? x : l * q;
  r = x == kInf ? kInf : r;
  return r;
}

// exp(x) - 1 = (u - 1) * x / log(u) with u = exp(x) (Kahan).
VMATH_INLINE float expm1(float x) {
  const float u = vmath::exp(x);
  const float um1 = u - 1.0f;
  const float l = vmath::log(u);
  const float ls = ((l == 0.0f) | (l != l)) ? 1.0f : l;  // "|": no branch
  float r = (um1 * x) / ls;
  r = ((u == 1.0f) | (x != x)) ? x : r;  // (this form if-converts; GCC 12)
  r = um1 == -1.0f ? -1.0f : r;
  r = u == kInf ? kInf : r;
  return r;
}

// tanh(|x|) with the sign of x put back (odd function; keeps -0 and NaN):
// Cephes' odd polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above. Past
// |x| = 9.01 the result rounds to 1, so 2|x| is clamped to 19: e stays a
// normal float below 2^28 and needs none of exp's range handling.
VMATH_INLINE float tanh(float x) {
  const float ax = __builtin_fabsf(x);
  const float z = ax * ax;
  float p = -5.70498872745E-3f;
  p = fma(p, z, 2.06390887954E-2f);
  p = fma(p, z, -5.37397155531E-2f);
  p = fma(p, z, 1.33314422036E-1f);
  p = fma(p, z, -3.33332819422E-1f);
  const float small = fma(p * z, ax, ax);  // ax exactly where z underflows
  const float y = ax + ax;
  float n;
  const float m = exp_reduced(y < 19.0f ? y : 19.0f, &n);  // NaN: 19, replaced below
  const float e = m * f32_from_bits(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  const float big = 1.0f - 2.0f / (e + 1.0f);
  const float t = ax >= 0.625f ? big : small;  // NaN takes the polynomial: stays NaN
  return f32_from_bits(f32_bits(t) | (f32_bits(x) & 0x80000000u));
}

VMATH_INLINE float logistic(float x) { return 1.0f / (1.0f + vmath::exp(-x)); }

VMATH_INLINE float erf(float a) {
  float x = a > 4.0f ? 4.0f : a;
  x = x < -4.0f ? -4.0f : x;
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return p / q;
}

// Cephes sinf/cosf: reduce by pi/4 in three parts, pick the sine or cosine
// polynomial by octant. Valid for |x| <= 8192; callers fix up the rest.
constexpr float kTrigLimit = 8192.0f;

VMATH_INLINE void trig_reduce(float ax, float* r, int32_t* j) {
  const float axc = ax <= kTrigLimit ? ax : 0.0f;             // also NaN -> 0
  int32_t q = static_cast<int32_t>(axc * 1.27323954473516f);  // 4/pi
  q = (q + 1) & ~1;
  const float y = static_cast<float>(q);
  *r = ((axc - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f;
  *j = q;
}

VMATH_INLINE float sin_poly(float x, float z) {
  float p = -1.9515295891E-4f;
  p = p * z + 8.3321608736E-3f;
  p = p * z + -1.6666654611E-1f;
  return (p * z) * x + x;
}

VMATH_INLINE float cos_poly(float z) {
  float p = 2.443315711809948E-005f;
  p = p * z + -1.388731625493765E-003f;
  p = p * z + 4.166664568298827E-002f;
  return ((p * z) * z - 0.5f * z) + 1.0f;
}

VMATH_INLINE float sin(float x) {
  float r;
  int32_t j;
  trig_reduce(__builtin_fabsf(x), &r, &j);
  const float z = r * r;
  const float v = (j & 2) ? cos_poly(z) : sin_poly(r, z);
  const uint32_t flip = ((j & 4) ? 0x80000000u : 0u) ^ (f32_bits(x) & 0x80000000u);
  return f32_from_bits(f32_bits(v) ^ flip);
}

VMATH_INLINE float cos(float x) {
  float r;
  int32_t j;
  trig_reduce(__builtin_fabsf(x), &r, &j);
  const float z = r * r;
  const float v = (j & 2) ? sin_poly(r, z) : cos_poly(z);
  const uint32_t flip = (((j & 4) != 0) != ((j & 2) != 0)) ? 0x80000000u : 0u;
  return f32_from_bits(f32_bits(v) ^ flip);
}

}  // namespace torch_tpu::exec::vmath
