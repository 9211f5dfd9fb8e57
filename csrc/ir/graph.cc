#include "ir/graph.h"

#include <algorithm>
#include <stdexcept>

namespace torch_tpu::ir {

Scalar Scalar::of(double value, ElementType t) {
  Scalar s;
  if (is_float(t)) {
    s.f = value;
  } else if (is_pred(t)) {
    s.i = value != 0.0;
  } else {
    s.i = static_cast<int64_t>(value);
  }
  return s;
}

bool Scalar::operator==(const Scalar& o) const { return std::memcmp(&f, &o.f, sizeof f) == 0 && i == o.i; }

bool Attributes::operator==(const Attributes& o) const {
  return parameter_index == o.parameter_index && value == o.value && direction == o.direction &&
         dimensions == o.dimensions && reduce_kind == o.reduce_kind && init == o.init;
}

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kParameter:
      return "parameter";
    case OpKind::kConstant:
      return "constant";
    case OpKind::kNegate:
      return "negate";
    case OpKind::kAbs:
      return "abs";
    case OpKind::kExponential:
      return "exponential";
    case OpKind::kLog:
      return "log";
    case OpKind::kLogPlusOne:
      return "log_plus_one";
    case OpKind::kExponentialMinusOne:
      return "exponential_minus_one";
    case OpKind::kTanh:
      return "tanh";
    case OpKind::kLogistic:
      return "logistic";
    case OpKind::kSqrt:
      return "sqrt";
    case OpKind::kRsqrt:
      return "rsqrt";
    case OpKind::kSine:
      return "sine";
    case OpKind::kCosine:
      return "cosine";
    case OpKind::kErf:
      return "erf";
    case OpKind::kFloor:
      return "floor";
    case OpKind::kCeil:
      return "ceil";
    case OpKind::kSign:
      return "sign";
    case OpKind::kNot:
      return "not";
    case OpKind::kConvert:
      return "convert";
    case OpKind::kAdd:
      return "add";
    case OpKind::kSubtract:
      return "subtract";
    case OpKind::kMultiply:
      return "multiply";
    case OpKind::kDivide:
      return "divide";
    case OpKind::kMaximum:
      return "maximum";
    case OpKind::kMinimum:
      return "minimum";
    case OpKind::kPower:
      return "power";
    case OpKind::kAnd:
      return "and";
    case OpKind::kOr:
      return "or";
    case OpKind::kCompare:
      return "compare";
    case OpKind::kSelect:
      return "select";
    case OpKind::kBroadcastInDim:
      return "broadcast_in_dim";
    case OpKind::kReshape:
      return "reshape";
    case OpKind::kReduce:
      return "reduce";
  }
  return "unknown";
}

const char* direction_name(CompareDirection d) {
  switch (d) {
    case CompareDirection::EQ:
      return "EQ";
    case CompareDirection::NE:
      return "NE";
    case CompareDirection::LT:
      return "LT";
    case CompareDirection::LE:
      return "LE";
    case CompareDirection::GT:
      return "GT";
    case CompareDirection::GE:
      return "GE";
  }
  return "?";
}

const char* reduce_kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMin:
      return "min";
    case ReduceKind::kProd:
      return "prod";
  }
  return "?";
}

bool is_unary_elementwise(OpKind k) { return k >= OpKind::kNegate && k <= OpKind::kConvert; }
bool is_binary_elementwise(OpKind k) { return k >= OpKind::kAdd && k <= OpKind::kCompare; }
bool is_elementwise(OpKind k) { return is_unary_elementwise(k) || is_binary_elementwise(k) || k == OpKind::kSelect; }
bool is_fusible(OpKind k) {
  return is_elementwise(k) || k == OpKind::kConstant || k == OpKind::kBroadcastInDim || k == OpKind::kReduce;
}
bool is_transcendental(OpKind k) {
  switch (k) {
    case OpKind::kExponential:
    case OpKind::kLog:
    case OpKind::kLogPlusOne:
    case OpKind::kExponentialMinusOne:
    case OpKind::kTanh:
    case OpKind::kLogistic:
    case OpKind::kSine:
    case OpKind::kCosine:
    case OpKind::kErf:
    case OpKind::kPower:
      return true;
    default:
      return false;
  }
}

