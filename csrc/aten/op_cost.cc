#include "aten/op_cost.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

#include "aten/portability.h"
#include "vtpu/layout.h"

namespace torch_tpu {
namespace {

template <typename Fn>
void for_each_tensor(c10::ArrayRef<c10::IValue> args, const Fn& fn) {
  for (const auto& v : args) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) fn(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) fn(t);
    } else if (v.isOptionalTensorList()) {
      for (const auto& e : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = e;
        if (t.has_value() && t->defined()) fn(*t);
      }
    }
  }
}

int passes_for(c10::ScalarType dtype, at::Float32MatmulPrecision precision) {
  if (dtype != at::kFloat) return 1;
  switch (precision) {
    case at::Float32MatmulPrecision::HIGHEST:
      return 6;
    case at::Float32MatmulPrecision::HIGH:
      return 3;
    default:
      return 1;
  }
}

const at::Tensor* tensor_arg(c10::ArrayRef<c10::IValue> args, size_t i) {
  return i < args.size() && args[i].isTensor() && args[i].toTensor().defined() ? &args[i].toTensor() : nullptr;
}

// Products: (a, b) operand positions by op name.
bool product_operands(const std::string& name, size_t* a, size_t* b) {
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::mv" || name == "aten::dot") {
    *a = 0, *b = 1;
    return true;
  }
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm" || name == "aten::addmv") {
    *a = 1, *b = 2;
    return true;
  }
  return false;
}

// flop_counter's conv_flop_count: 2 x batch x prod(weight) x prod(spatial
// extent the kernel slides over: output's, or input's when transposed).
double conv_flops(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& output, bool transposed) {
  const auto& spatial = transposed ? input : output;
  double extent = 1;
  for (int64_t d = 2; d < spatial.dim(); ++d) extent *= spatial.size(d);
  return 2.0 * input.size(0) * static_cast<double>(weight.numel()) * extent;
}

}  // namespace

double causal_pairs(int64_t t, int64_t s, bool causal) {
  if (!causal) return static_cast<double>(t) * static_cast<double>(s);
  // Rows i < t each see keys 0..min(i, s - 1): sum over i of min(i + 1, s).
  const double full = static_cast<double>(std::min(t, s));
  return full * (full + 1) / 2 + static_cast<double>(std::max<int64_t>(0, t - s)) * static_cast<double>(s);
}

double physical_bytes_of(const at::Tensor& t) {
  if (!t.defined()) return 0;
  return static_cast<double>(vtpu::physical_bytes(t.sizes().vec(), t.element_size()));
}

vtpu::OpCost transfer_cost(double bytes_read, double bytes_written) {
  vtpu::OpCost c;
  c.bytes_read = bytes_read;
  c.bytes_written = bytes_written;
  c.flops = 0;
  return c;
}

namespace {
std::mutex custom_costs_mutex;
std::unordered_map<std::string, CustomOpCostFn> custom_costs;
std::atomic<bool> any_custom_cost{false};         // one load on the common path
std::atomic<uint64_t> custom_cost_generation{1};  // bumped by every set_custom_op_cost

CustomOpCostFn custom_cost_of(const std::string& name) {
  if (!any_custom_cost.load(std::memory_order_relaxed)) return {};
  std::lock_guard<std::mutex> lock(custom_costs_mutex);
  auto it = custom_costs.find(name);
  return it == custom_costs.end() ? CustomOpCostFn() : it->second;
}
}  // namespace

void set_custom_op_cost(const std::string& op, CustomOpCostFn fn) {
  std::lock_guard<std::mutex> lock(custom_costs_mutex);
  if (fn) {
    custom_costs[op] = std::move(fn);
  } else {
    custom_costs.erase(op);
  }
  any_custom_cost.store(!custom_costs.empty());
  custom_cost_generation.fetch_add(1, std::memory_order_release);
}

bool CustomCostCheck::has(const std::string& op) const {
  const uint64_t generation = custom_cost_generation.load(std::memory_order_acquire);
  const uint64_t seen = seen_.load(std::memory_order_relaxed);
  if (seen >> 1 == generation) return seen & 1;
  bool found;
  {
    std::lock_guard<std::mutex> lock(custom_costs_mutex);
    found = custom_costs.count(op) > 0;
  }
  // Read at `generation` or later: a set since then bumps it again, and the next call looks again.
  seen_.store(generation << 1 | static_cast<uint64_t>(found), std::memory_order_relaxed);
  return found;
}

