// The reference interpreter on hand-checked cases: it defines the semantics
// the executor is tested against.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ir/builder.h"
#include "ir/interpreter.h"

namespace {

using namespace torch_tpu::ir;

Literal floats(ElementType t, Shape s, std::vector<double> v) {
  Literal l = Literal::zeros({t, std::move(s)});
  l.f = std::move(v);
  return l;
}
Literal ints(ElementType t, Shape s, std::vector<int64_t> v) {
  Literal l = Literal::zeros({t, std::move(s)});
  l.i = std::move(v);
  return l;
}

TEST(IrInterpreter, BroadcastInDimAndReduceWithInit) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {2});
  ValueId bx = b.broadcast_in_dim(x, {2, 3}, {0});
  ValueId s = b.reduce(bx, ReduceKind::kSum, {1}, 10.0);
  ValueId m = b.reduce(bx, ReduceKind::kMax, {0, 1});
  b.output(bx);
  b.output(s);
  b.output(m);
  auto out = interpret(b.graph(), {floats(ElementType::f32, {2}, {1.5, -2.0})});
  EXPECT_EQ(out[0].f, (std::vector<double>{1.5, 1.5, 1.5, -2.0, -2.0, -2.0}));
  EXPECT_EQ(out[1].f, (std::vector<double>{14.5, 4.0}));
  EXPECT_EQ(out[2].f, (std::vector<double>{1.5}));
}

TEST(IrInterpreter, ReduceOverMiddleAndEmptyDimensions) {
  Builder b;
  ValueId x = b.parameter(ElementType::s32, {2, 3, 2});
  b.output(b.reduce_sum(x, {1}));
  ValueId e = b.parameter(ElementType::f32, {3, 0});
  b.output(b.reduce(e, ReduceKind::kProd, {1}));
  std::vector<int64_t> v(12);
  for (int i = 0; i < 12; ++i) v[i] = i;
  auto out = interpret(b.graph(), {ints(ElementType::s32, {2, 3, 2}, v), Literal::zeros({ElementType::f32, {3, 0}})});
  EXPECT_EQ(out[0].i, (std::vector<int64_t>{0 + 2 + 4, 1 + 3 + 5, 6 + 8 + 10, 7 + 9 + 11}));
  EXPECT_EQ(out[1].f, (std::vector<double>{1.0, 1.0, 1.0}));
}

TEST(IrInterpreter, IntegerOpsWrapAndFollowXlaDivision) {
  Builder b;
  ValueId a = b.parameter(ElementType::s8, {4});
  ValueId c = b.parameter(ElementType::s8, {4});
  b.output(b.add(a, c));
  b.output(b.divide(a, c));
  b.output(b.power(a, c));
  b.output(b.negate(a));
  auto out =
      interpret(b.graph(), {ints(ElementType::s8, {4}, {127, -128, 7, -7}), ints(ElementType::s8, {4}, {1, -1, 0, 2})});
  EXPECT_EQ(out[0].i, (std::vector<int64_t>{-128, 127, 7, -5}));
  EXPECT_EQ(out[1].i, (std::vector<int64_t>{127, -128, -1, -3}));  // -128/-1 wraps, x/0 = -1, truncation
  EXPECT_EQ(out[2].i, (std::vector<int64_t>{127, 0, 1, 49}));      // 127^1, (-128)^-1 = 0, x^0, (-7)^2
  EXPECT_EQ(out[3].i, (std::vector<int64_t>{-127, -128, -7, 7}));
}

TEST(IrInterpreter, ConvertSaturatesTruncatesAndRounds) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {6});
  b.output(b.convert(x, ElementType::u8));
  b.output(b.convert(x, ElementType::s32));
  b.output(b.convert(x, ElementType::pred));
  ValueId y = b.parameter(ElementType::f32, {3});
  b.output(b.convert(y, ElementType::bf16));
  ValueId i = b.parameter(ElementType::s32, {2});
  b.output(b.convert(i, ElementType::s8));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto out = interpret(b.graph(), {floats(ElementType::f32, {6}, {300.7, -5.5, 2.9, nan, -0.0, 3e9}),
                                   floats(ElementType::f32, {3}, {1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 1e40}),
                                   ints(ElementType::s32, {2}, {200, -129})});
  EXPECT_EQ(out[0].i, (std::vector<int64_t>{255, 0, 2, 0, 0, 255}));
  EXPECT_EQ(out[1].i, (std::vector<int64_t>{300, -5, 2, 0, 0, 2147483647}));
  EXPECT_EQ(out[2].i, (std::vector<int64_t>{1, 1, 1, 1, 0, 1}));
  // bf16 has 8 significant bits: 1 + 2^-8 is a tie (to even: 1), 1 + 3*2^-8
  // rounds up to 1 + 2^-6; 1e40 (an f32 infinity) stays infinite.
  EXPECT_EQ(out[3].f[0], 1.0);
  EXPECT_EQ(out[3].f[1], 1.0 + 1.0 / 64);
  EXPECT_TRUE(std::isinf(out[3].f[2]));
  EXPECT_EQ(out[4].i, (std::vector<int64_t>{-56, 127}));
}

