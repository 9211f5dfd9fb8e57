// The program IR: a region of StableHLO-named ops over tensors with static
// shapes. Every op produces one SSA value; a value's id is the index of the op
// that defines it, and the Graph keeps its ops in topological order (an op's
// operands are defined before it). Parameters are ops too, numbered 0..n-1 in
// the function signature; outputs are the values that leave the region.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/types.h"

namespace torch_tpu::ir {

using ValueId = int32_t;

enum class OpKind : uint8_t {
  kParameter,
  kConstant,  // scalar splat to the result shape
  // Unary elementwise.
  kNegate,
  kAbs,
  kExponential,
  kLog,
  kLogPlusOne,
  kExponentialMinusOne,
  kTanh,
  kLogistic,
  kSqrt,
  kRsqrt,
  kSine,
  kCosine,
  kErf,
  kFloor,
  kCeil,
  kSign,
  kNot,
  kConvert,  // to the result's element type
  // Binary elementwise.
  kAdd,
  kSubtract,
  kMultiply,
  kDivide,
  kMaximum,
  kMinimum,
  kPower,
  kAnd,
  kOr,
  kCompare,  // result pred; attrs.direction
  // Ternary elementwise.
  kSelect,  // (pred, on_true, on_false)
  // Data movement.
  kBroadcastInDim,  // attrs.dimensions[i] = result dim of operand dim i
  kReshape,         // row-major order kept
  // Reductions: attrs.reduce_kind over attrs.dimensions, starting from attrs.init.
  kReduce,
};
constexpr int kNumOpKinds = static_cast<int>(OpKind::kReduce) + 1;

enum class CompareDirection : uint8_t { EQ, NE, LT, LE, GT, GE };
enum class ReduceKind : uint8_t { kSum, kMax, kMin, kProd };

// A scalar of any element type: floating types use `f`, integer and pred
// types use `i` (pred: 0 or 1). Compared bit for bit (so -0.0 != 0.0 and a
// NaN equals the same NaN), which is what structural equality needs.
struct Scalar {
  double f = 0.0;
  int64_t i = 0;
  static Scalar of(double value, ElementType t);  // ints truncate, pred = (value != 0)
  bool operator==(const Scalar& o) const;
  bool operator!=(const Scalar& o) const { return !(*this == o); }
};

struct Attributes {
  int64_t parameter_index = -1;                       // kParameter
  Scalar value;                                       // kConstant
  CompareDirection direction = CompareDirection::EQ;  // kCompare
  std::vector<int64_t> dimensions;                    // kBroadcastInDim, kReduce (sorted)
  ReduceKind reduce_kind = ReduceKind::kSum;          // kReduce
  Scalar init;                                        // kReduce: the init value
  bool operator==(const Attributes& o) const;
};

struct Op {
  OpKind kind;
  std::vector<ValueId> operands;
  TensorType type;  // of the result
  Attributes attrs;
};

class Graph {
 public:
  // Appends an op; operands must already be defined. Returns its value id.
  // Checks only wiring; the Builder checks types and shapes.
  ValueId add_op(OpKind kind, std::vector<ValueId> operands, TensorType type, Attributes attrs = {});
  void add_output(ValueId v);
  void set_outputs(std::vector<ValueId> outputs);

  const std::vector<Op>& ops() const { return ops_; }
  const Op& op(ValueId v) const { return ops_.at(static_cast<size_t>(v)); }
  const TensorType& type(ValueId v) const { return op(v).type; }
  int64_t num_ops() const { return static_cast<int64_t>(ops_.size()); }
  // Parameter values in signature order (parameters()[i] has parameter_index i).
  const std::vector<ValueId>& parameters() const { return parameters_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }

  // Checks every invariant (wiring, parameter numbering, per-op types and
  // shapes); throws std::invalid_argument naming the op.
  void verify() const;

 private:
  std::vector<Op> ops_;
  std::vector<ValueId> parameters_;
  std::vector<ValueId> outputs_;
};

// StableHLO spelling of an op ("add", "broadcast_in_dim", "log_plus_one"...).
const char* op_name(OpKind kind);
const char* direction_name(CompareDirection d);  // "EQ", ...
const char* reduce_kind_name(ReduceKind k);      // "sum", "max", "min", "prod"

bool is_unary_elementwise(OpKind k);   // kNegate .. kConvert
bool is_binary_elementwise(OpKind k);  // kAdd .. kCompare
bool is_elementwise(OpKind k);         // unary, binary, select
// Ops the fusion planner may put inside a kernel: elementwise, constant,
// broadcast_in_dim, reduce (only at a kernel's end).
bool is_fusible(OpKind k);
// Transcendental ops cost more than an add when the planner weighs recomputation.
bool is_transcendental(OpKind k);

// Checks the types of one op given its operand types; returns an error
// message starting with "[op_name]", or "" when it is well formed.
std::string check_op(const Graph& g, OpKind kind, const std::vector<ValueId>& operands, const TensorType& type,
                     const Attributes& attrs);

}  // namespace torch_tpu::ir