namespace {

bool float_only(OpKind k) {
  switch (k) {
    case OpKind::kExponential:
    case OpKind::kLog:
    case OpKind::kLogPlusOne:
    case OpKind::kExponentialMinusOne:
    case OpKind::kTanh:
    case OpKind::kLogistic:
    case OpKind::kSqrt:
    case OpKind::kRsqrt:
    case OpKind::kSine:
    case OpKind::kCosine:
    case OpKind::kErf:
    case OpKind::kFloor:
    case OpKind::kCeil:
      return true;
    default:
      return false;
  }
}

std::string err(OpKind k, const std::string& msg) { return std::string("[") + op_name(k) + "] " + msg; }

}  // namespace

std::string check_op(const Graph& g, OpKind kind, const std::vector<ValueId>& operands, const TensorType& type,
                     const Attributes& attrs) {
  auto arity = [&](size_t n) -> std::string {
    if (operands.size() != n)
      return err(kind, "expects " + std::to_string(n) + " operands, got " + std::to_string(operands.size()));
    return "";
  };
  for (int64_t d : type.shape)
    if (d < 0) return err(kind, "negative dimension in result " + type.str());
  if (kind == OpKind::kParameter || kind == OpKind::kConstant) return arity(0);
  if (is_unary_elementwise(kind)) {
    if (auto e = arity(1); !e.empty()) return e;
    const TensorType& a = g.type(operands[0]);
    if (kind == OpKind::kConvert) {
      if (a.shape != type.shape) return err(kind, "shape changes: " + a.str() + " -> " + type.str());
      return "";
    }
    if (a != type) return err(kind, "result " + type.str() + " differs from operand " + a.str());
    if (float_only(kind) && !is_float(a.dtype)) return err(kind, "needs a floating-point operand, got " + a.str());
    if (kind == OpKind::kNot && is_float(a.dtype)) return err(kind, "needs a pred or integer operand, got " + a.str());
    if ((kind == OpKind::kNegate || kind == OpKind::kAbs || kind == OpKind::kSign) && is_pred(a.dtype))
      return err(kind, "not defined on pred");
    return "";
  }
  if (is_binary_elementwise(kind)) {
    if (auto e = arity(2); !e.empty()) return e;
    const TensorType& a = g.type(operands[0]);
    const TensorType& b = g.type(operands[1]);
    if (a != b) return err(kind, "operand types differ: " + a.str() + " vs " + b.str());
    if (kind == OpKind::kCompare) {
      if (type != TensorType{ElementType::pred, a.shape})
        return err(kind, "result must be pred" + shape_str(a.shape) + ", got " + type.str());
      return "";
    }
    if (a != type) return err(kind, "result " + type.str() + " differs from operands " + a.str());
    if ((kind == OpKind::kAnd || kind == OpKind::kOr) && is_float(a.dtype))
      return err(kind, "needs pred or integer operands, got " + a.str());
    bool arithmetic = kind == OpKind::kAdd || kind == OpKind::kSubtract || kind == OpKind::kMultiply ||
                      kind == OpKind::kDivide || kind == OpKind::kPower;
    if (arithmetic && is_pred(a.dtype)) return err(kind, "not defined on pred");
    return "";
  }
  if (kind == OpKind::kSelect) {
    if (auto e = arity(3); !e.empty()) return e;
    const TensorType& p = g.type(operands[0]);
    const TensorType& a = g.type(operands[1]);
    const TensorType& b = g.type(operands[2]);
    if (!is_pred(p.dtype) || p.shape != a.shape)
      return err(kind, "predicate must be pred" + shape_str(a.shape) + ", got " + p.str());
    if (a != b || a != type) return err(kind, "branch types differ: " + a.str() + " vs " + b.str());
    return "";
  }
  if (kind == OpKind::kBroadcastInDim) {
    if (auto e = arity(1); !e.empty()) return e;
    const TensorType& a = g.type(operands[0]);
    if (a.dtype != type.dtype) return err(kind, "element type changes: " + a.str() + " -> " + type.str());
    if (static_cast<int64_t>(attrs.dimensions.size()) != a.rank())
      return err(kind, "needs one dimension per operand dimension of " + a.str());
    std::vector<bool> used(type.shape.size(), false);
    for (size_t i = 0; i < attrs.dimensions.size(); ++i) {
      int64_t d = attrs.dimensions[i];
      if (d < 0 || d >= type.rank() || used[d])
        return err(kind, "dimension " + std::to_string(d) + " out of range or repeated for " + type.str());
      used[d] = true;
      if (a.shape[i] != 1 && a.shape[i] != type.shape[d])
        return err(kind, "operand " + a.str() + " dim " + std::to_string(i) + " does not broadcast to " + type.str());
    }
    return "";
  }
  if (kind == OpKind::kReshape) {
    if (auto e = arity(1); !e.empty()) return e;
    const TensorType& a = g.type(operands[0]);
    if (a.dtype != type.dtype || a.numel() != type.numel())
      return err(kind, "cannot reshape " + a.str() + " to " + type.str());
    return "";
  }
  if (kind == OpKind::kReduce) {
    if (auto e = arity(1); !e.empty()) return e;
    const TensorType& a = g.type(operands[0]);
    if ((attrs.reduce_kind == ReduceKind::kSum || attrs.reduce_kind == ReduceKind::kProd) && is_pred(a.dtype))
      return err(kind, std::string(reduce_kind_name(attrs.reduce_kind)) + " not defined on pred");
    Shape expect;
    std::vector<bool> reduced(a.shape.size(), false);
    for (size_t i = 0; i < attrs.dimensions.size(); ++i) {
      int64_t d = attrs.dimensions[i];
      if (d < 0 || d >= a.rank() || reduced[d] || (i && d <= attrs.dimensions[i - 1]))
        return err(kind, "dimensions must be sorted, unique and within " + a.str());
      reduced[d] = true;
    }
    for (size_t i = 0; i < a.shape.size(); ++i)
      if (!reduced[i]) expect.push_back(a.shape[i]);
    if (type != TensorType{a.dtype, expect})
      return err(kind, "result must be " + TensorType{a.dtype, expect}.str() + ", got " + type.str());
    return "";
  }
  return err(kind, "unknown op");
}

