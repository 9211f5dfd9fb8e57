// Pieces of the op fallback shared between its strict path (fallback.cc) and
// debug mode (debug_mode.cc).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

#include "aten/portability.h"
#include "runtime/device.h"
#include "runtime/host_alias.h"
#include "vtpu/cost_model.h"

namespace torch_tpu {

// The device the op runs on and a check that its tensors agree about it.
class DeviceCheck {
 public:
  explicit DeviceCheck(const std::string& op) : op_(op) {}
  // `written`: an out= or in-place argument, which must be on the device even when 0-d.
  void tensor(const at::Tensor& t, bool host_allowed, bool written = false) {
    if (!t.defined()) return;
    // A Python number's wrapped tensor (float64 for `x * 2.0`) takes the other operand's dtype.
    if (unsupported_on_tpu(t.scalar_type()) && !noted_ && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
      note_unsupported(op_, t.scalar_type());
      noted_ = true;
    }
    if (t.device().type() == kTPU) {
      if (index_ < 0) {
        index_ = t.device().index();
      } else if (t.device().index() != index_) {
        TORCH_CHECK(false,
                    "Expected all tensors to be on the same device, but found at least two "
                    "devices, tpu:",
                    static_cast<int>(index_), " and ", t.device(), "! (in ", op_, ")");
      }
      return;
    }
    // Host scalars mix with device tensors as inputs, as with CUDA; index lists may be on the host.
    if (t.device().is_cpu() && !written && (t.dim() == 0 || host_allowed)) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu and ",
                t.device(), "! (in ", op_, ": argument of shape ", t.sizes(), " and dtype ", t.scalar_type(), " is on ",
                t.device(), ")");
  }
  void device(const c10::Device& d) {
    if (d.type() == kTPU && index_ < 0) index_ = resolve_index(d.has_index() ? d.index() : -1);
  }
  c10::DeviceIndex index() const { return index_ < 0 ? current_device() : index_; }

 private:
  const std::string& op_;
  c10::DeviceIndex index_ = -1;
  bool noted_ = false;
};

// Synchronous path: waits for the chip, runs the CPU kernel on host aliases
// on the calling thread, and leaves tpu results on the stack.
void run_now(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label);

// Strict mode's synchronous first call per signature (TORCH_TPU_VALIDATE_FIRST_CALL).
void set_validate_first_calls(bool on);
bool validating_first_calls();

// The boxed fallback every tpu op without a native kernel goes through.
void tpu_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// What one strict call of the boxed fallback did, for the unboxed fast kernels (fast_ops.cc),
// which take over a signature once the fallback has queued it this way. Filled only by the
// strict path's queued (asynchronous) outcome; `queued` stays false for anything else (a
// synchronous run, a dry run, meta warnings, an uncached signature, a custom cost function).
struct StrictCapture {
  const c10::FunctionSchema* op = nullptr;  // the op it describes
  bool queued = false;
  bool out_variant = false;  // the CPU kernel ran as the op's out= overload into a fresh result
  bool validated = false;    // its signature passed the first-call validation (or that is off)
  vtpu::OpCost cost;         // the cost recorded for it, with its roofline estimates
  vtpu::CostEstimates estimates;
};
// The next strict_fallback call on this thread reports into `capture` (and clears this).
void capture_next_strict_call(StrictCapture* capture);

// The ops with unboxed strict-mode kernels in fast_ops.cc ("aten::add.Tensor", ...): their
// PrivateUse1 kernel is that one (fusible_ops.cc registers the others).
const std::vector<std::string>& fast_op_labels();
// How many calls on this thread took a kept signature of those kernels (tests, profiling).
uint64_t fast_kept_calls();

// A host tensor's contents as a recipe over a fresh host buffer (one memcpy), or an empty
// recipe (no storage) where that does not apply (see fallback.cc).
TensorRecipe dense_host_snapshot(const at::Tensor& t);

// native_layer_norm written by CPU's own kernel straight into its HBM results `fresh`
// (output, mean, rstd) over the host stack `cpu` (layer_norm_direct.cc). False, with nothing
// done, when the call needs CPU's wrapper (non-contiguous input or parameters, no elements).
bool layer_norm_into_hbm(const torch::jit::Stack& cpu, const std::vector<TensorRecipe>& fresh, AliasBuilder& host);

// Debug mode: runs `op` synchronously with bounds / NaN checks; errors carry
// the op, its arguments and the Python source line.
void debug_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label);

}  // namespace torch_tpu
