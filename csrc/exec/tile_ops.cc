#include "exec/tile_ops.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "exec/vmath.h"

// Runtime CPU dispatch: each entry point below exists as an AVX-512 (x86-64-v4),
// an AVX2 + FMA (x86-64-v3) and a baseline clone; the loops are forced inline so each clone
// vectorizes them for its own ISA (vmath's explicit FMAs: vfmadd in the first two, libm's
// exact fmaf in the baseline one, so all three give the same bits).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TPU_CLONES
#endif
#define TPU_AI inline __attribute__((always_inline))

namespace torch_tpu::exec {

using ir::CompareDirection;
using ir::ElementType;
using ir::OpKind;
using ir::ReduceKind;

Lane lane_of(ElementType t) {
  switch (t) {
    case ElementType::f32:
    case ElementType::bf16:
    case ElementType::f16:
      return Lane::kF32;
    case ElementType::f64:
      return Lane::kF64;
    case ElementType::pred:
      return Lane::kPred;
    default:
      return Lane::kI64;
  }
}

int64_t lane_bytes(Lane l) {
  switch (l) {
    case Lane::kF32:
      return 4;
    case Lane::kF64:
    case Lane::kI64:
      return 8;
    case Lane::kPred:
      return 1;
  }
  return 8;
}

const char* lane_name(Lane l) {
  switch (l) {
    case Lane::kF32:
      return "f32";
    case Lane::kF64:
      return "f64";
    case Lane::kI64:
      return "i64";
    case Lane::kPred:
      return "pred";
  }
  return "?";
}

namespace tile {
namespace {

using u8 = uint8_t;
using u64 = uint64_t;

[[noreturn]] void unsupported(const char* what, OpKind op, Lane lane) {
  throw std::logic_error(std::string("[") + ir::op_name(op) + "] no " + what + " tile loop for lane " +
                         lane_name(lane));
}

template <class T, class F>
TPU_AI void map1(T* __restrict__ d, const T* __restrict__ a, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) d[i] = f(a[i]);
}

template <class T, class R, class F>
TPU_AI void map2(R* __restrict__ d, const T* __restrict__ a, T ia, const T* __restrict__ b, T ib, int64_t n, F f) {
  if (a && b) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
  } else if (a) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], ib);
  } else if (b) {
    for (int64_t i = 0; i < n; ++i) d[i] = f(ia, b[i]);
  } else {
    const R v = f(ia, ib);
    for (int64_t i = 0; i < n; ++i) d[i] = v;
  }
}

template <class T, class F>
TPU_AI void pair_loop(T* __restrict__ d, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c,
                      int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], b[i], c[i]);
}

template <class T>
TPU_AI T imm_as(Imm v) {
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(v.f);
  else
    return static_cast<T>(v.i);
}

// NaN-propagating maximum / minimum (XLA, PyTorch).
template <class T>
TPU_AI T fmax_nan(T x, T y) {
  return (x > y || x != x) ? x : y;
}
template <class T>
TPU_AI T fmin_nan(T x, T y) {
  return (x < y || x != x) ? x : y;
}

