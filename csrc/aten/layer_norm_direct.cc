// native_layer_norm's CPU kernel called into HBM results (see layer_norm_into_hbm).
//
// ATen's DispatchStub declarations depend on the CPU capabilities torch was built with; x86-64
// wheels define AVX2 and AVX512 kernels, so the stub's call path links only with both declared.
// Elsewhere the generic path (CPU's wrapper, then a copy) runs.
#if defined(__x86_64__)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#define TORCH_TPU_LAYER_NORM_STUB 1
#else
#define TORCH_TPU_LAYER_NORM_STUB 0
#endif
#include <ATen/native/layer_norm.h>
#include <c10/util/accumulate.h>

#include "aten/fallback_internal.h"

namespace torch_tpu {

// Queued float32/float64 calls (whose meta results agree with CPU's): the kernel CPU's
// layer_norm_cpu calls, with the same M and N, instead of CPU's wrapper into host temporaries
// that are then copied into HBM.
bool layer_norm_into_hbm(const torch::jit::Stack& cpu, const std::vector<TensorRecipe>& fresh, AliasBuilder& host) {
#if !TORCH_TPU_LAYER_NORM_STUB
  return false;
#else
  const at::Tensor& x = cpu[0].toTensor();
  const auto normalized = cpu[1].toDimVector();
  const at::Tensor gamma = cpu[2].isTensor() ? cpu[2].toTensor() : at::Tensor();
  const at::Tensor beta = cpu[3].isTensor() ? cpu[3].toTensor() : at::Tensor();
  if (fresh.size() != 3 || x.numel() == 0 || !x.is_contiguous() || normalized.empty() ||
      static_cast<size_t>(x.dim()) < normalized.size())
    return false;
  for (const at::Tensor& p : {gamma, beta}) {
    if (p.defined() && (!p.is_contiguous() || p.scalar_type() != x.scalar_type())) return false;
  }
  const int64_t n = c10::multiply_integers(normalized);
  const int64_t m = x.numel() / n;
  at::Tensor y = host.alias(fresh[0]), mean = host.alias(fresh[1]), rstd = host.alias(fresh[2]);
  if (!y.is_contiguous() || !mean.is_contiguous() || !rstd.is_contiguous() || mean.numel() != m) return false;
  at::native::LayerNormKernel(c10::kCPU, x, gamma, beta, m, n, cpu[4].toDouble(), &y, &mean, &rstd);
  return true;
#endif
}

}  // namespace torch_tpu
