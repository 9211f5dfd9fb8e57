// Kernels that route the fusible ops to the tpu fallback, where
// defer_and_fuse may record them.
//
// Without them most fusible functional ops would not reach the fallback as
// themselves: PyTorch's CompositeExplicitAutograd(NonFunctional) kernels
// allocate the result (in HBM) and call the out= overload, which leaves
// nothing to defer. With them, strict and debug modes run the functional op
// through the same fallback (which uses the out= overload on the chip).
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <algorithm>

#include "aten/fallback_internal.h"
#include "aten/op_info.h"
#include "defer/defer.h"
#include "defer/lower.h"
#include "runtime/eager_mode.h"

namespace torch_tpu {
namespace {

// Offers a natively implemented op to the recorder; true if recorded.
template <typename... Args>
bool try_record(const char* name, at::Tensor* result, Args&&... args) {
  if (eager_mode() != EagerMode::kDeferAndFuse) return false;
  static thread_local std::unordered_map<const char*, c10::OperatorHandle> handles;
  auto it = handles.find(name);
  if (it == handles.end()) it = handles.emplace(name, c10::Dispatcher::singleton().findSchemaOrThrow(name, "")).first;
  torch::jit::Stack stack;
  torch::jit::push(stack, std::forward<Args>(args)...);
  if (!defer_record(it->second, &stack, op_info(it->second))) return false;
  *result = stack.back().toTensor();
  return true;
}

// _to_copy and clone keep their composite kernels (empty + copy_) outside
// defer_and_fuse: they also serve device-to-host copies.
at::Tensor to_copy_tpu(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                       std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                       std::optional<at::MemoryFormat> memory_format) {
  at::Tensor out;
  if ((!device || device->type() == c10::DeviceType::PrivateUse1) &&
      try_record("aten::_to_copy", &out, self, dtype, layout, device, pin_memory, non_blocking, memory_format)) {
    return out;
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

at::Tensor clone_tpu(const at::Tensor& self, std::optional<at::MemoryFormat> memory_format) {
  at::Tensor out;
  if (try_record("aten::clone", &out, self, memory_format)) return out;
  return at::native::clone(self, memory_format);
}

// ATen's CPU kernel (native_dropout_cpu) composed of tpu ops, so that the
// mask is drawn from the chip's generator (ATen's kernel would draw from the
// CPU's default generator, on the chip's worker thread) and, in
// defer_and_fuse, fuses: the mask is recorded (bernoulli.p draws it when the
// region runs, as strict mode's bernoulli_ would) and reaches HBM only if
// something keeps it (autograd's saved mask).
std::tuple<at::Tensor, at::Tensor> native_dropout_tpu(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  const double p1m = 1. - p;
  const double scale = p1m == 0 ? 0. : 1. / p1m;  // ATen's guard against p == 1
  if (eager_mode() == EagerMode::kDeferAndFuse) {
    // x * m equals x * bool(m): the mask's dtype does not change the result.
    at::Tensor m = at::bernoulli(input, p1m);
    return {input.mul(m).mul_(scale), m.to(at::kBool)};
  }
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(p1m);
  return {input.mul(mask).mul_(scale), mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const std::string& label : defer::fusible_op_labels()) {
    const std::string qualified = label.substr(0, label.find('.'));
    const std::string overload = label.find('.') == std::string::npos ? "" : label.substr(label.find('.') + 1);
    if (qualified == "aten::_to_copy" || qualified == "aten::clone") continue;
    const auto& fast = fast_op_labels();  // their unboxed kernels hand other modes to the fallback
    if (std::find(fast.begin(), fast.end(), label) != fast.end()) continue;
    auto handle = c10::Dispatcher::singleton().findOp({qualified, overload});
    // Composite-implicit ops decompose into fusible ones (a backend kernel
    // would bypass their autograd formula); native tpu kernels stay.
    if (!handle || handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    m.impl(label.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_boxed_fallback>());
  }
  m.impl("_to_copy", TORCH_FN(to_copy_tpu));
  m.impl("clone", TORCH_FN(clone_tpu));
  m.impl("native_dropout", TORCH_FN(native_dropout_tpu));
}

}  // namespace torch_tpu
