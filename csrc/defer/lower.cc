// The fusible ATen ops of defer_and_fuse and their IR lowerings.
//
// Each lowering reproduces the ATen CPU kernel's arithmetic: operands are
// cast to the op's common dtype (ATen type promotion), 16-bit floats compute
// in f32 and are rounded once per ATen op (an explicit convert, so a fused
// chain rounds exactly where eager PyTorch does), formulas follow the order
// of ATen's vectorized CPU kernels (gelu, silu, softmax, ...). What still
// differs: transcendentals (exec/vmath.h polynomials, within a few ulp),
// add/sub with alpha != 1 (ATen uses an FMA) and reductions (a different
// summation order).
#include "defer/lower.h"

#include <ATen/native/TypeProperties.h>
#include <c10/core/ScalarType.h>
#include <c10/core/WrapDimMinimal.h>

#include <cmath>
#include <unordered_map>

#include "runtime/generator.h"

namespace torch_tpu::defer {

using ir::CompareDirection;
using ir::ElementType;
using ir::OpKind;
using ir::ReduceKind;

std::optional<ElementType> ir_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return ElementType::f32;
    case c10::kBFloat16:
      return ElementType::bf16;
    case c10::kHalf:
      return ElementType::f16;
    case c10::kDouble:
      return ElementType::f64;
    case c10::kLong:
      return ElementType::s64;
    case c10::kInt:
      return ElementType::s32;
    case c10::kChar:
      return ElementType::s8;
    case c10::kByte:
      return ElementType::u8;
    case c10::kBool:
      return ElementType::pred;
    default:
      return std::nullopt;
  }
}

c10::ScalarType scalar_type_of(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return c10::kFloat;
    case ElementType::bf16:
      return c10::kBFloat16;
    case ElementType::f16:
      return c10::kHalf;
    case ElementType::f64:
      return c10::kDouble;
    case ElementType::s64:
      return c10::kLong;
    case ElementType::s32:
      return c10::kInt;
    case ElementType::s8:
      return c10::kChar;
    case ElementType::u8:
      return c10::kByte;
    case ElementType::pred:
      return c10::kBool;
  }
  return c10::kFloat;
}

ElementType opmath_of(ElementType t) {
  return (t == ElementType::bf16 || t == ElementType::f16) ? ElementType::f32 : t;
}

namespace {

ElementType ir_or_throw(c10::ScalarType t) {
  auto e = ir_type(t);
  if (!e) throw NotFusible{};
  return *e;
}

bool is_float_dtype(c10::ScalarType t) { return c10::isFloatingType(t); }

}  // namespace

const Operand& Lowering::arg(size_t i) const { return args_.at(i); }

const c10::IValue& Lowering::ivalue(size_t i) const {
  const c10::IValue* v = args_.at(i).ivalue;
  if (!v) throw NotFusible{};
  return *v;
}

c10::Scalar Lowering::scalar(size_t i) const {
  const Operand& a = args_.at(i);
  if (a.kind == Operand::Kind::kScalar) return a.scalar;
  throw NotFusible{};
}

c10::ScalarType Lowering::promote(std::initializer_list<size_t> idx) const {
  at::native::ResultTypeState state;
  for (size_t i : idx) {
    if (i >= args_.size()) continue;
    const Operand& a = args_[i];
    if (a.kind == Operand::Kind::kTensor) {
      state = at::native::update_result_type_state(a.tensor, state);
    } else if (a.kind == Operand::Kind::kScalar) {
      state = a.tensor.defined() ? at::native::update_result_type_state(a.tensor, state)
                                 : at::native::update_result_type_state(a.scalar, state);
    }
  }
  return at::native::result_type(state);
}

ValueId Lowering::cst(double v, ElementType t, ir::Shape shape) {
  ValueId c = is_float(t) ? b.constant(ir::round_to_type(v, t), t)
                          : b.constant_int(ir::wrap_to_type(static_cast<int64_t>(v), t), t);
  return shape.empty() ? c : b.broadcast_in_dim(c, shape, {});
}

ValueId Lowering::user_scalar(size_t arg, double v, ElementType t, ir::Shape shape) {
  ir::Scalar s;
  if (is_float(t))
    s.f = ir::round_to_type(v, t);
  else
    s.i = ir::is_pred(t) ? (v != 0) : ir::wrap_to_type(static_cast<int64_t>(v), t);
  ValueId c = sink_ ? sink_->scalar(b, arg, s, t) : (is_float(t) ? b.constant(s.f, t) : b.constant_int(s.i, t));
  return shape.empty() ? c : b.broadcast_in_dim(c, shape, {});
}

ValueId Lowering::load(size_t i, c10::ScalarType ct, const ir::Shape& shape, bool exact_scalar) {
  const ElementType cti = ir_or_throw(ct);
  const ElementType mt = opmath_of(cti);
  const Operand& a = args_.at(i);
  if (a.kind == Operand::Kind::kTensor) {
    ValueId v = a.value;
    if (b.type(v).dtype != cti) v = b.convert(v, cti);
    if (mt != cti) v = b.convert(v, mt);
    if (b.type(v).shape.size() > shape.size()) throw NotFusible{};
    return b.broadcast_to(v, shape);
  }
  if (a.kind != Operand::Kind::kScalar) throw NotFusible{};
  const c10::Scalar& s = a.scalar;
  if (s.isComplex()) throw NotFusible{};
  if (is_float(mt)) {
    double d = s.toDouble();
    // ATen casts a scalar operand to the common dtype unless the kernel
    // reads it in opmath precision.
    if (!exact_scalar) d = ir::round_to_type(d, cti);
    return user_scalar(i, d, mt, shape);
  }
  if (ir::is_pred(mt)) return user_scalar(i, s.toBool() ? 1 : 0, mt, shape);
  if (s.isFloatingPoint()) throw NotFusible{};
  const int64_t v = s.toLong();
  if (static_cast<int64_t>(static_cast<double>(v)) != v) throw NotFusible{};  // beyond 2^53
  return user_scalar(i, static_cast<double>(v), mt, shape);
}