ValueId Graph::add_op(OpKind kind, std::vector<ValueId> operands, TensorType type, Attributes attrs) {
  for (ValueId v : operands)
    if (v < 0 || v >= num_ops())
      throw std::invalid_argument(std::string("[") + op_name(kind) + "] operand %" + std::to_string(v) +
                                  " is not defined");
  if (kind == OpKind::kParameter) {
    attrs.parameter_index = static_cast<int64_t>(parameters_.size());
    parameters_.push_back(static_cast<ValueId>(ops_.size()));
  }
  ops_.push_back(Op{kind, std::move(operands), std::move(type), std::move(attrs)});
  return static_cast<ValueId>(ops_.size() - 1);
}

void Graph::add_output(ValueId v) {
  if (v < 0 || v >= num_ops()) throw std::invalid_argument("[output] value %" + std::to_string(v) + " is not defined");
  outputs_.push_back(v);
}

void Graph::set_outputs(std::vector<ValueId> outputs) {
  outputs_.clear();
  for (ValueId v : outputs) add_output(v);
}

void Graph::verify() const {
  int64_t next_param = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    for (ValueId v : op.operands)
      if (v < 0 || static_cast<size_t>(v) >= i)
        throw std::invalid_argument(std::string("[") + op_name(op.kind) + "] %" + std::to_string(i) + " uses %" +
                                    std::to_string(v) + " before its definition");
    if (op.kind == OpKind::kParameter) {
      if (op.attrs.parameter_index != next_param ||
          parameters_.at(static_cast<size_t>(next_param)) != static_cast<ValueId>(i))
        throw std::invalid_argument("[parameter] parameters are not numbered in order");
      ++next_param;
    }
    std::string e = check_op(*this, op.kind, op.operands, op.type, op.attrs);
    if (!e.empty()) throw std::invalid_argument(e + " (at %" + std::to_string(i) + ")");
  }
  if (next_param != static_cast<int64_t>(parameters_.size()))
    throw std::invalid_argument("[parameter] parameter list does not match the ops");
  for (ValueId v : outputs_)
    if (v < 0 || v >= num_ops()) throw std::invalid_argument("[output] undefined value");
}

}  // namespace torch_tpu::ir
