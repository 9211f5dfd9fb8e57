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

// Whether large float32 products go to oneDNN. At start-up, from TORCH_TPU_ONEDNN_GEMM: unset or
// "auto", on an AMD CPU with full-width AVX-512 (F, BW, VL, DQ; Zen 5 and later); "0", never; any
// other value, on any AMD CPU with AVX-512 (Zen 4 too).
bool onednn_gemm_on_this_host();

// Turns the oneDNN route on or off for the process (tests, A/B runs); returns the previous setting.
// Raises c10::Error when asked to turn it on where the CPU is not an AMD CPU with AVX-512.
bool set_onednn_gemm(bool on);

// out = a @ b through oneDNN's matmul (ATen's own at::native::mkldnn_matmul,
// which CPU eager uses for bf16), for float32 products where ATen's kernel
// (MKL's sgemm) is slow: on AMD CPUs MKL takes a code path without AVX-512,
// which on full-width AVX-512 units (Zen 5) runs 1.4-2.6x slower than oneDNN
// ([1024, 1024]^2: 11.7 ms against 6.4 ms on 2 Zen 5 cores, bench/README.md
// "oneDNN"). K is summed in chunks of
// 128 (as accurate as MKL's blocked sums, tests/python/ops/test_onednn_gemm.py).
// a [M, K], b [K, N], out [M, N] contiguous: all float32, M and N at least 64,
// M * N * K at least 2^26 (below, the two libraries trade places); out must not
// overlap a or b. Only under a global float32 matmul precision of "highest",
// with torch.backends.mkldnn enabled and on a host where
// onednn_gemm_on_this_host(). Returns false, having done nothing, otherwise:
// the caller runs ATen's kernel.
bool matmul_on_onednn(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out);

// out = beta * self + alpha * (a @ b) (aten::addmm.out) through oneDNN, on matmul_on_onednn's
// conditions; self float32, broadcastable to out and not overlapping it unless it is out itself;
// alpha not 0 or NaN. beta == 0 ignores self's values (NaN included), as ATen does. False, having done
// nothing: ATen's kernel.
bool addmm_on_onednn(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                     const at::Scalar& alpha, const at::Tensor& out);

// The boxed form for a host stack: when `op` is aten::mm.out or aten::addmm.out
// and the product qualifies for one of the orders or libraries above, computes
// it, leaves the result on the stack (as callBoxed would) and returns true;
// otherwise does nothing and returns false.
bool call_mm_out_in_faster_order(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_tpu