ValueId Lowering::finish(ValueId v, size_t k) {
  const ElementType t = ir_or_throw(out_dtype(k));
  if (b.type(v).dtype != t) v = b.convert(v, t);
  if (b.type(v).shape != out(k).shape) throw NotFusible{};
  return v;
}

namespace {

// ---------------------------------------------------------------- helpers

struct Ops {
  Lowering& L;
  const ir::Shape& shape;
  ElementType mt;
  ValueId c(double v) const { return L.cst(v, mt, shape); }
  ValueId add(ValueId a, ValueId b) const { return L.b.add(a, b); }
  ValueId sub(ValueId a, ValueId b) const { return L.b.subtract(a, b); }
  ValueId mul(ValueId a, ValueId b) const { return L.b.multiply(a, b); }
  ValueId div(ValueId a, ValueId b) const { return L.b.divide(a, b); }
  ValueId cmp(ValueId a, ValueId b, CompareDirection d) const { return L.b.compare(a, b, d); }
  ValueId sel(ValueId p, ValueId a, ValueId b) const { return L.b.select(p, a, b); }
};

Ops ops_for(Lowering& L, c10::ScalarType ct, const ir::Shape& shape) {
  return Ops{L, shape, opmath_of(ir_or_throw(ct))};
}

void require(bool ok) {
  if (!ok) throw NotFusible{};
}

c10::ScalarType float_out(Lowering& L) {
  c10::ScalarType t = L.out_dtype();
  require(is_float_dtype(t));
  return t;
}

// ---------------------------------------------------------------- binary

// self + alpha * other (sub: -, rsub: other - alpha * self).
// exact_scalar false: a scalar operand is rounded to the common dtype first
// (ATen's add, sub and rsub, and mul_.Scalar, on 16-bit floats).
void add_sub(Lowering& L, OpKind kind, bool reverse, bool exact_scalar = true) {
  c10::ScalarType ct = L.promote({0, 1});
  require(ct != c10::kBool);
  const auto& shape = L.out().shape;
  Ops o = ops_for(L, ct, shape);
  size_t first = reverse ? 1 : 0, second = reverse ? 0 : 1;
  ValueId a = L.load(first, ct, shape, false);
  ValueId b = L.load(second, ct, shape, exact_scalar);
  if (!L.is_none(2)) {
    c10::Scalar alpha = L.scalar(2);
    require(!alpha.isComplex());
    if (is_float(o.mt)) {
      if (alpha.toDouble() != 1.0) b = o.mul(b, L.user_scalar(2, alpha.toDouble(), o.mt, shape));
    } else {
      require(!alpha.isFloatingPoint());
      if (alpha.toLong() != 1) b = o.mul(b, L.user_scalar(2, static_cast<double>(alpha.toLong()), o.mt, shape));
    }
  }
  L.results = {L.finish(L.b.binary(kind, a, b))};
}

void mul_div(Lowering& L, OpKind kind, bool exact_scalar = true) {
  c10::ScalarType ct = L.promote({0, 1});
  if (kind == OpKind::kDivide && c10::isIntegralType(ct, /*includeBool=*/true)) ct = float_out(L);
  require(ct != c10::kBool);
  const auto& shape = L.out().shape;
  ValueId a = L.load(0, ct, shape, false);
  ValueId b = L.load(1, ct, shape, exact_scalar);
  L.results = {L.finish(L.b.binary(kind, a, b))};
}

void max_min(Lowering& L, OpKind kind) {
  c10::ScalarType ct = L.promote({0, 1});
  require(ct != c10::kBool);
  ValueId a = L.load(0, ct), b = L.load(1, ct);
  L.results = {L.finish(L.b.binary(kind, a, b))};
}

void compare(Lowering& L, CompareDirection d) {
  c10::ScalarType ct = L.promote({0, 1});
  ValueId a = L.load(0, ct), b = L.load(1, ct);
  L.results = {L.finish(L.b.compare(a, b, d))};
}

void pow_tensor_scalar(Lowering& L) {
  c10::ScalarType ct = L.out_dtype();
  require(ct != c10::kBool);
  const auto& shape = L.out().shape;
  Ops o = ops_for(L, ct, shape);
  ValueId x = L.load(0, ct);
  c10::Scalar e = L.scalar(1);
  require(!e.isComplex());
  ValueId r;
  if (is_float(o.mt)) {
    // ATen's fast paths (pow_tensor_scalar_optimized_kernel, sqrt/rsqrt/reciprocal).
    // bf16 runs them in bf16 arithmetic (x * x rounded before the next step)
    // and rounds a general exponent to bf16 first.
    const ElementType cti = ir_or_throw(ct);
    auto rounded = [&](ValueId v) { return cti == ElementType::bf16 ? L.b.convert(L.b.convert(v, cti), o.mt) : v; };
    double v = e.toDouble();
    if (v == 2.0)
      r = o.mul(x, x);
    else if (v == 3.0)
      r = o.mul(rounded(o.mul(x, x)), x);
    else if (v == 0.5)
      r = L.b.sqrt(x);
    else if (v == -0.5)
      r = L.b.rsqrt(x);
    else if (v == -1.0)
      r = o.div(o.c(1.0), x);
    else if (v == -2.0)
      r = o.div(o.c(1.0), rounded(o.mul(x, x)));
    else
      r = L.b.power(x, L.user_scalar(1, cti == ElementType::f64 ? v : ir::round_to_type(v, cti), o.mt, shape));
  } else {
    require(!e.isFloatingPoint() && e.toLong() >= 0);
    r = L.b.power(x, L.user_scalar(1, static_cast<double>(e.toLong()), o.mt, shape));
  }
  L.results = {L.finish(r)};
}

void pow_tensor_tensor(Lowering& L) {
  c10::ScalarType ct = L.promote({0, 1});
  require(c10::isFloatingType(ct));
  ValueId a = L.load(0, ct), b = L.load(1, ct);
  L.results = {L.finish(L.b.power(a, b))};
}

void logical(Lowering& L, OpKind kind) {  // and / or on x != 0
  const auto& shape = L.out().shape;
  auto truth = [&](size_t i) {
    c10::ScalarType t = L.is_tensor(i) ? L.arg(i).tensor.scalar_type() : L.promote({i});
    ValueId v = L.load(i, t, shape);
    if (ir::is_pred(L.b.type(v).dtype)) return v;
    return L.b.compare(v, L.cst(0, L.b.type(v).dtype, shape), CompareDirection::NE);
  };
  ValueId a = truth(0), b = truth(1);
  ValueId r = kind == OpKind::kCompare ? L.b.compare(a, b, CompareDirection::NE) : L.b.binary(kind, a, b);
  L.results = {L.finish(r)};
}

void bitwise(Lowering& L, OpKind kind) {
  c10::ScalarType ct = L.promote({0, 1});
  require(c10::isIntegralType(ct, /*includeBool=*/true));
  ValueId a = L.load(0, ct), b = L.load(1, ct);
  L.results = {L.finish(L.b.binary(kind, a, b))};
}

// ---------------------------------------------------------------- unary

void unary_float(Lowering& L, OpKind kind) {
  c10::ScalarType ct = float_out(L);
  L.results = {L.finish(L.b.unary(kind, L.load(0, ct)))};
}

void unary_same(Lowering& L, OpKind kind) {  // neg, abs: any non-bool dtype
  c10::ScalarType ct = L.out_dtype();
  require(ct != c10::kBool);
  L.results = {L.finish(L.b.unary(kind, L.load(0, ct)))};
}

void floor_ceil(Lowering& L, OpKind kind) {
  require(L.is_tensor(0));
  require(is_float_dtype(L.arg(0).tensor.scalar_type()));
  unary_float(L, kind);
}

void reciprocal(Lowering& L) {
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  L.results = {L.finish(o.div(o.c(1.0), L.load(0, ct)))};
}

// ATen: (0 < x) - (x < 0), so sign(-0) = 0 and sign(NaN) = 0.
void sign(Lowering& L) {
  c10::ScalarType ct = L.out_dtype();
  require(ct != c10::kBool);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId x = L.load(0, ct);
  ValueId pos = L.b.convert(o.cmp(o.c(0), x, CompareDirection::LT), o.mt);
  ValueId neg = L.b.convert(o.cmp(x, o.c(0), CompareDirection::LT), o.mt);
  L.results = {L.finish(o.sub(pos, neg))};
}

void logical_not(Lowering& L) {
  require(L.is_tensor(0));
  c10::ScalarType t = L.arg(0).tensor.scalar_type();
  ValueId x = L.load(0, t);
  ValueId r = ir::is_pred(L.b.type(x).dtype)
                  ? L.b.not_(x)
                  : L.b.compare(x, L.cst(0, L.b.type(x).dtype, L.out().shape), CompareDirection::EQ);
  L.results = {L.finish(r)};
}

void bitwise_not(Lowering& L) {
  c10::ScalarType ct = L.out_dtype();
  require(c10::isIntegralType(ct, /*includeBool=*/true));
  L.results = {L.finish(L.b.not_(L.load(0, ct)))};
}

// ---------------------------------------------------------------- where / clamp

void where(Lowering& L) {
  require(L.is_tensor(0) && L.arg(0).tensor.scalar_type() == c10::kBool);
  c10::ScalarType ct = L.out_dtype();
  const auto& shape = L.out().shape;
  ValueId c = L.b.broadcast_to(L.arg(0).value, shape);
  ValueId a = L.load(1, ct), b = L.load(2, ct);
  L.results = {L.finish(L.b.select(c, a, b))};
}

// min(max(x, lo), hi): NaN-propagating like ATen's clamp.
void clamp(Lowering& L, bool has_lo, bool has_hi, size_t lo_i, size_t hi_i) {
  c10::ScalarType ct = L.out_dtype();
  require(ct != c10::kBool);
  const auto& shape = L.out().shape;
  ValueId x = L.load(0, ct);
  if (has_lo && !L.is_none(lo_i)) x = L.b.maximum(x, L.load(lo_i, ct, shape, /*exact_scalar=*/true));
  if (has_hi && !L.is_none(hi_i)) x = L.b.minimum(x, L.load(hi_i, ct, shape, /*exact_scalar=*/true));
  L.results = {L.finish(x)};
}

void relu(Lowering& L) {
  c10::ScalarType ct = L.out_dtype();
  require(ct != c10::kBool);
  Ops o = ops_for(L, ct, L.out().shape);
  L.results = {L.finish(L.b.maximum(L.load(0, ct), o.c(0)))};
}

// ---------------------------------------------------------------- activations

// x <= threshold ? value : other  (threshold: other = x; threshold_backward: other = grad)
void threshold(Lowering& L, bool backward) {
  c10::ScalarType ct = L.out_dtype();
  require(ct != c10::kBool);
  const auto& shape = L.out().shape;
  Ops o = ops_for(L, ct, shape);
  size_t x_i = backward ? 1 : 0;
  ValueId x = L.load(x_i, ct);
  ValueId th = L.load(backward ? 2 : 1, ct, shape, /*exact_scalar=*/true);
  ValueId value = backward ? o.c(0) : L.load(2, ct, shape, /*exact_scalar=*/true);
  ValueId other = backward ? L.load(0, ct) : x;
  L.results = {L.finish(o.sel(o.cmp(x, th, CompareDirection::LE), value, other))};
}

void leaky_relu(Lowering& L, bool backward) {
  c10::ScalarType ct = float_out(L);
  const auto& shape = L.out().shape;
  Ops o = ops_for(L, ct, shape);
  size_t x_i = backward ? 1 : 0;
  ValueId x = L.load(x_i, ct);
  ValueId slope = L.load(backward ? 2 : 1, ct, shape, /*exact_scalar=*/true);
  ValueId v = backward ? L.load(0, ct) : x;
  L.results = {L.finish(o.sel(o.cmp(x, o.c(0), CompareDirection::GT), v, o.mul(v, slope)))};
}

std::string approximate_of(Lowering& L, size_t i) {
  if (L.is_none(i)) return "none";
  const c10::IValue& v = L.ivalue(i);
  require(v.isString());
  return v.toStringRef();
}

// GeluKernel.cpp, vectorized float paths.
constexpr double kSqrt1_2 = 0.70710678118654752440;     // M_SQRT1_2
constexpr double k2_SqrtPi = 1.12837916709551257390;    // M_2_SQRTPI
constexpr double kSqrt2 = 1.41421356237309504880;       // M_SQRT2
constexpr double kGeluBeta = kSqrt2 * k2_SqrtPi * 0.5;  // sqrt(2/pi)
constexpr double kGeluKappa = 0.044715;

void gelu(Lowering& L) {
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId x = L.load(0, ct);
  std::string approx = approximate_of(L, 1);
  ValueId r;
  if (approx == "none") {
    r = o.mul(o.mul(x, o.c(0.5)), o.add(o.c(1.0), L.b.erf(o.mul(x, o.c(kSqrt1_2)))));
  } else {
    require(approx == "tanh");
    ValueId x_cube = o.mul(o.mul(x, x), x);
    ValueId inner = o.mul(o.c(kGeluBeta), o.add(x, o.mul(o.c(kGeluKappa), x_cube)));
    r = o.mul(o.mul(o.c(0.5), x), o.add(o.c(1.0), L.b.tanh(inner)));
  }
  L.results = {L.finish(r)};
}

void gelu_backward(Lowering& L) {
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId dy = L.load(0, ct);
  ValueId x = L.load(1, ct);
  std::string approx = approximate_of(L, 2);
  ValueId r;
  if (approx == "none") {
    constexpr double kBeta = k2_SqrtPi * kSqrt1_2 * 0.5;
    ValueId cdf = o.mul(o.c(0.5), o.add(o.c(1.0), L.b.erf(o.mul(x, o.c(kSqrt1_2)))));
    ValueId pdf = o.mul(o.c(kBeta), L.b.exponential(o.mul(o.mul(x, x), o.c(-0.5))));
    r = o.mul(dy, o.add(cdf, o.mul(x, pdf)));
  } else {
    require(approx == "tanh");
    ValueId x_sq = o.mul(x, x);
    ValueId x_cube = o.mul(x, x_sq);
    ValueId inner = o.mul(o.c(kGeluBeta), o.add(x, o.mul(o.c(kGeluKappa), x_cube)));
    ValueId t = L.b.tanh(inner);
    ValueId left = o.mul(o.c(0.5), x);
    ValueId right = o.add(o.c(1.0), t);
    ValueId left_d = o.mul(o.c(0.5), right);
    ValueId tanh_d = o.sub(o.c(1.0), o.mul(t, t));
    ValueId inner_d = o.mul(o.c(kGeluBeta), o.add(o.c(1.0), o.mul(o.mul(o.c(3.0), o.c(kGeluKappa)), x_sq)));
    ValueId right_d = o.mul(o.mul(left, tanh_d), inner_d);
    r = o.mul(dy, o.add(left_d, right_d));
  }
  L.results = {L.finish(r)};
}

void silu(Lowering& L) {  // x / (1 + exp(-x))
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId x = L.load(0, ct);
  L.results = {L.finish(o.div(x, o.add(o.c(1.0), L.b.exponential(L.b.negate(x)))))};
}

void silu_backward(Lowering& L) {  // dy * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x))
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId dy = L.load(0, ct), x = L.load(1, ct);
  ValueId s = o.div(o.c(1.0), o.add(o.c(1.0), L.b.exponential(L.b.negate(x))));
  L.results = {L.finish(o.mul(o.mul(dy, s), o.add(o.c(1.0), o.mul(x, o.sub(o.c(1.0), s)))))};
}

void sigmoid_backward(Lowering& L) {  // dy * (1 - y) * y
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId dy = L.load(0, ct), y = L.load(1, ct);
  L.results = {L.finish(o.mul(o.mul(dy, o.sub(o.c(1.0), y)), y))};
}

void tanh_backward(Lowering& L) {  // dy * (1 - y * y)
  c10::ScalarType ct = float_out(L);
  Ops o = ops_for(L, ct, L.out().shape);
  ValueId dy = L.load(0, ct), y = L.load(1, ct);
  L.results = {L.finish(o.mul(dy, o.sub(o.c(1.0), o.mul(y, y))))};
}

void softplus(Lowering& L) {  // x * beta > threshold ? x : log1p(exp(x * beta)) / beta
  c10::ScalarType ct = float_out(L);
  const auto& shape = L.out().shape;
  Ops o = ops_for(L, ct, shape);
  ValueId x = L.load(0, ct);
  ValueId beta = L.load(1, ct, shape, true), th = L.load(2, ct, shape, true);
  ValueId xb = o.mul(x, beta);
  ValueId soft = o.div(L.b.log_plus_one(L.b.exponential(xb)), beta);
  L.results = {L.finish(o.sel(o.cmp(xb, th, CompareDirection::GT), x, soft))};
}

// ---------------------------------------------------------------- dtype casts

void to_copy(Lowering& L) {
  // _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
  if (!L.is_none(2)) require(L.ivalue(2).toLayout() == c10::kStrided);
  require(L.is_tensor(0));
  if (!L.is_none(3)) {
    c10::Device d = L.ivalue(3).toDevice();
    require(d.type() == c10::DeviceType::PrivateUse1 &&
            (!d.has_index() || d.index() == L.arg(0).tensor.device().index()));
  }
  if (!L.is_none(4)) require(!L.ivalue(4).toBool());
  if (!L.is_none(6)) {
    auto f = L.ivalue(6).toMemoryFormat();
    require(f == c10::MemoryFormat::Preserve || f == c10::MemoryFormat::Contiguous);
  }
  L.results = {L.b.convert(L.arg(0).value, ir_or_throw(L.out_dtype()))};
  L.results[0] = L.finish(L.results[0]);
}

void clone(Lowering& L) {
  require(L.is_tensor(0));
  if (!L.is_none(1)) {
    auto f = L.ivalue(1).toMemoryFormat();
    require(f == c10::MemoryFormat::Preserve || f == c10::MemoryFormat::Contiguous);
  }
  L.results = {L.finish(L.b.convert(L.arg(0).value, ir_or_throw(L.out_dtype())))};
}

// ---------------------------------------------------------------- reductions

// The reduced dimensions of argument `dims_i` (None / [] = all), sorted.
std::vector<int64_t> reduce_dims(Lowering& L, size_t dims_i, int64_t rank) {
  std::vector<int64_t> dims;
  if (dims_i < L.num_args() && !L.is_none(dims_i)) {
    const c10::IValue& v = L.ivalue(dims_i);
    if (v.isIntList()) {
      for (int64_t d : v.toIntList()) dims.push_back(d);
    } else if (v.isInt()) {
      dims.push_back(v.toInt());
    } else {
      throw NotFusible{};
    }
  }
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t& d : dims) d = c10::maybe_wrap_dim(d, rank == 0 ? 1 : rank);
  std::sort(dims.begin(), dims.end());
  require(std::adjacent_find(dims.begin(), dims.end()) == dims.end());
  if (rank == 0) dims.clear();
  return dims;
}

