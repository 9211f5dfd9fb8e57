#include "aten/op_info.h"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "aten/matmul_precision.h"
#include "runtime/device.h"

namespace torch_tpu {
namespace {

ReturnAlias return_alias(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* r = alias_of(schema.returns()[ret]);
  if (!r || r->beforeSets().empty()) return {};
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = alias_of(schema.arguments()[i]);
    if (a && a->beforeSets() == r->beforeSets()) return {static_cast<int>(i), r->isWrite()};
  }
  return {};
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns()) {
    const auto& type = r.type();
    if (type->kind() == c10::TypeKind::TensorType) continue;
    if (type->kind() == c10::TypeKind::ListType && type->containedType(0)->kind() == c10::TypeKind::TensorType) {
      continue;
    }
    return false;
  }
  return true;
}

// The out= overload of a functional op: same arguments followed by one
// kwarg-only Tensor(a!) per return ("add.Tensor" -> "add.out"; "mean" -> "mean.dtype_out",
// "sum.dim_IntList" -> "sum.IntList_out"). Cached.
std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const std::string& overload = schema.overload_name();
  std::vector<std::string> names = {overload.empty() ? std::string("out") : overload + "_out", "out", "dtype_out"};
  if (overload.rfind("dim_", 0) == 0) names.push_back(overload.substr(4) + "_out");
  for (const std::string& name : names) {
    auto handle = c10::Dispatcher::singleton().findOp({schema.name(), name});
    if (!handle) continue;
    const auto& out = handle->schema();
    const size_t n = schema.arguments().size(), r = schema.returns().size();
    if (out.arguments().size() != n + r || out.returns().size() != r) continue;
    bool same = true;
    for (size_t i = 0; i < n && same; ++i) {
      same = out.arguments()[i].name() == schema.arguments()[i].name() &&
             *out.arguments()[i].type() == *schema.arguments()[i].type();
    }
    for (size_t i = n; i < n + r && same; ++i) {
      const auto* a = out.arguments()[i].alias_info();
      same = a && a->isWrite() && out.arguments()[i].kwarg_only() &&
             out.arguments()[i].type()->kind() == c10::TypeKind::TensorType;
    }
    if (same) return handle;
  }
  return std::nullopt;
}

