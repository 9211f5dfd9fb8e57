// Random ops on the philox generator (TORCH_TPU_RNG=philox, the default):
// element i of an op issued at generator state (seed, offset) is a function of
// runtime/philox.h's philox_block(seed, offset + i) alone; i counts the
// elements of the result in row-major order.
//
// Drawn with their own kernels (philox_native): uniform_, normal_, random_
// (all overloads), bernoulli_ / bernoulli (scalar and tensor p), exponential_,
// geometric_, log_normal_, cauchy_ on real dtypes. Every other op taking a
// generator (randperm, multinomial, poisson, normal with tensor moments, ...)
// runs ATen's CPU kernel with a fresh CPU generator seeded from the block at
// the generator's offset, which then advances by 4: reproducible, and the same
// in every eager mode, but not sliceable by offsets as DTensor would need.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <cstdint>

#include "runtime/generator.h"

namespace torch_tpu {

// The value a tpu generator argument takes in queued work under the philox
// kind: (seed, offset) as a tuple of two ints for philox_native ops (after
// checking the op's arguments as the CPU kernel would, so errors raise before
// the offset moves), a seeded CPU generator for others.
c10::IValue philox_generator_arg(TPUGeneratorImpl& gen, const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

// Whether a queued argument is philox_generator_arg's tuple.
inline bool is_philox_arg(const c10::IValue& v) { return v.isTuple(); }

// Runs a philox_native op over host tensors; the stack as for op.callBoxed,
// with philox_generator_arg's tuple in the generator slot.
void run_philox_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// out[0..n) = 1 with probability p, as bernoulli_(p) draws them at (seed, offset).
void philox_bernoulli_mask(uint64_t seed, uint64_t offset, double p, uint8_t* out, int64_t n);

}  // namespace torch_tpu