// `v` reduced over `dims`, reshaped to the result's shape (keepdim: size-1
// dimensions through broadcast_in_dim, which keeps the kernel fused).
ValueId to_result_shape(Lowering& L, ValueId v, const std::vector<int64_t>& dims, int64_t rank, size_t k = 0) {
  const ir::Shape& want = L.out(k).shape;
  if (L.b.type(v).shape == want) return v;
  require(static_cast<int64_t>(want.size()) == rank);
  std::vector<int64_t> keep;
  for (int64_t d = 0; d < rank; ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) keep.push_back(d);
  return L.b.broadcast_in_dim(v, want, keep);
}

void reduce(Lowering& L, ReduceKind kind, bool mean, size_t dims_i) {
  require(L.is_tensor(0) && L.arg(0).tensor.dim() >= 1);
  const at::Tensor& x = L.arg(0).tensor;
  const int64_t rank = x.dim();
  std::vector<int64_t> dims = reduce_dims(L, dims_i, rank);
  c10::ScalarType od = L.out_dtype();
  ElementType odi = ir_or_throw(od);
  ValueId v = L.arg(0).value;
  ValueId r;
  if (mean) {
    require(is_float_dtype(od));
    // ATen (CPU): sum in opmath, divide, round once.
    ElementType mt = opmath_of(odi);
    if (L.b.type(v).dtype != odi) v = L.b.convert(v, odi);
    if (mt != odi) v = L.b.convert(v, mt);
    int64_t count = 1;
    for (int64_t d : dims) count *= x.size(d);
    r = L.b.reduce(v, ReduceKind::kSum, dims);
    r = L.b.divide(r, L.cst(static_cast<double>(count), mt, L.b.type(r).shape));
  } else {
    if (kind == ReduceKind::kSum || kind == ReduceKind::kProd) require(od != c10::kBool);
    if (L.b.type(v).dtype != odi) v = L.b.convert(v, odi);
    r = L.b.reduce(v, kind, dims);
  }
  L.results = {L.finish(to_result_shape(L, r, dims, rank))};
}