template <class T>
TPU_AI void unary_float(OpKind op, T* __restrict__ d, const T* __restrict__ a, int64_t n) {
  switch (op) {
    case OpKind::kNegate:
      map1(d, a, n, [](T x) { return -x; });
      return;
    case OpKind::kAbs:
      map1(d, a, n, [](T x) { return std::fabs(x); });
      return;
    case OpKind::kSqrt:
      map1(d, a, n, [](T x) { return std::sqrt(x); });
      return;
    case OpKind::kRsqrt:
      map1(d, a, n, [](T x) { return T(1) / std::sqrt(x); });
      return;
    case OpKind::kFloor:
      map1(d, a, n, [](T x) { return std::floor(x); });
      return;
    case OpKind::kCeil:
      map1(d, a, n, [](T x) { return std::ceil(x); });
      return;
    case OpKind::kSign:
      map1(d, a, n, [](T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); });
      return;
    default:
      break;
  }
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case OpKind::kExponential:
        map1(d, a, n, [](float x) { return vmath::exp(x); });
        return;
      case OpKind::kLog:
        map1(d, a, n, [](float x) { return vmath::log(x); });
        return;
      case OpKind::kLogPlusOne:
        map1(d, a, n, [](float x) { return vmath::log1p(x); });
        return;
      case OpKind::kExponentialMinusOne:
        map1(d, a, n, [](float x) { return vmath::expm1(x); });
        return;
      case OpKind::kTanh:
        map1(d, a, n, [](float x) { return vmath::tanh(x); });
        return;
      case OpKind::kLogistic:
        map1(d, a, n, [](float x) { return vmath::logistic(x); });
        return;
      case OpKind::kErf:
        map1(d, a, n, [](float x) { return vmath::erf(x); });
        return;
      case OpKind::kSine:
        map1(d, a, n, [](float x) { return vmath::sin(x); });
        for (int64_t i = 0; i < n; ++i)
          if (!(std::fabs(a[i]) <= vmath::kTrigLimit)) d[i] = static_cast<float>(std::sin(static_cast<double>(a[i])));
        return;
      case OpKind::kCosine:
        map1(d, a, n, [](float x) { return vmath::cos(x); });
        for (int64_t i = 0; i < n; ++i)
          if (!(std::fabs(a[i]) <= vmath::kTrigLimit)) d[i] = static_cast<float>(std::cos(static_cast<double>(a[i])));
        return;
      default:
        break;
    }
  } else {
    // f64 is emulated on a TPU: correctness over speed, libm in double.
    switch (op) {
      case OpKind::kExponential:
        map1(d, a, n, [](double x) { return std::exp(x); });
        return;
      case OpKind::kLog:
        map1(d, a, n, [](double x) { return std::log(x); });
        return;
      case OpKind::kLogPlusOne:
        map1(d, a, n, [](double x) { return std::log1p(x); });
        return;
      case OpKind::kExponentialMinusOne:
        map1(d, a, n, [](double x) { return std::expm1(x); });
        return;
      case OpKind::kTanh:
        map1(d, a, n, [](double x) { return std::tanh(x); });
        return;
      case OpKind::kLogistic:
        map1(d, a, n, [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
        return;
      case OpKind::kErf:
        map1(d, a, n, [](double x) { return std::erf(x); });
        return;
      case OpKind::kSine:
        map1(d, a, n, [](double x) { return std::sin(x); });
        return;
      case OpKind::kCosine:
        map1(d, a, n, [](double x) { return std::cos(x); });
        return;
      default:
        break;
    }
  }
  unsupported("unary", op, std::is_same_v<T, float> ? Lane::kF32 : Lane::kF64);
}

template <class T>
TPU_AI void binary_float(OpKind op, T* d, const T* a, T ia, const T* b, T ib, int64_t n) {
  switch (op) {
    case OpKind::kAdd:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return x + y; });
      return;
    case OpKind::kSubtract:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return x - y; });
      return;
    case OpKind::kMultiply:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return x * y; });
      return;
    case OpKind::kDivide:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return x / y; });
      return;
    case OpKind::kMaximum:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return fmax_nan(x, y); });
      return;
    case OpKind::kMinimum:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return fmin_nan(x, y); });
      return;
    case OpKind::kPower:
      // General exponents: correctly rounded enough through double pow.
      map2(d, a, ia, b, ib, n,
           [](T x, T y) { return static_cast<T>(std::pow(static_cast<double>(x), static_cast<double>(y))); });
      return;
    default:
      unsupported("binary", op, std::is_same_v<T, float> ? Lane::kF32 : Lane::kF64);
  }
}

TPU_AI void binary_int(OpKind op, int64_t* d, const int64_t* a, int64_t ia, const int64_t* b, int64_t ib, int64_t n) {
  switch (op) {
    case OpKind::kAdd:
      map2(d, a, ia, b, ib, n,
           [](int64_t x, int64_t y) { return static_cast<int64_t>(static_cast<u64>(x) + static_cast<u64>(y)); });
      return;
    case OpKind::kSubtract:
      map2(d, a, ia, b, ib, n,
           [](int64_t x, int64_t y) { return static_cast<int64_t>(static_cast<u64>(x) - static_cast<u64>(y)); });
      return;
    case OpKind::kMultiply:
      map2(d, a, ia, b, ib, n,
           [](int64_t x, int64_t y) { return static_cast<int64_t>(static_cast<u64>(x) * static_cast<u64>(y)); });
      return;
    case OpKind::kDivide:
      map2(d, a, ia, b, ib, n, [](int64_t x, int64_t y) { return ir::int_divide(x, y); });
      return;
    case OpKind::kMaximum:
      map2(d, a, ia, b, ib, n, [](int64_t x, int64_t y) { return x > y ? x : y; });
      return;
    case OpKind::kMinimum:
      map2(d, a, ia, b, ib, n, [](int64_t x, int64_t y) { return x < y ? x : y; });
      return;
    case OpKind::kPower:
      map2(d, a, ia, b, ib, n, [](int64_t x, int64_t y) { return ir::int_power(x, y); });
      return;
    case OpKind::kAnd:
      map2(d, a, ia, b, ib, n, [](int64_t x, int64_t y) { return x & y; });
      return;
    case OpKind::kOr:
      map2(d, a, ia, b, ib, n, [](int64_t x, int64_t y) { return x | y; });
      return;
    default:
      unsupported("binary", op, Lane::kI64);
  }
}

