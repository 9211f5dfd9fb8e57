// Fusion planning: how many kernels, and which values each reads from
// memory, writes, and keeps internal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ir/builder.h"
#include "ir/fusion.h"
#include "ir/passes.h"

namespace {

using namespace torch_tpu::ir;
using Ids = std::vector<ValueId>;

bool has(const Ids& v, ValueId x) { return std::find(v.begin(), v.end(), x) != v.end(); }
Ids sorted(Ids v) {
  std::sort(v.begin(), v.end());
  return v;
}

ValueId scalar_splat(Builder& b, double v, const Shape& shape, ElementType t = ElementType::f32) {
  return b.broadcast_in_dim(b.constant(v, t), shape, {});
}

// y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
struct Gelu {
  ValueId x3, inner, t, y;
};
Gelu gelu(Builder& b, ValueId x) {
  const Shape s = b.type(x).shape;
  const ElementType t = b.type(x).dtype;
  Gelu g;
  g.x3 = b.multiply(b.multiply(x, x), x);
  g.inner = b.add(x, b.multiply(scalar_splat(b, 0.044715, s, t), g.x3));
  g.t = b.tanh(b.multiply(scalar_splat(b, std::sqrt(2.0 / M_PI), s, t), g.inner));
  g.y = b.multiply(b.multiply(scalar_splat(b, 0.5, s, t), x), b.add(scalar_splat(b, 1.0, s, t), g.t));
  return g;
}

TEST(IrFusion, TanhGeluIsOneKernel) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {1024});
  Gelu g = gelu(b, x);
  b.output(g.y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 1u) << plan.to_string(graph);
  const FusedKernel& k = plan.kernels[0];
  EXPECT_FALSE(k.has_reduce());
  EXPECT_EQ(k.iteration_shape, (Shape{1024}));
  EXPECT_EQ(k.reads, Ids{x});
  EXPECT_EQ(k.writes, Ids{g.y});
  EXPECT_TRUE(has(k.internal, g.t));
  EXPECT_TRUE(has(k.internal, g.x3));
  EXPECT_EQ(plan.writer[g.y], 0);
  EXPECT_EQ(plan.writer[g.t], -1);
}

TEST(IrFusion, BiasGeluFusesTheBroadcast) {
  Builder b;
  ValueId x = b.parameter(ElementType::bf16, {64, 256});
  ValueId bias = b.parameter(ElementType::bf16, {256});
  ValueId xb = b.add(x, b.broadcast_in_dim(bias, {64, 256}, {1}));
  Gelu g = gelu(b, xb);
  b.output(g.y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 1u) << plan.to_string(graph);
  EXPECT_EQ(sorted(plan.kernels[0].reads), sorted({x, bias}));
  EXPECT_EQ(plan.kernels[0].writes, Ids{g.y});
  EXPECT_TRUE(has(plan.kernels[0].internal, xb));
}

// h = x + r; mean = sum(h)/D; d = h - mean; var = sum(d*d)/D;
// y = d * rsqrt(var + eps) * gamma + beta
struct LayerNorm {
  ValueId x, r, gamma, beta, h, s1, mean, d, s2, rs, y;
};
LayerNorm residual_layer_norm(Builder& b, int64_t n, int64_t dim) {
  LayerNorm l;
  const Shape s{n, dim};
  l.x = b.parameter(ElementType::f32, s);
  l.r = b.parameter(ElementType::f32, s);
  l.gamma = b.parameter(ElementType::f32, {dim});
  l.beta = b.parameter(ElementType::f32, {dim});
  l.h = b.add(l.x, l.r);
  l.s1 = b.reduce_sum(l.h, {1});
  l.mean = b.multiply(l.s1, scalar_splat(b, 1.0 / dim, {n}));
  l.d = b.subtract(l.h, b.broadcast_in_dim(l.mean, s, {0}));
  l.s2 = b.reduce_sum(b.multiply(l.d, l.d), {1});
  ValueId var = b.multiply(l.s2, scalar_splat(b, 1.0 / dim, {n}));
  l.rs = b.rsqrt(b.add(var, scalar_splat(b, 1e-5, {n})));
  ValueId norm = b.multiply(l.d, b.broadcast_in_dim(l.rs, s, {0}));
  l.y = b.add(b.multiply(norm, b.broadcast_in_dim(l.gamma, s, {1})), b.broadcast_in_dim(l.beta, s, {1}));
  return l;
}

