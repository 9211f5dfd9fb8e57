// The vectorized loops a tile program is made of (executor-internal).
// Each function runs one op over n values of a tile; pointers are to arrays
// of the lane type (float, double, int64_t, uint8_t), never aliasing each
// other. An operand pointer may be null: then its immediate scalar is used.
// Each entry point is compiled for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3)
// and baseline x86-64, chosen at load time (function multiversioning).
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace torch_tpu::exec {

// How values of an element type are held in a tile.
enum class Lane : uint8_t { kF32, kF64, kI64, kPred };
Lane lane_of(ir::ElementType t);
int64_t lane_bytes(Lane l);
const char* lane_name(Lane l);

struct Imm {
  double f = 0.0;  // for float lanes
  int64_t i = 0;   // for int64 and pred lanes
};

namespace tile {

void fill(Lane lane, Imm v, void* dst, int64_t n);
// Unary elementwise op (not convert); on I64 lanes the result is not yet
// wrapped to a narrow type (see wrap).
void unary(ir::OpKind op, Lane lane, void* dst, const void* a, int64_t n);
void binary(ir::OpKind op, Lane lane, void* dst, const void* a, Imm ia, const void* b, Imm ib, int64_t n);
// dst = (a op1 b) op2 c over float lanes, op1 and op2 each add, subtract or
// multiply; the inner result is rounded to float as a pass of its own would.
void binary_pair(ir::OpKind op1, ir::OpKind op2, float* dst, const float* a, float ia, const float* b, float ib,
                 const float* c, float ic, int64_t n);
void compare(ir::CompareDirection dir, Lane lane, uint8_t* dst, const void* a, Imm ia, const void* b, Imm ib,
             int64_t n);
void select(Lane lane, void* dst, const uint8_t* pred, const void* a, Imm ia, const void* b, Imm ib, int64_t n);
// Lane conversion with convert's semantics; to_dtype decides rounding
// (bf16/f16 in f32 lanes), saturation (float -> int) and wrapping (int -> int).
void convert(Lane from, ir::ElementType from_dtype, Lane to, ir::ElementType to_dtype, void* dst, const void* src,
             int64_t n);
// Wraps int64 values to an integer type's width (two's complement).
void wrap(ir::ElementType dtype, int64_t* x, int64_t n);
// x^e for the exponents has_fast_power() accepts, in float lanes.
bool has_fast_power(double e);
void power_const(Lane lane, double e, void* dst, const void* a, int64_t n);

// Memory <-> tile: n elements of `dtype` at src + k*stride (stride in
// elements; 0 broadcasts one element).
void load(ir::ElementType dtype, const void* src, int64_t stride, void* dst, int64_t n);
void store(ir::ElementType dtype, void* dst, int64_t stride, const void* src, int64_t n);

// Rows of a tile: dst[k * row_len + j] = src[k * src_stride] (one value of
// `dtype` per row, broadcast along it) for k < rows, j < row_len.
void expand_rows(ir::ElementType dtype, const void* src, int64_t src_stride, int64_t rows, int64_t row_len, void* dst);

// *acc = combine(*acc, reduction of src[0..n)).
void reduce_run(ir::ReduceKind kind, Lane lane, const void* src, int64_t n, void* acc);
// Whole rows of a tile: acc[k * acc_stride] = combine(acc[k * acc_stride],
// reduction of src[k * row_len .. (k + 1) * row_len)) for k < rows.
void reduce_rows(ir::ReduceKind kind, Lane lane, const void* src, int64_t rows, int64_t row_len, void* acc,
                 int64_t acc_stride);
// acc[k] = combine(acc[k], src[k]).
void reduce_cols(ir::ReduceKind kind, Lane lane, const void* src, void* acc, int64_t n);

}  // namespace tile
}  // namespace torch_tpu::exec