TPU_AI void binary_pred(OpKind op, u8* d, const u8* a, u8 ia, const u8* b, u8 ib, int64_t n) {
  switch (op) {
    case OpKind::kAnd:
    case OpKind::kMinimum:
      map2(d, a, ia, b, ib, n, [](u8 x, u8 y) { return static_cast<u8>(x & y); });
      return;
    case OpKind::kOr:
    case OpKind::kMaximum:
      map2(d, a, ia, b, ib, n, [](u8 x, u8 y) { return static_cast<u8>(x | y); });
      return;
    default:
      unsupported("binary", op, Lane::kPred);
  }
}

template <class T>
TPU_AI void compare_typed(CompareDirection dir, u8* d, const T* a, T ia, const T* b, T ib, int64_t n) {
  switch (dir) {
    case CompareDirection::EQ:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return static_cast<u8>(x == y); });
      return;
    case CompareDirection::NE:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return static_cast<u8>(x != y); });
      return;
    case CompareDirection::LT:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return static_cast<u8>(x < y); });
      return;
    case CompareDirection::LE:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return static_cast<u8>(x <= y); });
      return;
    case CompareDirection::GT:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return static_cast<u8>(x > y); });
      return;
    case CompareDirection::GE:
      map2(d, a, ia, b, ib, n, [](T x, T y) { return static_cast<u8>(x >= y); });
      return;
  }
}

template <class T>
TPU_AI void select_typed(T* __restrict__ d, const u8* __restrict__ p, const T* __restrict__ a, T ia,
                         const T* __restrict__ b, T ib, int64_t n) {
  // Both sides are read unconditionally so that the select if-converts.
  if (a && b) {
    for (int64_t i = 0; i < n; ++i) {
      const T x = a[i], y = b[i];
      d[i] = p[i] ? x : y;
    }
  } else if (a) {
    for (int64_t i = 0; i < n; ++i) {
      const T x = a[i];
      d[i] = p[i] ? x : ib;
    }
  } else if (b) {
    for (int64_t i = 0; i < n; ++i) {
      const T y = b[i];
      d[i] = p[i] ? ia : y;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = p[i] ? ia : ib;
  }
}

TPU_AI float round_f32_lane(float x, ElementType t) {
  return t == ElementType::bf16 ? ir::round_to_bf16(x) : t == ElementType::f16 ? ir::round_to_f16(x) : x;
}

// Saturating float -> int conversion bounds of an integer type.
struct IntRange {
  double lo, hi;  // values at or beyond saturate
  int64_t lo_i, hi_i;
};
IntRange int_range(ElementType t) {
  switch (t) {
    case ElementType::s32:
      return {-2147483648.0, 2147483647.0, INT32_MIN, INT32_MAX};
    case ElementType::s8:
      return {-128.0, 127.0, -128, 127};
    case ElementType::u8:
      return {0.0, 255.0, 0, 255};
    default:
      return {-9223372036854775808.0, 9223372036854775808.0, INT64_MIN, INT64_MAX};
  }
}

template <class F>
TPU_AI void float_to_int(const F* __restrict__ s, int64_t* __restrict__ d, ElementType t, int64_t n) {
  const IntRange r = int_range(t);
  const F lo = static_cast<F>(r.lo), hi = static_cast<F>(r.hi);
  for (int64_t i = 0; i < n; ++i) {
    F x = s[i];
    F c = x != x ? F(0) : (x <= lo ? F(0) : (x >= hi ? F(0) : x));
    int64_t v = static_cast<int64_t>(c);
    d[i] = x <= lo ? r.lo_i : (x >= hi ? r.hi_i : v);
  }
}

TPU_AI void wrap_loop(ElementType t, int64_t* __restrict__ x, int64_t n) {
  switch (t) {
    case ElementType::s32:
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<u64>(x[i])));
      return;
    case ElementType::s8:
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<int8_t>(static_cast<u8>(static_cast<u64>(x[i])));
      return;
    case ElementType::u8:
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<u8>(static_cast<u64>(x[i]));
      return;
    default:
      return;
  }
}

template <class S, class T, class C>
TPU_AI void load_loop(const S* __restrict__ s, int64_t stride, T* __restrict__ d, int64_t n, C cv) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = cv(s[i]);
  } else if (stride == 0) {
    const T v = cv(s[0]);
    for (int64_t i = 0; i < n; ++i) d[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = cv(s[i * stride]);
  }
}

