#include "aten/matmul_precision.h"

#include <ATen/ops/empty.h>

#include <string>
#include <unordered_map>

namespace torch_tpu {
namespace {

// Argument positions: the two matrix operands and the additive term (bias or
// `self` scaled by beta), which the extra passes of `high` must not repeat.
struct Operands {
  int a, b;
  int additive;  // -1: none
  bool is_bias;  // additive is an optional bias (pass None) rather than beta (pass 0)
  int beta;      // position of beta, when !is_bias
};

const Operands* operands_of(const c10::OperatorHandle& op) {
  static const std::unordered_map<std::string, Operands> table = {
      {"aten::mm", {0, 1, -1, false, -1}},        {"aten::bmm", {0, 1, -1, false, -1}},
      {"aten::mv", {0, 1, -1, false, -1}},        {"aten::dot", {0, 1, -1, false, -1}},
      {"aten::addmm", {1, 2, 0, false, 3}},       {"aten::baddbmm", {1, 2, 0, false, 3}},
      {"aten::addbmm", {1, 2, 0, false, 3}},      {"aten::addmv", {1, 2, 0, false, 3}},
      {"aten::convolution", {0, 1, 2, true, -1}},
  };
  auto it = table.find(op.schema().name());
  return it == table.end() ? nullptr : &it->second;
}

bool is_f32(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == at::kFloat;
}

at::Tensor round_to_bf16(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

}  // namespace

bool is_matmul_family(const c10::OperatorHandle& op) { return operands_of(op) != nullptr; }

void call_with_matmul_precision(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                at::Float32MatmulPrecision precision) {
  const Operands* ops = operands_of(op);
  // out= overloads (what structured kernels reach) name their result
  // argument; other writing overloads (addmm_) are in-place.
  const auto& args = op.schema().arguments();
  int out_arg = -1;
  bool in_place = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) {
      if (args[i].kwarg_only()) {
        out_arg = static_cast<int>(i);
      } else {
        in_place = true;
      }
    }
  }
  if (!ops || precision == at::Float32MatmulPrecision::HIGHEST || !is_f32((*stack)[ops->a]) ||
      !is_f32((*stack)[ops->b])) {
    op.callBoxed(stack);
    return;
  }
  const at::Tensor a = (*stack)[ops->a].toTensor(), b = (*stack)[ops->b].toTensor();
  const at::Tensor a_hi = round_to_bf16(a), b_hi = round_to_bf16(b);
  if (precision == at::Float32MatmulPrecision::MEDIUM || in_place) {
    (*stack)[ops->a] = a_hi;
    (*stack)[ops->b] = b_hi;
    op.callBoxed(stack);
    return;
  }
  // HIGH: the two correction passes carry no additive term.
  const at::Tensor a_lo = round_to_bf16(a.sub(a_hi)), b_lo = round_to_bf16(b.sub(b_hi));
  torch::jit::Stack correction = *stack;
  if (ops->additive >= 0) {
    if (ops->is_bias) {
      correction[ops->additive] = c10::IValue();
    } else {
      correction[ops->beta] = c10::IValue(0);
    }
  }
  if (out_arg >= 0) {
    const at::Tensor& out = correction[out_arg].toTensor();
    correction[out_arg] = at::empty({0}, out.options());
  }
  torch::jit::Stack second = correction;
  if (out_arg >= 0) second[out_arg] = at::empty({0}, second[out_arg].toTensor().options());
  correction[ops->a] = a_hi;
  correction[ops->b] = b_lo;
  second[ops->a] = a_lo;
  second[ops->b] = b_hi;
  op.callBoxed(&correction);
  op.callBoxed(&second);
  (*stack)[ops->a] = a_hi;
  (*stack)[ops->b] = b_hi;
  op.callBoxed(stack);
  (*stack)[0].toTensor().add_(correction[0].toTensor().add(second[0].toTensor()));
}

}  // namespace torch_tpu
