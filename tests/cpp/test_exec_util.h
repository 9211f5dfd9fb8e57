// Helpers for the executor tests: host arrays in any element type, random
// data, and comparison of executor results with the reference interpreter.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "ir/builder.h"
#include "ir/interpreter.h"

namespace exec_test {

using namespace torch_tpu;
using ir::ElementType;

// A contiguous host array in the memory format of its element type.
struct HostArray {
  ir::TensorType type;
  std::vector<char> bytes;

  explicit HostArray(ir::TensorType t)
      : type(std::move(t)),
        bytes(static_cast<size_t>(std::max<int64_t>(type.numel() * ir::element_size(type.dtype), 1))) {}
  static HostArray from_literal(const ir::Literal& l) {
    HostArray a(l.type);
    l.to_bytes(a.bytes.data());
    return a;
  }
  exec::Buffer buffer() { return exec::Buffer::contiguous(bytes.data(), type.dtype, type.shape); }
  ir::Literal literal() const { return ir::Literal::from_bytes(type, bytes.data()); }
};

// Floats uniform in [lo, hi] (exactly representable in the type), integers
// uniform in [lo, hi] clipped to the type, pred fair coin.
inline ir::Literal random_literal(const ir::TensorType& t, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  ir::Literal l = ir::Literal::zeros(t);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t k = 0; k < l.numel(); ++k) {
    if (ir::is_float(t.dtype)) {
      l.f[k] = ir::round_to_type(u(rng), t.dtype);
    } else if (ir::is_pred(t.dtype)) {
      l.i[k] = rng() & 1;
    } else {
      double v = std::floor(u(rng));
      l.i[k] = ir::wrap_to_type(static_cast<int64_t>(v), t.dtype);
    }
  }
  return l;
}

inline HostArray random_array(const ir::TensorType& t, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  return HostArray::from_literal(random_literal(t, rng, lo, hi));
}

struct Tolerance {
  double rtol = 0.0, atol = 0.0;
};

// Per-op tolerance of the executor (f32 math, vmath polynomials) against the
// double-precision interpreter; 16-bit types allow one unit in the last place
// of the type (the f32 and the double result may round to neighbours).
inline Tolerance tolerance_for(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return {2e-6, 1e-6};
    case ElementType::bf16:
      return {8e-3, 1e-6};
    case ElementType::f16:
      return {1e-3, 1e-6};
    case ElementType::f64:
      return {1e-12, 1e-14};
    default:
      return {0.0, 0.0};
  }
}

// Compares element by element; NaN matches NaN, infinities must match exactly.
inline ::testing::AssertionResult all_close(const ir::Literal& got, const ir::Literal& want, Tolerance tol) {
  if (got.type != want.type)
    return ::testing::AssertionFailure() << "type " << got.type.str() << " vs " << want.type.str();
  int bad = 0;
  std::ostringstream msg;
  for (int64_t k = 0; k < got.numel(); ++k) {
    if (!ir::is_float(got.type.dtype)) {
      if (got.i[k] != want.i[k]) {
        if (bad++ < 5) msg << "\n  [" << k << "] got " << got.i[k] << " want " << want.i[k];
      }
      continue;
    }
    double a = got.f[k], b = want.f[k];
    bool ok;
    if (std::isnan(b))
      ok = std::isnan(a);
    else if (std::isinf(b))
      ok = a == b;
    else
      ok = std::isfinite(a) && std::fabs(a - b) <= tol.atol + tol.rtol * std::fabs(b);
    if (!ok && bad++ < 5) msg << "\n  [" << k << "] got " << a << " want " << b << " (diff " << a - b << ")";
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << got.numel() << " elements differ:" << msg.str();
  return ::testing::AssertionSuccess();
}

// Runs a compiled region on host arrays; returns the outputs as literals.
inline std::vector<ir::Literal> run_region(const exec::CompiledRegion& r, std::vector<HostArray>& inputs) {
  std::vector<exec::Buffer> in;
  for (auto& a : inputs) in.push_back(a.buffer());
  std::vector<HostArray> outs;
  for (const auto& t : r.output_types()) outs.emplace_back(t);
  std::vector<exec::Buffer> out;
  for (auto& a : outs) out.push_back(a.buffer());
  exec::run(r, in, out);
  std::vector<ir::Literal> res;
  for (auto& a : outs) res.push_back(a.literal());
  return res;
}

// The interpreter with the executor's 16-bit semantics (f32-or-better inside
// a kernel, rounded on store); identical to per-op rounding for single ops.
inline std::vector<ir::Literal> reference(const ir::Graph& g, const std::vector<HostArray>& inputs) {
  std::vector<ir::Literal> lits;
  for (const auto& a : inputs) lits.push_back(a.literal());
  ir::InterpretOptions o;
  o.round_16bit_each_op = false;
  return ir::interpret(g, lits, o);
}

// Compiles `g`, runs it and the interpreter on `inputs`, and compares every
// output with the tolerance of its element type scaled by `scale`.
// `fixed`, when given, replaces the tolerance of every floating output.
inline void expect_matches_reference(const ir::Graph& g, std::vector<HostArray>& inputs,
                                     const exec::CompileOptions& options = {}, double scale = 1.0,
                                     const Tolerance* fixed = nullptr) {
  exec::CompiledRegion r = exec::compile(g, options);
  std::vector<ir::Literal> got = run_region(r, inputs);
  std::vector<ir::Literal> want = reference(g, inputs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    Tolerance tol = tolerance_for(want[j].type.dtype);
    tol.rtol *= scale;
    tol.atol *= scale;
    if (fixed && ir::is_float(want[j].type.dtype)) tol = *fixed;
    EXPECT_TRUE(all_close(got[j], want[j], tol)) << "output " << j << "\n" << r.describe();
  }
}

}  // namespace exec_test