template <class S, class T, class C>
TPU_AI void store_loop(const S* __restrict__ s, int64_t stride, T* __restrict__ d, int64_t n, C cv) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = cv(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * stride] = cv(s[i]);
  }
}

// W independent accumulators: with 64, four AVX-512 vectors of floats rather
// than one latency-bound chain; short runs take 16, whose final combine is cheaper.
// The tail (n % W values) goes into the accumulators too, before the pairwise
// combine: added one by one to the whole run's sum instead, up to W - 1
// roundings at its magnitude (a float sum of 1000 values was ~16 ulp off).
template <int W, class T, class F>
TPU_AI T tree_reduce_w(const T* __restrict__ x, int64_t n, T id, F f) {
  T acc[W];
  for (int j = 0; j < W; ++j) acc[j] = id;
  int64_t i = 0;
  for (; i + W <= n; i += W)
    for (int j = 0; j < W; ++j) acc[j] = f(acc[j], x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] = f(acc[j], x[i + j]);
  for (int w = W / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = f(acc[j], acc[j + w]);
  return acc[0];
}

template <class T, class F>
TPU_AI T tree_reduce(const T* __restrict__ x, int64_t n, T id, F f) {
  return n >= 512 ? tree_reduce_w<64>(x, n, id, f) : tree_reduce_w<16>(x, n, id, f);
}

// NaN-propagating max (kMax) or min of floats. The plain select `v > a ? v :
// a` is one vmaxps; NaNs are caught apart (a NaN lane keeps the NaN), so the
// loop vectorizes where fmax_nan's "or" does not.
template <bool kMax, class T>
TPU_AI T float_extreme(const T* __restrict__ x, int64_t n, T id) {
  constexpr int W = 32;
  T acc[W], nan[W];
  for (int j = 0; j < W; ++j) acc[j] = id, nan[j] = T(0);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    for (int j = 0; j < W; ++j) {
      const T v = x[i + j];
      acc[j] = (kMax ? v > acc[j] : v < acc[j]) ? v : acc[j];
      nan[j] = v != v ? v : nan[j];
    }
  }
  T r = id, q = T(0);
  for (int j = 0; j < W; ++j) {
    r = (kMax ? acc[j] > r : acc[j] < r) ? acc[j] : r;
    q = nan[j] != nan[j] ? nan[j] : q;
  }
  for (; i < n; ++i) {
    r = (kMax ? x[i] > r : x[i] < r) ? x[i] : r;
    q = x[i] != x[i] ? x[i] : q;
  }
  return q != q ? q : r;
}

template <class T, class F>
TPU_AI void cols(T* __restrict__ acc, const T* __restrict__ x, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], x[i]);
}

template <class T>
TPU_AI void reduce_run_typed(ReduceKind kind, const T* x, int64_t n, T* acc) {
  switch (kind) {
    case ReduceKind::kSum:
      if constexpr (std::is_same_v<T, int64_t>) {
        auto f = [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<u64>(a) + static_cast<u64>(b)); };
        *acc = f(*acc, tree_reduce(x, n, int64_t{0}, f));
      } else {
        auto f = [](T a, T b) { return a + b; };
        *acc = f(*acc, tree_reduce(x, n, T(0), f));
      }
      return;
    case ReduceKind::kProd:
      if constexpr (std::is_same_v<T, int64_t>) {
        auto f = [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<u64>(a) * static_cast<u64>(b)); };
        *acc = f(*acc, tree_reduce(x, n, int64_t{1}, f));
      } else {
        auto f = [](T a, T b) { return a * b; };
        *acc = f(*acc, tree_reduce(x, n, T(1), f));
      }
      return;
    case ReduceKind::kMax: {
      auto f = [](T a, T b) { return fmax_nan(b, a); };
      T id =
          std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
      if constexpr (std::is_floating_point_v<T>)
        *acc = f(*acc, float_extreme<true>(x, n, id));
      else
        *acc = f(*acc, tree_reduce(x, n, id, f));
      return;
    }
    case ReduceKind::kMin: {
      auto f = [](T a, T b) { return fmin_nan(b, a); };
      T id = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
      if constexpr (std::is_floating_point_v<T>)
        *acc = f(*acc, float_extreme<false>(x, n, id));
      else
        *acc = f(*acc, tree_reduce(x, n, id, f));
      return;
    }
  }
}