// ---------------------------------------------------------------- softmax

ValueId bcast_back(Lowering& L, ValueId v, const ir::Shape& shape, const std::vector<int64_t>& keep) {
  return L.b.broadcast_in_dim(v, shape, keep);
}

// All dimensions of a rank-`rank` tensor except `dim`, ascending.
std::vector<int64_t> dims_except(int64_t rank, int64_t dim) {
  std::vector<int64_t> keep;
  for (int64_t d = 0; d < rank; ++d) {
    if (d != dim) keep.push_back(d);
  }
  return keep;
}

// What a softmax (or its backward) over `t`, along the dim in argument
// `dim_arg`, computes with: the dim, the opmath type of the float result,
// the result shape and the dimensions a per-row value broadcasts back along.
struct SoftmaxFrame {
  int64_t dim;
  ElementType mt;
  ir::Shape shape;
  std::vector<int64_t> keep;
};

SoftmaxFrame softmax_frame(Lowering& L, const at::Tensor& t, size_t dim_arg) {
  const int64_t rank = t.dim();
  const int64_t dim = c10::maybe_wrap_dim(L.ivalue(dim_arg).toInt(), rank);
  return SoftmaxFrame{dim, opmath_of(ir_or_throw(float_out(L))), L.out().shape, dims_except(rank, dim)};
}

