// What the fallback needs to know about an operator's schema, computed once
// per operator and cached: its label, which returns alias which arguments,
// whether it has an out= overload, whether it has a meta kernel.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "aten/op_cost.h"

namespace torch_tpu {

// Which argument a return aliases (-1: a fresh tensor), and whether it writes.
struct ReturnAlias {
  int arg = -1;
  bool write = false;
};

struct OpInfo {
  std::string label;                 // "aten::add.Tensor"
  bool sparse = false;               // a sparse-layout op: not supported on tpu
  bool returns_only_tensors = true;  // else the host needs its results now
  std::vector<ReturnAlias> returns;
  bool writes_args = false;  // in-place or out= arguments
  bool matmul = false;       // follows the float32 matmul precision
  bool pointwise = false;    // ATen's `pointwise` tag: outputs never depend on a double's value
  // "add.Tensor" -> "add.out": same arguments plus one kwarg-only Tensor(a!)
  // per return, so the CPU kernel can write straight into HBM.
  std::optional<c10::OperatorHandle> out_variant;
  // Learned on first use: no meta kernel, so the op runs synchronously.
  mutable std::atomic<bool> no_meta{false};
  // Its meta kernel exists but disagrees with the CPU kernel (so no_meta is set): a dry
  // run, which has no CPU results, still takes shapes from it.
  bool meta_disagrees = false;
  // Some calls' meta kernels disagree with the CPU kernel: those run synchronously
  // (kFactoryOut: arange/linspace/logspace into a shaped out=; kEmptyDims: nansum(dim=[]);
  // kLayerNormDtype, kBatchNormTraining: all but the calls queued in meta_disagrees_here;
  // kBatchNormBackwardMask: no grad_input asked for, which the meta kernel returns anyway;
  // kGroupNormDtype: parameters of another dtype, CPU's mean/rstd float32 where the meta's are not).
  enum class MetaCheck {
    kNone,
    kFactoryOut,
    kEmptyDims,
    kLayerNormDtype,
    kBatchNormTraining,
    kBatchNormBackwardMask,
    kGroupNormDtype
  } meta_check = MetaCheck::kNone;
  bool quantized = false;                 // creates quantized tensors: NotImplementedError at the call
  bool has_optional_tensor_list = false;  // a Tensor?[] argument (index lists)
  // Its CPU kernel allocates its results and keeps none of its tensors past the call (the
  // convolutions, relu, flip, roll): they are offered the HBM results' memory
  // (runtime/host_result_offer.h).
  bool offer_results = false;
  CustomCostCheck custom_cost;  // has(schema name): priced by a custom function
};

// Thread-safe; the reference stays valid for the life of the process.
const OpInfo& op_info(const c10::OperatorHandle& op);

std::string op_label(const c10::FunctionSchema& schema);
// The alias annotation of an argument or return (element's, for Tensor(a)[]).
const c10::AliasInfo* alias_of(const c10::Argument& a);
bool is_generator_arg(const c10::Argument& a);
// A tpu device argument as `to` (CPU for host kernels, Meta for meta kernels).
c10::IValue map_device(const c10::IValue& v, c10::DeviceType to);

}  // namespace torch_tpu