template <class T>
TPU_AI void reduce_cols_typed(ReduceKind kind, const T* x, T* acc, int64_t n) {
  switch (kind) {
    case ReduceKind::kSum:
      if constexpr (std::is_same_v<T, int64_t>)
        cols(acc, x, n,
             [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<u64>(a) + static_cast<u64>(b)); });
      else
        cols(acc, x, n, [](T a, T b) { return a + b; });
      return;
    case ReduceKind::kProd:
      if constexpr (std::is_same_v<T, int64_t>)
        cols(acc, x, n,
             [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<u64>(a) * static_cast<u64>(b)); });
      else
        cols(acc, x, n, [](T a, T b) { return a * b; });
      return;
    case ReduceKind::kMax:
      cols(acc, x, n, [](T a, T b) { return fmax_nan(b, a); });
      return;
    case ReduceKind::kMin:
      cols(acc, x, n, [](T a, T b) { return fmin_nan(b, a); });
      return;
  }
}

}  // namespace

TPU_CLONES void fill(Lane lane, Imm v, void* dst, int64_t n) {
  switch (lane) {
    case Lane::kF32: {
      float x = static_cast<float>(v.f);
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = x;
      return;
    }
    case Lane::kF64: {
      double* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = v.f;
      return;
    }
    case Lane::kI64: {
      int64_t* d = static_cast<int64_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = v.i;
      return;
    }
    case Lane::kPred: {
      u8* d = static_cast<u8*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = v.i != 0;
      return;
    }
  }
}

TPU_CLONES void unary(OpKind op, Lane lane, void* dst, const void* a, int64_t n) {
  switch (lane) {
    case Lane::kF32:
      unary_float(op, static_cast<float*>(dst), static_cast<const float*>(a), n);
      return;
    case Lane::kF64:
      unary_float(op, static_cast<double*>(dst), static_cast<const double*>(a), n);
      return;
    case Lane::kI64: {
      int64_t* d = static_cast<int64_t*>(dst);
      const int64_t* x = static_cast<const int64_t*>(a);
      switch (op) {
        case OpKind::kNegate:
          map1(d, x, n, [](int64_t v) { return static_cast<int64_t>(u64{0} - static_cast<u64>(v)); });
          return;
        case OpKind::kAbs:
          map1(d, x, n, [](int64_t v) { return v < 0 ? static_cast<int64_t>(u64{0} - static_cast<u64>(v)) : v; });
          return;
        case OpKind::kSign:
          map1(d, x, n, [](int64_t v) { return v > 0 ? int64_t{1} : (v < 0 ? int64_t{-1} : int64_t{0}); });
          return;
        case OpKind::kNot:
          map1(d, x, n, [](int64_t v) { return ~v; });
          return;
        default:
          unsupported("unary", op, lane);
      }
    }
    case Lane::kPred: {
      if (op != OpKind::kNot) unsupported("unary", op, lane);
      map1(static_cast<u8*>(dst), static_cast<const u8*>(a), n, [](u8 v) { return static_cast<u8>(v ^ 1u); });
      return;
    }
  }
}

TPU_CLONES void binary(OpKind op, Lane lane, void* dst, const void* a, Imm ia, const void* b, Imm ib, int64_t n) {
  switch (lane) {
    case Lane::kF32:
      binary_float(op, static_cast<float*>(dst), static_cast<const float*>(a), imm_as<float>(ia),
                   static_cast<const float*>(b), imm_as<float>(ib), n);
      return;
    case Lane::kF64:
      binary_float(op, static_cast<double*>(dst), static_cast<const double*>(a), ia.f, static_cast<const double*>(b),
                   ib.f, n);
      return;
    case Lane::kI64:
      binary_int(op, static_cast<int64_t*>(dst), static_cast<const int64_t*>(a), ia.i, static_cast<const int64_t*>(b),
                 ib.i, n);
      return;
    case Lane::kPred:
      binary_pred(op, static_cast<u8*>(dst), static_cast<const u8*>(a), static_cast<u8>(ia.i != 0),
                  static_cast<const u8*>(b), static_cast<u8>(ib.i != 0), n);
      return;
  }
}

