// Fused kernels end to end: chains, broadcasting, strided inputs and
// outputs, reductions over any dimensions, views, multi-output kernels, the
// compile cache, and concurrent runs. Every result is checked against the
// reference interpreter.
#include <atomic>
#include <chrono>
#include <thread>

#include "exec/compile_cache.h"
#include "ir/hash.h"
#include "test_exec_util.h"

namespace {

using namespace exec_test;
using ir::OpKind;
using ir::ReduceKind;
using ir::ValueId;

ValueId splat(ir::Builder& b, double v, const ir::Shape& s, ElementType t = ElementType::f32) {
  return b.broadcast_in_dim(b.constant(v, t), s, {});
}

ValueId gelu(ir::Builder& b, ValueId x) {
  const ir::Shape s = b.type(x).shape;
  const ElementType t = b.type(x).dtype;
  ValueId x3 = b.multiply(b.multiply(x, x), x);
  ValueId inner = b.add(x, b.multiply(splat(b, 0.044715, s, t), x3));
  ValueId th = b.tanh(b.multiply(splat(b, std::sqrt(2.0 / M_PI), s, t), inner));
  return b.multiply(b.multiply(splat(b, 0.5, s, t), x), b.add(splat(b, 1.0, s, t), th));
}

TEST(ExecFusion, GeluChainF32AndBf16) {
  for (ElementType t : {ElementType::f32, ElementType::bf16}) {
    ir::Builder b;
    ValueId x = b.parameter(t, {100003});
    b.output(gelu(b, x));
    std::mt19937 rng(1);
    std::vector<HostArray> in{random_array({t, {100003}}, rng, -6, 6)};
    exec::CompiledRegion r = exec::compile(b.graph());
    EXPECT_EQ(r.num_kernels(), 1);
    EXPECT_EQ(r.temp_bytes(), 0);  // nothing between kernels
    SCOPED_TRACE(ir::element_type_name(t));
    expect_matches_reference(b.graph(), in, {}, 4.0);
  }
}

TEST(ExecFusion, FusedAndUnfusedAgreeBitForBitInF32) {
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {5000});
  b.output(gelu(b, x));
  std::mt19937 rng(2);
  std::vector<HostArray> in{random_array({ElementType::f32, {5000}}, rng, -6, 6)};
  exec::CompileOptions unfused;
  unfused.fusion.fuse = false;
  exec::CompiledRegion rf = exec::compile(b.graph()), ru = exec::compile(b.graph(), unfused);
  EXPECT_EQ(ru.num_kernels(), 9);
  EXPECT_GT(ru.temp_bytes(), 0);
  ir::Literal a = run_region(rf, in)[0], c = run_region(ru, in)[0];
  EXPECT_EQ(a.f, c.f);
}

TEST(ExecFusion, BiasGeluBroadcastsTheBias) {
  for (ElementType t : {ElementType::f32, ElementType::bf16}) {
    ir::Builder b;
    ValueId x = b.parameter(t, {67, 300});
    ValueId bias = b.parameter(t, {300});
    b.output(gelu(b, b.add(x, b.broadcast_in_dim(bias, {67, 300}, {1}))));
    std::mt19937 rng(3);
    std::vector<HostArray> in{random_array({t, {67, 300}}, rng, -4, 4), random_array({t, {300}}, rng, -1, 1)};
    SCOPED_TRACE(ir::element_type_name(t));
    expect_matches_reference(b.graph(), in, {}, t == ElementType::bf16 ? 2.0 : 4.0);
  }
}

TEST(ExecFusion, BroadcastPatterns) {
  ir::Builder b;
  const ir::Shape s{33, 65};
  ValueId x = b.parameter(ElementType::f32, s);
  ValueId row = b.parameter(ElementType::f32, {65});
  ValueId col = b.parameter(ElementType::f32, {33});
  ValueId one = b.parameter(ElementType::f32, {33, 1});
  ValueId scalar = b.parameter(ElementType::f32, {});
  ValueId sq = b.parameter(ElementType::f32, {65, 33});
  ValueId v = b.parameter(ElementType::f32, {9});
  ValueId y = b.add(x, b.broadcast_in_dim(row, s, {1}));
  y = b.multiply(y, b.broadcast_in_dim(col, s, {0}));
  y = b.subtract(y, b.broadcast_in_dim(one, s, {0, 1}));
  y = b.divide(y, b.add(b.broadcast_in_dim(b.exponential(scalar), s, {}), splat(b, 1.0, s)));
  y = b.add(y, b.broadcast_in_dim(sq, s, {1, 0}));  // transposing broadcast
  b.output(y);
  // The same small value at two different maps: outer sum v[i] + v[j].
  b.output(b.add(b.broadcast_in_dim(v, {9, 9}, {0}), b.broadcast_in_dim(v, {9, 9}, {1})));
  // Broadcast to a higher rank, then through an elementwise op on the small side.
  b.output(b.multiply(b.broadcast_in_dim(b.tanh(row), {4, 33, 65}, {2}), b.broadcast_in_dim(x, {4, 33, 65}, {1, 2})));
  std::mt19937 rng(4);
  std::vector<HostArray> in;
  for (ValueId p : b.graph().parameters()) in.push_back(random_array(b.type(p), rng, -2, 2));
  exec::CompileOptions o;
  o.tile_elements = 1024;
  expect_matches_reference(b.graph(), in, o, 4.0);
  exec::CompiledRegion r = exec::compile(b.graph());
  EXPECT_EQ(r.num_kernels(), 3);
}

