// float32 matrix products with the TPU's MXU numerics, selected by
// torch.get_float32_matmul_precision(), or locally by torch.tpu.precision()
// (docs/design.md "Numerics"):
//   highest: exact float32                                  (XLA's HIGHEST);
//   high:    three bf16 passes (a_hi*b_hi + a_hi*b_lo + a_lo*b_hi, fp32 accumulation)  (HIGH);
//   medium:  one bf16 pass (inputs rounded to bf16, fp32 accumulation) — the TPU's native
//            mode                                           (DEFAULT).
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/SafePyObject.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

namespace torch_tpu {

// The precision a float32 product issued now uses: the calling thread's
// override (torch.tpu.precision) if one is set, else global_matmul_precision().
// Read once per op, at the call: work queued on a chip's stream carries the
// value read here.
at::Float32MatmulPrecision effective_matmul_precision();

// torch.get_float32_matmul_precision()'s value, read from the per-backend
// settings its setter writes (torch.backends.mkldnn.matmul and
// torch.backends.cuda.matmul .fp32_precision, inheriting as PyTorch's do): the
// lower of the two ("bf16": medium, "tf32": high, else highest). Each pair the
// legacy setter writes gives its value back; a pair it never writes (the
// per-backend API used alone or mixed with it, where the getter raises) still
// has one: a backend asked for reduced-precision products.
at::Float32MatmulPrecision global_matmul_precision();

// Whether ATen's CPU matmul and convolution kernels compute float32 products in
// float32 (mkldnn's matmul and conv precisions "ieee" or unset), read on the
// thread that runs them: with "bf16" or "tf32" oneDNN may round them on hosts
// with bf16 or AMX units.
bool host_float32_products_exact();

// The calling thread's override (nullopt: none). The override lives in
// PyTorch's thread-local state (at::impl::ThreadLocalPythonObjects), which
// at::ThreadLocalState carries to the threads that work on the thread's behalf:
// the autograd engine's device threads run a backward() under the state of the
// thread that called it, so the backward matmuls of a loss.backward() issued
// inside the block follow the override too. (ThreadLocalDebugInfo, the other
// propagated slot, is a push/pop stack that a profiler started or stopped inside
// the block would break.)
std::optional<at::Float32MatmulPrecision> matmul_precision_override();
// Sets (a precision) or clears (nullopt) the calling thread's override. Needs
// set_matmul_precision_tokens() first.
void set_matmul_precision_override(std::optional<at::Float32MatmulPrecision> precision);

// The three objects (indexed by at::Float32MatmulPrecision: HIGHEST, HIGH,
// MEDIUM) that stand for an override in the thread-local state; they are
// recognised by identity, so reading the override touches no Python object.
// Set once by the Python bindings, which own the interpreter.
void set_matmul_precision_tokens(std::array<std::shared_ptr<c10::SafePyObject>, 3> tokens);

// "highest" | "high" | "medium" (torch.set_float32_matmul_precision's names);
// parse raises ValueError listing them.
const char* matmul_precision_name(at::Float32MatmulPrecision precision);
at::Float32MatmulPrecision parse_matmul_precision(const std::string& name);

// Whether `op` is a matrix product whose float32 numerics follow the precision.
bool is_matmul_family(const c10::OperatorHandle& op);

// Whether the host computes the product of `a` and `b`, both bf16 or both fp16, in float32 over
// the widened operands: where ATen's half kernels lack AVX-512 (an AVX2 host) they run 100-200x
// slower than float32 GEMM, and the MXU too multiplies bf16 exactly and accumulates in float32.
// Only with TORCH_TPU_WIDEN_HALF_PRODUCTS=1 (docs/env.md).
bool widens_half_product(const at::Tensor& a, const at::Tensor& b);
// Whether half products widen in this process (the opt-in, read once, on a host without AVX-512).
bool widening_half_products();

// Runs `op` (a CPU kernel over host tensors) on `stack` with the MXU numerics
// of `precision`; other ops and dtypes run unchanged. Under widening_half_products(), CPU's blocked
// attention kernel and its backward (`_scaled_dot_product_flash_attention_for_cpu[_backward]`)
// widen too: for bf16 they multiply in ATen's scalar half GEMM on such a host.
void call_with_matmul_precision(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                at::Float32MatmulPrecision precision);

}  // namespace torch_tpu
