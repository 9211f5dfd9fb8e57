// Every op of the executor against the reference interpreter, on random
// inputs, for f32 / bf16 (and f16, f64, the integer types and pred where
// the op is defined), over several tiles with a partial last one.
#include <limits>
#include <tuple>

#include "test_exec_util.h"

namespace {

using namespace exec_test;
using ir::CompareDirection;
using ir::OpKind;
using ir::ValueId;

const ir::Shape kShape{37, 129};  // 4773 elements: 5 tiles of 1024, the last partial

exec::CompileOptions small_tiles() {
  exec::CompileOptions o;
  o.tile_elements = 1024;
  return o;
}

struct UnaryCase {
  OpKind op;
  double lo, hi;
};

const UnaryCase kUnary[] = {
    {OpKind::kNegate, -5, 5},
    {OpKind::kAbs, -5, 5},
    {OpKind::kExponential, -10, 10},
    {OpKind::kLog, 1e-3, 100},
    {OpKind::kLogPlusOne, -0.99, 10},
    {OpKind::kExponentialMinusOne, -5, 5},
    {OpKind::kTanh, -6, 6},
    {OpKind::kLogistic, -12, 12},
    {OpKind::kSqrt, 0, 100},
    {OpKind::kRsqrt, 1e-2, 100},
    {OpKind::kSine, -20, 20},
    {OpKind::kCosine, -20, 20},
    {OpKind::kErf, -4, 4},
    {OpKind::kFloor, -5, 5},
    {OpKind::kCeil, -5, 5},
    {OpKind::kSign, -5, 5},
};

class ExecUnary : public ::testing::TestWithParam<std::tuple<UnaryCase, ElementType>> {};

TEST_P(ExecUnary, MatchesReference) {
  auto [c, t] = GetParam();
  ir::Builder b;
  ValueId x = b.parameter(t, kShape);
  b.output(b.unary(c.op, x));
  std::mt19937 rng(static_cast<unsigned>(c.op) * 31 + static_cast<unsigned>(t));
  std::vector<HostArray> in{random_array({t, kShape}, rng, c.lo, c.hi)};
  expect_matches_reference(b.graph(), in, small_tiles());
  expect_matches_reference(b.graph(), in);  // default tile size
}

INSTANTIATE_TEST_SUITE_P(AllFloatTypes, ExecUnary,
                         ::testing::Combine(::testing::ValuesIn(kUnary),
                                            ::testing::Values(ElementType::f32, ElementType::bf16, ElementType::f16,
                                                              ElementType::f64)),
                         [](const auto& info) {
                           return std::string(ir::op_name(std::get<0>(info.param).op)) + "_" +
                                  ir::element_type_name(std::get<1>(info.param));
                         });

TEST(ExecUnarySpecialValues, F32EdgeCasesMatchReference) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<double> specials = {0.0f,     -0.0f,    inf,     -inf,      nan,    1e-40f,  -1e-40f, 1e30f,
                                        -1e30f,   88.8f,    -104.0f, 1.0f,      -1.0f,  0.5f,    1e-7f,   9000.0f,
                                        -9000.0f, 3.14159f, 1e10f,   -0.99999f, 0.625f, -0.625f, 4.5f,    -88.0f};
  ir::Literal lit = ir::Literal::zeros({ElementType::f32, {static_cast<int64_t>(specials.size())}});
  lit.f = specials;
  for (const UnaryCase& c : kUnary) {
    ir::Builder b;
    ValueId x = b.parameter(ElementType::f32, lit.type.shape);
    b.output(b.unary(c.op, x));
    std::vector<HostArray> in{HostArray::from_literal(lit)};
    SCOPED_TRACE(ir::op_name(c.op));
    expect_matches_reference(b.graph(), in);
  }
}

struct BinaryCase {
  OpKind op;
  double lo_a, hi_a, lo_b, hi_b;
};

const BinaryCase kBinary[] = {
    {OpKind::kAdd, -5, 5, -5, 5},        {OpKind::kSubtract, -5, 5, -5, 5}, {OpKind::kMultiply, -5, 5, -5, 5},
    {OpKind::kDivide, -5, 5, 0.5, 4},    {OpKind::kMaximum, -5, 5, -5, 5},  {OpKind::kMinimum, -5, 5, -5, 5},
    {OpKind::kPower, 0.1, 3, -2.5, 2.5},
};