TEST(ExecFusion, StridedAndExpandedInputs) {
  // x^T (strides [1, 40]), every other row (stride 2*cols), an expanded
  // column (stride 0), a reversed row (negative stride).
  const int64_t rows = 30, cols = 40;
  std::mt19937 rng(5);
  ir::Literal base = random_literal({ElementType::f32, {cols, rows}}, rng, -3, 3);  // storage of x^T
  ir::Literal tall = random_literal({ElementType::f32, {2 * rows, cols}}, rng, -3, 3);
  ir::Literal colv = random_literal({ElementType::f32, {rows}}, rng, -3, 3);
  ir::Literal rowv = random_literal({ElementType::f32, {cols}}, rng, -3, 3);
  HostArray base_h = HostArray::from_literal(base), tall_h = HostArray::from_literal(tall),
            col_h = HostArray::from_literal(colv), row_h = HostArray::from_literal(rowv);
  // Logical [rows, cols] inputs, and their contiguous copies for the reference.
  auto logical = [&](auto value_at) {
    ir::Literal l = ir::Literal::zeros({ElementType::f32, {rows, cols}});
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) l.f[i * cols + j] = value_at(i, j);
    return HostArray::from_literal(l);
  };
  std::vector<HostArray> dense{logical([&](int64_t i, int64_t j) { return base.f[j * rows + i]; }),
                               logical([&](int64_t i, int64_t j) { return tall.f[2 * i * cols + j]; }),
                               logical([&](int64_t i, int64_t) { return colv.f[i]; }),
                               logical([&](int64_t, int64_t j) { return rowv.f[cols - 1 - j]; })};
  ir::Builder b;
  std::vector<ValueId> p;
  for (int k = 0; k < 4; ++k) p.push_back(b.parameter(ElementType::f32, {rows, cols}));
  ValueId y = b.add(b.multiply(p[0], p[1]), b.exponential(b.multiply(p[2], splat(b, 0.1, {rows, cols}))));
  b.output(b.subtract(y, p[3]));
  b.output(b.reduce_sum(b.multiply(p[0], p[3]), {0}));
  exec::CompileOptions o;
  o.tile_elements = 1024;
  exec::CompiledRegion r = exec::compile(b.graph(), o);
  std::vector<exec::Buffer> in{
      exec::Buffer::strided(base_h.bytes.data(), ElementType::f32, {rows, cols}, {1, rows}),
      exec::Buffer::strided(tall_h.bytes.data(), ElementType::f32, {rows, cols}, {2 * cols, 1}),
      exec::Buffer::strided(col_h.bytes.data(), ElementType::f32, {rows, cols}, {1, 0}),
      exec::Buffer::strided(row_h.bytes.data() + (cols - 1) * 4, ElementType::f32, {rows, cols}, {0, -1})};
  HostArray out0({ElementType::f32, {rows, cols}}), out1({ElementType::f32, {cols}});
  exec::run(r, in, {out0.buffer(), out1.buffer()});
  std::vector<ir::Literal> want = reference(b.graph(), dense);
  EXPECT_TRUE(all_close(out0.literal(), want[0], Tolerance{1e-5, 1e-6}));
  EXPECT_TRUE(all_close(out1.literal(), want[1], Tolerance{1e-5, 1e-5}));
}

