// Pieces of defer_and_fuse shared between the recorder (record.cc) and
// the table of op lowerings (lower.cc).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <string>
#include <vector>

#include "ir/builder.h"

namespace torch_tpu::defer {

using ir::ValueId;

// The IR element type of an ATen dtype, or nullopt when the IR has none
// (int16, unsigned > 8 bit, complex, float8, ...).
std::optional<ir::ElementType> ir_type(c10::ScalarType t);
// The ATen dtype of an IR element type (the inverse of ir_type).
c10::ScalarType scalar_type_of(ir::ElementType t);
// 16-bit floats compute in f32 inside an op (ATen's opmath type, the VPU's lanes).
ir::ElementType opmath_of(ir::ElementType t);

// One argument of the op being lowered.
struct Operand {
  enum class Kind { kOther, kTensor, kScalar } kind = Kind::kOther;
  ValueId value = -1;                   // kTensor: IR value with the tensor's dtype and shape
  at::Tensor tensor;                    // kTensor: the tpu tensor; kScalar: the host 0-dim tensor, if it was one
  c10::Scalar scalar;                   // kScalar: a Scalar argument, a wrapped number or a host 0-dim tensor's value
  const c10::IValue* ivalue = nullptr;  // the argument itself
};

// Thrown by a lowering for an argument combination it does not handle; the
// op then runs strictly (nothing recorded is used).
struct NotFusible {};

// Decides how a scalar the user passed (a Python number, a Scalar argument)
// enters the IR: as a constant, which the kernels bake in, or -- once the
// scalar at that call site has been seen to change, e.g. a scheduled
// learning rate -- as a rank-0 parameter, so the region's structure (and its
// compiled kernels) stay the same from step to step.
class ScalarSink {
 public:
  virtual ~ScalarSink() = default;
  // `v` is already in type t (floats rounded, integers wrapped); `arg` is the
  // argument position it came from.
  virtual ValueId scalar(ir::Builder& b, size_t arg, const ir::Scalar& v, ir::ElementType t) = 0;
  // A pred mask of `shape`, true with probability p, drawn when the region
  // runs from `gen` (a tpu generator) exactly as ATen's bernoulli_(p) would
  // draw it at that point of the program. Regions only (NotFusible elsewhere).
  virtual ValueId bernoulli_mask(ir::Builder& b, const ir::Shape& shape, double p, const at::Generator& gen) {
    throw NotFusible{};
  }
};

// Fills out[0..n) with 0/1 exactly as ATen's CPU bernoulli_(p) fills a bool
// tensor of n contiguous elements from `gen` (a tpu generator: its host
// engine), advancing the generator the same way. Runs on the chip's stream.
void draw_bernoulli_mask(const at::Generator& gen, double p, uint8_t* out, int64_t n);
// Whether draw_bernoulli_mask uses its vectorized mt19937 (checked once
// against ATen's kernel) or calls ATen's kernel (e.g. ATen's MKL path on Intel CPUs).
bool bernoulli_mask_is_vectorized();

// What a lowering sees: the operands, the result type from the meta kernel,
// the builder, and helpers that follow ATen's type-promotion and opmath rules.
class Lowering {
 public:
  Lowering(ir::Builder& b, std::vector<Operand>& args, std::vector<ir::TensorType> outs,
           std::vector<c10::ScalarType> out_dtypes, ScalarSink* sink = nullptr)
      : b(b), args_(args), outs_(std::move(outs)), out_dtypes_(std::move(out_dtypes)), sink_(sink) {}

  ir::Builder& b;
  const Operand& arg(size_t i) const;
  size_t num_args() const { return args_.size(); }
  bool is_tensor(size_t i) const { return i < args_.size() && args_[i].kind == Operand::Kind::kTensor; }
  bool is_none(size_t i) const { return i >= args_.size() || args_[i].ivalue == nullptr || args_[i].ivalue->isNone(); }
  c10::Scalar scalar(size_t i) const;  // kScalar (or a Scalar-typed IValue)
  const c10::IValue& ivalue(size_t i) const;

  const ir::TensorType& out(size_t k = 0) const { return outs_.at(k); }
  c10::ScalarType out_dtype(size_t k = 0) const { return out_dtypes_.at(k); }

  // ATen's result_type over the listed arguments (tensors, wrapped numbers,
  // Scalars; absent optional arguments skipped).
  c10::ScalarType promote(std::initializer_list<size_t> idx) const;
  // Argument i cast to `ct` (ATen's common-dtype cast), widened to the opmath
  // type, broadcast to `shape`. A scalar becomes a constant; `exact_scalar`
  // keeps it unrounded in opmath precision, as ATen's kernels do for a
  // scalar second operand of add/sub/mul/div and for clamp bounds.
  ValueId load(size_t i, c10::ScalarType ct, const ir::Shape& shape, bool exact_scalar = false);
  ValueId load(size_t i, c10::ScalarType ct) { return load(i, ct, out().shape); }
  // A splat constant of element type t (default: the opmath type of ct).
  ValueId cst(double v, ir::ElementType t, ir::Shape shape);
  // A scalar the user passed in argument `arg` (see ScalarSink), splat to shape.
  ValueId user_scalar(size_t arg, double v, ir::ElementType t, ir::Shape shape);
  // The opmath value `v` rounded to the k-th result's dtype.
  ValueId finish(ValueId v, size_t k = 0);
  // See ScalarSink::bernoulli_mask.
  ValueId bernoulli_mask(const ir::Shape& shape, double p, const at::Generator& gen) {
    if (!sink_) throw NotFusible{};
    return sink_->bernoulli_mask(b, shape, p, gen);
  }

  // Per result: the IR value (set by the lowering).
  std::vector<ValueId> results;

 private:
  std::vector<Operand>& args_;
  std::vector<ir::TensorType> outs_;
  std::vector<c10::ScalarType> out_dtypes_;
  ScalarSink* sink_;
};

using LowerFn = void (*)(Lowering&);

// The lowering of an ATen op ("aten::add.Tensor", "aten::add_.Tensor"), or
// nullptr when it is not fusible. In-place variants share the functional
// op's lowering; the recorder writes the result back to `self`.
LowerFn find_lowering(const std::string& label);
// Every label find_lowering knows (some are not operators of this PyTorch).
std::vector<std::string> fusible_op_labels();

}  // namespace torch_tpu::defer
