#include "ir/builder.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace torch_tpu::ir {

ValueId Builder::append(OpKind kind, std::vector<ValueId> operands, TensorType type, Attributes attrs) {
  for (ValueId v : operands)
    if (v < 0 || v >= graph_.num_ops())
      throw std::invalid_argument(std::string("[") + op_name(kind) + "] operand %" + std::to_string(v) +
                                  " is not defined");
  std::string e = check_op(graph_, kind, operands, type, attrs);
  if (!e.empty()) throw std::invalid_argument(e);
  return graph_.add_op(kind, std::move(operands), std::move(type), std::move(attrs));
}

ValueId Builder::parameter(ElementType dtype, Shape shape) {
  return append(OpKind::kParameter, {}, TensorType{dtype, std::move(shape)});
}

ValueId Builder::constant(double value, ElementType dtype, Shape shape) {
  Attributes a;
  a.value = Scalar::of(value, dtype);
  return append(OpKind::kConstant, {}, TensorType{dtype, std::move(shape)}, a);
}

ValueId Builder::constant_int(int64_t value, ElementType dtype, Shape shape) {
  Attributes a;
  if (is_float(dtype))
    a.value.f = static_cast<double>(value);
  else
    a.value.i = is_pred(dtype) ? (value != 0) : value;
  return append(OpKind::kConstant, {}, TensorType{dtype, std::move(shape)}, a);
}

ValueId Builder::unary(OpKind kind, ValueId a) {
  if (!is_unary_elementwise(kind) || kind == OpKind::kConvert)
    throw std::invalid_argument(std::string("[") + op_name(kind) + "] is not a unary elementwise op");
  return append(kind, {a}, graph_.type(a));
}

ValueId Builder::convert(ValueId a, ElementType to) {
  return append(OpKind::kConvert, {a}, TensorType{to, graph_.type(a).shape});
}

ValueId Builder::binary(OpKind kind, ValueId a, ValueId b) {
  if (!is_binary_elementwise(kind) || kind == OpKind::kCompare)
    throw std::invalid_argument(std::string("[") + op_name(kind) + "] is not a binary elementwise op");
  return append(kind, {a, b}, graph_.type(a));
}

ValueId Builder::compare(ValueId a, ValueId b, CompareDirection direction) {
  Attributes attrs;
  attrs.direction = direction;
  return append(OpKind::kCompare, {a, b}, TensorType{ElementType::pred, graph_.type(a).shape}, attrs);
}

ValueId Builder::select(ValueId pred, ValueId on_true, ValueId on_false) {
  return append(OpKind::kSelect, {pred, on_true, on_false}, graph_.type(on_true));
}

ValueId Builder::broadcast_in_dim(ValueId a, Shape shape, std::vector<int64_t> dims) {
  Attributes attrs;
  attrs.dimensions = std::move(dims);
  return append(OpKind::kBroadcastInDim, {a}, TensorType{graph_.type(a).dtype, std::move(shape)}, attrs);
}

ValueId Builder::broadcast_to(ValueId a, const Shape& shape) {
  const TensorType& t = graph_.type(a);
  if (t.shape == shape) return a;
  if (t.shape.size() > shape.size())
    throw std::invalid_argument("[broadcast_in_dim] cannot broadcast " + t.str() + " to " + shape_str(shape));
  std::vector<int64_t> dims(t.shape.size());
  size_t offset = shape.size() - t.shape.size();
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(offset + i);
  return broadcast_in_dim(a, shape, dims);
}

ValueId Builder::reshape(ValueId a, Shape shape) {
  return append(OpKind::kReshape, {a}, TensorType{graph_.type(a).dtype, std::move(shape)});
}

Scalar reduce_identity(ReduceKind kind, ElementType dtype) {
  Scalar s;
  bool f = is_float(dtype);
  switch (kind) {
    case ReduceKind::kSum:
      break;
    case ReduceKind::kProd:
      s.f = 1.0;
      s.i = 1;
      break;
    case ReduceKind::kMax:
      if (f)
        s.f = -std::numeric_limits<double>::infinity();
      else if (dtype == ElementType::s64)
        s.i = std::numeric_limits<int64_t>::min();
      else if (dtype == ElementType::s32)
        s.i = std::numeric_limits<int32_t>::min();
      else if (dtype == ElementType::s8)
        s.i = -128;
      else
        s.i = 0;  // u8, pred
      break;
    case ReduceKind::kMin:
      if (f)
        s.f = std::numeric_limits<double>::infinity();
      else if (dtype == ElementType::s64)
        s.i = std::numeric_limits<int64_t>::max();
      else if (dtype == ElementType::s32)
        s.i = std::numeric_limits<int32_t>::max();
      else if (dtype == ElementType::s8)
        s.i = 127;
      else if (dtype == ElementType::u8)
        s.i = 255;
      else
        s.i = 1;  // pred
      break;
  }
  if (!f)
    s.f = 0.0;
  else
    s.i = 0;
  return s;
}

ValueId Builder::reduce(ValueId a, ReduceKind kind, std::vector<int64_t> dims, std::optional<double> init) {
  const TensorType& t = graph_.type(a);
  for (int64_t& d : dims)
    if (d < 0) d += t.rank();
  std::sort(dims.begin(), dims.end());
  Shape out;
  for (int64_t i = 0; i < t.rank(); ++i)
    if (!std::binary_search(dims.begin(), dims.end(), i)) out.push_back(t.shape[i]);
  Attributes attrs;
  attrs.dimensions = std::move(dims);
  attrs.reduce_kind = kind;
  attrs.init = init ? Scalar::of(*init, t.dtype) : reduce_identity(kind, t.dtype);
  return append(OpKind::kReduce, {a}, TensorType{t.dtype, out}, attrs);
}

}  // namespace torch_tpu::ir
