#include "aten/random_ops.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "runtime/philox.h"

namespace torch_tpu {
namespace {

// The aten sources build at -O2, whose vectorizer declines the Philox rounds;
// with O3 and AVX-512 or AVX2 (runtime dispatch, as csrc/exec's kernels) they vectorize.
#pragma GCC optimize("O3")
#define PHILOX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

PHILOX_CLONES void blocks_of(uint64_t seed, uint64_t start, uint32_t (*out)[kPhiloxLanes]) {
  philox_blocks(seed, start, out);
}

// bernoulli(p) at positions start .. start + kPhiloxLanes - 1, as 0/1 bytes: u < p on
// philox_uniform53's u = k 2^-53 is k < threshold = ceil(p 2^53), an integer compare.
PHILOX_CLONES void bernoulli_lanes(uint64_t seed, uint64_t start, uint64_t threshold, uint8_t* mask) {
  uint32_t w[4][kPhiloxLanes];
  philox_blocks(seed, start, w);
  for (int j = 0; j < kPhiloxLanes; ++j) {
    const uint64_t k = ((static_cast<uint64_t>(w[0][j]) << 32) | w[1][j]) >> 11;
    mask[j] = k < threshold ? 1 : 0;
  }
}

// normal(mean, std) as float at positions start .. start + lanes - 1: mean + std * z in double,
// rounded once (the double math of the element-by-element fills).
PHILOX_CLONES void normal_lanes(uint64_t seed, uint64_t start, double mean, double std, float* out, int lanes) {
  float z[kPhiloxLanes];
  philox_normal_lanes(seed, start, z);
  for (int j = 0; j < lanes; ++j) out[j] = static_cast<float>(mean + std * static_cast<double>(z[j]));
}

// uniform(a, b) as float at positions start .. start + lanes - 1: a + u (b - a) in double, rounded
// once; a value that rounds to b becomes a, so that the range stays half-open (as CUDA's).
PHILOX_CLONES void uniform_lanes(uint64_t seed, uint64_t start, double a, double b, float* out, int lanes) {
  uint32_t w[4][kPhiloxLanes];
  philox_blocks(seed, start, w);
  const float low = static_cast<float>(a);
  for (int j = 0; j < lanes; ++j) {
    const float r = static_cast<float>(a + static_cast<double>(philox_uniform24(w[0][j])) * (b - a));
    out[j] = (static_cast<double>(r) < b || !(a < b)) ? r : low;
  }
}

enum class Kind {
  kNone,
  kUniform,
  kNormal,
  kRandom,
  kRandomTo,
  kRandomFrom,
  kBernoulliFloat,
  kBernoulliTensor,
  kBernoulliSelf,
  kExponential,
  kGeometric,
  kLogNormal,
  kCauchy
};

Kind kind_of(const c10::FunctionSchema& s) {
  const std::string& n = s.name();
  const std::string& o = s.overload_name();
  if (n == "aten::uniform_" && o.empty()) return Kind::kUniform;
  if (n == "aten::normal_" && o.empty()) return Kind::kNormal;
  if (n == "aten::random_") return o.empty() ? Kind::kRandom : o == "to" ? Kind::kRandomTo : Kind::kRandomFrom;
  if (n == "aten::bernoulli_") return o == "float" ? Kind::kBernoulliFloat : Kind::kBernoulliTensor;
  if (n == "aten::bernoulli") {
    if (o == "p") return Kind::kBernoulliFloat;
    if (o == "Tensor") return Kind::kBernoulliTensor;
    if (o.empty()) return Kind::kBernoulliSelf;
    return Kind::kNone;  // out= overloads
  }
  if (n == "aten::exponential_") return Kind::kExponential;
  if (n == "aten::geometric_") return Kind::kGeometric;
  if (n == "aten::log_normal_") return Kind::kLogNormal;
  if (n == "aten::cauchy_") return Kind::kCauchy;
  return Kind::kNone;
}

bool is_random_kind(Kind k) { return k == Kind::kRandom || k == Kind::kRandomTo || k == Kind::kRandomFrom; }
bool is_bernoulli(Kind k) {
  return k == Kind::kBernoulliFloat || k == Kind::kBernoulliTensor || k == Kind::kBernoulliSelf;
}
bool in_place(const c10::FunctionSchema& s) { return s.name().back() == '_'; }

bool float_like(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// Ops and dtypes drawn by the kernels below.
bool native(Kind k, c10::ScalarType t) {
  if (k == Kind::kNone) return false;
  if (is_random_kind(k) || is_bernoulli(k)) return float_like(t) || c10::isIntegralType(t, /*includeBool=*/true);
  return float_like(t);
}

// The CPU kernel's own argument checks (bounds, probabilities, dtypes), on
// host tensors of `elements` zeros (0 or 1), so that a bad argument raises at the
// call as on CPU. With 1 element the kernel draws from a private generator: the
// CPU's default one does not move. (Some kernels check dtypes only with data.)
void check_like_cpu(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, int64_t elements = 0) {
  torch::jit::Stack stack;
  for (const auto& v : args) {
    if (v.isTensor() && v.toTensor().defined()) {
      stack.emplace_back(at::zeros({elements}, at::TensorOptions().dtype(v.toTensor().scalar_type())));
    } else if (v.isGenerator()) {
      if (elements > 0) {
        stack.emplace_back(at::make_generator<at::CPUGeneratorImpl>(0));
      } else {
        stack.emplace_back();
      }
    } else {
      stack.push_back(v);
    }
  }
  op.callBoxed(&stack);
}

// --------------------------------------------------------------- sampling

// [0, 1) from a block, at T's precision (24 bits below double, 53 for double).
template <typename T>
double uniform01(const PhiloxCounter& b) {
  if constexpr (std::is_same_v<T, double>) return philox_uniform53(b[0], b[1]);
  return philox_uniform24(b[0]);
}

// (0, 1] (for logarithms).
template <typename T>
double uniform01_open_low(const PhiloxCounter& b) {
  return 1.0 - uniform01<T>(b);
}

// Box-Muller, one of the pair (the cosine branch) per element; float math below double.
template <typename T>
double standard_normal(const PhiloxCounter& b) {
  if constexpr (std::is_same_v<T, double>) {
    const double u1 = 1.0 - philox_uniform53(b[0], b[1]);
    const double u2 = philox_uniform53(b[2], b[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  } else {
    return philox_box_muller(b[0], b[1]);
  }
}

// Uniform integer in [0, range) (range 0: all of 2^64).
uint64_t uniform_int(const PhiloxCounter& b, uint64_t range) {
  if (range != 0 && range <= (uint64_t{1} << 32)) return b[0] % range;
  const uint64_t r = (static_cast<uint64_t>(b[0]) << 32) | b[1];
  return range == 0 ? r : r % range;
}

// The largest value random_() (no bounds) draws for T: ATen's.
template <typename T>
uint64_t random_max() {
  if constexpr (std::is_same_v<T, bool>) {
    return 1;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<uint64_t>(std::numeric_limits<T>::max());
  } else {
    return uint64_t{1} << std::numeric_limits<T>::digits;
  }
}

struct Params {
  Kind kind;
  double a = 0, b = 0;            // from/to, mean/std, lambda, p, median/sigma
  int64_t from = 0;               // random_
  uint64_t range = 0;             // random_: values from + [0, range); 0 is 2^64
  const at::Tensor* p = nullptr;  // bernoulli: probabilities laid out as the result
};

// Calls lanes_at(base, lanes) for runs of at most kPhiloxLanes positions covering [0, n), split
// across the intra-op threads: the whole-block fills.
template <typename LanesAt>
void for_each_lanes(int64_t n, const LanesAt& lanes_at) {
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t base = begin; base < end; base += kPhiloxLanes) {
      lanes_at(base, static_cast<int>(std::min<int64_t>(kPhiloxLanes, end - base)));
    }
  });
}

template <typename T>
void fill(T* out, int64_t n, uint64_t seed, uint64_t offset, const Params& prm, const double* probs) {
  auto at = [offset](int64_t base) { return offset + static_cast<uint64_t>(base); };
  if (prm.kind == Kind::kBernoulliFloat && probs == nullptr) {                                // dropout's masks
    const uint64_t threshold = static_cast<uint64_t>(std::ceil(prm.a * 9007199254740992.0));  // p in [0, 1]
    return for_each_lanes(n, [&](int64_t base, int lanes) {
      uint8_t mask[kPhiloxLanes];
      bernoulli_lanes(seed, at(base), threshold, mask);
      for (int j = 0; j < lanes; ++j) out[base + j] = static_cast<T>(mask[j]);
    });
  }
  if constexpr (std::is_same_v<T, float>) {
    if (prm.kind == Kind::kNormal) {
      return for_each_lanes(
          n, [&](int64_t base, int lanes) { normal_lanes(seed, at(base), prm.a, prm.b, out + base, lanes); });
    }
    if (prm.kind == Kind::kUniform) {
      return for_each_lanes(
          n, [&](int64_t base, int lanes) { uniform_lanes(seed, at(base), prm.a, prm.b, out + base, lanes); });
    }
  } else if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    if (prm.kind == Kind::kNormal) {  // through float, as static_cast<T>(double) goes
      return for_each_lanes(n, [&](int64_t base, int lanes) {
        float v[kPhiloxLanes];
        normal_lanes(seed, at(base), prm.a, prm.b, v, lanes);
        for (int j = 0; j < lanes; ++j) out[base + j] = static_cast<T>(v[j]);
      });
    }
  }
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    uint32_t words[4][kPhiloxLanes];
    int64_t base = -1;
    for (int64_t i = begin; i < end; ++i) {
      if (base < 0 || i - base >= kPhiloxLanes) {
        base = i;
        blocks_of(seed, offset + static_cast<uint64_t>(i), words);
      }
      const int64_t j = i - base;
      const PhiloxCounter b{words[0][j], words[1][j], words[2][j], words[3][j]};
      double v = 0;
      switch (prm.kind) {
        case Kind::kUniform: {
          v = prm.a + uniform01<T>(b) * (prm.b - prm.a);
          T r = static_cast<T>(v);
          // Rounding to T may reach `to`: the range stays half-open, as CUDA's.
          if (!(static_cast<double>(r) < prm.b) && prm.a < prm.b) r = static_cast<T>(prm.a);
          out[i] = r;
          continue;
        }
        case Kind::kNormal:
          v = prm.a + prm.b * standard_normal<T>(b);
          break;
        case Kind::kLogNormal:
          v = std::exp(prm.a + prm.b * standard_normal<T>(b));
          break;
        case Kind::kExponential:
          v = -std::log(uniform01_open_low<T>(b)) / prm.a;
          break;
        case Kind::kGeometric:
          v = std::max(1.0, std::ceil(std::log(uniform01_open_low<T>(b)) / std::log1p(-prm.a)));
          break;
        case Kind::kCauchy:
          v = prm.a + prm.b * std::tan(M_PI * (uniform01<T>(b) - 0.5));
          break;
        case Kind::kRandom:
        case Kind::kRandomTo:
        case Kind::kRandomFrom:
          out[i] = static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(prm.from) + uniform_int(b, prm.range)));
          continue;
        default: {  // bernoulli: 53-bit uniform below p
          const double p = probs ? probs[i] : prm.a;
          if (probs) TORCH_CHECK(p >= 0.0 && p <= 1.0, "bernoulli_ expects p to be in [0, 1], but got p=", p);
          out[i] = static_cast<T>(philox_uniform53(b[0], b[1]) < p ? 1 : 0);
          continue;
        }
      }
      out[i] = static_cast<T>(v);
    }
  });
}

