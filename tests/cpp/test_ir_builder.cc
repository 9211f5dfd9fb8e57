// IR builder (type checks, error messages) and the StableHLO printer.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "ir/builder.h"
#include "ir/printer.h"

namespace {

using namespace torch_tpu::ir;

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(IrBuilder, BuildsTopologicalGraphWithNumberedParameters) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 8});
  ValueId y = b.parameter(ElementType::f32, {4, 8});
  ValueId s = b.add(x, y);
  b.output(s);
  Graph g = b.build();
  EXPECT_EQ(g.num_ops(), 3);
  ASSERT_EQ(g.parameters().size(), 2u);
  EXPECT_EQ(g.op(g.parameters()[1]).attrs.parameter_index, 1);
  EXPECT_EQ(g.op(s).kind, OpKind::kAdd);
  EXPECT_EQ(g.type(s), (TensorType{ElementType::f32, {4, 8}}));
  EXPECT_EQ(g.outputs(), std::vector<ValueId>{s});
  EXPECT_NO_THROW(g.verify());
}

TEST(IrBuilder, ResultTypesFollowStableHlo) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {2, 3});
  EXPECT_EQ(b.type(b.compare(x, x, CompareDirection::LT)).dtype, ElementType::pred);
  EXPECT_EQ(b.type(b.convert(x, ElementType::bf16)), (TensorType{ElementType::bf16, {2, 3}}));
  EXPECT_EQ(b.type(b.reduce_sum(x, {1})).shape, (Shape{2}));
  EXPECT_EQ(b.type(b.reduce_sum(x, {-1, 0})).shape, (Shape{}));
  EXPECT_EQ(b.type(b.broadcast_in_dim(x, {5, 2, 3}, {1, 2})).shape, (Shape{5, 2, 3}));
  EXPECT_EQ(b.type(b.reshape(x, {6})).shape, (Shape{6}));
  ValueId r = b.reduce(x, ReduceKind::kMax, {1});
  EXPECT_EQ(b.graph().op(r).attrs.init.f, -INFINITY);
  ValueId r2 = b.reduce(x, ReduceKind::kSum, {0}, 10.0);
  EXPECT_EQ(b.graph().op(r2).attrs.init.f, 10.0);
}

TEST(IrBuilder, BroadcastToAlignsTrailingDimensions) {
  Builder b;
  ValueId v = b.parameter(ElementType::f32, {8});
  ValueId w = b.broadcast_to(v, {4, 8});
  EXPECT_EQ(b.graph().op(w).attrs.dimensions, (std::vector<int64_t>{1}));
  ValueId c = b.parameter(ElementType::f32, {4, 1});
  ValueId wc = b.broadcast_to(c, {4, 8});
  EXPECT_EQ(b.graph().op(wc).attrs.dimensions, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(b.broadcast_to(w, {4, 8}), w);  // no-op
}

TEST(IrBuilder, ErrorsNameTheOpAndTypes) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 8});
  ValueId v = b.parameter(ElementType::f32, {8});
  ValueId i = b.parameter(ElementType::s32, {4, 8});
  ValueId p = b.parameter(ElementType::pred, {4, 8});
  EXPECT_EQ(error_of([&] { b.add(x, v); }), "[add] operand types differ: f32[4,8] vs f32[8]");
  EXPECT_EQ(error_of([&] { b.log(i); }), "[log] needs a floating-point operand, got s32[4,8]");
  EXPECT_EQ(error_of([&] { b.not_(x); }), "[not] needs a pred or integer operand, got f32[4,8]");
  EXPECT_EQ(error_of([&] { b.add(p, p); }), "[add] not defined on pred");
  EXPECT_EQ(error_of([&] { b.select(x, x, x); }), "[select] predicate must be pred[4,8], got f32[4,8]");
  EXPECT_EQ(error_of([&] { b.reshape(x, {5}); }), "[reshape] cannot reshape f32[4,8] to f32[5]");
  EXPECT_EQ(error_of([&] {
              b.broadcast_in_dim(v, {4, 7}, {1});
            }),
            "[broadcast_in_dim] operand f32[8] dim 0 does not broadcast to f32[4,7]");
  EXPECT_EQ(error_of([&] {
              b.broadcast_in_dim(v, {4, 8}, {2});
            }),
            "[broadcast_in_dim] dimension 2 out of range or repeated for f32[4,8]");
  EXPECT_EQ(error_of([&] { b.reduce_sum(x, {2}); }), "[reduce] dimensions must be sorted, unique and within f32[4,8]");
  EXPECT_EQ(error_of([&] { b.reduce_sum(p, {0}); }), "[reduce] sum not defined on pred");
  EXPECT_EQ(error_of([&] { b.add(x, 99); }), "[add] operand %99 is not defined");
  EXPECT_NE(error_of([&] { b.parameter(ElementType::f32, {-1}); }), "");
}