TEST(IrInterpreter, FloatSemanticsNanSignAndRounding) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  ValueId y = b.parameter(ElementType::f32, {4});
  b.output(b.maximum(x, y));
  b.output(b.minimum(x, y));
  b.output(b.sign(x));
  b.output(b.compare(x, y, CompareDirection::NE));
  b.output(b.add(x, y));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto out = interpret(b.graph(), {floats(ElementType::f32, {4}, {nan, 1.0, -0.0, 1.0}),
                                   floats(ElementType::f32, {4}, {1.0, nan, 2.0, 1e-8})});
  EXPECT_TRUE(std::isnan(out[0].f[0]));
  EXPECT_TRUE(std::isnan(out[0].f[1]));
  EXPECT_EQ(out[0].f[2], 2.0);
  EXPECT_TRUE(std::isnan(out[1].f[0]));
  EXPECT_TRUE(std::isnan(out[1].f[1]));
  EXPECT_TRUE(std::isnan(out[2].f[0]));
  EXPECT_TRUE(std::signbit(out[2].f[2]));  // sign(-0) = -0
  EXPECT_EQ(out[3].i, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(out[4].f[3], 1.0);  // 1 + 1e-8 rounds to f32 1
}

TEST(IrInterpreter, ConstantsRoundToTheirTypeAndSelectPicks) {
  Builder b;
  ValueId p = b.parameter(ElementType::pred, {3});
  ValueId c = b.constant(0.1, ElementType::bf16, {3});
  ValueId d = b.constant(-1.0, ElementType::bf16, {3});
  b.output(b.select(p, c, d));
  auto out = interpret(b.graph(), {ints(ElementType::pred, {3}, {1, 0, 1})});
  EXPECT_EQ(out[0].f[0], round_to_bf16(0.1f));
  EXPECT_EQ(out[0].f[1], -1.0);
}

TEST(IrInterpreter, LiteralBytesRoundTrip) {
  for (ElementType t : {ElementType::f32, ElementType::bf16, ElementType::f16, ElementType::f64, ElementType::s64,
                        ElementType::s32, ElementType::s8, ElementType::u8, ElementType::pred}) {
    Literal l = Literal::zeros({t, {5}});
    for (int k = 0; k < 5; ++k) {
      if (is_float(t))
        l.f[k] = k - 2.5;
      else if (is_pred(t))
        l.i[k] = k & 1;
      else
        l.i[k] = t == ElementType::u8 ? k * 50 : k - 2;
    }
    std::vector<char> bytes(5 * element_size(t));
    l.to_bytes(bytes.data());
    Literal back = Literal::from_bytes(l.type, bytes.data());
    EXPECT_EQ(back.f, l.f) << element_type_name(t);
    EXPECT_EQ(back.i, l.i) << element_type_name(t);
  }
}

TEST(IrInterpreter, RejectsWrongInputs) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {2});
  b.output(x);
  EXPECT_THROW(interpret(b.graph(), {}), std::invalid_argument);
  EXPECT_THROW(interpret(b.graph(), {Literal::zeros({ElementType::f32, {3}})}), std::invalid_argument);
}

TEST(IrTypes, HalfConversionsMatchTheCompiler) {
  // Every f16 bit pattern, and f32 values around every f16 rounding boundary.
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 hf;
    uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&hf, &bits, 2);
    float want = static_cast<float>(hf);
    float got = f16_to_f32(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      continue;
    }
    ASSERT_EQ(f32_bits(got), f32_bits(want)) << h;
    // Around the value itself and around the midpoint to the next one (ties).
    uint16_t next_bits = static_cast<uint16_t>(h + 1);
    _Float16 next_hf;
    std::memcpy(&next_hf, &next_bits, 2);
    float next = static_cast<float>(next_hf);
    float mid = std::isfinite(next) ? want + (next - want) / 2 : want;
    for (int delta = -2; delta <= 5; ++delta) {
      float base = delta <= 2 ? want : mid;
      float f = f32_from_bits(f32_bits(base) + static_cast<uint32_t>(delta <= 2 ? delta : delta - 4));
      if (std::isnan(f)) continue;
      _Float16 r = static_cast<_Float16>(f);
      uint16_t rb;
      std::memcpy(&rb, &r, 2);
      ASSERT_EQ(f32_to_f16(f), rb) << f;
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);  // tie to even
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.8p-8f), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()) & 0x7FC0, 0x7FC0);
}

}  // namespace
