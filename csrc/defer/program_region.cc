// A torch.compile program's IR region (see program_region.h).
#include "defer/program_region.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <stdexcept>

#include "ir/hash.h"
#include "ir/printer.h"
#include "runtime/errors.h"

namespace torch_tpu {
namespace {

using ir::ValueId;

ir::ElementType element_type_of(c10::ScalarType st) {
  auto e = defer::ir_type(st);
  if (!e) throw std::invalid_argument(std::string("dtype ") + c10::toString(st) + " has no IR element type");
  return *e;
}

}  // namespace

ProgramRegion::ProgramRegion(ir::Graph graph) : graph_(std::move(graph)), built_(true) { graph_.verify(); }

ValueId ProgramRegion::parameter(c10::ScalarType dtype, std::vector<int64_t> shape) {
  require_building();
  return builder_.parameter(element_type_of(dtype), std::move(shape));
}

ValueId ProgramRegion::constant(double value, c10::ScalarType dtype, std::vector<int64_t> shape) {
  require_building();
  const ir::ElementType t = element_type_of(dtype);
  ValueId c = ir::is_float(t)  ? builder_.constant(ir::round_to_type(value, t), t)
              : ir::is_pred(t) ? builder_.constant_int(value != 0 ? 1 : 0, t)
                               : builder_.constant_int(ir::wrap_to_type(static_cast<int64_t>(value), t), t);
  return shape.empty() ? c : builder_.broadcast_in_dim(c, std::move(shape), {});
}

std::optional<LowerableOp> ProgramRegion::find_op(const std::string& name, const std::string& overload) const {
  require_building();
  const std::string label = overload.empty() || overload == "default" ? name : name + "." + overload;
  defer::LowerFn fn = defer::find_lowering(label);
  if (!fn) return std::nullopt;
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
  if (!handle) return std::nullopt;
  const c10::FunctionSchema& schema = handle->schema();
  if (schema.returns().size() != 1) return std::nullopt;
  for (const auto& a : schema.arguments()) {
    if (a.alias_info() && a.alias_info()->isWrite()) return std::nullopt;  // functional graphs only
  }
  return LowerableOp{&schema, fn};
}

std::optional<std::vector<ValueId>> ProgramRegion::lower(const LowerableOp& op, const std::vector<NodeArg>& args,
                                                         const std::vector<NodeType>& out_types) {
  require_building();
  const c10::FunctionSchema& schema = *op.schema;
  const size_t n = schema.arguments().size();
  std::vector<c10::IValue> ivalues(n);
  std::vector<defer::Operand> operands(n);
  try {
    for (size_t i = 0; i < n; ++i) {
      const c10::Argument& arg = schema.arguments()[i];
      const NodeArg& a = i < args.size() ? args[i] : NodeArg{};
      defer::Operand& o = operands[i];
      switch (a.kind) {
        case NodeArg::Kind::kValue: {
          const ir::TensorType& t = builder_.type(a.value);
          ivalues[i] = at::empty(t.shape, at::TensorOptions().dtype(defer::scalar_type_of(t.dtype)).device(c10::kMeta));
          o.kind = defer::Operand::Kind::kTensor;
          o.value = a.value;
          o.tensor = ivalues[i].toTensor();
          break;
        }
        case NodeArg::Kind::kNumber: {
          at::Tensor w = c10::scalar_to_tensor(a.number);
          w.unsafeGetTensorImpl()->set_wrapped_number(true);
          ivalues[i] = w;
          o.kind = defer::Operand::Kind::kScalar;
          o.tensor = w;
          o.scalar = a.number;
          break;
        }
        case NodeArg::Kind::kAbsent:
          if (arg.default_value()) ivalues[i] = *arg.default_value();
          break;
        case NodeArg::Kind::kNone:
          break;
        case NodeArg::Kind::kIValue:
          ivalues[i] = a.ivalue;
          break;
      }
      o.ivalue = &ivalues[i];
      const c10::IValue& v = ivalues[i];
      if (o.kind == defer::Operand::Kind::kScalar) continue;
      if (o.kind == defer::Operand::Kind::kOther && (v.isDouble() || v.isInt() || v.isBool())) {
        o.kind = defer::Operand::Kind::kScalar;
        o.scalar = v.toScalar();
      } else if (v.isTensorList() || v.isComplexDouble()) {
        return std::nullopt;
      }
    }
  } catch (const std::exception&) {
    return std::nullopt;  // an argument the lowerings do not take: a library call
  }
  std::vector<ir::TensorType> outs;
  std::vector<c10::ScalarType> out_dtypes;
  for (const auto& [st, shape] : out_types) {
    auto et = defer::ir_type(st);
    if (!et) return std::nullopt;
    if (ir::numel(shape) == 0) return std::nullopt;
    outs.push_back(ir::TensorType{*et, shape});
    out_dtypes.push_back(st);
  }
  if (outs.size() != 1) return std::nullopt;
  defer::Lowering L(builder_, operands, outs, out_dtypes, nullptr);
  try {
    op.lower(L);
  } catch (const defer::NotFusible&) {
    return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (L.results.size() != outs.size()) return std::nullopt;
  return L.results;
}

void ProgramRegion::finish(const std::vector<ValueId>& outputs) {
  require_building();
  for (ValueId v : outputs) builder_.output(v);
  graph_ = builder_.build();
  translate_errors([&] { graph_.verify(); });
  built_ = true;
}

const ir::Graph& ProgramRegion::graph() const {
  require_built();
  return graph_;
}

std::string ProgramRegion::stablehlo(const std::string& fn_name) const {
  require_built();
  return ir::to_stablehlo(graph_, fn_name);
}

uint64_t ProgramRegion::structural_hash() const {
  require_built();
  return ir::structural_hash(graph_);
}

bool ProgramRegion::compile() {
  require_built();
  ir::Graph g = graph_;
  num_outputs_ = g.outputs().size();
  std::vector<ValueId> outs = g.outputs();
  for (ValueId v : row_statistics(g)) outs.push_back(v);
  g.set_outputs(outs);
  bool miss = false;
  translate_errors([&] { launch_ = plan_region_launch(g, &miss); });
  return miss;
}

std::vector<at::Tensor> ProgramRegion::run(const std::vector<at::Tensor>& inputs, c10::DeviceIndex device,
                                           const std::string& name, const std::vector<std::vector<int64_t>>& strides,
                                           const std::vector<std::optional<at::Tensor>>& into) {
  if (!launch_.region) throw std::runtime_error("region not compiled");
  if (into.size() > num_outputs_) {
    throw std::invalid_argument(name + ": " + std::to_string(into.size()) + " tensors to write into, the region has " +
                                std::to_string(num_outputs_) + " outputs");
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(num_outputs_);
  for (size_t j = 0; j < num_outputs_; ++j) {
    const ir::TensorType& t = launch_.output_types[j];
    const c10::ScalarType st = defer::scalar_type_of(t.dtype);
    if (j < into.size() && into[j].has_value() && into[j]->defined()) {
      const at::Tensor& d = *into[j];
      if (d.scalar_type() != st || d.sizes() != c10::IntArrayRef(t.shape) || !d.is_contiguous() ||
          d.device() != c10::Device(c10::DeviceType::PrivateUse1, device) || d.is_conj() || d.is_neg()) {
        throw std::invalid_argument(name + ": output " + std::to_string(j) + " cannot be written into a " +
                                    std::string(c10::toString(d.scalar_type())) + " tensor of shape " +
                                    c10::str(d.sizes()) + " on " + d.device().str() +
                                    " (needs a contiguous tensor of its dtype and shape on the region's device)");
      }
      outputs.push_back(d);
      continue;
    }
    auto opts = at::TensorOptions().dtype(st).device(c10::Device(c10::DeviceType::PrivateUse1, device));
    if (j < strides.size() && !strides[j].empty()) {
      outputs.push_back(at::empty_strided(t.shape, strides[j], opts));
    } else {
      outputs.push_back(at::empty(t.shape, opts));
    }
  }
  translate_errors([&] { enqueue_region(launch_, device, inputs, outputs, name); });
  return outputs;
}

void ProgramRegion::require_building() const {
  if (built_) throw std::runtime_error("region already finished");
}

void ProgramRegion::require_built() const {
  if (!built_) throw std::runtime_error("region not finished");
}

}  // namespace torch_tpu
