// Structural hashing / equality (the compile cache key), dead-code
// elimination, common-subexpression elimination and the pass pipeline.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/builder.h"
#include "ir/hash.h"
#include "ir/passes.h"
#include "ir/printer.h"

namespace {

using namespace torch_tpu::ir;

// x * sigmoid(x) + exp(y), with the two independent branches appended in
// either order (different value ids, same structure).
Graph swish_plus_exp(bool exp_first, Shape shape = {4, 8}, double scale = 2.0) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, shape);
  ValueId y = b.parameter(ElementType::f32, shape);
  ValueId e = -1, s = -1;
  if (exp_first) e = b.exponential(y);
  ValueId k = b.constant(scale, ElementType::f32, shape);
  s = b.multiply(b.multiply(x, b.logistic(x)), k);
  if (!exp_first) e = b.exponential(y);
  b.output(b.add(s, e));
  return b.build();
}

TEST(IrHash, IsomorphicGraphsHashAndCompareEqual) {
  Graph a = swish_plus_exp(true), b = swish_plus_exp(false);
  ASSERT_NE(a.op(3).kind, b.op(3).kind);  // really appended in another order
  EXPECT_EQ(structural_hash(a), structural_hash(b));
  EXPECT_TRUE(structurally_equal(a, b));
  EXPECT_TRUE(structurally_equal(a, a));
}

TEST(IrHash, ShapeTypeAttributeConstantAndWiringChangesAreDifferent) {
  Graph base = swish_plus_exp(true);
  const uint64_t h = structural_hash(base);
  Graph other_shape = swish_plus_exp(true, {4, 9});
  Graph other_constant = swish_plus_exp(true, {4, 8}, 3.0);
  EXPECT_NE(structural_hash(other_shape), h);
  EXPECT_FALSE(structurally_equal(other_shape, base));
  EXPECT_NE(structural_hash(other_constant), h);
  EXPECT_FALSE(structurally_equal(other_constant, base));

  auto make = [](ElementType t, CompareDirection d, std::vector<int64_t> dims, bool swap) {
    Builder b;
    ValueId x = b.parameter(t, {4, 8});
    ValueId y = b.parameter(t, {4, 8});
    ValueId c = swap ? b.compare(y, x, d) : b.compare(x, y, d);
    b.output(b.reduce(b.select(c, x, y), ReduceKind::kMax, dims));
    return b.build();
  };
  Graph g0 = make(ElementType::f32, CompareDirection::LT, {1}, false);
  EXPECT_TRUE(structurally_equal(g0, make(ElementType::f32, CompareDirection::LT, {1}, false)));
  EXPECT_NE(structural_hash(g0), structural_hash(make(ElementType::bf16, CompareDirection::LT, {1}, false)));
  EXPECT_NE(structural_hash(g0), structural_hash(make(ElementType::f32, CompareDirection::LE, {1}, false)));
  EXPECT_NE(structural_hash(g0), structural_hash(make(ElementType::f32, CompareDirection::LT, {0}, false)));
  EXPECT_NE(structural_hash(g0), structural_hash(make(ElementType::f32, CompareDirection::LT, {1}, true)));
  EXPECT_FALSE(structurally_equal(g0, make(ElementType::f32, CompareDirection::LT, {1}, true)));
}

TEST(IrHash, ParameterOrderAndOutputOrderMatter) {
  auto make = [](bool swap_outputs) {
    Builder b;
    ValueId x = b.parameter(ElementType::f32, {4});
    ValueId y = b.parameter(ElementType::f32, {4});
    ValueId d = b.subtract(x, y);
    ValueId e = b.exponential(x);
    if (swap_outputs) {
      b.output(e);
      b.output(d);
    } else {
      b.output(d);
      b.output(e);
    }
    return b.build();
  };
  EXPECT_FALSE(structurally_equal(make(false), make(true)));
  EXPECT_NE(structural_hash(make(false)), structural_hash(make(true)));
  // x - y vs y - x: parameters are identified by their signature position.
  Builder b1, b2;
  ValueId x1 = b1.parameter(ElementType::f32, {4}), y1 = b1.parameter(ElementType::f32, {4});
  b1.output(b1.subtract(x1, y1));
  ValueId x2 = b2.parameter(ElementType::f32, {4}), y2 = b2.parameter(ElementType::f32, {4});
  b2.output(b2.subtract(y2, x2));
  EXPECT_FALSE(structurally_equal(b1.graph(), b2.graph()));
}

TEST(IrHash, NegativeZeroAndNanConstantsAreStructure) {
  auto make = [](double v) {
    Builder b;
    ValueId x = b.parameter(ElementType::f32, {});
    b.output(b.add(x, b.constant(v, ElementType::f32)));
    return b.build();
  };
  EXPECT_FALSE(structurally_equal(make(0.0), make(-0.0)));
  EXPECT_TRUE(structurally_equal(make(NAN), make(NAN)));
}