class ExecBinary : public ::testing::TestWithParam<std::tuple<BinaryCase, ElementType>> {};

TEST_P(ExecBinary, MatchesReferenceWithArrayAndScalarOperands) {
  auto [c, t] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.op) * 17 + static_cast<unsigned>(t));
  ir::Builder b;
  ValueId x = b.parameter(t, kShape);
  ValueId y = b.parameter(t, kShape);
  b.output(b.binary(c.op, x, y));
  // A constant on either side takes the immediate-operand loops.
  const double k = c.op == OpKind::kDivide ? 1.75 : c.op == OpKind::kPower ? 1.3 : -1.25;
  ValueId splat = b.broadcast_in_dim(b.constant(k, t), kShape, {});
  b.output(b.binary(c.op, x, splat));
  if (c.op != OpKind::kPower) b.output(b.binary(c.op, splat, y));
  std::vector<HostArray> in{random_array({t, kShape}, rng, c.lo_a, c.hi_a),
                            random_array({t, kShape}, rng, c.lo_b, c.hi_b)};
  expect_matches_reference(b.graph(), in, small_tiles());
}

INSTANTIATE_TEST_SUITE_P(AllFloatTypes, ExecBinary,
                         ::testing::Combine(::testing::ValuesIn(kBinary),
                                            ::testing::Values(ElementType::f32, ElementType::bf16, ElementType::f16,
                                                              ElementType::f64)),
                         [](const auto& info) {
                           return std::string(ir::op_name(std::get<0>(info.param).op)) + "_" +
                                  ir::element_type_name(std::get<1>(info.param));
                         });

TEST(ExecBinarySpecialValues, NanInfAndZerosMatchReference) {
  const double inf = INFINITY, nan = NAN;
  std::vector<double> a = {nan, 1.0, nan, inf, -inf, 0.0, -0.0, 0.0, inf, 2.0, -2.0, 1e-40};
  std::vector<double> c = {1.0, nan, nan, inf, inf, 0.0, 0.0, -0.0, 0.0, -inf, 0.5, 1e-40};
  const int64_t n = static_cast<int64_t>(a.size());
  ir::Literal la = ir::Literal::zeros({ElementType::f32, {n}}), lb = la;
  la.f = a;
  lb.f = c;
  for (OpKind op : {OpKind::kAdd, OpKind::kSubtract, OpKind::kMultiply, OpKind::kDivide, OpKind::kMaximum,
                    OpKind::kMinimum, OpKind::kPower}) {
    ir::Builder b;
    ValueId x = b.parameter(ElementType::f32, {n});
    ValueId y = b.parameter(ElementType::f32, {n});
    b.output(b.binary(op, x, y));
    std::vector<HostArray> in{HostArray::from_literal(la), HostArray::from_literal(lb)};
    SCOPED_TRACE(ir::op_name(op));
    expect_matches_reference(b.graph(), in);
  }
}

TEST(ExecPower, ConstantExponentsTakeTheFastPathWithPowSemantics) {
  const double inf = INFINITY;
  std::vector<double> v = {-0.0, 0.0, -inf, inf, NAN, -2.0, 3.0, 1e-20, -1e-3, 1.5, 1e19, -7.25, 0.1};
  const int64_t n = static_cast<int64_t>(v.size());
  ir::Literal lit = ir::Literal::zeros({ElementType::f32, {n}});
  lit.f = v;
  for (double e : {0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, -0.5, 2.5}) {
    ir::Builder b;
    ValueId x = b.parameter(ElementType::f32, {n});
    b.output(b.power(x, b.broadcast_in_dim(b.constant(e, ElementType::f32), {n}, {})));
    std::vector<HostArray> in{HostArray::from_literal(lit)};
    exec::CompiledRegion r = exec::compile(b.graph());
    bool fast = r.describe().find("power_const") != std::string::npos;
    EXPECT_EQ(fast, e != 2.5) << e;
    SCOPED_TRACE(e);
    expect_matches_reference(b.graph(), in);
  }
}