TEST(IrFusion, ResidualLayerNormIsThreeKernels) {
  Builder b;
  LayerNorm l = residual_layer_norm(b, 32, 128);
  b.output(l.y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 3u) << plan.to_string(graph);
  const FusedKernel &k0 = plan.kernels[0], &k1 = plan.kernels[1], &k2 = plan.kernels[2];
  // Pass 1: the residual add and the mean's sum in one loop; h is written
  // because both later kernels read it.
  EXPECT_EQ(sorted(k0.reads), sorted({l.x, l.r}));
  EXPECT_EQ(sorted(k0.writes), sorted({l.h, l.s1}));
  EXPECT_EQ(k0.reduce_dimensions, (std::vector<int64_t>{1}));
  // Pass 2: variance; d = h - mean is recomputed, never stored.
  EXPECT_EQ(sorted(k1.reads), sorted({l.h, l.s1}));
  EXPECT_EQ(k1.writes, Ids{l.s2});
  EXPECT_TRUE(has(k1.internal, l.d));
  EXPECT_TRUE(has(k1.internal, l.mean));
  // Pass 3: normalize, scale, shift.
  EXPECT_EQ(sorted(k2.reads), sorted({l.h, l.s1, l.s2, l.gamma, l.beta}));
  EXPECT_EQ(k2.writes, Ids{l.y});
  EXPECT_TRUE(has(k2.internal, l.d));
  EXPECT_TRUE(has(k2.internal, l.rs));
  EXPECT_EQ(plan.writer[l.d], -1);
  // Values that reach memory: h, the two sums, y.
  Ids written;
  for (const FusedKernel& k : plan.kernels) written.insert(written.end(), k.writes.begin(), k.writes.end());
  EXPECT_EQ(sorted(written), sorted({l.h, l.s1, l.s2, l.y}));
}

TEST(IrFusion, ResidualStreamOutputIsWrittenByTheFirstKernel) {
  Builder b;
  LayerNorm l = residual_layer_norm(b, 8, 64);
  b.output(l.y);
  b.output(l.h);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 3u) << plan.to_string(graph);
  EXPECT_EQ(plan.writer[l.h], 0);
  EXPECT_EQ(plan.writer[l.y], 2);
}

TEST(IrFusion, ReductionEpilogueFusesElementwiseProducers) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {16, 1000});
  ValueId e = b.exponential(b.multiply(x, scalar_splat(b, 2.0, {16, 1000})));
  ValueId s = b.reduce_sum(e, {1});
  b.output(s);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 1u);
  EXPECT_EQ(plan.kernels[0].reads, Ids{x});
  EXPECT_EQ(plan.kernels[0].writes, Ids{s});
  EXPECT_EQ(plan.kernels[0].reduces, Ids{s});
  EXPECT_TRUE(has(plan.kernels[0].internal, e));
}

TEST(IrFusion, SoftmaxRecomputesExpInsteadOfStoringIt) {
  Builder b;
  const Shape s{8, 512};
  ValueId x = b.parameter(ElementType::f32, s);
  ValueId m = b.reduce_max(x, {1});
  ValueId e = b.exponential(b.subtract(x, b.broadcast_in_dim(m, s, {0})));
  ValueId sum = b.reduce_sum(e, {1});
  ValueId y = b.divide(e, b.broadcast_in_dim(sum, s, {0}));
  b.output(y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 3u) << plan.to_string(graph);
  EXPECT_EQ(plan.kernels[0].writes, Ids{m});
  EXPECT_EQ(plan.kernels[1].writes, Ids{sum});
  EXPECT_EQ(plan.kernels[2].writes, Ids{y});
  EXPECT_EQ(sorted(plan.kernels[2].reads), sorted({x, m, sum}));
  EXPECT_EQ(plan.writer[e], -1);
}

TEST(IrFusion, ExpensiveSharedValueIsWrittenOnceCheapOneRecomputed) {
  auto build = [](bool expensive, ValueId* v_out) {
    Builder b;
    ValueId x = b.parameter(ElementType::f32, {64, 32});
    ValueId v = expensive ? b.tanh(b.exponential(b.sine(x))) : b.multiply(x, x);
    *v_out = v;
    b.output(b.reduce_sum(v, {0}));
    b.output(b.reduce_sum(v, {1}));
    return b.build();
  };
  ValueId v;
  Graph g1 = build(true, &v);
  FusionPlan p1 = plan_fusion(g1);
  ASSERT_EQ(p1.kernels.size(), 2u) << p1.to_string(g1);
  EXPECT_TRUE(has(p1.kernels[0].writes, v));  // computed with the first sum, read by the second
  EXPECT_TRUE(has(p1.kernels[1].reads, v));
  Graph g2 = build(false, &v);
  FusionPlan p2 = plan_fusion(g2);
  ASSERT_EQ(p2.kernels.size(), 2u) << p2.to_string(g2);
  EXPECT_EQ(p2.writer[v], -1);
  EXPECT_TRUE(has(p2.kernels[0].internal, v));
  EXPECT_TRUE(has(p2.kernels[1].internal, v));
}

TEST(IrFusion, SiblingReductionsShareOnePass) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {32, 256});
  ValueId s = b.reduce_sum(x, {1});
  ValueId ss = b.reduce_sum(b.multiply(x, x), {1});
  ValueId mx = b.reduce_max(x, {1});
  b.output(s);
  b.output(ss);
  b.output(mx);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 1u) << plan.to_string(graph);
  EXPECT_EQ(plan.kernels[0].reads, Ids{x});
  EXPECT_EQ(sorted(plan.kernels[0].writes), sorted({s, ss, mx}));
}

