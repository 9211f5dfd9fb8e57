// Fusion planning: partitions a graph into fused kernels.
//
// A kernel is one loop nest over an iteration space (a shape). It evaluates
// elementwise ops, constants and broadcast_in_dim in that space and may end
// in reductions over it; intermediates live in the kernel's tiles, and only
// the kernel's writes reach memory.
//
// The planner decides which values are *realized* (in memory); everything
// else is computed inline by the kernels that need it:
//  - parameters, outputs and reduce results are realized; so are reshape
//    operands and results (a reshape is a view of its operand's memory);
//  - an inline value needed by two or more kernels is recomputed in each when
//    that is cheap (cost <= max_duplicate_cost, transcendentals counting 4,
//    and at most one full-size read), otherwise realized once;
//  - ops on a smaller shape that reach the kernel through broadcast_in_dim are
//    recomputed at each element of the iteration space (XLA does the same),
//    so a broadcast never materializes.
// Then each realized value that is computed becomes a kernel root, and roots
// with the same iteration space (and the same reduce dimensions) are merged
// into one multi-output kernel when they share inputs or one reads the other
// elementwise, and no dependency cycle results. A reduction ends its kernel:
// its result is read by later kernels only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace torch_tpu::ir {

struct FusionOptions {
  // false: one kernel per op, every intermediate in memory (for comparison
  // and debugging); broadcast_in_dim is still read through a stride-0 map.
  bool fuse = true;
  int max_duplicate_cost = 8;
};

struct FusedKernel {
  Shape iteration_shape;         // result shape, or the reduced operand's shape
  std::vector<ValueId> reduces;  // reduce ops ending the kernel (same dimensions)
  std::vector<int64_t> reduce_dimensions;
  std::vector<ValueId> ops;       // every op evaluated (topological), reduces included
  std::vector<ValueId> reads;     // realized values loaded from memory
  std::vector<ValueId> writes;    // values stored: used by another kernel or an output
  std::vector<ValueId> internal;  // values computed here that never reach memory
  bool has_reduce() const { return !reduces.empty(); }
};

struct FusionPlan {
  std::vector<FusedKernel> kernels;  // in execution order
  std::vector<ValueId> views;        // reshape results, aliases of their operand
  // Per value id: index of the kernel that writes it, or -1.
  std::vector<int32_t> writer;
  std::string to_string(const Graph& g) const;  // one line per kernel
};

FusionPlan plan_fusion(const Graph& g, const FusionOptions& options = {});

// How a value is indexed inside a kernel: for each iteration dimension, the
// value's dimension it follows, or -1 where the value is broadcast (stride 0).
using DimMap = std::vector<int32_t>;
DimMap identity_map(int64_t rank);
// The operand's map of broadcast_in_dim `op` (result shape out, operand
// shape in) when its result is indexed by `result_map`.
DimMap compose_broadcast(const DimMap& result_map, const Op& op, const Shape& operand_shape);

}  // namespace torch_tpu::ir