// _softmax(self, dim, half_to_float) / _log_softmax: ATen's _vec_softmax:
// exp(x - max) * (1 / sum), and (x - max) - log(sum).
void softmax(Lowering& L, bool log) {
  require(L.is_tensor(0));
  const at::Tensor& x_t = L.arg(0).tensor;
  require(is_float_dtype(x_t.scalar_type()) && x_t.dim() >= 1);
  const auto [dim, mt, shape, keep] = softmax_frame(L, x_t, 1);
  ValueId x = L.arg(0).value;
  if (L.b.type(x).dtype != mt) x = L.b.convert(x, mt);
  ValueId mx = L.b.reduce(x, ReduceKind::kMax, {dim});
  ValueId shifted = L.b.subtract(x, bcast_back(L, mx, shape, keep));
  ValueId e = L.b.exponential(shifted);
  ValueId s = L.b.reduce(e, ReduceKind::kSum, {dim});
  ValueId r;
  if (log) {
    r = L.b.subtract(shifted, bcast_back(L, L.b.log(s), shape, keep));
  } else {
    ValueId inv = L.b.divide(L.cst(1.0, mt, L.b.type(s).shape), s);
    r = L.b.multiply(e, bcast_back(L, inv, shape, keep));
  }
  L.results = {L.finish(r)};
}