void fill_tensor(const at::Tensor& target, uint64_t seed, uint64_t offset, const Params& prm) {
  const int64_t n = target.numel();
  if (n == 0) return;
  at::Tensor dst = target.is_contiguous() ? target : at::empty(target.sizes(), target.options());
  at::Tensor probs;
  if (prm.p) probs = prm.p->to(at::kDouble).expand(target.sizes()).contiguous();
  const double* pp = probs.defined() ? probs.const_data_ptr<double>() : nullptr;
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dst.scalar_type(), "philox_fill",
                             [&] { fill<scalar_t>(dst.mutable_data_ptr<scalar_t>(), n, seed, offset, prm, pp); });
  if (!dst.is_same(target)) target.copy_(dst);
}

// random_'s [from, from + range) for the op's bounds and self's dtype.
void random_bounds(Kind k, c10::ArrayRef<c10::IValue> args, c10::ScalarType t, Params& prm) {
  uint64_t max = 0;
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, t, "random_", [&] { max = random_max<scalar_t>(); });
  if (k == Kind::kRandom) {
    prm.from = 0;
    prm.range = max + 1;
  } else if (k == Kind::kRandomTo) {
    prm.from = 0;
    prm.range = static_cast<uint64_t>(args[1].toInt());
  } else {
    prm.from = args[1].toInt();
    if (!args[2].isNone()) {
      prm.range = static_cast<uint64_t>(args[2].toInt()) - static_cast<uint64_t>(prm.from);
    } else {
      prm.range = max - static_cast<uint64_t>(prm.from) + 1;  // wraps to 0 for all of int64
    }
  }
}

}  // namespace