TEST(ExecFusion, StridedOutputs) {
  // Writes the result transposed into a [cols, rows] array, and into every
  // other element of a larger one.
  const int64_t rows = 17, cols = 23;
  ir::Builder b;
  ValueId x = b.parameter(ElementType::bf16, {rows, cols});
  b.output(b.logistic(x));
  b.output(b.reduce_sum(x, {1}));
  std::mt19937 rng(6);
  std::vector<HostArray> in{random_array({ElementType::bf16, {rows, cols}}, rng, -5, 5)};
  std::vector<ir::Literal> want = reference(b.graph(), in);
  exec::CompiledRegion r = exec::compile(b.graph());
  std::vector<uint16_t> transposed(rows * cols), spaced(2 * rows);
  exec::run(r, {in[0].buffer()},
            {exec::Buffer::strided(transposed.data(), ElementType::bf16, {rows, cols}, {1, rows}),
             exec::Buffer::strided(spaced.data(), ElementType::bf16, {rows}, {2})});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      EXPECT_NEAR(ir::bf16_to_f32(transposed[j * rows + i]), want[0].f[i * cols + j],
                  8e-3 * std::fabs(want[0].f[i * cols + j]));
    EXPECT_NEAR(ir::bf16_to_f32(spaced[2 * i]), want[1].f[i], 1e-2 * std::fabs(want[1].f[i]) + 1e-3);
    EXPECT_EQ(spaced[2 * i + 1], 0);
  }
}

struct ReduceCase {
  ir::Shape shape;
  std::vector<int64_t> dims;
};

class ExecReduce : public ::testing::TestWithParam<std::tuple<ReduceCase, ElementType>> {};

TEST_P(ExecReduce, AllKindsMatchReference) {
  auto [c, t] = GetParam();
  std::mt19937 rng(7);
  ir::Builder b;
  ValueId x = b.parameter(t, c.shape);
  ValueId q = b.parameter(t, c.shape);  // near 1, for products
  b.output(b.reduce(x, ReduceKind::kSum, c.dims));
  b.output(b.reduce(x, ReduceKind::kMax, c.dims));
  b.output(b.reduce(x, ReduceKind::kMin, c.dims));
  b.output(b.reduce(q, ReduceKind::kProd, c.dims));
  b.output(b.reduce(b.exponential(x), ReduceKind::kSum, c.dims, 3.0));  // epilogue fusion, init
  std::vector<HostArray> in{random_array({t, c.shape}, rng, 0.5, 1.5), random_array({t, c.shape}, rng, 0.999, 1.001)};
  exec::CompileOptions o;
  o.tile_elements = 1024;
  // f32 accumulation over up to ~5000 terms against a double reference.
  expect_matches_reference(b.graph(), in, o, t == ElementType::f32 ? 20.0 : 1.0);
  expect_matches_reference(b.graph(), in, {}, t == ElementType::f32 ? 20.0 : 1.0);
}

INSTANTIATE_TEST_SUITE_P(Dims, ExecReduce,
                         ::testing::Combine(::testing::Values(ReduceCase{{37, 129}, {1}},         // rows (trailing)
                                                              ReduceCase{{37, 129}, {0}},         // columns (leading)
                                                              ReduceCase{{37, 129}, {0, 1}},      // everything
                                                              ReduceCase{{5, 7, 11, 3}, {1, 2}},  // middle block
                                                              ReduceCase{{5, 7, 11, 3}, {0, 2}},  // interleaved
                                                              ReduceCase{{5, 7, 11, 3}, {3}},
                                                              ReduceCase{{6, 1, 9}, {1}},  // size-1 dimension
                                                              ReduceCase{{4, 9}, {}},      // nothing reduced
                                                              ReduceCase{{}, {}},          // scalar
                                                              ReduceCase{{3000}, {0}}),    // many tiles, one result
                                            ::testing::Values(ElementType::f32, ElementType::bf16)),
                         [](const auto& info) {
                           const ReduceCase& c = std::get<0>(info.param);
                           std::string n = "shape";
                           for (int64_t d : c.shape) n += "_" + std::to_string(d);
                           n += "_dims";
                           for (int64_t d : c.dims) n += "_" + std::to_string(d);
                           return n + "_" + ir::element_type_name(std::get<1>(info.param));
                         });

TEST(ExecReduce, IntegerPredAndF64Reductions) {
  std::mt19937 rng(8);
  ir::Builder b;
  ValueId i = b.parameter(ElementType::s32, {50, 60});
  ValueId u = b.parameter(ElementType::u8, {50, 60});
  ValueId p = b.parameter(ElementType::pred, {50, 60});
  ValueId d = b.parameter(ElementType::f64, {50, 60});
  for (ReduceKind k : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kProd}) {
    b.output(b.reduce(i, k, {1}));
    b.output(b.reduce(u, k, {0}));
    b.output(b.reduce(d, k, {0, 1}));
  }
  b.output(b.reduce(p, ReduceKind::kMax, {1}));  // any
  b.output(b.reduce(p, ReduceKind::kMin, {0}));  // all
  std::vector<HostArray> in{random_array({ElementType::s32, {50, 60}}, rng, -1e6, 1e6),
                            random_array({ElementType::u8, {50, 60}}, rng, 0, 256),
                            random_array({ElementType::pred, {50, 60}}, rng),
                            random_array({ElementType::f64, {50, 60}}, rng, 0.99, 1.01)};
  expect_matches_reference(b.graph(), in);
}