// _softmax_backward_data(grad_output, output, dim, input_dtype): (gO - sum(gO * y)) * y
// _log_softmax_backward_data: gO - exp(y) * sum(gO)
void softmax_backward(Lowering& L, bool log) {
  require(L.is_tensor(0) && L.is_tensor(1));
  const at::Tensor& y_t = L.arg(1).tensor;
  require(y_t.dim() >= 1);
  const auto [dim, mt, shape, keep] = softmax_frame(L, y_t, 2);
  auto widen = [&L, mt = mt](ValueId v) { return L.b.type(v).dtype == mt ? v : L.b.convert(v, mt); };
  ValueId g = widen(L.arg(0).value), y = widen(L.arg(1).value);
  require(L.b.type(g).shape == shape && L.b.type(y).shape == shape);
  ValueId r;
  if (log) {
    ValueId s = L.b.reduce(g, ReduceKind::kSum, {dim});
    r = L.b.subtract(g, L.b.multiply(L.b.exponential(y), bcast_back(L, s, shape, keep)));
  } else {
    ValueId s = L.b.reduce(L.b.multiply(g, y), ReduceKind::kSum, {dim});
    r = L.b.multiply(L.b.subtract(g, bcast_back(L, s, shape, keep)), y);
  }
  L.results = {L.finish(r)};
}

// ---------------------------------------------------------------- random

// bernoulli.p(self, p, generator) and bernoulli_.float: self's dtype and
// shape, 1 with probability p; the mask is drawn from the generator when the
// region runs, in program order (see draw_bernoulli_mask).
void bernoulli(Lowering& L) {
  const double p = L.ivalue(1).toDouble();
  require(p >= 0.0 && p <= 1.0);  // ATen raises for others
  at::Generator gen;
  if (!L.is_none(2))
    gen = L.ivalue(2).toGenerator();
  else if (L.is_tensor(0))
    gen = default_generator(L.arg(0).tensor.device().index());
  if (!gen.defined() || gen.device().type() != c10::DeviceType::PrivateUse1) throw NotFusible{};  // strict raises
  ValueId m = L.bernoulli_mask(L.out().shape, p, gen);
  L.results = {L.finish(L.b.convert(m, ir_or_throw(L.out_dtype())))};
}