TEST(IrBuilder, VerifyCatchesHandBuiltMistakes) {
  Graph g;
  ValueId x = g.add_op(OpKind::kParameter, {}, TensorType{ElementType::f32, {4}});
  g.add_op(OpKind::kExponential, {x}, TensorType{ElementType::f32, {5}});
  try {
    g.verify();
    FAIL() << "verify() accepted a wrong result type";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[exponential] result f32[5] differs from operand f32[4]"), std::string::npos)
        << e.what();
  }
}

TEST(IrPrinter, GoldenFloatRegion) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 8});
  ValueId bias = b.parameter(ElementType::f32, {8});
  ValueId bb = b.broadcast_in_dim(bias, {4, 8}, {1});
  ValueId s = b.add(x, bb);
  ValueId half = b.constant(0.5, ElementType::f32, {4, 8});
  ValueId m = b.multiply(s, half);
  ValueId t = b.tanh(m);
  ValueId p = b.compare(t, x, CompareDirection::GT);
  ValueId sel = b.select(p, t, x);
  ValueId r = b.reduce_sum(sel, {1});
  ValueId c = b.convert(r, ElementType::bf16);
  ValueId e = b.erf(x);
  b.output(c);
  b.output(e);
  const char* want =
      "func.func @region(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>) -> (tensor<4xbf16>, tensor<4x8xf32>) {\n"
      "  %0 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>\n"
      "  %1 = stablehlo.add %arg0, %0 : tensor<4x8xf32>\n"
      "  %2 = stablehlo.constant dense<5.000000e-01> : tensor<4x8xf32>\n"
      "  %3 = stablehlo.multiply %1, %2 : tensor<4x8xf32>\n"
      "  %4 = stablehlo.tanh %3 : tensor<4x8xf32>\n"
      "  %5 = stablehlo.compare  GT, %4, %arg0,  FLOAT : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>\n"
      "  %6 = stablehlo.select %5, %4, %arg0 : tensor<4x8xi1>, tensor<4x8xf32>\n"
      "  %7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>\n"
      "  %8 = stablehlo.reduce(%6 init: %7) applies stablehlo.add across dimensions = [1] : "
      "(tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>\n"
      "  %9 = stablehlo.convert %8 : (tensor<4xf32>) -> tensor<4xbf16>\n"
      "  %10 = chlo.erf %arg0 : tensor<4x8xf32> -> tensor<4x8xf32>\n"
      "  return %9, %10 : tensor<4xbf16>, tensor<4x8xf32>\n"
      "}\n";
  EXPECT_EQ(to_stablehlo(b.graph()), want);
}