TEST(IrHash, CanonicalOrderVisitsEveryOpOnceOperandsFirst) {
  Graph g = swish_plus_exp(false);
  std::vector<ValueId> order = canonical_order(g);
  ASSERT_EQ(static_cast<int64_t>(order.size()), g.num_ops());
  std::vector<int> pos(order.size(), -1);
  for (size_t i = 0; i < order.size(); ++i) pos[order[i]] = static_cast<int>(i);
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    ASSERT_GE(pos[v], 0);
    for (ValueId u : g.op(v).operands) EXPECT_LT(pos[u], pos[v]);
  }
}

TEST(IrPasses, DeadCodeEliminationKeepsOutputsAndAllParameters) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  ValueId unused = b.parameter(ElementType::f32, {4});
  ValueId dead = b.exponential(b.tanh(x));
  (void)dead;
  ValueId live = b.log(x);
  b.output(live);
  Graph g = dead_code_elimination(b.graph());
  EXPECT_EQ(g.num_ops(), 3);  // two parameters and the log
  ASSERT_EQ(g.parameters().size(), 2u);
  EXPECT_EQ(g.type(g.parameters()[1]), b.type(unused));
  EXPECT_EQ(g.op(g.outputs()[0]).kind, OpKind::kLog);
  EXPECT_NO_THROW(g.verify());
  // Idempotent.
  EXPECT_TRUE(structurally_equal(dead_code_elimination(g), g));
}

TEST(IrPasses, CommonSubexpressionEliminationMergesIdenticalOps) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {8});
  ValueId y = b.parameter(ElementType::f32, {8});
  ValueId e1 = b.exponential(x);
  ValueId e2 = b.exponential(x);  // same as e1
  ValueId e3 = b.exponential(y);  // different operand
  ValueId c1 = b.constant(2.0, ElementType::f32, {8});
  ValueId c2 = b.constant(2.0, ElementType::f32, {8});  // same splat
  ValueId c3 = b.constant(3.0, ElementType::f32, {8});  // different value
  ValueId m1 = b.multiply(e1, c1);
  ValueId m2 = b.multiply(e2, c2);  // same once e2 = e1 and c2 = c1
  ValueId lt = b.compare(x, y, CompareDirection::LT);
  ValueId gt = b.compare(x, y, CompareDirection::GT);  // attribute differs
  b.output(b.add(m1, m2));
  b.output(b.multiply(e3, c3));
  b.output(b.select(lt, x, y));
  b.output(b.select(gt, x, y));
  Graph g = run_passes(b.graph(), default_passes());
  int exps = 0, consts = 0, muls = 0, cmps = 0;
  for (const Op& op : g.ops()) {
    exps += op.kind == OpKind::kExponential;
    consts += op.kind == OpKind::kConstant;
    muls += op.kind == OpKind::kMultiply;
    cmps += op.kind == OpKind::kCompare;
  }
  EXPECT_EQ(exps, 2);
  EXPECT_EQ(consts, 2);
  EXPECT_EQ(muls, 2);
  EXPECT_EQ(cmps, 2);
  const Op& sum = g.op(g.outputs()[0]);
  EXPECT_EQ(sum.operands[0], sum.operands[1]);  // exp(x)*2 + exp(x)*2 reads one product twice
  EXPECT_EQ(g.outputs().size(), 4u);
  EXPECT_NO_THROW(g.verify());
}

TEST(IrPasses, CseDoesNotMergeParameters) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  ValueId y = b.parameter(ElementType::f32, {4});
  b.output(b.add(x, y));
  Graph g = common_subexpression_elimination(b.graph());
  EXPECT_EQ(g.parameters().size(), 2u);
  EXPECT_NE(g.op(g.outputs()[0]).operands[0], g.op(g.outputs()[0]).operands[1]);
}

TEST(IrPasses, PipelineCallsDumpHookAfterEachPass) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  b.exponential(x);  // dead
  b.output(b.add(b.tanh(x), b.tanh(x)));
  std::vector<std::string> seen;
  std::string last_text;
  Graph g = run_passes(b.graph(), default_passes(), [&](const std::string& name, const Graph& after) {
    seen.push_back(name);
    last_text = to_stablehlo(after);
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"cse", "dce"}));
  EXPECT_EQ(g.num_ops(), 3);
  EXPECT_EQ(last_text,
            "func.func @region(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  %0 = stablehlo.tanh %arg0 : tensor<4xf32>\n"
            "  %1 = stablehlo.add %0, %0 : tensor<4xf32>\n"
            "  return %1 : tensor<4xf32>\n"
            "}\n");
}

}  // namespace
