// Reference interpreter of the IR: slow, simple, and the definition every
// fast path is tested against.
//
// Semantics:
// - Floating ops compute in double and round the result to the op's element
//   type (f32, bf16, f16: through f32, round to nearest even). This is eager
//   PyTorch's per-op rounding; the executor may keep bf16/f16 values that
//   stay inside a fused kernel in f32, so chains in 16-bit types compare
//   within 16-bit tolerances.
// - Integer ops compute in int64 and wrap to the type's width (two's
//   complement). divide truncates toward zero; x / 0 = -1 (all ones) and
//   MIN / -1 = MIN, as XLA defines them. power with a negative exponent is 0
//   unless the base is 1 or -1.
// - maximum / minimum propagate NaN. sign keeps +-0 and NaN.
// - convert: float -> int truncates toward zero, saturates at the type's
//   range, NaN -> 0; int -> int wraps; x -> pred is x != 0; pred -> x is 0/1.
// - reduce accumulates in double (integers: int64, wrapping) from `init`, in
//   row-major order of the operand, then rounds once to the element type.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace torch_tpu::ir {

// A host array of one element type: floating types in `f`, integers and
// pred (0/1) in `i`; row-major.
struct Literal {
  TensorType type;
  std::vector<double> f;
  std::vector<int64_t> i;

  static Literal zeros(const TensorType& t);
  // Reads a contiguous row-major array in the memory format of t.dtype
  // (bf16/f16 as uint16 bits, pred as one byte).
  static Literal from_bytes(const TensorType& t, const void* data);
  void to_bytes(void* data) const;
  int64_t numel() const { return type.numel(); }
};

struct InterpretOptions {
  // false: bf16/f16 results of arithmetic stay in double and are rounded only
  // by convert, by reduce, and at the outputs -- the executor's "f32 inside a
  // kernel, round once on store" semantics, for checking fused 16-bit chains.
  bool round_16bit_each_op = true;
};

// inputs[k] is parameter k. Returns one literal per output.
std::vector<Literal> interpret(const Graph& g, const std::vector<Literal>& inputs,
                               const InterpretOptions& options = {});

}  // namespace torch_tpu::ir