TEST(ExecReduce, EmptyReductionGivesInit) {
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {3, 0});
  b.output(b.reduce(x, ReduceKind::kSum, {1}, 2.5));
  b.output(b.reduce(x, ReduceKind::kMax, {1}));
  std::vector<HostArray> in{HostArray({ElementType::f32, {3, 0}})};
  std::vector<ir::Literal> got = run_region(exec::compile(b.graph()), in);
  EXPECT_EQ(got[0].f, (std::vector<double>{2.5, 2.5, 2.5}));
  EXPECT_EQ(got[1].f[0], -INFINITY);
}

// A run's tail (n % 64 values) is summed into the partial accumulators, not
// added one by one to the whole run's sum: a row of 1000 equal floats
// (960 + 40) was 17 ulp off with the tail added serially, 1023 of them 27.
TEST(ExecReduce, RunTailIsSummedPairwise) {
  for (int64_t len : {1000, 1023, 100, 511}) {
    ir::Builder b;
    ValueId x = b.parameter(ElementType::f32, {9, len});
    b.output(b.reduce_sum(x, {1}));
    ir::Literal l = ir::Literal::zeros({ElementType::f32, {9, len}});
    const float v[9] = {1.2345678f, -0.7777777f, 1.9999999f,  0.3333333f, -1.4142135f,
                        1.1f,       0.9876543f,  -1.7320508f, 1.6180339f};
    for (int64_t r = 0; r < 9; ++r)
      for (int64_t k = 0; k < len; ++k) l.f[r * len + k] = v[r];
    std::vector<HostArray> in{HostArray::from_literal(l)};
    std::vector<ir::Literal> got = run_region(exec::compile(b.graph()), in);
    for (int64_t r = 0; r < 9; ++r) {
      const double exact = static_cast<double>(v[r]) * static_cast<double>(len);
      const double ulp =
          std::nextafter(static_cast<float>(std::fabs(exact)), INFINITY) - std::fabs(static_cast<float>(exact));
      EXPECT_LE(std::fabs(got[0].f[r] - exact), 8 * ulp) << "len " << len << " row " << r;  // was up to 27
    }
  }
}

TEST(ExecReduce, NanPropagatesThroughMaxAndSum) {
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 100});
  b.output(b.reduce_max(x, {1}));
  b.output(b.reduce(x, ReduceKind::kMin, {0}));
  b.output(b.reduce_sum(x, {1}));
  ir::Literal l = ir::Literal::zeros({ElementType::f32, {4, 100}});
  for (int64_t k = 0; k < 400; ++k) l.f[k] = static_cast<double>(k % 17);
  l.f[150] = NAN;
  std::vector<HostArray> in{HostArray::from_literal(l)};
  expect_matches_reference(b.graph(), in);
}

TEST(ExecFusion, ResidualLayerNormMatchesReference) {
  for (ElementType t : {ElementType::f32, ElementType::bf16}) {
    const int64_t n = 24, d = 384;
    const ir::Shape s{n, d};
    ir::Builder b;
    ValueId x = b.parameter(t, s), r = b.parameter(t, s), gamma = b.parameter(t, {d}), beta = b.parameter(t, {d});
    ValueId h = b.add(x, r);
    ValueId mean = b.multiply(b.reduce_sum(h, {1}), splat(b, 1.0 / d, {n}, t));
    ValueId dv = b.subtract(h, b.broadcast_in_dim(mean, s, {0}));
    ValueId var = b.multiply(b.reduce_sum(b.multiply(dv, dv), {1}), splat(b, 1.0 / d, {n}, t));
    ValueId rs = b.rsqrt(b.add(var, splat(b, 1e-5, {n}, t)));
    ValueId y = b.add(b.multiply(b.multiply(dv, b.broadcast_in_dim(rs, s, {0})), b.broadcast_in_dim(gamma, s, {1})),
                      b.broadcast_in_dim(beta, s, {1}));
    b.output(y);
    b.output(h);
    std::mt19937 rng(9);
    std::vector<HostArray> in{random_array({t, s}, rng, -2, 2), random_array({t, s}, rng, -2, 2),
                              random_array({t, {d}}, rng, 0.5, 1.5), random_array({t, {d}}, rng, -0.5, 0.5)};
    exec::CompiledRegion region = exec::compile(b.graph());
    EXPECT_EQ(region.num_kernels(), 3);
    // The two [24] sums (64-byte aligned); h lives in its output buffer.
    EXPECT_EQ(region.temp_bytes(), 2 * ((24 * ir::element_size(t) + 63) / 64 * 64));
    SCOPED_TRACE(ir::element_type_name(t));
    if (t == ElementType::f32) {
      expect_matches_reference(b.graph(), in, {}, 50.0);
    } else {
      // h is stored in bf16 between the kernels (the reference keeps it in
      // double): errors of a bf16 ulp of h (~2^-8 * 4) reach y.
      const Tolerance bf16_layer_norm{2e-2, 2e-2};
      expect_matches_reference(b.graph(), in, {}, 1.0, &bf16_layer_norm);
    }
  }
}

