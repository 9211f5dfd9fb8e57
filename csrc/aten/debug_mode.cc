// Debug eager mode: every op synchronous, index bounds and NaN/Inf checks.
#include <ATen/ops/empty.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "aten/fallback_internal.h"
#include "runtime/eager_mode.h"
#include "runtime/host_alias.h"

namespace torch_tpu {
namespace {

using c10::IValue;

std::string describe(const IValue& v) {
  std::ostringstream out;
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) {
      out << "None";
      return;
    }
    out << c10::toString(t.scalar_type()) << t.sizes() << " " << t.device();
  };
  if (v.isTensor()) {
    tensor(v.toTensor());
  } else if (v.isTensorList()) {
    const char* sep = "";
    out << "[";
    for (const at::Tensor& t : v.toTensorList()) out << sep, tensor(t), sep = ", ";
    out << "]";
  } else if (v.isOptionalTensorList()) {
    const char* sep = "";
    out << "[";
    for (const auto& e : v.toOptionalTensorList()) {
      std::optional<at::Tensor> t = e;
      out << sep;
      tensor(t.has_value() ? *t : at::Tensor());
      sep = ", ";
    }
    out << "]";
  } else {
    out << v;
  }
  return out.str();
}

std::string signature(const std::string& label, const std::vector<IValue>& args) {
  std::string s = label + "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + describe(args[i]);
  return s + ")";
}

// First index outside [low, high) of an integer index tensor, if any.
std::optional<int64_t> out_of_range(const at::Tensor& index, int64_t low, int64_t high) {
  if (!index.defined() || index.numel() == 0 || !c10::isIntegralType(index.scalar_type(), false)) {
    return std::nullopt;
  }
  at::Tensor host = index.device().type() == kTPU ? host_alias(index) : index;
  at::Tensor bad = host.lt(low).logical_or(host.ge(high));
  if (!bad.any().item<bool>()) return std::nullopt;
  return host.flatten().index({bad.flatten()})[0].item<int64_t>();
}

// Bounds of the index ops docs/eager-modes.md lists (debug); the chip has been synchronized.
void check_index_bounds(const std::string& name, const std::vector<IValue>& args) {
  auto tensor = [&](size_t i) { return i < args.size() && args[i].isTensor() ? args[i].toTensor() : at::Tensor(); };
  auto dim_size = [](const at::Tensor& t, int64_t dim) {
    return t.dim() == 0 ? 1 : t.size(c10::maybe_wrap_dim(dim, t.dim()));
  };
  auto fail = [&](int64_t bad, int64_t size, const std::string& what) {
    TORCH_CHECK_INDEX(false, name, ": index ", bad, " is out of bounds for ", what, " with size ", size);
  };
  if (name == "aten::index_select" || name == "aten::gather" || name == "aten::scatter" ||
      name == "aten::scatter_add" || name == "aten::scatter_reduce") {
    const at::Tensor self = tensor(0), index = tensor(2);
    if (!self.defined() || !args[1].isInt()) return;
    const int64_t dim = args[1].toInt();
    const int64_t size = dim_size(self, dim);
    if (auto bad = out_of_range(index, 0, size)) fail(*bad, size, "dimension " + std::to_string(dim));
  } else if (name == "aten::embedding") {
    const at::Tensor weight = tensor(0), indices = tensor(1);
    if (weight.defined() && weight.dim() > 0) {
      if (auto bad = out_of_range(indices, 0, weight.size(0))) fail(*bad, weight.size(0), "embedding rows");
    }
  } else if (name == "aten::embedding_dense_backward") {
    // (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    if (args.size() > 2 && args[2].isInt()) {
      const int64_t rows = args[2].toInt();
      if (auto bad = out_of_range(tensor(1), 0, rows)) fail(*bad, rows, "embedding rows");
    }
  } else if (name == "aten::take") {
    const at::Tensor self = tensor(0);
    if (auto bad = out_of_range(tensor(1), -self.numel(), self.numel()))
      fail(*bad, self.numel(), "the flattened input");
  } else if (name == "aten::index" || name == "aten::index_put" || name == "aten::_index_put_impl" ||
             name == "aten::index_put_") {
    const at::Tensor self = tensor(0);
    if (!self.defined() || args.size() < 2 || !args[1].isOptionalTensorList()) return;
    int64_t dim = 0;
    for (const auto& e : args[1].toOptionalTensorList()) {
      std::optional<at::Tensor> idx = e;
      if (idx.has_value() && idx->defined() && (idx->scalar_type() == at::kBool || idx->scalar_type() == at::kByte)) {
        dim += idx->dim();
        continue;
      }
      if (idx.has_value() && idx->defined() && dim < self.dim()) {
        const int64_t size = self.size(dim);
        if (auto bad = out_of_range(*idx, -size, size)) fail(*bad, size, "dimension " + std::to_string(dim));
      }
      ++dim;
    }
  }
}

void check_results_finite(const std::string& label, const torch::jit::Stack& stack, size_t num_returns) {
  for (size_t r = stack.size() - num_returns; r < stack.size(); ++r) {
    auto check = [&](const at::Tensor& t) {
      if (!t.defined() || !c10::isFloatingType(t.scalar_type()) || t.numel() == 0) return;
      at::Tensor host = t.device().type() == kTPU ? host_alias(t) : t;
      TORCH_CHECK(host.isfinite().all().item<bool>(), label, " produced NaN or Inf (TORCH_TPU_CHECK_FINITE=1): output ",
                  c10::toString(t.scalar_type()), t.sizes());
    };
    if (stack[r].isTensor()) check(stack[r].toTensor());
    if (stack[r].isTensorList())
      for (const at::Tensor& t : stack[r].toTensorList()) check(t);
  }
}

}  // namespace

// Runs the op synchronously on the calling thread, checking what debug mode
// promises; errors carry the op, its arguments and the Python source line.
void debug_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<IValue> args(stack->end() - num_args, stack->end());
  try {
    DeviceCheck check(label);
    for (const auto& v : args) {
      if (v.isTensor()) check.tensor(v.toTensor(), true);
    }
    synchronize_device(check.index());
    check_index_bounds(schema.name(), args);
    run_now(op, stack, label);
    synchronize_device(check.index());
    if (check_finite()) check_results_finite(label, *stack, schema.returns().size());
  } catch (c10::Error& e) {
    const std::string where = source_line();
    e.add_context("[tpu debug mode] in " + signature(label, args) + (where.empty() ? "" : " at " + where));
    throw;
  }
}

}  // namespace torch_tpu
