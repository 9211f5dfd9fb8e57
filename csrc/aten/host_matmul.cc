#include "aten/host_matmul.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

namespace torch_tpu {

bool mm_few_rows_by_transposed(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  // Measured on 1 and 2 threads (bench/README.md, "lm_head"): outside these bounds the two
  // orders trade places from shape to shape, and for one row MKL's own order wins. On Intel CPUs
  // MKL takes another code path: it does not repack w for 2-6 rows (the reordered product is up
  // to 2.3x slower there), and for 7-8 rows it is faster but sums more accurately (mean error
  // against float64 2.1e-6, the reordered product's 4.9e-6), so there ATen's kernel always runs.
  static const bool kReorderPays = !__builtin_cpu_is("intel");
  constexpr int64_t kMinRows = 2, kMaxRows = 8, kMinColumns = 8192;
  if (!kReorderPays) return false;
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || out.scalar_type() != at::kFloat) return false;
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2 || a.is_conj() || b.is_conj()) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m < kMinRows || m > kMaxRows || n < kMinColumns || k < 1 || b.size(0) != k) return false;
  if (b.stride(0) != 1 || b.stride(1) != k || out.size(0) != m || out.size(1) != n) return false;
  // An out= that overlaps an operand: ATen's kernel, so that the result is CPU's whatever it is.
  if (at::get_overlap_status(out, a) != at::MemOverlapStatus::No ||
      at::get_overlap_status(out, b) != at::MemOverlapStatus::No || at::has_internal_overlap(out) != at::MemOverlap::No)
    return false;
  at::Tensor transposed = at::empty({n, m}, a.options().device(c10::kCPU));
  at::mm_out(transposed, b.t(), a.t());
  out.copy_(transposed.t());
  return true;
}

bool call_mm_out_in_faster_order(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (stack->size() < 3 || schema.name() != "aten::mm" || schema.overload_name() != "out") return false;
  const size_t first = stack->size() - 3;
  at::Tensor out = (*stack)[first + 2].toTensor();
  if (!mm_few_rows_by_transposed((*stack)[first].toTensor(), (*stack)[first + 1].toTensor(), out)) return false;
  torch::jit::drop(*stack, 3);
  stack->push_back(std::move(out));
  return true;
}

}  // namespace torch_tpu