c10::IValue philox_generator_arg(TPUGeneratorImpl& gen, const c10::OperatorHandle& op,
                                 c10::ArrayRef<c10::IValue> args) {
  const Kind k = kind_of(op.schema());
  const bool self_ok = !args.empty() && args[0].isTensor() && args[0].toTensor().defined();
  const bool drawn = self_ok && native(k, args[0].toTensor().scalar_type());
  const bool self_written = self_ok && in_place(op.schema());
  // CPU's checks at the call, before the generator moves. For a fill the kernels do not draw
  // (a dtype the op rejects, complex) of one of their distributions, on one element: the CPU
  // kernel checks the dtype only with data.
  if (self_written || (self_ok && k != Kind::kNone)) {
    const bool one_element = !drawn && k != Kind::kNone && args[0].toTensor().numel() > 0;
    check_like_cpu(op, args, one_element ? 1 : 0);
  }
  // CPU's in-place kernels reject a self with overlapping elements before drawing.
  if (self_written) at::assert_no_internal_overlap(args[0].toTensor());
  if (drawn) {
    auto [seed, offset] = gen.reserve(static_cast<uint64_t>(args[0].toTensor().numel()));
    return c10::ivalue::Tuple::create(
        {c10::IValue(static_cast<int64_t>(seed)), c10::IValue(static_cast<int64_t>(offset))});
  }
  auto [seed, offset] = gen.reserve(4);
  const PhiloxCounter b = philox_block(seed, offset);
  return c10::IValue(at::make_generator<at::CPUGeneratorImpl>((static_cast<uint64_t>(b[1]) << 32) | b[0]));
}

