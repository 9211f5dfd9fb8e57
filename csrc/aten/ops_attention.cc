// scaled_dot_product_attention on tpu takes PyTorch's math path: matmuls and
// softmax that each run on the chip (and follow the matmul precision), as an
// XLA lowering of attention does, rather than a host-specific fused kernel.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace torch_tpu {
namespace {

constexpr int64_t kSdpMath = 0;  // sdp::SDPBackend::math

int64_t fused_sdp_choice_tpu(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                             double, bool, std::optional<double>, bool) {
  return kSdpMath;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice_tpu)); }

}  // namespace
}  // namespace torch_tpu