TEST(ExecFusion, SoftmaxRowsSumToOne) {
  ir::Builder b;
  const ir::Shape s{10, 1000};
  ValueId x = b.parameter(ElementType::f32, s);
  ValueId m = b.reduce_max(x, {1});
  ValueId e = b.exponential(b.subtract(x, b.broadcast_in_dim(m, s, {0})));
  ValueId y = b.divide(e, b.broadcast_in_dim(b.reduce_sum(e, {1}), s, {0}));
  b.output(y);
  std::mt19937 rng(10);
  std::vector<HostArray> in{random_array({ElementType::f32, s}, rng, -20, 20)};
  expect_matches_reference(b.graph(), in, {}, 10.0);
  ir::Literal out = run_region(exec::compile(b.graph()), in)[0];
  for (int64_t i = 0; i < 10; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < 1000; ++j) sum += out.f[i * 1000 + j];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST(ExecFusion, ViewsOutputsAndCopies) {
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {6, 4});
  ValueId e = b.exponential(x);
  ValueId r = b.reshape(e, {24});  // view of a temp
  ValueId y = b.add(r, splat(b, 1.0, {24}));
  ValueId xr = b.reshape(x, {4, 6});  // view of a (possibly strided) input
  b.output(y);
  b.output(x);  // parameter as output: copied
  b.output(y);  // same value twice
  b.output(b.multiply(xr, xr));
  b.output(r);                      // view as output
  b.output(splat(b, 7.0, {2, 2}));  // constant output
  std::mt19937 rng(11);
  std::vector<HostArray> in{random_array({ElementType::f32, {6, 4}}, rng)};
  expect_matches_reference(b.graph(), in);
  // Same region with a transposed (non-contiguous) input: the reshape copies it.
  ir::Literal l = in[0].literal();
  std::vector<float> t(24);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) t[j * 6 + i] = static_cast<float>(l.f[i * 4 + j]);
  exec::CompiledRegion region = exec::compile(b.graph());
  std::vector<HostArray> outs;
  for (const auto& ty : region.output_types()) outs.emplace_back(ty);
  std::vector<exec::Buffer> ob;
  for (auto& o : outs) ob.push_back(o.buffer());
  exec::run(region, {exec::Buffer::strided(t.data(), ElementType::f32, {6, 4}, {1, 6})}, ob);
  std::vector<ir::Literal> want = reference(b.graph(), in);
  for (size_t j = 0; j < outs.size(); ++j)
    EXPECT_TRUE(all_close(outs[j].literal(), want[j], Tolerance{2e-6, 1e-6})) << j;
}

TEST(ExecFusion, ZeroSizeAndRankZero) {
  ir::Builder b;
  ValueId z = b.parameter(ElementType::f32, {0, 5});
  ValueId s = b.parameter(ElementType::bf16, {});
  b.output(b.exponential(z));
  b.output(b.tanh(b.multiply(s, s)));
  ir::Literal sl = ir::Literal::zeros({ElementType::bf16, {}});
  sl.f = {1.5};
  std::vector<HostArray> in{HostArray({ElementType::f32, {0, 5}}), HostArray::from_literal(sl)};
  expect_matches_reference(b.graph(), in);
}

TEST(ExecFusion, WideMultiOutputKernelsAndMixedTypes) {
  // A kernel that converts between lanes, compares, selects and writes
  // values of several element types at once.
  ir::Builder b;
  const ir::Shape s{3, 1111};
  ValueId x = b.parameter(ElementType::bf16, s);
  ValueId i = b.parameter(ElementType::s32, s);
  ValueId xf = b.convert(x, ElementType::f32);
  ValueId fi = b.convert(i, ElementType::f32);
  ValueId pos = b.compare(xf, splat(b, 0.0, s), ir::CompareDirection::GT);
  ValueId relu = b.select(pos, xf, splat(b, 0.0, s));
  ValueId mix = b.add(relu, b.multiply(fi, splat(b, 0.25, s)));
  b.output(b.convert(mix, ElementType::bf16));
  b.output(b.convert(b.floor(mix), ElementType::s8));
  b.output(pos);
  b.output(b.convert(b.multiply(xf, xf), ElementType::f64));
  b.output(b.reduce_sum(b.convert(pos, ElementType::s32), {1}));
  std::mt19937 rng(12);
  std::vector<HostArray> in{random_array({ElementType::bf16, s}, rng, -3, 3),
                            random_array({ElementType::s32, s}, rng, -100, 100)};
  expect_matches_reference(b.graph(), in);
  EXPECT_EQ(exec::compile(b.graph()).num_kernels(), 1);
}