vtpu::OpCost op_cost(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                     const std::vector<at::Tensor>& results, at::Float32MatmulPrecision precision) {
  vtpu::OpCost c;
  if (CustomOpCostFn custom = custom_cost_of(schema.name())) {
    vtpu::OpCost priced;
    if (custom(args, results, &priced)) return priced;
  }
  double largest = 0;
  // out= arguments are only written (counted among the results). No copies of the
  // arguments: a tensor's refcount going up can take the GIL (its Python object).
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& arg = schema.arguments()[i];
    if (arg.kwarg_only() && arg.alias_info() && arg.alias_info()->isWrite()) continue;
    for_each_tensor(args.slice(i, 1), [&](const at::Tensor& t) {
      if (t.device().type() != c10::DeviceType::PrivateUse1) return;  // host scalars: no HBM
      c.bytes_read += physical_bytes_of(t);
      largest = std::max(largest, static_cast<double>(t.numel()));
      c.emulated = c.emulated || unsupported_on_tpu(t.scalar_type());
    });
  }
  for (const auto& r : results) {
    c.bytes_written += physical_bytes_of(r);
    largest = std::max(largest, static_cast<double>(r.numel()));
    c.emulated = c.emulated || unsupported_on_tpu(r.scalar_type());
  }
  const std::string& name = schema.name();
  size_t ia = 0, ib = 0;
  if (product_operands(name, &ia, &ib)) {
    const at::Tensor* a = tensor_arg(args, ia);
    const at::Tensor* b = tensor_arg(args, ib);
    if (a && b && a->dim() >= 1 && b->dim() >= 1) {
      const int64_t k = a->size(-1);
      const int64_t m = a->dim() >= 2 ? a->size(-2) : 1;
      const int64_t n = b->dim() >= 2 ? b->size(-1) : 1;
      // bmm/baddbmm: batch in front; addbmm sums over the batch.
      const int64_t batch = a->dim() == 3 ? a->size(0) : 1;
      c.mxu = true;
      c.m = m, c.k = k, c.n = n;
      c.flops = 2.0 * batch * m * k * n;
      c.passes = passes_for(a->scalar_type(), precision);
      return c;
    }
  }
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
      name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward") {
    // Fused attention: the T x S scores stay on chip (VMEM); FLOPs as flop_counter's
    // sdpa_flop_count: forward QK^T and PV 4·B·H·T·S·D, backward 8·B·H·T·S·D, over the
    // query/key pairs the kernel computes: with is_causal (PyTorch's top-left mask, key j <= query i)
    // a TPU flash kernel skips the masked blocks, so only the unmasked pairs are priced.
    const bool backward = name.size() > 9 && name.compare(name.size() - 9, 9, "_backward") == 0;
    const at::Tensor* q = tensor_arg(args, backward ? 1 : 0);
    const at::Tensor* k = tensor_arg(args, backward ? 2 : 1);
    const size_t causal_at = backward ? 7 : 4;
    const bool causal = causal_at < args.size() && args[causal_at].isBool() && args[causal_at].toBool();
    if (q && k && q->dim() == 4 && k->dim() == 4) {
      const int64_t b = q->size(0), h = q->size(1), t = q->size(2), d = q->size(3), s = k->size(2);
      c.mxu = true;
      c.m = t, c.k = d, c.n = s;
      c.flops = (backward ? 8.0 : 4.0) * b * h * causal_pairs(t, s, causal) * d;
      c.passes = passes_for(q->scalar_type(), precision);
      return c;
    }
  }
  if (name == "aten::convolution" || name == "aten::convolution_backward") {
    const bool backward = name == "aten::convolution_backward";
    // convolution(input, weight, bias, stride, padding, dilation, transposed, ...)
    // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, ...)
    const at::Tensor* input = tensor_arg(args, backward ? 1 : 0);
    const at::Tensor* weight = tensor_arg(args, backward ? 2 : 1);
    const at::Tensor* output = backward ? tensor_arg(args, 0) : (results.empty() ? nullptr : &results[0]);
    const size_t transposed_at = backward ? 7 : 6;
    const bool transposed = transposed_at < args.size() && args[transposed_at].isBool() && args[transposed_at].toBool();
    if (input && weight && output && input->dim() >= 3) {
      double once = conv_flops(*input, *weight, *output, transposed);
      double times = 1;
      if (backward && args.size() > 10 && args[10].isBoolList()) {
        auto mask = args[10].toBoolList();
        times = (mask.get(0) ? 1 : 0) + (mask.get(1) ? 1 : 0);
      }
      c.mxu = true;
      // Implicit GEMM: M = batch x output positions, K = in-channels x kernel, N = out-channels.
      // A weight without output or input channels does no work (CPU's kernel raises for the
      // first; its meta kernel does not, and this runs before the kernel's checks).
      c.n = weight->size(0);
      c.k = c.n > 0 ? weight->numel() / c.n : 0;
      c.m = c.k > 0 ? static_cast<int64_t>(once / (2.0 * static_cast<double>(c.k) * static_cast<double>(c.n))) : 0;
      c.flops = once * times;
      c.passes = passes_for(input->scalar_type(), precision);
      return c;
    }
  }
  c.flops = largest;  // elementwise and reductions: one op per element
  return c;
}

}  // namespace torch_tpu
