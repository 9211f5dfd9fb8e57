// Builds a Graph op by op, checking types and shapes as it goes. Errors are
// std::invalid_argument with a message that starts with the op name:
//   "[add] operand types differ: f32[4,8] vs f32[8]".
#pragma once

#include <optional>

#include "ir/graph.h"

namespace torch_tpu::ir {

class Builder {
 public:
  // Parameters are numbered in the order they are created.
  ValueId parameter(ElementType dtype, Shape shape);
  ValueId parameter(const TensorType& t) { return parameter(t.dtype, t.shape); }
  // A splat of `value` (converted to dtype: ints truncate, pred = value != 0).
  ValueId constant(double value, ElementType dtype, Shape shape = {});
  ValueId constant_int(int64_t value, ElementType dtype, Shape shape = {});

  ValueId negate(ValueId a) { return unary(OpKind::kNegate, a); }
  ValueId abs(ValueId a) { return unary(OpKind::kAbs, a); }
  ValueId exponential(ValueId a) { return unary(OpKind::kExponential, a); }
  ValueId log(ValueId a) { return unary(OpKind::kLog, a); }
  ValueId log_plus_one(ValueId a) { return unary(OpKind::kLogPlusOne, a); }
  ValueId exponential_minus_one(ValueId a) { return unary(OpKind::kExponentialMinusOne, a); }
  ValueId tanh(ValueId a) { return unary(OpKind::kTanh, a); }
  ValueId logistic(ValueId a) { return unary(OpKind::kLogistic, a); }
  ValueId sqrt(ValueId a) { return unary(OpKind::kSqrt, a); }
  ValueId rsqrt(ValueId a) { return unary(OpKind::kRsqrt, a); }
  ValueId sine(ValueId a) { return unary(OpKind::kSine, a); }
  ValueId cosine(ValueId a) { return unary(OpKind::kCosine, a); }
  ValueId erf(ValueId a) { return unary(OpKind::kErf, a); }
  ValueId floor(ValueId a) { return unary(OpKind::kFloor, a); }
  ValueId ceil(ValueId a) { return unary(OpKind::kCeil, a); }
  ValueId sign(ValueId a) { return unary(OpKind::kSign, a); }
  ValueId not_(ValueId a) { return unary(OpKind::kNot, a); }
  ValueId convert(ValueId a, ElementType to);

  ValueId add(ValueId a, ValueId b) { return binary(OpKind::kAdd, a, b); }
  ValueId subtract(ValueId a, ValueId b) { return binary(OpKind::kSubtract, a, b); }
  ValueId multiply(ValueId a, ValueId b) { return binary(OpKind::kMultiply, a, b); }
  ValueId divide(ValueId a, ValueId b) { return binary(OpKind::kDivide, a, b); }
  ValueId maximum(ValueId a, ValueId b) { return binary(OpKind::kMaximum, a, b); }
  ValueId minimum(ValueId a, ValueId b) { return binary(OpKind::kMinimum, a, b); }
  ValueId power(ValueId a, ValueId b) { return binary(OpKind::kPower, a, b); }
  ValueId and_(ValueId a, ValueId b) { return binary(OpKind::kAnd, a, b); }
  ValueId or_(ValueId a, ValueId b) { return binary(OpKind::kOr, a, b); }
  ValueId compare(ValueId a, ValueId b, CompareDirection direction);
  ValueId select(ValueId pred, ValueId on_true, ValueId on_false);

  // Generic forms (for a recorder that maps ATen ops to OpKinds).
  ValueId unary(OpKind kind, ValueId a);              // any unary elementwise op but convert
  ValueId binary(OpKind kind, ValueId a, ValueId b);  // any binary op but compare

  // StableHLO broadcast_in_dim: operand dim i becomes result dim dims[i]
  // (size equal, or 1 and expanded).
  ValueId broadcast_in_dim(ValueId a, Shape shape, std::vector<int64_t> dims);
  // NumPy-style broadcast to `shape` (trailing dims aligned); a no-op when
  // the shape already matches.
  ValueId broadcast_to(ValueId a, const Shape& shape);
  ValueId reshape(ValueId a, Shape shape);
  // Reduces over `dims` (any order, made sorted). Without `init`, the
  // identity of the kind: 0, 1, -inf / lowest, +inf / highest.
  ValueId reduce(ValueId a, ReduceKind kind, std::vector<int64_t> dims, std::optional<double> init = std::nullopt);
  ValueId reduce_sum(ValueId a, std::vector<int64_t> dims) { return reduce(a, ReduceKind::kSum, std::move(dims)); }
  ValueId reduce_max(ValueId a, std::vector<int64_t> dims) { return reduce(a, ReduceKind::kMax, std::move(dims)); }

  void output(ValueId v) { graph_.add_output(v); }

  const TensorType& type(ValueId v) const { return graph_.type(v); }
  const Graph& graph() const { return graph_; }
  Graph build() { return std::move(graph_); }  // leaves the builder empty

 private:
  ValueId append(OpKind kind, std::vector<ValueId> operands, TensorType type, Attributes attrs = {});
  Graph graph_;
};

// The identity init of a reduction for an element type.
Scalar reduce_identity(ReduceKind kind, ElementType dtype);

}  // namespace torch_tpu::ir