TEST(IrFusion, SmallSideOpsAreRecomputedThroughTheBroadcast) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {128, 64});
  ValueId w = b.parameter(ElementType::f32, {64});
  ValueId ew = b.exponential(w);
  ValueId y = b.multiply(x, b.broadcast_in_dim(ew, {128, 64}, {1}));
  b.output(y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 1u);
  EXPECT_EQ(sorted(plan.kernels[0].reads), sorted({x, w}));
  EXPECT_TRUE(has(plan.kernels[0].internal, ew));
}

TEST(IrFusion, ReshapeIsAViewOfAWrittenValue) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 8});
  ValueId e = b.exponential(x);
  ValueId r = b.reshape(e, {32});
  ValueId y = b.add(r, scalar_splat(b, 1.0, {32}));
  b.output(y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 2u) << plan.to_string(graph);
  EXPECT_EQ(plan.kernels[0].writes, Ids{e});
  EXPECT_EQ(plan.kernels[1].reads, Ids{r});
  EXPECT_EQ(plan.views, Ids{r});
}

TEST(IrFusion, ReshapedReductionIsReadByALaterKernel) {
  // amax backward: sum over the last dim, reshaped to the keepdim shape and
  // broadcast back over its input. The consumer has the reduction's
  // iteration space but reads the reduction's memory (through the reshape),
  // which the reducing kernel writes only at its end: a kernel of its own.
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {3, 1, 2});
  ValueId s = b.reduce_sum(x, {2});
  ValueId r = b.reshape(s, {3, 1, 1});
  ValueId y = b.subtract(b.broadcast_in_dim(r, {3, 1, 2}, {0, 1, 2}), x);
  b.output(y);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 2u) << plan.to_string(graph);
  EXPECT_EQ(plan.kernels[0].writes, Ids{s});
  EXPECT_TRUE(has(plan.kernels[1].reads, r)) << plan.to_string(graph);
}

TEST(IrFusion, MergingNeverCreatesACycle) {
  // A = exp(x); B = transpose(A) + 1 (reads A through a permuting broadcast,
  // so not in A's kernel); C = B * x shares x with A's kernel but needs B:
  // it joins B's kernel.
  Builder b;
  const Shape s{16, 16};
  ValueId x = b.parameter(ElementType::f32, s);
  ValueId a = b.exponential(x);
  ValueId bt = b.add(b.broadcast_in_dim(a, s, {1, 0}), scalar_splat(b, 1.0, s));
  ValueId c = b.multiply(bt, x);
  b.output(a);
  b.output(bt);
  b.output(c);
  Graph graph = b.build();
  FusionPlan plan = plan_fusion(graph);
  ASSERT_EQ(plan.kernels.size(), 2u) << plan.to_string(graph);
  EXPECT_EQ(plan.kernels[0].writes, Ids{a});
  EXPECT_EQ(sorted(plan.kernels[1].writes), sorted({bt, c}));
  EXPECT_EQ(sorted(plan.kernels[1].reads), sorted({x, a}));
}

TEST(IrFusion, UnfusedModeWritesEveryIntermediate) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {256});
  Gelu g = gelu(b, x);
  b.output(g.y);
  Graph graph = b.build();
  FusionOptions no_fusion;
  no_fusion.fuse = false;
  FusionPlan plan = plan_fusion(graph, no_fusion);
  // x*x, *x, *c, +x, *c, tanh, +1, 0.5*x, * : nine kernels.
  ASSERT_EQ(plan.kernels.size(), 9u) << plan.to_string(graph);
  for (const FusedKernel& k : plan.kernels) {
    EXPECT_EQ(k.writes.size(), 1u);
    EXPECT_TRUE(k.internal.empty() || std::all_of(k.internal.begin(), k.internal.end(), [&](ValueId v) {
                  OpKind kind = graph.op(v).kind;
                  return kind == OpKind::kConstant || kind == OpKind::kBroadcastInDim;
                }));
  }
  EXPECT_EQ(plan.writer[g.t], 5);
}

TEST(IrFusion, OutputsThatAreParametersNeedNoKernel) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  b.output(x);
  Graph graph = b.build();
  EXPECT_TRUE(plan_fusion(graph).kernels.empty());
}

TEST(IrFusion, PlanDumpNamesKernelsReadsAndWrites) {
  Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 8});
  b.output(b.reduce_sum(b.exponential(x), {1}));
  Graph graph = b.build();
  EXPECT_EQ(plan_fusion(graph).to_string(graph),
            "kernel 0 reduce[4,8] over [1]: 2 ops (exponential reduce); reads %0; writes %2; internal %1\n");
}

}  // namespace
