// Module.to("tpu") converts parameters in place (param.data = converted), as
// for CUDA, so Parameter objects keep their identity and tied weights stay
// tied. c10's built-in check only knows CPU/CUDA/MPS/HIP/XPU/HPU as dense
// backends and would make Module._apply create new (untied) Parameters.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace torch_tpu {
namespace {

bool is_dense_strided(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
         (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
}

bool has_compatible_shallow_copy_type_tpu(const at::Tensor& self, const at::Tensor& from) {
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (is_dense_strided(self) && is_dense_strided(from));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type_tpu));
}

}  // namespace
}  // namespace torch_tpu