OpInfo* build(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  auto* info = new OpInfo;
  info->label = op_label(schema);
  info->sparse = info->label.find("sparse") != std::string::npos;
  info->returns_only_tensors = returns_only_tensors(schema);
  for (size_t r = 0; r < schema.returns().size(); ++r) info->returns.push_back(return_alias(schema, r));
  for (const auto& a : schema.arguments()) info->writes_args |= (alias_of(a) && alias_of(a)->isWrite());
  for (const auto& a : schema.arguments()) {
    const auto* list = a.type()->castRaw<c10::ListType>();
    const auto* elem = list ? list->getElementType()->castRaw<c10::OptionalType>() : nullptr;
    info->has_optional_tensor_list |= elem && elem->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  info->matmul = is_matmul_family(op);
  info->pointwise = op.hasTag(at::Tag::pointwise);
  // Ops whose meta kernels disagree with their CPU kernels (output dtypes or
  // shapes), or whose CPU out= kernels resize or re-stride their outputs:
  // they run synchronously on the CPU kernel's own results.
  static const std::unordered_set<std::string> meta_disagrees = {"aten::native_batch_norm",
                                                                 "aten::native_layer_norm",  // bf16 mean/rstd
                                                                 "aten::_native_batch_norm_legit",
                                                                 "aten::_native_batch_norm_legit_no_training",
                                                                 "aten::_batch_norm_with_update",
                                                                 "aten::_batch_norm_no_update",
                                                                 "aten::huber_loss",
                                                                 "aten::binary_cross_entropy",
                                                                 "aten::_embedding_bag",
                                                                 "aten::_embedding_bag_forward_only",
                                                                 "aten::max_unpool2d",
                                                                 "aten::max_unpool3d",
                                                                 "aten::mkldnn_rnn_layer"};  // empty workspace
  if (meta_disagrees.count(schema.name())) info->no_meta = info->meta_disagrees = true;
  const std::string& name = schema.name();
  if (name == "aten::arange" || name == "aten::linspace" || name == "aten::logspace") {
    info->meta_check = OpInfo::MetaCheck::kFactoryOut;
  }
  if (name == "aten::nansum") info->meta_check = OpInfo::MetaCheck::kEmptyDims;
  // Its meta kernel's mean/rstd dtypes differ only for reduced-precision or mixed-dtype calls:
  // float32/float64 ones are queued like other ops (meta_disagrees_here).
  if (name == "aten::native_layer_norm") {
    info->no_meta = false;
    info->meta_check = OpInfo::MetaCheck::kLayerNormDtype;
  }
  // Its meta kernel agrees with CPU's for float32 training calls on dense or channels-last
  // input (compared over 4184 random shapes and layouts; see meta_disagrees_here):
  // those are queued, the rest run synchronously.
  if (name == "aten::native_batch_norm") {
    info->no_meta = false;
    info->meta_check = OpInfo::MetaCheck::kBatchNormTraining;
  }
  if (name == "aten::native_batch_norm_backward") info->meta_check = OpInfo::MetaCheck::kBatchNormBackwardMask;
  if (name == "aten::native_group_norm") info->meta_check = OpInfo::MetaCheck::kGroupNormDtype;
  // CPU kernels that allocate their results (no out= overload, or a generated out= wrapper that
  // copies) and keep none of their tensors: offered the HBM results' memory.
  static const std::unordered_set<std::string> offers = {"aten::convolution",
                                                         "aten::convolution_backward",
                                                         "aten::relu",
                                                         "aten::flip",
                                                         "aten::roll",
                                                         "aten::native_group_norm",
                                                         "aten::native_group_norm_backward",
                                                         "aten::native_layer_norm_backward"};
  info->offer_results = offers.count(name) > 0;
  info->quantized = name.rfind("aten::quantize_per", 0) == 0 || name.rfind("aten::_make_per_", 0) == 0 ||
                    name == "aten::_empty_affine_quantized" || name == "aten::_empty_per_channel_affine_quantized";
  // Out= overloads whose CPU kernels resize the out tensor to the unreduced shape before
  // reducing into it: handed a 0-d out of the right shape they print PyTorch's "An output with
  // one or more elements was resized" warning, which the functional kernel does not.
  static const std::unordered_set<std::string> out_resizes = {"aten::mse_loss", "aten::smooth_l1_loss"};
  if (!out_resizes.count(name)) info->out_variant = find_out_variant(op);
  return info;
}

}  // namespace

std::string op_label(const c10::FunctionSchema& schema) {
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  return name;
}

const c10::AliasInfo* alias_of(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info && info->beforeSets().empty() && !info->containedTypes().empty()) {
    return &info->containedTypes()[0];  // Tensor(a)[]
  }
  return info;
}

bool is_generator_arg(const c10::Argument& a) {
  auto type = a.type();
  if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
  return type->kind() == c10::TypeKind::GeneratorType;
}

c10::IValue map_device(const c10::IValue& v, c10::DeviceType to) {
  if (v.isDevice() && v.toDevice().type() == kTPU) return c10::IValue(c10::Device(to));
  return v;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  // A lock-free per-thread map in front of the shared one.
  thread_local std::unordered_map<const void*, const OpInfo*> local;
  const void* key = &op.schema();
  auto it = local.find(key);
  if (it != local.end()) return *it->second;
  static std::mutex mu;
  static std::unordered_map<const void*, std::unique_ptr<OpInfo>> shared;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = shared[key];
  if (!slot) slot.reset(build(op));
  local.emplace(key, slot.get());
  return *slot;
}

}  // namespace torch_tpu