TEST(IrPrinter, GoldenIntegerPredAndSpecialConstants) {
  Builder b;
  ValueId i = b.parameter(ElementType::s32, {2, 3});
  ValueId u = b.parameter(ElementType::u8, {6});
  ValueId seven = b.constant_int(7, ElementType::s32, {2, 3});
  ValueId lt = b.compare(i, seven, CompareDirection::LT);
  ValueId ne = b.compare(u, b.constant_int(0, ElementType::u8, {6}), CompareDirection::NE);
  ValueId both = b.and_(lt, b.reshape(ne, {2, 3}));
  ValueId neither = b.not_(b.or_(lt, both));
  ValueId mx = b.reduce(i, ReduceKind::kMax, {0, 1});
  ValueId inf = b.constant(INFINITY, ElementType::bf16);
  ValueId base = b.constant(0.1, ElementType::f64);
  ValueId exponent = b.constant(3.0, ElementType::f64);
  ValueId p = b.power(base, exponent);
  b.output(neither);
  b.output(mx);
  b.output(inf);
  b.output(p);
  const char* want =
      "func.func @region(%arg0: tensor<2x3xi32>, %arg1: tensor<6xui8>) -> (tensor<2x3xi1>, tensor<i32>, "
      "tensor<bf16>, tensor<f64>) {\n"
      "  %0 = stablehlo.constant dense<7> : tensor<2x3xi32>\n"
      "  %1 = stablehlo.compare  LT, %arg0, %0,  SIGNED : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>\n"
      "  %2 = stablehlo.constant dense<0> : tensor<6xui8>\n"
      "  %3 = stablehlo.compare  NE, %arg1, %2,  UNSIGNED : (tensor<6xui8>, tensor<6xui8>) -> tensor<6xi1>\n"
      "  %4 = stablehlo.reshape %3 : (tensor<6xi1>) -> tensor<2x3xi1>\n"
      "  %5 = stablehlo.and %1, %4 : tensor<2x3xi1>\n"
      "  %6 = stablehlo.or %1, %5 : tensor<2x3xi1>\n"
      "  %7 = stablehlo.not %6 : tensor<2x3xi1>\n"
      "  %8 = stablehlo.constant dense<-2147483648> : tensor<i32>\n"
      "  %9 = stablehlo.reduce(%arg0 init: %8) applies stablehlo.maximum across dimensions = [0, 1] : "
      "(tensor<2x3xi32>, tensor<i32>) -> tensor<i32>\n"
      "  %10 = stablehlo.constant dense<0x7F80> : tensor<bf16>\n"
      "  %11 = stablehlo.constant dense<1.000000e-01> : tensor<f64>\n"
      "  %12 = stablehlo.constant dense<3.000000e+00> : tensor<f64>\n"
      "  %13 = stablehlo.power %11, %12 : tensor<f64>\n"
      "  return %7, %9, %10, %13 : tensor<2x3xi1>, tensor<i32>, tensor<bf16>, tensor<f64>\n"
      "}\n";
  EXPECT_EQ(to_stablehlo(b.graph()), want);
}

TEST(IrPrinter, EveryOpPrints) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {3});
  for (OpKind k : {OpKind::kNegate, OpKind::kAbs, OpKind::kExponential, OpKind::kLog, OpKind::kLogPlusOne,
                   OpKind::kExponentialMinusOne, OpKind::kTanh, OpKind::kLogistic, OpKind::kSqrt, OpKind::kRsqrt,
                   OpKind::kSine, OpKind::kCosine, OpKind::kErf, OpKind::kFloor, OpKind::kCeil, OpKind::kSign})
    b.output(b.unary(k, x));
  for (OpKind k : {OpKind::kAdd, OpKind::kSubtract, OpKind::kMultiply, OpKind::kDivide, OpKind::kMaximum,
                   OpKind::kMinimum, OpKind::kPower})
    b.output(b.binary(k, x, x));
  std::string text = to_stablehlo(b.graph(), "all_ops");
  EXPECT_EQ(text.rfind("func.func @all_ops(%arg0: tensor<3xf32>) -> (", 0), 0u) << text;
  for (const char* name : {"stablehlo.negate",  "stablehlo.abs",          "stablehlo.exponential ",
                           "stablehlo.log ",    "stablehlo.log_plus_one", "stablehlo.exponential_minus_one",
                           "stablehlo.tanh",    "stablehlo.logistic",     "stablehlo.sqrt",
                           "stablehlo.rsqrt",   "stablehlo.sine",         "stablehlo.cosine",
                           "chlo.erf",          "stablehlo.floor",        "stablehlo.ceil",
                           "stablehlo.sign",    "stablehlo.subtract",     "stablehlo.divide",
                           "stablehlo.maximum", "stablehlo.minimum",      "stablehlo.power"})
    EXPECT_NE(text.find(name), std::string::npos) << name;
}

}  // namespace
