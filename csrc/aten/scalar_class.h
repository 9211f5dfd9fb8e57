// What a double scalar argument is, as far as an op's checks and type promotion can tell
// without its value: NaN, infinities, zero, or a finite value's sign, whether it is whole, and
// which float types' ranges it exceeds. Used to key first-call validation (fallback.cc) and,
// for pointwise ops, cached meta results (meta_cache.cc).
#pragma once

#include <cmath>
#include <cstdint>

namespace torch_tpu {

inline uint64_t double_class(double d) {
  if (std::isnan(d)) return 1;
  if (std::isinf(d)) return d > 0 ? 2 : 3;
  if (d == 0) return 4;
  const double a = std::fabs(d);
  return 10 + (d < 0) + 2 * (a == std::floor(a)) + 4 * (a > 65504.0) + 8 * (a > 3.4028234663852886e38) +
         16 * (a < 1.1754943508222875e-38) + 32 * (a > 9007199254740992.0);
}

}  // namespace torch_tpu