TPU_CLONES void binary_pair(OpKind op1, OpKind op2, float* dst, const float* a, float ia, const float* b, float ib,
                            const float* c, float ic, int64_t n) {
  auto run = [&](auto f1, auto f2) {
    if (!c) {
      map2(dst, a, ia, b, ib, n, [&](float x, float y) { return f2(f1(x, y), ic); });
    } else if (a && b) {
      pair_loop(dst, a, b, c, n, [&](float x, float y, float z) { return f2(f1(x, y), z); });
    } else if (a) {
      map2(dst, a, 0.0f, c, 0.0f, n, [&](float x, float z) { return f2(f1(x, ib), z); });
    } else if (b) {
      map2(dst, b, 0.0f, c, 0.0f, n, [&](float y, float z) { return f2(f1(ia, y), z); });
    } else {
      const float x = f1(ia, ib);
      map1(dst, c, n, [&](float z) { return f2(x, z); });
    }
  };
  auto with_second = [&](auto f1) {
    switch (op2) {
      case OpKind::kAdd:
        return run(f1, [](float x, float y) { return x + y; });
      case OpKind::kSubtract:
        return run(f1, [](float x, float y) { return x - y; });
      case OpKind::kMultiply:
        return run(f1, [](float x, float y) { return x * y; });
      default:
        unsupported("binary_pair", op2, Lane::kF32);
    }
  };
  switch (op1) {
    case OpKind::kAdd:
      return with_second([](float x, float y) { return x + y; });
    case OpKind::kSubtract:
      return with_second([](float x, float y) { return x - y; });
    case OpKind::kMultiply:
      return with_second([](float x, float y) { return x * y; });
    default:
      unsupported("binary_pair", op1, Lane::kF32);
  }
}

TPU_CLONES void compare(CompareDirection dir, Lane lane, u8* dst, const void* a, Imm ia, const void* b, Imm ib,
                        int64_t n) {
  switch (lane) {
    case Lane::kF32:
      compare_typed(dir, dst, static_cast<const float*>(a), imm_as<float>(ia), static_cast<const float*>(b),
                    imm_as<float>(ib), n);
      return;
    case Lane::kF64:
      compare_typed(dir, dst, static_cast<const double*>(a), ia.f, static_cast<const double*>(b), ib.f, n);
      return;
    case Lane::kI64:
      compare_typed(dir, dst, static_cast<const int64_t*>(a), ia.i, static_cast<const int64_t*>(b), ib.i, n);
      return;
    case Lane::kPred:
      compare_typed(dir, dst, static_cast<const u8*>(a), static_cast<u8>(ia.i != 0), static_cast<const u8*>(b),
                    static_cast<u8>(ib.i != 0), n);
      return;
  }
}

TPU_CLONES void select(Lane lane, void* dst, const u8* pred, const void* a, Imm ia, const void* b, Imm ib, int64_t n) {
  switch (lane) {
    case Lane::kF32:
      select_typed(static_cast<float*>(dst), pred, static_cast<const float*>(a), imm_as<float>(ia),
                   static_cast<const float*>(b), imm_as<float>(ib), n);
      return;
    case Lane::kF64:
      select_typed(static_cast<double*>(dst), pred, static_cast<const double*>(a), ia.f, static_cast<const double*>(b),
                   ib.f, n);
      return;
    case Lane::kI64:
      select_typed(static_cast<int64_t*>(dst), pred, static_cast<const int64_t*>(a), ia.i,
                   static_cast<const int64_t*>(b), ib.i, n);
      return;
    case Lane::kPred:
      select_typed(static_cast<u8*>(dst), pred, static_cast<const u8*>(a), static_cast<u8>(ia.i != 0),
                   static_cast<const u8*>(b), static_cast<u8>(ib.i != 0), n);
      return;
  }
}

TPU_CLONES void convert(Lane from, ElementType from_dtype, Lane to, ElementType to_dtype, void* dst, const void* src,
                        int64_t n) {
  (void)from_dtype;
  if (from == Lane::kF32) {
    const float* s = static_cast<const float*>(src);
    switch (to) {
      case Lane::kF32: {
        float* d = static_cast<float*>(dst);
        if (to_dtype == ElementType::bf16)
          map1(d, s, n, [](float x) { return ir::round_to_bf16(x); });
        else if (to_dtype == ElementType::f16)
          map1(d, s, n, [](float x) { return ir::round_to_f16(x); });
        else
          for (int64_t i = 0; i < n; ++i) d[i] = s[i];
        return;
      }
      case Lane::kF64: {
        double* d = static_cast<double*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i];
        return;
      }
      case Lane::kI64:
        float_to_int(s, static_cast<int64_t*>(dst), to_dtype, n);
        return;
      case Lane::kPred: {
        u8* d = static_cast<u8*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i] != 0.0f;
        return;
      }
    }
  }
  if (from == Lane::kF64) {
    const double* s = static_cast<const double*>(src);
    switch (to) {
      case Lane::kF32: {
        float* d = static_cast<float*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = round_f32_lane(static_cast<float>(s[i]), to_dtype);
        return;
      }
      case Lane::kF64: {
        double* d = static_cast<double*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i];
        return;
      }
      case Lane::kI64:
        float_to_int(s, static_cast<int64_t*>(dst), to_dtype, n);
        return;
      case Lane::kPred: {
        u8* d = static_cast<u8*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i] != 0.0;
        return;
      }
    }
  }
  if (from == Lane::kI64) {
    const int64_t* s = static_cast<const int64_t*>(src);
    switch (to) {
      case Lane::kF32: {
        float* d = static_cast<float*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = round_f32_lane(static_cast<float>(static_cast<double>(s[i])), to_dtype);
        return;
      }
      case Lane::kF64: {
        double* d = static_cast<double*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(s[i]);
        return;
      }
      case Lane::kI64: {
        int64_t* d = static_cast<int64_t*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i];
        wrap_loop(to_dtype, d, n);
        return;
      }
      case Lane::kPred: {
        u8* d = static_cast<u8*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = s[i] != 0;
        return;
      }
    }
  }
  const u8* s = static_cast<const u8*>(src);
  switch (to) {
    case Lane::kF32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i];
      return;
    }
    case Lane::kF64: {
      double* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i];
      return;
    }
    case Lane::kI64: {
      int64_t* d = static_cast<int64_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i];
      return;
    }
    case Lane::kPred: {
      u8* d = static_cast<u8*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i];
      return;
    }
  }
}

