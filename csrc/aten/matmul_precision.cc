#include "aten/matmul_precision.h"

#include <ATen/ThreadLocalPythonObjects.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <unordered_map>

#include "aten/host_matmul.h"
#include "vtpu/env.h"

namespace torch_tpu {
namespace {

// The key of the override in at::impl::ThreadLocalPythonObjects.
const std::string& override_key() {
  static const std::string key = "torch_tpu.matmul_precision";
  return key;
}

// Leaked on purpose: a token must outlive every thread-local copy of the
// state, and its destructor would touch Python after the interpreter ends.
std::array<std::shared_ptr<c10::SafePyObject>, 3>* tokens = nullptr;
// No override was ever set: the per-op read is one atomic load.
std::atomic<bool> override_used{false};

constexpr std::array<at::Float32MatmulPrecision, 3> kPrecisions = {
    at::Float32MatmulPrecision::HIGHEST, at::Float32MatmulPrecision::HIGH, at::Float32MatmulPrecision::MEDIUM};

size_t token_index(at::Float32MatmulPrecision precision) {
  for (size_t i = 0; i < kPrecisions.size(); ++i)
    if (kPrecisions[i] == precision) return i;
  TORCH_CHECK_VALUE(false, "matmul precision: unknown value ", static_cast<int>(precision));
}

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

bool is_tensor_of(const c10::IValue& v, at::ScalarType dtype) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == dtype;
}

bool is_f32(const c10::IValue& v) { return is_tensor_of(v, at::kFloat); }

at::Tensor round_to_bf16(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

// Runs `op` with its operands (and additive term) of dtype `narrow` widened to `wide`, rounding
// the result once back to `narrow`. `stack` holds the arguments and gets the returns, as with
// callBoxed; `written` is the out= argument or, in place, self (-1: none).
void call_widened(const c10::OperatorHandle& op, torch::jit::Stack* stack, const Operands& ops, int written,
                  at::ScalarType narrow, at::ScalarType wide) {
  torch::jit::Stack widened = *stack;
  for (int i : {ops.a, ops.b, ops.additive}) {
    if (i >= 0 && is_tensor_of(widened[i], narrow)) widened[i] = widened[i].toTensor().to(wide);
  }
  const bool out = written >= 0 && written != ops.additive;
  if (out) widened[written] = at::empty({0}, widened[written].toTensor().options().dtype(wide));
  op.callBoxed(&widened);
  at::Tensor result = widened[0].toTensor().to(narrow);
  if (written >= 0) {
    at::Tensor target = (*stack)[written].toTensor();
    if (out && !target.sizes().equals(result.sizes())) target.resize_(result.sizes());
    target.copy_(result);
    result = target;
  }
  stack->clear();
  stack->push_back(std::move(result));
}

bool is_half(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

// CPU's blocked attention: where its query is, and how many leading returns are in the inputs'
// dtype (the forward's row log-sum-exp is float32 whatever the inputs). Null: another op.
struct AttentionArgs {
  int query;
  int narrow_returns;
};
const AttentionArgs* attention_args(const c10::OperatorHandle& op) {
  static const AttentionArgs forward{0, 1}, backward{1, 3};
  const std::string& name = op.schema().name();
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu") return &forward;
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward") return &backward;
  return nullptr;
}

// Runs CPU's blocked attention (forward or backward) over its half tensors widened to float32,
// rounding the half-typed results once back. False: not such a call.
bool call_attention_widened(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!widening_half_products()) return false;
  const AttentionArgs* args = attention_args(op);
  if (args == nullptr || !(*stack)[args->query].isTensor()) return false;
  const at::ScalarType narrow = (*stack)[args->query].toTensor().scalar_type();
  if (!is_half(narrow)) return false;
  for (c10::IValue& v : *stack) {
    if (is_tensor_of(v, narrow)) v = v.toTensor().to(at::kFloat);
  }
  op.callBoxed(stack);
  for (int i = 0; i < args->narrow_returns; ++i) (*stack)[i] = (*stack)[i].toTensor().to(narrow);
  return true;
}

}  // namespace

// ATen's CPU kernels for bf16 and fp16 products are fast only with AVX-512 (oneDNN); on an AVX2
// host they fall back to a scalar loop that runs 100-200x slower than float32 GEMM
// ([2048, 512] x [512, 2048] bf16: 8.5 s against 42 ms). The MXU multiplies bf16 inputs exactly
// and accumulates in float32, which a float32 GEMM over the widened inputs does too.
// Opt-in (TORCH_TPU_WIDEN_HALF_PRODUCTS=1): CPU eager's half kernels round partial sums of some
// products (addbmm, transposed convolution) to the half type, so widened results differ from CPU's.
bool widening_half_products() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool widen =
      !__builtin_cpu_supports("avx512bw") && vtpu::env_flag("TORCH_TPU_WIDEN_HALF_PRODUCTS", false);
  return widen;
#else
  return false;
#endif
}

