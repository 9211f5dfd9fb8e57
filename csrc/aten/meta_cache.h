// Output metadata of an op from its meta kernel, cached per thread.
//
// Meta kernels are slow (many are Python registrations, ~100 us): their
// answers are keyed by the op and everything a meta kernel can see (argument
// shapes, strides, offsets, dtypes, storage sharing and non-tensor values).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <vector>

#include "vtpu/cost_model.h"
#include "vtpu/counters.h"

namespace torch_tpu {

// What the meta kernel said about one returned tensor.
struct TensorMeta {
  bool defined = false;
  c10::DimVector sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};
struct ReturnMeta {
  bool is_list = false;
  std::vector<TensorMeta> tensors;
};
using MetaResult = std::vector<ReturnMeta>;

bool meta_has_lists(const MetaResult& meta);

// Runs the meta kernel on meta aliases of `args` (or reuses its cached
// answer); throws what the meta kernel throws. The reference is valid until
// the next call on this thread. `pointwise` (OpInfo::pointwise): the cache keys
// double arguments by their class and order instead of their bits.
// Its warnings are given to the caller's warning handler at every call.
const MetaResult& meta_result(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool pointwise);

// What the strict fallback learns about a cached signature at its first call and
// reuses at later ones (so that a repeated call skips that work).
struct MetaExtras {
  bool validated = false;  // its first call's validation passed (TORCH_TPU_VALIDATE_FIRST_CALL)
  bool priced = false;     // `cost` holds the op's cost-model figures
  int8_t precision = -1;   // the at::Float32MatmulPrecision `cost` was priced at
  vtpu::OpCost cost;
  vtpu::CostEstimates estimates;  // of `cost`, worked out on its first record (Chip::record_cost)
};
// The extras of the entry the last meta_result() on this thread answered from,
// or nullptr when that call could not be cached. Valid as long as its result.
MetaExtras* last_meta_extras();

// The messages of the warnings the last meta_result() on this thread gave:
// the CPU kernel repeating them is not warned twice.
const std::vector<std::string>& last_meta_warnings();

// How many times meta_result() ran a meta kernel on this thread (cache misses; tests).
uint64_t meta_kernel_calls_on_this_thread();

}  // namespace torch_tpu