TEST(ExecFusion, InPlaceLoadsAndDirectStores) {
  // a is written straight into its output and read again by later ops; y and
  // its identity broadcast are one tile value stored twice; the same region
  // runs with contiguous and with strided outputs, and with an s32 input that
  // cannot be read in place.
  const ir::Shape s{9, 700};
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, s);
  ValueId k = b.parameter(ElementType::s32, s);
  ValueId a = b.exponential(x);
  ValueId y = b.add(b.multiply(a, a), b.convert(k, ElementType::f32));
  b.output(a);
  b.output(y);
  b.output(b.broadcast_in_dim(y, s, {0, 1}));
  b.output(b.compare(a, y, ir::CompareDirection::LT));
  std::mt19937 rng(15);
  std::vector<HostArray> in{random_array({ElementType::f32, s}, rng, -2, 2),
                            random_array({ElementType::s32, s}, rng, 0, 9)};  // no cancellation in a*a + k
  exec::CompileOptions o;
  o.tile_elements = 1024;
  expect_matches_reference(b.graph(), in, o);
  exec::CompiledRegion r = exec::compile(b.graph(), o);
  std::vector<ir::Literal> want = reference(b.graph(), in);
  std::vector<float> out_a(2 * s[0] * s[1]);
  HostArray out_y({ElementType::f32, s}), out_y2({ElementType::f32, s}), out_p({ElementType::pred, s});
  exec::run(r, {in[0].buffer(), in[1].buffer()},
            {exec::Buffer::strided(out_a.data(), ElementType::f32, s, {2 * s[1], 2}), out_y.buffer(), out_y2.buffer(),
             out_p.buffer()});
  ir::Literal got_a = ir::Literal::zeros({ElementType::f32, s});
  for (int64_t i = 0; i < s[0] * s[1]; ++i) got_a.f[i] = out_a[2 * i];
  EXPECT_TRUE(all_close(got_a, want[0], tolerance_for(ElementType::f32)));
  EXPECT_TRUE(all_close(out_y.literal(), want[1], tolerance_for(ElementType::f32)));
  EXPECT_TRUE(all_close(out_y2.literal(), want[2], tolerance_for(ElementType::f32)));
  EXPECT_TRUE(all_close(out_p.literal(), want[3], Tolerance{}));
}

TEST(ExecFusion, LongChainIsOneKernelAndCompilesInLinearTime) {
  // A region at a generous size cap: 6000 ops in one dependency chain.
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {777});
  ValueId y = b.parameter(ElementType::f32, {777});
  ValueId v = x;
  for (int i = 0; i < 6000; ++i) v = i % 3 == 0 ? b.tanh(v) : i % 3 == 1 ? b.add(v, y) : b.multiply(v, x);
  b.output(v);
  std::mt19937 rng(16);
  std::vector<HostArray> in{random_array({ElementType::f32, {777}}, rng), random_array({ElementType::f32, {777}}, rng)};
  auto t0 = std::chrono::steady_clock::now();
  exec::CompiledRegion r = exec::compile(b.graph());
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.num_kernels(), 1);
  EXPECT_LT(seconds, 5.0);  // ~30 ms here; quadratic passes took seconds
  std::vector<ir::Literal> got = run_region(r, in), want = reference(b.graph(), in);
  EXPECT_TRUE(all_close(got[0], want[0], Tolerance{1e-4, 1e-5}));
}

// Row statistics broadcast back along rows (softmax's shape of computation)
// over rows shorter than a tile (packed whole, reduced and expanded a row at
// a time), rows of exactly a tile (per-row values are scalars) and rows
// longer than a tile; with NaN and infinities in some rows, and the row
// statistics read from a strided (transposed) view.
TEST(ExecFusion, RowStatisticsBroadcastBackMatchReference) {
  for (int64_t d : {1, 7, 128, 1000, 1024, 3000}) {
    for (ElementType t : {ElementType::f32, ElementType::bf16, ElementType::f64}) {
      const int64_t n = 37;
      const ir::Shape s{n, d};
      ir::Builder b;
      ValueId x = b.parameter(t, s);
      ValueId mx = b.reduce_max(x, {1});
      ValueId mn = b.reduce(x, ReduceKind::kMin, {1});
      ValueId shifted = b.subtract(x, b.broadcast_in_dim(mx, s, {0}));
      ValueId e = b.exponential(shifted);
      ValueId sum = b.reduce_sum(e, {1});
      b.output(b.divide(e, b.broadcast_in_dim(sum, s, {0})));
      b.output(b.multiply(x, b.broadcast_in_dim(mn, s, {0})));
      b.output(mx);
      b.output(mn);
      std::mt19937 rng(static_cast<unsigned>(d));
      std::vector<HostArray> in{random_array({t, s}, rng, -3, 3)};
      ir::Literal l = in[0].literal();
      l.f[3 * d] = NAN;               // row 3
      l.f[5 * d + d / 2] = INFINITY;  // row 5
      l.f[6 * d] = -INFINITY;         // row 6
      in[0] = HostArray::from_literal(l);
      SCOPED_TRACE("d=" + std::to_string(d) + " " + ir::element_type_name(t));
      expect_matches_reference(b.graph(), in, {}, 4.0);
    }
  }
}

