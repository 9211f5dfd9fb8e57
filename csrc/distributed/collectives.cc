#include "distributed/collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <set>

namespace torch_tpu::dist {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

}  // namespace

std::string dtype_name(int32_t dtype) {
  switch (static_cast<at::ScalarType>(dtype)) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    default:
      return c10::toString(static_cast<at::ScalarType>(dtype));
  }
}

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

const char* redop_name(int redop) {
  switch (static_cast<RedOp>(redop)) {
    case RedOp::SUM:
      return "SUM";
    case RedOp::AVG:
      return "AVG";
    case RedOp::PRODUCT:
      return "PRODUCT";
    case RedOp::MIN:
      return "MIN";
    case RedOp::MAX:
      return "MAX";
    case RedOp::BAND:
      return "BAND";
    case RedOp::BOR:
      return "BOR";
    case RedOp::BXOR:
      return "BXOR";
    case RedOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNKNOWN";
  }
}

void combine(void* dst, const void* a, const void* b, int64_t count, at::ScalarType dtype, int redop) {
  if (count <= 0) return;
  const auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
  at::Tensor D = at::from_blob(dst, {count}, opts);
  at::Tensor A = at::from_blob(const_cast<void*>(a), {count}, opts);
  at::Tensor B = at::from_blob(const_cast<void*>(b), {count}, opts);
  switch (static_cast<RedOp>(redop)) {
    case RedOp::SUM:
    case RedOp::AVG:
    case RedOp::PREMUL_SUM:
      if (dtype == at::kBool) {
        at::logical_or_out(D, A, B);
      } else {
        at::add_out(D, A, B);
      }
      break;
    case RedOp::PRODUCT:
      if (dtype == at::kBool) {
        at::logical_and_out(D, A, B);
      } else {
        at::mul_out(D, A, B);
      }
      break;
    case RedOp::MIN:
      at::minimum_out(D, A, B);
      break;
    case RedOp::MAX:
      at::maximum_out(D, A, B);
      break;
    case RedOp::BAND:
      at::bitwise_and_out(D, A, B);
      break;
    case RedOp::BOR:
      at::bitwise_or_out(D, A, B);
      break;
    case RedOp::BXOR:
      at::bitwise_xor_out(D, A, B);
      break;
    default:
      TORCH_CHECK(false, "tpu_dist: unsupported reduce op ", redop_name(redop));
  }
}

void divide(void* data, int64_t count, at::ScalarType dtype, int64_t n) {
  if (count <= 0 || n == 1) return;
  at::Tensor t = at::from_blob(data, {count}, at::TensorOptions().dtype(dtype));
  if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    t.div_(n, "trunc");
  } else {
    t.div_(n);
  }
}

std::vector<int> ring_order(const std::vector<int>& chips, const vtpu::Topology& topology) {
  const int n = static_cast<int>(chips.size());
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::set<int> distinct;
  for (int c : chips) {
    if (c < 0 || c >= topology.num_chips()) return order;
    distinct.insert(c);
  }
  if (static_cast<int>(distinct.size()) != n || n <= 2) return order;
  std::map<int, int> rank_of;  // chip -> rank
  for (int i = 0; i < n; ++i) rank_of[chips[i]] = i;
  std::set<int> xs, ys, zs;
  for (int c : chips) {
    const auto xyz = topology.coords(c);
    xs.insert(xyz[0]);
    ys.insert(xyz[1]);
    zs.insert(xyz[2]);
  }
  const int spanned = (xs.size() > 1) + (ys.size() > 1) + (zs.size() > 1);
  order.clear();
  if (spanned == 1) {
    const int axis = xs.size() > 1 ? 0 : ys.size() > 1 ? 1 : 2;
    const int start = *std::min_element(chips.begin(), chips.end());
    for (int c : topology.ring(start, axis)) {
      auto it = rank_of.find(c);
      if (it != rank_of.end()) order.push_back(it->second);
    }
    return order;
  }
  // A snake (boustrophedon) through the box: consecutive chips are neighbours.
  std::vector<int> yv(ys.begin(), ys.end()), xv(xs.begin(), xs.end());
  int row = 0;
  int plane = 0;
  for (int z : zs) {
    std::vector<int> yo = yv;
    if (plane++ % 2) std::reverse(yo.begin(), yo.end());
    for (int y : yo) {
      std::vector<int> xo = xv;
      if (row++ % 2) std::reverse(xo.begin(), xo.end());
      for (int x : xo) {
        const int c = topology.chip_at({x, y, z});
        auto it = rank_of.find(c);
        if (it != rank_of.end()) order.push_back(it->second);
      }
    }
  }
  return order;
}

int ring_links(const std::vector<int>& chips, const vtpu::Topology& topology) {
  std::set<int> axis_values[3];
  for (int c : chips) {
    if (c < 0 || c >= topology.num_chips()) return 1;
    const auto xyz = topology.coords(c);
    for (int a = 0; a < 3; ++a) axis_values[a].insert(xyz[a]);
  }
  int links = 0;
  for (int a = 0; a < 3; ++a) {
    const int extent = static_cast<int>(axis_values[a].size());
    if (extent <= 1) continue;
    links += (topology.wraps(a) && extent == topology.shape()[a] && extent > 2) ? 2 : 1;
  }
  return std::max(links, 1);
}

vtpu::CollectiveCost ring_cost(OpKind op, int n, double payload) {
  vtpu::CollectiveCost c;
  c.payload_bytes = payload;
  if (n <= 1) return c;
  const double f = static_cast<double>(n - 1) / n;
  switch (op) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
      c.ici_bytes = 2 * f * payload;
      c.ici_steps = 2 * (n - 1);
      break;
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
      c.ici_bytes = f * payload;  // payload: the n-rank buffer (output of all_gather, input of reduce_scatter)
      c.ici_steps = n - 1;
      break;
    case OpKind::kBroadcast:
      c.ici_bytes = payload;  // pipelined along the ring: every chip forwards the buffer once
      c.ici_steps = n - 1;
      break;
    case OpKind::kBarrier:
      c.ici_steps = n - 1;
      break;
    default:
      break;
  }
  return c;
}

}  // namespace torch_tpu::dist
