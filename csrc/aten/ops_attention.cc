// scaled_dot_product_attention on tpu: the backend choice.
//
// Where the arguments allow, SDPA takes the blocked (flash) kernel: ATen's
// `_scaled_dot_product_flash_attention_for_cpu` and its backward, run on the
// chip through the fallback (over host aliases of the HBM buffers). Its T x S
// scores live in per-thread host scratch, one query block at a time, never in
// HBM, as on a TPU where they stay in VMEM; HBM holds q, k, v, the output and
// the row log-sum-exp. `torch.tpu.ops.splash_sdpa` uses the same kernel.
//
// Everything else takes PyTorch's math path (matmuls and softmax that each run
// on the chip and follow the matmul precision, with the T x S scores in HBM):
// dropout, grouped-query heads (enable_gqa with fewer K/V heads), an attn_mask
// that needs a gradient, float32 under a matmul precision other than
// "highest" (the flash kernel computes exact float32, a TPU's DEFAULT/HIGH
// passes round to bf16), nested tensors, other dtypes, ranks or strides, traces
// (torch.compile graphs: see flash_allowed), and
// whenever `torch.nn.attention.sdpa_kernel` / torch.backends.cuda's switches
// disable the flash backend (sdpa_kernel([SDPBackend.MATH]) forces math).
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include "aten/matmul_precision.h"

namespace torch_tpu {
namespace {

constexpr int64_t kSdpMath = static_cast<int64_t>(at::SDPBackend::math);
constexpr int64_t kSdpFlash = static_cast<int64_t>(at::SDPBackend::flash_attention);

bool flash_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

bool flash_allowed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                   double dropout_p) {
  if (!at::globalContext().userEnabledFlashSDP()) return false;
  if (dropout_p > 0.0) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    // A trace (FakeTensor / FunctionalTensor: the Python key; symbolic sizes): torch.compile
    // decomposes the flash op's forward into the math path, and that decomposition's second
    // output is the attention matrix, not the log-sum-exp its backward expects. Traced graphs
    // keep the math path (its softmax is also what dynamic-shape bucketing masks).
    if (t->key_set().has(c10::DispatchKey::Python) || t->unsafeGetTensorImpl()->has_symbolic_sizes_strides())
      return false;
    if (t->is_nested() || t->dim() != 4 || t->stride(-1) != 1 || t->numel() == 0) return false;
  }
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type() || !flash_dtype(q.scalar_type()))
    return false;
  if (q.scalar_type() == at::kFloat &&
      (effective_matmul_precision() != at::Float32MatmulPrecision::HIGHEST || !host_float32_products_exact()))
    return false;
  // Same batch, heads and head dim everywhere (grouped-query heads take math); K and V the same length.
  if (q.size(0) != k.size(0) || q.size(0) != v.size(0) || q.size(1) != k.size(1) || q.size(1) != v.size(1) ||
      q.size(3) != k.size(3) || q.size(3) != v.size(3) || k.size(2) != v.size(2))
    return false;
  if (mask.has_value() && mask->defined()) {
    const at::Tensor& m = *mask;
    if (m.requires_grad() || m.is_nested() || (m.dim() != 2 && m.dim() != 4)) return false;
    if (m.scalar_type() != at::kBool && m.scalar_type() != q.scalar_type()) return false;
    if (m.size(-2) != q.size(2) && m.size(-2) != 1) return false;
    if (m.size(-1) != k.size(2) && m.size(-1) != 1) return false;
  }
  return true;
}

int64_t fused_sdp_choice_tpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool /*is_causal*/,
                             std::optional<double> /*scale*/, bool /*enable_gqa*/) {
  return flash_allowed(q, k, v, attn_mask, dropout_p) ? kSdpFlash : kSdpMath;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice_tpu)); }

}  // namespace
}  // namespace torch_tpu

// The composite scaled_dot_product_attention asks the dispatch stub, not the op above.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_tpu::fused_sdp_choice_tpu);
}  // namespace at::native