bool widens_half_product(const at::Tensor& a, const at::Tensor& b) {
  return is_half(a.scalar_type()) && b.scalar_type() == a.scalar_type() && widening_half_products();
}

bool is_matmul_family(const c10::OperatorHandle& op) { return operands_of(op) != nullptr; }

std::optional<at::Float32MatmulPrecision> matmul_precision_override() {
  if (!override_used.load(std::memory_order_acquire) || tokens == nullptr) return std::nullopt;
  if (!at::impl::ThreadLocalPythonObjects::contains(override_key())) return std::nullopt;
  const c10::SafePyObject* token = at::impl::ThreadLocalPythonObjects::get(override_key()).get();
  for (size_t i = 0; i < kPrecisions.size(); ++i)
    if ((*tokens)[i].get() == token) return kPrecisions[i];
  return std::nullopt;  // another object under our key: not ours to interpret
}

at::Float32MatmulPrecision global_matmul_precision() {
  const at::Context& context = at::globalContext();
  const auto rank = [](at::Float32Precision p) {
    if (p == at::Float32Precision::BF16) return at::Float32MatmulPrecision::MEDIUM;
    if (p == at::Float32Precision::TF32) return at::Float32MatmulPrecision::HIGH;
    return at::Float32MatmulPrecision::HIGHEST;
  };
  // The enum runs HIGHEST, HIGH, MEDIUM: the larger value is the lower precision.
  return std::max(rank(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL)),
                  rank(context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL)));
}

bool host_float32_products_exact() {
  const at::Context& context = at::globalContext();
  const auto exact = [](at::Float32Precision p) {
    return p == at::Float32Precision::IEEE || p == at::Float32Precision::NONE;
  };
  return exact(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL)) &&
         exact(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::CONV));
}

at::Float32MatmulPrecision effective_matmul_precision() {
  auto local = matmul_precision_override();
  return local ? *local : global_matmul_precision();
}

void set_matmul_precision_override(std::optional<at::Float32MatmulPrecision> precision) {
  if (!precision) {
    if (at::impl::ThreadLocalPythonObjects::contains(override_key()))
      at::impl::ThreadLocalPythonObjects::erase(override_key());
    return;
  }
  TORCH_CHECK(tokens != nullptr, "matmul precision override: tokens not installed");
  override_used.store(true);
  at::impl::ThreadLocalPythonObjects::set(override_key(), (*tokens)[token_index(*precision)]);
}

void set_matmul_precision_tokens(std::array<std::shared_ptr<c10::SafePyObject>, 3> t) {
  if (tokens == nullptr) tokens = new std::array<std::shared_ptr<c10::SafePyObject>, 3>(std::move(t));
}

const char* matmul_precision_name(at::Float32MatmulPrecision precision) {
  switch (precision) {
    case at::Float32MatmulPrecision::HIGHEST:
      return "highest";
    case at::Float32MatmulPrecision::HIGH:
      return "high";
    case at::Float32MatmulPrecision::MEDIUM:
      return "medium";
  }
  return "highest";
}

at::Float32MatmulPrecision parse_matmul_precision(const std::string& name) {
  if (name == "highest") return at::Float32MatmulPrecision::HIGHEST;
  if (name == "high") return at::Float32MatmulPrecision::HIGH;
  if (name == "medium") return at::Float32MatmulPrecision::MEDIUM;
  TORCH_CHECK_VALUE(false, "unknown matmul precision '", name, "'; valid: highest, high, medium");
}

void call_with_matmul_precision(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                at::Float32MatmulPrecision precision) {
  const Operands* ops = operands_of(op);
  if (!ops) {
    if (!call_attention_widened(op, stack)) op.callBoxed(stack);
    return;
  }
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
  const int written = out_arg >= 0 ? out_arg : (in_place ? 0 : -1);
  const c10::IValue& a_arg = (*stack)[ops->a];
  const c10::IValue& b_arg = (*stack)[ops->b];
  if (a_arg.isTensor() && a_arg.toTensor().defined() && is_tensor_of(b_arg, a_arg.toTensor().scalar_type()) &&
      widens_half_product(a_arg.toTensor(), b_arg.toTensor())) {
    return call_widened(op, stack, *ops, written, a_arg.toTensor().scalar_type(), at::kFloat);
  }
  if (!is_f32(a_arg) || !is_f32(b_arg)) {
    op.callBoxed(stack);
    return;
  }
  if (precision == at::Float32MatmulPrecision::HIGHEST) {
    // Read now, on the thread that runs the kernel: what ATen's CPU kernel will do.
    if (host_float32_products_exact()) {
      if (!call_mm_out_in_faster_order(op, stack)) op.callBoxed(stack);
    } else {
      // ATen's kernel may itself round: under mkldnn's "bf16" (a global "medium" and a
      // torch.tpu.precision(HIGHEST) block), oneDNN computes float32 products on CPUs with bf16
      // units in bf16.
      call_widened(op, stack, *ops, written, at::kFloat, at::kDouble);
    }
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