class ExecCompare : public ::testing::TestWithParam<std::tuple<CompareDirection, ElementType>> {};

TEST_P(ExecCompare, MatchesReference) {
  auto [dir, t] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(dir) * 7 + static_cast<unsigned>(t));
  ir::Builder b;
  ValueId x = b.parameter(t, kShape);
  ValueId y = b.parameter(t, kShape);
  ValueId p = b.compare(x, y, dir);
  b.output(p);
  b.output(b.compare(x, b.broadcast_in_dim(b.constant(1.0, t), kShape, {}), dir));
  if (!ir::is_pred(t)) b.output(b.select(p, x, y));
  // Small integer ranges so that equal pairs are common.
  std::vector<HostArray> in{random_array({t, kShape}, rng, -3, 3), random_array({t, kShape}, rng, -3, 3)};
  if (ir::is_float(t)) {  // and some NaNs
    ir::Literal l = in[0].literal();
    for (int64_t k = 0; k < l.numel(); k += 97) l.f[k] = NAN;
    in[0] = HostArray::from_literal(l);
  }
  expect_matches_reference(b.graph(), in, small_tiles());
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ExecCompare,
                         ::testing::Combine(::testing::Values(CompareDirection::EQ, CompareDirection::NE,
                                                              CompareDirection::LT, CompareDirection::LE,
                                                              CompareDirection::GT, CompareDirection::GE),
                                            ::testing::Values(ElementType::f32, ElementType::bf16, ElementType::s32,
                                                              ElementType::u8, ElementType::pred)),
                         [](const auto& info) {
                           return std::string(ir::direction_name(std::get<0>(info.param))) + "_" +
                                  ir::element_type_name(std::get<1>(info.param));
                         });

TEST(ExecSelect, ImmediateBranchesAndConstantPredicates) {
  for (ElementType t : {ElementType::f32, ElementType::bf16, ElementType::s32, ElementType::pred}) {
    std::mt19937 rng(5);
    ir::Builder b;
    ValueId p = b.parameter(ElementType::pred, kShape);
    ValueId x = b.parameter(t, kShape);
    auto splat = [&](double v, ElementType et) { return b.broadcast_in_dim(b.constant(v, et), kShape, {}); };
    b.output(b.select(p, x, splat(0, t)));
    b.output(b.select(p, splat(1, t), x));
    b.output(b.select(p, splat(1, t), splat(0, t)));
    b.output(b.select(splat(1, ElementType::pred), x, splat(0, t)));
    std::vector<HostArray> in{random_array({ElementType::pred, kShape}, rng), random_array({t, kShape}, rng, -4, 4)};
    SCOPED_TRACE(ir::element_type_name(t));
    expect_matches_reference(b.graph(), in, small_tiles());
  }
}

class ExecIntegerOps : public ::testing::TestWithParam<ElementType> {};

TEST_P(ExecIntegerOps, WrapLikeTheReference) {
  const ElementType t = GetParam();
  std::mt19937 rng(static_cast<unsigned>(t));
  const double lo = t == ElementType::u8 ? 0 : t == ElementType::s8 ? -128 : -3000;
  const double hi = t == ElementType::u8 ? 256 : t == ElementType::s8 ? 128 : 3000;
  ir::Builder b;
  ValueId x = b.parameter(t, kShape);
  ValueId y = b.parameter(t, kShape);
  ValueId e = b.parameter(t, kShape);  // small exponents, zeros among the divisors
  for (OpKind op : {OpKind::kNegate, OpKind::kAbs, OpKind::kSign, OpKind::kNot}) b.output(b.unary(op, x));
  for (OpKind op : {OpKind::kAdd, OpKind::kSubtract, OpKind::kMultiply, OpKind::kMaximum, OpKind::kMinimum,
                    OpKind::kAnd, OpKind::kOr})
    b.output(b.binary(op, x, y));
  b.output(b.divide(x, e));
  b.output(b.power(x, e));
  b.output(b.multiply(x, b.broadcast_in_dim(b.constant_int(77, t), kShape, {})));
  std::vector<HostArray> in{random_array({t, kShape}, rng, lo, hi), random_array({t, kShape}, rng, lo, hi),
                            random_array({t, kShape}, rng, t == ElementType::u8 ? 0 : -3, 6)};
  expect_matches_reference(b.graph(), in, small_tiles());
}

