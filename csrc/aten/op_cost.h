// Prices an ATen op for the cost model (vtpu/cost_model.h) from its schema,
// arguments and results: FLOPs as torch.utils.flop_counter counts them,
// HBM traffic in physical bytes, GEMM dimensions for matrix products.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "vtpu/cost_model.h"

namespace torch_tpu {

// `args` are the op's arguments, `results` its tpu outputs (fresh and written).
vtpu::OpCost op_cost(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                     const std::vector<at::Tensor>& results, at::Float32MatmulPrecision precision);

// Ops priced by whoever registered them (torch.tpu.pallas kernels, whose cost comes from
// the kernel, not the schema): `fn` fills `cost` from the op's arguments and tpu results
// and returns true, or returns false to have the op priced as any other. Keyed by the
// schema name ("ns::op"); an empty `fn` removes the entry.
using CustomOpCostFn =
    std::function<bool(c10::ArrayRef<c10::IValue> args, const std::vector<at::Tensor>& results, vtpu::OpCost* cost)>;
void set_custom_op_cost(const std::string& op, CustomOpCostFn fn);

// Whether one op has a custom cost function (so its price is asked on every call and
// never cached), for callers that ask about the same op on every call: one atomic load
// while the registrations stay as they were when it last looked. `op` as for
// set_custom_op_cost; a caller asks about one op only.
class CustomCostCheck {
 public:
  bool has(const std::string& op) const;

 private:
  mutable std::atomic<uint64_t> seen_{0};  // (registration generation << 1) | has; 0: never looked
};

// A copy or fill that moves `bytes_read` and writes `bytes_written` HBM bytes.
vtpu::OpCost transfer_cost(double bytes_read, double bytes_written);

// Query/key pairs an attention over t queries and s keys computes: t·s, or with a causal
// (top-left: key j <= query i) mask the unmasked ones, sum over i of min(i + 1, s).
double causal_pairs(int64_t t, int64_t s, bool causal);

// Physical bytes a tensor occupies in HBM (tiled layout); 0 for undefined.
double physical_bytes_of(const at::Tensor& t);

}  // namespace torch_tpu