TPU_CLONES void wrap(ElementType dtype, int64_t* x, int64_t n) { wrap_loop(dtype, x, n); }

bool has_fast_power(double e) {
  return e == 0.0 || e == 1.0 || e == 2.0 || e == 3.0 || e == -1.0 || e == -2.0 || e == 0.5 || e == -0.5;
}

TPU_CLONES void power_const(Lane lane, double e, void* dst, const void* a, int64_t n) {
  // Equal to pow() within an ulp, with pow's special cases: pow(x, 0) = 1
  // (NaN too), pow(-0, 0.5) = +0, pow(-inf, 0.5) = +inf, pow(-inf, -0.5) = 0.
  auto run = [&](auto* d, const auto* x) {
    using T = std::remove_reference_t<decltype(*d)>;
    const T inf = std::numeric_limits<T>::infinity();
    if (e == 0.0)
      map1(d, x, n, [](T) { return T(1); });
    else if (e == 1.0)
      map1(d, x, n, [](T v) { return v; });
    else if (e == 2.0)
      map1(d, x, n, [](T v) { return v * v; });
    else if (e == 3.0)
      map1(d, x, n, [](T v) { return (v * v) * v; });
    else if (e == -1.0)
      map1(d, x, n, [](T v) { return T(1) / v; });
    else if (e == -2.0)
      map1(d, x, n, [](T v) { return T(1) / (v * v); });
    else if (e == 0.5)
      map1(d, x, n, [inf](T v) { return v == -inf ? inf : std::sqrt(v) + T(0); });
    else
      map1(d, x, n, [inf](T v) { return v == -inf ? T(0) : T(1) / (std::sqrt(v) + T(0)); });
  };
  if (lane == Lane::kF32)
    run(static_cast<float*>(dst), static_cast<const float*>(a));
  else if (lane == Lane::kF64)
    run(static_cast<double*>(dst), static_cast<const double*>(a));
  else
    unsupported("power", OpKind::kPower, lane);
}

TPU_CLONES void load(ElementType dtype, const void* src, int64_t stride, void* dst, int64_t n) {
  switch (dtype) {
    case ElementType::f32:
      load_loop(static_cast<const float*>(src), stride, static_cast<float*>(dst), n, [](float x) { return x; });
      return;
    case ElementType::bf16:
      load_loop(static_cast<const uint16_t*>(src), stride, static_cast<float*>(dst), n,
                [](uint16_t x) { return ir::bf16_to_f32(x); });
      return;
    case ElementType::f16:
      load_loop(static_cast<const uint16_t*>(src), stride, static_cast<float*>(dst), n,
                [](uint16_t x) { return ir::f16_to_f32(x); });
      return;
    case ElementType::f64:
      load_loop(static_cast<const double*>(src), stride, static_cast<double*>(dst), n, [](double x) { return x; });
      return;
    case ElementType::s64:
      load_loop(static_cast<const int64_t*>(src), stride, static_cast<int64_t*>(dst), n, [](int64_t x) { return x; });
      return;
    case ElementType::s32:
      load_loop(static_cast<const int32_t*>(src), stride, static_cast<int64_t*>(dst), n,
                [](int32_t x) { return static_cast<int64_t>(x); });
      return;
    case ElementType::s8:
      load_loop(static_cast<const int8_t*>(src), stride, static_cast<int64_t*>(dst), n,
                [](int8_t x) { return static_cast<int64_t>(x); });
      return;
    case ElementType::u8:
      load_loop(static_cast<const u8*>(src), stride, static_cast<int64_t*>(dst), n,
                [](u8 x) { return static_cast<int64_t>(x); });
      return;
    case ElementType::pred:
      load_loop(static_cast<const u8*>(src), stride, static_cast<u8*>(dst), n,
                [](u8 x) { return static_cast<u8>(x != 0); });
      return;
  }
}