void run_philox_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const Kind k = kind_of(schema);
  const size_t num_args = schema.arguments().size();
  c10::ArrayRef<c10::IValue> args(&*(stack->end() - num_args), num_args);
  const auto& elems = args[num_args - 1].toTupleRef().elements();
  const uint64_t seed = static_cast<uint64_t>(elems[0].toInt());
  const uint64_t offset = static_cast<uint64_t>(elems[1].toInt());
  const at::Tensor self = args[0].toTensor();
  Params prm{k};
  at::Tensor p_tensor;
  switch (k) {
    case Kind::kUniform:
    case Kind::kNormal:
    case Kind::kLogNormal:
    case Kind::kCauchy:
      prm.a = args[1].toDouble();
      prm.b = args[2].toDouble();
      break;
    case Kind::kExponential:
    case Kind::kGeometric:
    case Kind::kBernoulliFloat:
      prm.a = args[1].toDouble();
      break;
    case Kind::kBernoulliTensor:
      p_tensor = args[1].toTensor();
      prm.p = &p_tensor;
      break;
    case Kind::kBernoulliSelf:
      prm.p = &self;
      break;
    default:
      random_bounds(k, args, self.scalar_type(), prm);
  }
  at::Tensor out = in_place(schema) ? self : at::empty(self.sizes(), self.options());
  fill_tensor(out, seed, offset, prm);
  torch::jit::drop(*stack, num_args);
  stack->emplace_back(out);
}

void philox_bernoulli_mask(uint64_t seed, uint64_t offset, double p, uint8_t* out, int64_t n) {
  Params prm{Kind::kBernoulliFloat};
  prm.a = p;
  fill<uint8_t>(out, n, seed, offset, prm, nullptr);
}

}  // namespace torch_tpu