// (a op1 b) op2 c runs as one binary_pair pass for every pair of add,
// subtract, multiply and every mix of array and scalar operands; a result
// that is read twice, or subtracted from, stays two passes. Same values as
// the reference (each op rounds to float).
TEST(ExecFusion, BinaryPairsMatchReference) {
  const OpKind kinds[] = {OpKind::kAdd, OpKind::kSubtract, OpKind::kMultiply};
  const int64_t n = 1000;
  for (OpKind k1 : kinds) {
    for (OpKind k2 : kinds) {
      for (int arrays = 0; arrays < 8; ++arrays) {
        if ((arrays & 3) == 0) continue;  // a op1 b on two scalars folds to a constant
        ir::Builder b;
        std::vector<HostArray> in;
        std::mt19937 rng(static_cast<unsigned>(arrays * 9 + static_cast<int>(k1) * 3 + static_cast<int>(k2)));
        auto operand = [&](int bit, double v) {
          if (arrays & (1 << bit)) {
            in.push_back(random_array({ElementType::f32, {n}}, rng, -2, 2));
            return b.parameter(ElementType::f32, {n});
          }
          return splat(b, v, {n}, ElementType::f32);
        };
        ValueId x = operand(0, 0.75), y = operand(1, -1.5), z = operand(2, 3.0);
        b.output(b.binary(k2, b.binary(k1, x, y), z));
        SCOPED_TRACE(std::string(ir::op_name(k1)) + "/" + ir::op_name(k2) + " arrays " + std::to_string(arrays));
        expect_matches_reference(b.graph(), in, {}, 1.0);
        EXPECT_NE(exec::compile(b.graph()).describe().find("binary_pair"), std::string::npos);
      }
    }
  }
  {  // read twice: not paired
    ir::Builder b;
    ValueId x = b.parameter(ElementType::f32, {n}), y = b.parameter(ElementType::f32, {n});
    ValueId s = b.add(x, y);
    b.output(b.multiply(s, y));
    b.output(s);
    std::mt19937 rng(1);
    std::vector<HostArray> in{random_array({ElementType::f32, {n}}, rng), random_array({ElementType::f32, {n}}, rng)};
    expect_matches_reference(b.graph(), in);
    EXPECT_EQ(exec::compile(b.graph()).describe().find("binary_pair"), std::string::npos);
  }
  {  // c - (a * b): the inner result on the right of a subtraction
    ir::Builder b;
    ValueId x = b.parameter(ElementType::f32, {n}), y = b.parameter(ElementType::f32, {n});
    b.output(b.subtract(y, b.multiply(x, y)));
    std::mt19937 rng(2);
    std::vector<HostArray> in{random_array({ElementType::f32, {n}}, rng), random_array({ElementType::f32, {n}}, rng)};
    expect_matches_reference(b.graph(), in);
  }
}

TEST(ExecFusion, RunChecksItsArguments) {
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {4});
  b.output(b.exponential(x));
  exec::CompiledRegion r = exec::compile(b.graph());
  std::vector<float> a(4), o(4);
  auto f32 = [](float* p, ir::Shape s) { return exec::Buffer::contiguous(p, ElementType::f32, std::move(s)); };
  EXPECT_THROW(exec::run(r, {}, {f32(o.data(), {4})}), std::invalid_argument);
  EXPECT_THROW(exec::run(r, {f32(a.data(), {5})}, {f32(o.data(), {4})}), std::invalid_argument);
  EXPECT_THROW(exec::run(r, {exec::Buffer::contiguous(a.data(), ElementType::bf16, {4})}, {f32(o.data(), {4})}),
               std::invalid_argument);
  EXPECT_THROW(exec::run(r, {f32(a.data(), {4})}, {}), std::invalid_argument);
  try {
    exec::run(r, {f32(a.data(), {2, 2})}, {f32(o.data(), {4})});
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "[run] input 0 must be f32[4], got f32[2,2]");
  }
}

