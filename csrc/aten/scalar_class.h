// What a scalar argument is, as far as an op's checks and type promotion can tell without its
// exact value. Used to key first-call validation (fallback.cc) and, for pointwise ops, cached
// meta results (meta_cache.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace torch_tpu {

// A magnitude's bit width and how close it is to the powers of two on either side (0 for 0):
// range checks sit there (int8 holds 127 and -128, randperm's n - 1 must fit its dtype), so
// values within three of one are told apart exactly.
inline uint64_t magnitude_class(uint64_t m) {
  if (m == 0) return 0;
  const int width = 64 - __builtin_clzll(m);
  const uint64_t above = m - (uint64_t{1} << (width - 1));
  const uint64_t below = width < 64 ? (uint64_t{1} << width) - m : ~m + 1;
  return static_cast<uint64_t>(width) << 4 | std::min<uint64_t>(above, 3) << 2 | std::min<uint64_t>(below, 3);
}

// NaN, the infinities, zero, or a finite value's sign, whether it is whole (and then its
// magnitude_class, as an integer of its sign: -128 as 127), and which floating types' finite
// ranges it exceeds (float8 e4m3fn 448, e5m2 57344, float16 65504, bfloat16, float32) or
// falls below (float32's smallest normal), or beyond 2^53.
inline uint64_t double_class(double d) {
  if (std::isnan(d)) return 1;
  if (std::isinf(d)) return d > 0 ? 2 : 3;
  if (d == 0) return 4;
  const double a = std::fabs(d);
  const bool whole = a == std::floor(a);
  uint64_t cls = 10 + (d < 0) + 2 * whole + 4 * (a > 65504.0) + 8 * (a > 3.4028234663852886e38) +
                 16 * (a < 1.1754943508222875e-38) + 32 * (a > 9007199254740992.0) + 64 * (a > 448.0) +
                 128 * (a > 57344.0) + 256 * (a > 3.3895313892515355e38);
  if (whole && a < 9223372036854775808.0) {
    const uint64_t m = static_cast<uint64_t>(a) - (d < 0);
    cls |= magnitude_class(m) << 16;
  }
  return cls;
}

}  // namespace torch_tpu
