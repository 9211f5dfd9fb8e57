// Float32 matrix products that the chip's worker computes faster than ATen's
// CPU kernel would, with the same float32 arithmetic (an exact float32 product
// per element, summed in another order: results agree to float32 rounding, not
// bit for bit).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_tpu {

// out[M, N] = a[M, K] @ b[K, N] for a few rows (2 <= M <= 8) against a large
// b (N >= 8192) stored transposed (b = w.t() with w a row-major [N, K] matrix,
// nn.Linear's weight layout): a language model's vocabulary projection at
// decode time. ATen's CPU kernel (MKL) repacks all of w for every such call and
// takes 3-6x as long as reading w once; computed as out^T = w @ a^T into a
// temporary (M x N floats, host memory) and copied into `out`, w is read once
// (bench/README.md, "lm_head"). Returns false, having done nothing, for any
// other product (dtype, rank, layout, shape), and always on an Intel CPU, where
// MKL does not repack w and sums more accurately: the caller runs ATen's kernel.
// `out` must have shape [M, N] and not overlap a or b (the out= rules).
bool mm_few_rows_by_transposed(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out);

// The boxed form for a host stack: when `op` is aten::mm.out and the product
// qualifies, computes it, leaves the result on the stack (as callBoxed would)
// and returns true; otherwise does nothing and returns false.
bool call_mm_out_in_faster_order(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_tpu
