// The vocabulary every tpu_dist collective shares: op kinds and the names
// messages use, the element-wise reductions, the ring order over the torus and
// the ring cost formulas (the cost model and the estimator use them too). The
// algorithms are in ring_engine.h; the c10d entry points in backend.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "vtpu/counters.h"
#include "vtpu/topology.h"

namespace torch_tpu::dist {

enum class OpKind : int32_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kReduce,
  kBarrier,
};
const char* op_name(OpKind op);
const char* redop_name(int redop);
// "float32", "bfloat16", "int64", ... (PyTorch's Python names).
std::string dtype_name(int32_t dtype);

// Ring order of ranks on `chips` (global chip id per rank, -1 = host tensor):
// along one torus axis, the axis ring; across several, a snake through the
// box; ranks without distinct chips keep rank order.
std::vector<int> ring_order(const std::vector<int>& chips, const vtpu::Topology& topology);
// ICI links a ring over these chips drives at once: per spanned axis, 2 when
// the group closes a wrapped ring of more than 2 chips, else 1.
int ring_links(const std::vector<int>& chips, const vtpu::Topology& topology);

// The ring formulas of Engine::cost for `n` ranks (payload on this rank; for all_gather and
// reduce_scatter the n-rank buffer): ICI bytes this rank sends and ring steps. all_reduce and
// reduce 2(n-1)/n·payload in 2(n-1) steps, all_gather and reduce_scatter (n-1)/n·payload in
// n-1, broadcast payload in n-1, barrier n-1 steps. ici_links is left at 1 (see ring_links).
// Other ops (gather, scatter, all_to_all) depend on the root or on per-peer counts: Engine::cost.
vtpu::CollectiveCost ring_cost(OpKind op, int n, double payload_bytes);

// dst = a (op) b over `count` elements; dst may alias a or b.
void combine(void* dst, const void* a, const void* b, int64_t count, at::ScalarType dtype, int redop);
// data /= n for AVG (truncating for integers).
void divide(void* data, int64_t count, at::ScalarType dtype, int64_t n);

}  // namespace torch_tpu::dist