TEST(ExecFusion, DescribeListsTheTileProgram) {
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {4, 8});
  ValueId y = b.parameter(ElementType::f32, {8});
  b.output(b.reduce_sum(b.multiply(x, b.broadcast_in_dim(y, {4, 8}, {1})), {1}));
  std::string d = exec::compile(b.graph()).describe();
  EXPECT_NE(d.find("load f32 %0 map [0,1]"), std::string::npos) << d;
  EXPECT_NE(d.find("load f32 %1 map [-1,0]"), std::string::npos) << d;
  EXPECT_NE(d.find("binary multiply f32 s0, s1"), std::string::npos) << d;
  EXPECT_NE(d.find("reduce f32 s2 -> %4"), std::string::npos) << d;
}

TEST(ExecCompileCache, HitsOnIsomorphicRegionsMissesOnChanges) {
  exec::CompileCache cache(16);
  auto region = [](ElementType t, int64_t n, double k, bool reorder) {
    ir::Builder b;
    ValueId x = b.parameter(t, {n});
    ValueId y = b.parameter(t, {n});
    ValueId a, c;
    if (reorder) {
      c = b.exponential(y);
      a = b.tanh(x);
    } else {
      a = b.tanh(x);
      c = b.exponential(y);
    }
    b.output(b.add(b.multiply(a, splat(b, k, {n}, t)), c));
    return b.build();
  };
  auto r1 = cache.get_or_compile(region(ElementType::f32, 64, 2.0, false));
  auto r2 = cache.get_or_compile(region(ElementType::f32, 64, 2.0, false));
  auto r3 = cache.get_or_compile(region(ElementType::f32, 64, 2.0, true));  // same structure, other ids
  EXPECT_EQ(r1.get(), r2.get());
  EXPECT_EQ(r1.get(), r3.get());
  EXPECT_EQ(cache.stats().hits, 2u);
  EXPECT_EQ(cache.stats().misses, 1u);
  cache.get_or_compile(region(ElementType::f32, 65, 2.0, false));   // shape
  cache.get_or_compile(region(ElementType::bf16, 64, 2.0, false));  // dtype
  cache.get_or_compile(region(ElementType::f32, 64, 3.0, false));   // constant
  EXPECT_EQ(cache.stats().misses, 4u);
  EXPECT_EQ(cache.stats().entries, 4u);
  // A cached region runs correctly for the graph that hit it.
  ir::Graph g = region(ElementType::f32, 64, 2.0, true);
  std::mt19937 rng(13);
  std::vector<HostArray> in{random_array({ElementType::f32, {64}}, rng), random_array({ElementType::f32, {64}}, rng)};
  auto hit = cache.get_or_compile(g);
  EXPECT_EQ(hit.get(), r1.get());
  std::vector<ir::Literal> got = run_region(*hit, in), want = reference(g, in);
  EXPECT_TRUE(all_close(got[0], want[0], tolerance_for(ElementType::f32)));
  cache.reset_stats();
  EXPECT_EQ(cache.stats().hits, 0u);
  cache.clear();
  EXPECT_EQ(cache.stats().entries, 0u);
}

TEST(ExecCompileCache, EvictsLeastRecentlyUsed) {
  exec::CompileCache cache(2);
  auto region = [](int64_t n) {
    ir::Builder b;
    b.output(b.negate(b.parameter(ElementType::f32, {n})));
    return b.build();
  };
  cache.get_or_compile(region(1));
  cache.get_or_compile(region(2));
  cache.get_or_compile(region(1));  // hit: 1 is now the most recent
  cache.get_or_compile(region(3));  // evicts 2
  EXPECT_EQ(cache.stats().evictions, 1u);
  cache.get_or_compile(region(1));
  EXPECT_EQ(cache.stats().hits, 2u);
  cache.get_or_compile(region(2));
  EXPECT_EQ(cache.stats().misses, 4u);
}

TEST(ExecCompileCache, ConcurrentLookupsAndRuns) {
  exec::CompileCache cache(8);
  ir::Builder b;
  ValueId x = b.parameter(ElementType::f32, {20000});
  b.output(gelu(b, x));
  b.output(b.reduce_sum(x, {0}));
  const ir::Graph g = b.build();
  std::mt19937 rng(14);
  std::vector<HostArray> in{random_array({ElementType::f32, {20000}}, rng, -3, 3)};
  const std::vector<ir::Literal> want = reference(g, in);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k) {
        auto r = cache.get_or_compile(g);
        std::vector<HostArray> local = in;
        std::vector<ir::Literal> got = run_region(*r, local);
        if (!all_close(got[0], want[0], Tolerance{4e-6, 4e-6}) || !all_close(got[1], want[1], Tolerance{1e-4, 1e-4}))
          ++failures;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(cache.stats().hits + cache.stats().misses, 80u);
  EXPECT_LE(cache.stats().misses, 4u);
  EXPECT_EQ(cache.stats().entries, 1u);
}

}  // namespace
