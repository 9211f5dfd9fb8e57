// float32 matrix products with the TPU's MXU numerics, selected by
// torch.get_float32_matmul_precision() (docs/design.md "Numerics"):
//   highest: exact float32;
//   high:    three bf16 passes (a_hi*b_hi + a_hi*b_lo + a_lo*b_hi, fp32 accumulation);
//   medium:  one bf16 pass (inputs rounded to bf16, fp32 accumulation) — the TPU's native mode.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_tpu {

// Whether `op` is a matrix product whose float32 numerics follow the precision.
bool is_matmul_family(const c10::OperatorHandle& op);

// Runs `op` (a CPU kernel over host tensors) on `stack` with the MXU numerics
// of `precision`; other ops and dtypes run unchanged.
void call_with_matmul_precision(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                at::Float32MatmulPrecision precision);

}  // namespace torch_tpu