TPU_CLONES void store(ElementType dtype, void* dst, int64_t stride, const void* src, int64_t n) {
  switch (dtype) {
    case ElementType::f32:
      store_loop(static_cast<const float*>(src), stride, static_cast<float*>(dst), n, [](float x) { return x; });
      return;
    case ElementType::bf16:
      store_loop(static_cast<const float*>(src), stride, static_cast<uint16_t*>(dst), n,
                 [](float x) { return ir::f32_to_bf16(x); });
      return;
    case ElementType::f16:
      store_loop(static_cast<const float*>(src), stride, static_cast<uint16_t*>(dst), n,
                 [](float x) { return ir::f32_to_f16(x); });
      return;
    case ElementType::f64:
      store_loop(static_cast<const double*>(src), stride, static_cast<double*>(dst), n, [](double x) { return x; });
      return;
    case ElementType::s64:
      store_loop(static_cast<const int64_t*>(src), stride, static_cast<int64_t*>(dst), n, [](int64_t x) { return x; });
      return;
    case ElementType::s32:
      store_loop(static_cast<const int64_t*>(src), stride, static_cast<int32_t*>(dst), n,
                 [](int64_t x) { return static_cast<int32_t>(x); });
      return;
    case ElementType::s8:
      store_loop(static_cast<const int64_t*>(src), stride, static_cast<int8_t*>(dst), n,
                 [](int64_t x) { return static_cast<int8_t>(x); });
      return;
    case ElementType::u8:
      store_loop(static_cast<const int64_t*>(src), stride, static_cast<u8*>(dst), n,
                 [](int64_t x) { return static_cast<u8>(x); });
      return;
    case ElementType::pred:
      store_loop(static_cast<const u8*>(src), stride, static_cast<u8*>(dst), n, [](u8 x) { return x; });
      return;
  }
}

TPU_CLONES void reduce_run(ReduceKind kind, Lane lane, const void* src, int64_t n, void* acc) {
  switch (lane) {
    case Lane::kF32:
      reduce_run_typed(kind, static_cast<const float*>(src), n, static_cast<float*>(acc));
      return;
    case Lane::kF64:
      reduce_run_typed(kind, static_cast<const double*>(src), n, static_cast<double*>(acc));
      return;
    case Lane::kI64:
      reduce_run_typed(kind, static_cast<const int64_t*>(src), n, static_cast<int64_t*>(acc));
      return;
    case Lane::kPred:
      reduce_run_typed(kind, static_cast<const u8*>(src), n, static_cast<u8*>(acc));
      return;
  }
}

TPU_CLONES void expand_rows(ElementType dtype, const void* src, int64_t src_stride, int64_t rows, int64_t row_len,
                            void* dst) {
  const int64_t es = ir::element_size(dtype);
  const int64_t lb = lane_bytes(lane_of(dtype));
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t k = 0; k < rows; ++k) load(dtype, s + k * src_stride * es, 0, d + k * row_len * lb, row_len);
}

TPU_CLONES void reduce_rows(ReduceKind kind, Lane lane, const void* src, int64_t rows, int64_t row_len, void* acc,
                            int64_t acc_stride) {
  const int64_t lb = lane_bytes(lane);
  const char* s = static_cast<const char*>(src);
  char* a = static_cast<char*>(acc);
  for (int64_t k = 0; k < rows; ++k) reduce_run(kind, lane, s + k * row_len * lb, row_len, a + k * acc_stride * lb);
}

TPU_CLONES void reduce_cols(ReduceKind kind, Lane lane, const void* src, void* acc, int64_t n) {
  switch (lane) {
    case Lane::kF32:
      reduce_cols_typed(kind, static_cast<const float*>(src), static_cast<float*>(acc), n);
      return;
    case Lane::kF64:
      reduce_cols_typed(kind, static_cast<const double*>(src), static_cast<double*>(acc), n);
      return;
    case Lane::kI64:
      reduce_cols_typed(kind, static_cast<const int64_t*>(src), static_cast<int64_t*>(acc), n);
      return;
    case Lane::kPred:
      reduce_cols_typed(kind, static_cast<const u8*>(src), static_cast<u8*>(acc), n);
      return;
  }
}

}  // namespace tile
}  // namespace torch_tpu::exec