INSTANTIATE_TEST_SUITE_P(AllIntegerTypes, ExecIntegerOps,
                         ::testing::Values(ElementType::s64, ElementType::s32, ElementType::s8, ElementType::u8),
                         [](const auto& info) { return std::string(ir::element_type_name(info.param)); });

TEST(ExecPredOps, LogicMatchesReference) {
  std::mt19937 rng(11);
  ir::Builder b;
  ValueId p = b.parameter(ElementType::pred, kShape);
  ValueId q = b.parameter(ElementType::pred, kShape);
  b.output(b.and_(p, q));
  b.output(b.or_(p, q));
  b.output(b.not_(p));
  b.output(b.maximum(p, q));
  b.output(b.minimum(p, q));
  std::vector<HostArray> in{random_array({ElementType::pred, kShape}, rng),
                            random_array({ElementType::pred, kShape}, rng)};
  expect_matches_reference(b.graph(), in, small_tiles());
}

class ExecConvert : public ::testing::TestWithParam<std::tuple<ElementType, ElementType>> {};

TEST_P(ExecConvert, MatchesReferenceExactly) {
  auto [from, to] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(from) * 9 + static_cast<unsigned>(to));
  ir::Literal l = random_literal({from, kShape}, rng, -300, 300);
  if (ir::is_float(from)) {
    const double specials[] = {NAN, INFINITY, -INFINITY, -0.0, 3e9, -3e9, 255.5, -128.5, 127.9, 1e20, 65519.0, 65520.0};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); ++k)
      l.f[k * 13] = ir::round_to_type(specials[k], from);
  } else if (from == ElementType::s64) {
    l.i[0] = std::numeric_limits<int64_t>::max();
    l.i[1] = std::numeric_limits<int64_t>::min();
    l.i[2] = (int64_t{1} << 53) + 1;
  }
  ir::Builder b;
  ValueId x = b.parameter(from, kShape);
  b.output(b.convert(x, to));
  std::vector<HostArray> in{HostArray::from_literal(l)};
  exec::CompiledRegion r = exec::compile(b.graph(), small_tiles());
  std::vector<ir::Literal> got = run_region(r, in);
  std::vector<ir::Literal> want = reference(b.graph(), in);
  EXPECT_TRUE(all_close(got[0], want[0], Tolerance{0, 0}));
}

const ElementType kAllTypes[] = {ElementType::f32, ElementType::bf16, ElementType::f16,
                                 ElementType::f64, ElementType::s64,  ElementType::s32,
                                 ElementType::s8,  ElementType::u8,   ElementType::pred};

INSTANTIATE_TEST_SUITE_P(AllPairs, ExecConvert,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes), ::testing::ValuesIn(kAllTypes)),
                         [](const auto& info) {
                           return std::string(ir::element_type_name(std::get<0>(info.param))) + "_to_" +
                                  ir::element_type_name(std::get<1>(info.param));
                         });

TEST(ExecConvert, ExplicitBf16RoundTripRoundsInsideAKernel) {
  // bf16 intermediates keep f32 precision inside a kernel, but an explicit
  // convert to bf16 and back rounds, as the program asks.
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  ValueId r = b.convert(b.convert(x, ElementType::bf16), ElementType::f32);
  b.output(r);
  ir::Literal l = ir::Literal::zeros({ElementType::f32, {4}});
  l.f = {1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 3.14159274101257324, -1e-3};
  std::vector<HostArray> in{HostArray::from_literal(l)};
  exec::CompiledRegion region = exec::compile(b.graph());
  ir::Literal got = run_region(region, in)[0];
  EXPECT_EQ(got.f[0], 1.0);
  EXPECT_EQ(got.f[1], 1.0 + 1.0 / 64);
  EXPECT_EQ(got.f[2], ir::round_to_bf16(3.14159274101257324f));
  EXPECT_EQ(region.num_kernels(), 1);
}

}  // namespace