// native_dropout_backward(grad, mask, scale) = grad * mask * scale (ATen's kernel).
void native_dropout_backward(Lowering& L) {
  c10::ScalarType ct = L.promote({0, 1});
  require(c10::isFloatingType(ct));
  const auto& shape = L.out().shape;
  const ElementType mt = opmath_of(ir_or_throw(ct));
  ValueId t = L.finish(L.b.binary(OpKind::kMultiply, L.load(0, ct, shape), L.load(1, ct, shape)));
  if (L.b.type(t).dtype != mt) t = L.b.convert(t, mt);
  ValueId s = L.user_scalar(2, L.ivalue(2).toDouble(), mt, shape);
  L.results = {L.finish(L.b.binary(OpKind::kMultiply, t, s))};
}

// ---------------------------------------------------------------- the table

using Table = std::unordered_map<std::string, LowerFn>;

void add_op(Table& t, const std::string& name, LowerFn fn, bool inplace = true) {
  // "aten::add.Tensor" -> also "aten::add_.Tensor"
  t[name] = fn;
  if (!inplace) return;
  size_t dot = name.find('.');
  std::string base = dot == std::string::npos ? name : name.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : name.substr(dot);
  t[base + "_" + overload] = fn;
}

Table build_table() {
  Table t;
  // Binary arithmetic.
  for (const char* ov : {".Tensor", ".Scalar"}) {
    // ATen casts the scalar of add/sub/rsub (Tensor and Scalar overloads) to the common dtype;
    // mul/div read theirs in opmath precision.
    add_op(t, std::string("aten::add") + ov, [](Lowering& L) { add_sub(L, OpKind::kAdd, false, false); });
    add_op(t, std::string("aten::sub") + ov, [](Lowering& L) { add_sub(L, OpKind::kSubtract, false, false); });
    add_op(
        t, std::string("aten::rsub") + ov, [](Lowering& L) { add_sub(L, OpKind::kSubtract, true, false); }, false);
    add_op(t, std::string("aten::mul") + ov, [](Lowering& L) { mul_div(L, OpKind::kMultiply); });
    add_op(t, std::string("aten::div") + ov, [](Lowering& L) { mul_div(L, OpKind::kDivide); });
    add_op(
        t, std::string("aten::eq") + ov, [](Lowering& L) { compare(L, CompareDirection::EQ); }, false);
    add_op(
        t, std::string("aten::ne") + ov, [](Lowering& L) { compare(L, CompareDirection::NE); }, false);
    add_op(
        t, std::string("aten::lt") + ov, [](Lowering& L) { compare(L, CompareDirection::LT); }, false);
    add_op(
        t, std::string("aten::le") + ov, [](Lowering& L) { compare(L, CompareDirection::LE); }, false);
    add_op(
        t, std::string("aten::gt") + ov, [](Lowering& L) { compare(L, CompareDirection::GT); }, false);
    add_op(
        t, std::string("aten::ge") + ov, [](Lowering& L) { compare(L, CompareDirection::GE); }, false);
    add_op(t, std::string("aten::bitwise_and") + ov, [](Lowering& L) { bitwise(L, OpKind::kAnd); });
    add_op(t, std::string("aten::bitwise_or") + ov, [](Lowering& L) { bitwise(L, OpKind::kOr); });
  }
  // ATen rounds the scalar of in-place mul_.Scalar to a 16-bit common dtype.
  t["aten::mul_.Scalar"] = [](Lowering& L) { mul_div(L, OpKind::kMultiply, false); };
  add_op(t, "aten::true_divide.Tensor", [](Lowering& L) { mul_div(L, OpKind::kDivide); });
  add_op(
      t, "aten::maximum", [](Lowering& L) { max_min(L, OpKind::kMaximum); }, false);
  add_op(
      t, "aten::minimum", [](Lowering& L) { max_min(L, OpKind::kMinimum); }, false);
  add_op(t, "aten::pow.Tensor_Scalar", pow_tensor_scalar);
  add_op(t, "aten::pow.Tensor_Tensor", pow_tensor_tensor);
  add_op(t, "aten::pow_.Scalar", pow_tensor_scalar, false);
  add_op(t, "aten::pow_.Tensor", pow_tensor_tensor, false);
  add_op(
      t, "aten::logical_and", [](Lowering& L) { logical(L, OpKind::kAnd); }, false);
  add_op(
      t, "aten::logical_or", [](Lowering& L) { logical(L, OpKind::kOr); }, false);
  add_op(
      t, "aten::logical_xor", [](Lowering& L) { logical(L, OpKind::kCompare); }, false);
  // Unary.
  add_op(t, "aten::exp", [](Lowering& L) { unary_float(L, OpKind::kExponential); });
  add_op(t, "aten::log", [](Lowering& L) { unary_float(L, OpKind::kLog); });
  add_op(t, "aten::log1p", [](Lowering& L) { unary_float(L, OpKind::kLogPlusOne); });
  add_op(t, "aten::expm1", [](Lowering& L) { unary_float(L, OpKind::kExponentialMinusOne); });
  add_op(t, "aten::tanh", [](Lowering& L) { unary_float(L, OpKind::kTanh); });
  add_op(t, "aten::sigmoid", [](Lowering& L) { unary_float(L, OpKind::kLogistic); });
  add_op(t, "aten::sqrt", [](Lowering& L) { unary_float(L, OpKind::kSqrt); });
  add_op(t, "aten::rsqrt", [](Lowering& L) { unary_float(L, OpKind::kRsqrt); });
  add_op(t, "aten::sin", [](Lowering& L) { unary_float(L, OpKind::kSine); });
  add_op(t, "aten::cos", [](Lowering& L) { unary_float(L, OpKind::kCosine); });
  add_op(t, "aten::erf", [](Lowering& L) { unary_float(L, OpKind::kErf); });
  add_op(t, "aten::floor", [](Lowering& L) { floor_ceil(L, OpKind::kFloor); });
  add_op(t, "aten::ceil", [](Lowering& L) { floor_ceil(L, OpKind::kCeil); });
  add_op(t, "aten::neg", [](Lowering& L) { unary_same(L, OpKind::kNegate); });
  add_op(t, "aten::abs", [](Lowering& L) { unary_same(L, OpKind::kAbs); });
  add_op(t, "aten::reciprocal", reciprocal);
  add_op(t, "aten::sign", sign);
  add_op(t, "aten::logical_not", logical_not);
  add_op(t, "aten::bitwise_not", bitwise_not);
  // where / clamp / activations.
  add_op(t, "aten::where.self", where, false);
  add_op(t, "aten::where.ScalarSelf", where, false);
  add_op(t, "aten::where.ScalarOther", where, false);
  add_op(t, "aten::where.Scalar", where, false);
  add_op(t, "aten::clamp", [](Lowering& L) { clamp(L, true, true, 1, 2); });
  add_op(t, "aten::clamp.Tensor", [](Lowering& L) { clamp(L, true, true, 1, 2); });
  add_op(t, "aten::clamp_min", [](Lowering& L) { clamp(L, true, false, 1, 0); });
  add_op(t, "aten::clamp_min.Tensor", [](Lowering& L) { clamp(L, true, false, 1, 0); });
  add_op(t, "aten::clamp_max", [](Lowering& L) { clamp(L, false, true, 0, 1); });
  add_op(t, "aten::clamp_max.Tensor", [](Lowering& L) { clamp(L, false, true, 0, 1); });
  add_op(t, "aten::hardtanh", [](Lowering& L) { clamp(L, true, true, 1, 2); });
  add_op(t, "aten::relu", relu);
  add_op(t, "aten::threshold", [](Lowering& L) { threshold(L, false); });
  add_op(
      t, "aten::threshold_backward", [](Lowering& L) { threshold(L, true); }, false);
  add_op(t, "aten::leaky_relu", [](Lowering& L) { leaky_relu(L, false); });
  add_op(
      t, "aten::leaky_relu_backward", [](Lowering& L) { leaky_relu(L, true); }, false);
  add_op(t, "aten::gelu", gelu);
  add_op(t, "aten::gelu_backward", gelu_backward, false);
  add_op(t, "aten::silu", silu);
  add_op(t, "aten::silu_backward", silu_backward, false);
  add_op(t, "aten::sigmoid_backward", sigmoid_backward, false);
  add_op(t, "aten::tanh_backward", tanh_backward, false);
  add_op(t, "aten::softplus", softplus, false);
  // Casts.
  add_op(t, "aten::_to_copy", to_copy, false);
  add_op(t, "aten::clone", clone, false);
  // Reductions.
  add_op(
      t, "aten::sum", [](Lowering& L) { reduce(L, ReduceKind::kSum, false, SIZE_MAX); }, false);
  add_op(
      t, "aten::sum.dim_IntList", [](Lowering& L) { reduce(L, ReduceKind::kSum, false, 1); }, false);
  add_op(
      t, "aten::mean", [](Lowering& L) { reduce(L, ReduceKind::kSum, true, SIZE_MAX); }, false);
  add_op(
      t, "aten::mean.dim", [](Lowering& L) { reduce(L, ReduceKind::kSum, true, 1); }, false);
  add_op(
      t, "aten::amax", [](Lowering& L) { reduce(L, ReduceKind::kMax, false, 1); }, false);
  add_op(
      t, "aten::amin", [](Lowering& L) { reduce(L, ReduceKind::kMin, false, 1); }, false);
  add_op(
      t, "aten::max", [](Lowering& L) { reduce(L, ReduceKind::kMax, false, SIZE_MAX); }, false);
  add_op(
      t, "aten::min", [](Lowering& L) { reduce(L, ReduceKind::kMin, false, SIZE_MAX); }, false);
  add_op(
      t, "aten::prod", [](Lowering& L) { reduce(L, ReduceKind::kProd, false, SIZE_MAX); }, false);
  add_op(
      t, "aten::_softmax", [](Lowering& L) { softmax(L, false); }, false);
  add_op(
      t, "aten::_log_softmax", [](Lowering& L) { softmax(L, true); }, false);
  add_op(
      t, "aten::_softmax_backward_data", [](Lowering& L) { softmax_backward(L, false); }, false);
  add_op(
      t, "aten::_log_softmax_backward_data", [](Lowering& L) { softmax_backward(L, true); }, false);
  // Random.
  add_op(t, "aten::bernoulli.p", bernoulli, false);
  add_op(t, "aten::bernoulli_.float", bernoulli, false);
  add_op(t, "aten::native_dropout_backward", native_dropout_backward, false);
  return t;
}

const Table& table() {
  static const Table t = build_table();
  return t;
}

}  // namespace

LowerFn find_lowering(const std::string& label) {
  auto it = table().find(label);
  return it == table().end() ? nullptr : it->second;
}

std::vector<std::string> fusible_op_labels() {
  std::vector<std::string> out;
  for (const auto& [label, fn] : table()) out.push_back(label);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace torch_tpu::defer
