#include "ir/printer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace torch_tpu::ir {

std::string mlir_tensor_type(const TensorType& t) {
  std::string s = "tensor<";
  for (int64_t d : t.shape) s += std::to_string(d) + "x";
  return s + mlir_type_name(t.dtype) + ">";
}

namespace {

// Shortest %e form that reads back as the same double; inf and NaN as the
// hex bit pattern of the element type, as MLIR requires.
std::string float_literal(double v, ElementType t) {
  if (!std::isfinite(v)) {
    char buf[32];
    bool neg = std::signbit(v);
    switch (t) {
      case ElementType::f64: {
        uint64_t bits = std::isnan(v) ? 0x7FF8000000000000ull : (neg ? 0xFFF0000000000000ull : 0x7FF0000000000000ull);
        std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(bits));
        break;
      }
      case ElementType::f32: {
        uint32_t bits = std::isnan(v) ? 0x7FC00000u : (neg ? 0xFF800000u : 0x7F800000u);
        std::snprintf(buf, sizeof buf, "0x%08X", bits);
        break;
      }
      case ElementType::bf16: {
        unsigned bits = std::isnan(v) ? 0x7FC0u : (neg ? 0xFF80u : 0x7F80u);
        std::snprintf(buf, sizeof buf, "0x%04X", bits);
        break;
      }
      default: {  // f16
        unsigned bits = std::isnan(v) ? 0x7E00u : (neg ? 0xFC00u : 0x7C00u);
        std::snprintf(buf, sizeof buf, "0x%04X", bits);
        break;
      }
    }
    return buf;
  }
  char buf[64];
  for (int digits : {6, 9, 17}) {
    std::snprintf(buf, sizeof buf, "%.*e", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string scalar_literal(const Scalar& s, ElementType t) {
  if (is_float(t)) return float_literal(s.f, t);
  if (is_pred(t)) return s.i ? "true" : "false";
  return std::to_string(s.i);
}

std::string dims_list(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

const char* compare_type(ElementType t) {
  if (is_float(t)) return "FLOAT";
  if (t == ElementType::u8 || t == ElementType::pred) return "UNSIGNED";
  return "SIGNED";
}

const char* reduce_body(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum:
      return "stablehlo.add";
    case ReduceKind::kMax:
      return "stablehlo.maximum";
    case ReduceKind::kMin:
      return "stablehlo.minimum";
    case ReduceKind::kProd:
      return "stablehlo.multiply";
  }
  return "?";
}

}  // namespace

std::string to_stablehlo(const Graph& g, const std::string& function_name) {
  std::ostringstream out;
  std::vector<std::string> name(static_cast<size_t>(g.num_ops()));
  out << "func.func @" << function_name << "(";
  for (size_t i = 0; i < g.parameters().size(); ++i) {
    ValueId p = g.parameters()[i];
    name[p] = "%arg" + std::to_string(i);
    out << (i ? ", " : "") << name[p] << ": " << mlir_tensor_type(g.type(p));
  }
  out << ")";
  const auto& outs = g.outputs();
  if (outs.size() == 1) {
    out << " -> " << mlir_tensor_type(g.type(outs[0]));
  } else if (outs.size() > 1) {
    out << " -> (";
    for (size_t i = 0; i < outs.size(); ++i) out << (i ? ", " : "") << mlir_tensor_type(g.type(outs[i]));
    out << ")";
  }
  out << " {\n";
  int next = 0;
  auto fresh = [&]() { return "%" + std::to_string(next++); };
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    const Op& op = g.op(v);
    if (op.kind == OpKind::kParameter) continue;
    const std::string ty = mlir_tensor_type(op.type);
    auto arg = [&](int i) -> const std::string& { return name[op.operands[i]]; };
    auto argty = [&](int i) { return mlir_tensor_type(g.type(op.operands[i])); };
    if (op.kind == OpKind::kReduce) {
      std::string init = fresh();
      TensorType scalar{op.type.dtype, {}};
      out << "  " << init << " = stablehlo.constant dense<" << scalar_literal(op.attrs.init, op.type.dtype)
          << "> : " << mlir_tensor_type(scalar) << "\n";
      name[v] = fresh();
      out << "  " << name[v] << " = stablehlo.reduce(" << arg(0) << " init: " << init << ") applies "
          << reduce_body(op.attrs.reduce_kind) << " across dimensions = " << dims_list(op.attrs.dimensions) << " : ("
          << argty(0) << ", " << mlir_tensor_type(scalar) << ") -> " << ty << "\n";
      continue;
    }
    name[v] = fresh();
    out << "  " << name[v] << " = ";
    switch (op.kind) {
      case OpKind::kConstant:
        out << "stablehlo.constant dense<" << scalar_literal(op.attrs.value, op.type.dtype) << "> : " << ty;
        break;
      case OpKind::kErf:
        out << "chlo.erf " << arg(0) << " : " << argty(0) << " -> " << ty;
        break;
      case OpKind::kConvert:
      case OpKind::kReshape:
        out << "stablehlo." << op_name(op.kind) << " " << arg(0) << " : (" << argty(0) << ") -> " << ty;
        break;
      case OpKind::kBroadcastInDim:
        out << "stablehlo.broadcast_in_dim " << arg(0) << ", dims = " << dims_list(op.attrs.dimensions) << " : ("
            << argty(0) << ") -> " << ty;
        break;
      case OpKind::kCompare:
        out << "stablehlo.compare  " << direction_name(op.attrs.direction) << ", " << arg(0) << ", " << arg(1) << ",  "
            << compare_type(g.type(op.operands[0]).dtype) << " : (" << argty(0) << ", " << argty(1) << ") -> " << ty;
        break;
      case OpKind::kSelect:
        out << "stablehlo.select " << arg(0) << ", " << arg(1) << ", " << arg(2) << " : " << argty(0) << ", " << ty;
        break;
      default:
        if (is_unary_elementwise(op.kind)) {
          out << "stablehlo." << op_name(op.kind) << " " << arg(0) << " : " << ty;
        } else if (is_binary_elementwise(op.kind)) {
          out << "stablehlo." << op_name(op.kind) << " " << arg(0) << ", " << arg(1) << " : " << ty;
        } else {
          throw std::invalid_argument(std::string("[") + op_name(op.kind) + "] cannot be printed");
        }
    }
    out << "\n";
  }
  out << "  return";
  for (size_t i = 0; i < outs.size(); ++i) out << (i ? ", " : " ") << name[outs[i]];
  if (!outs.empty()) {
    out << " : ";
    for (size_t i = 0; i < outs.size(); ++i) out << (i ? ", " : "") << mlir_tensor_type(g.type(outs[i]));
  }
  out << "\n}\n";
  return out.str();
}

}  // namespace torch_tpu::ir
