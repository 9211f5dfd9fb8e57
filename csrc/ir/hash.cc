#include "ir/hash.h"

#include <cstring>

namespace torch_tpu::ir {

namespace {

uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

}  // namespace

std::vector<ValueId> canonical_order(const Graph& g) {
  const int64_t n = g.num_ops();
  std::vector<ValueId> order;
  order.reserve(static_cast<size_t>(n));
  std::vector<char> visited(static_cast<size_t>(n), 0);
  // Iterative post-order DFS (graphs can be deep chains).
  std::vector<std::pair<ValueId, size_t>> stack;
  auto visit = [&](ValueId root) {
    if (visited[root]) return;
    visited[root] = 1;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      const auto& operands = g.op(v).operands;
      if (next < operands.size()) {
        ValueId u = operands[next++];
        if (!visited[u]) {
          visited[u] = 1;
          stack.push_back({u, 0});
        }
      } else {
        order.push_back(v);
        stack.pop_back();
      }
    }
  };
  for (ValueId v : g.outputs()) visit(v);
  for (ValueId v : g.parameters()) visit(v);
  for (ValueId v = 0; v < n; ++v) visit(v);
  return order;
}

uint64_t structural_hash(const Graph& g) {
  std::vector<ValueId> order = canonical_order(g);
  std::vector<int64_t> position(order.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int64_t>(i);
  uint64_t h = hash_mix(0x7470755F6972ull, static_cast<uint64_t>(order.size()));
  for (ValueId v : order) {
    const Op& op = g.op(v);
    h = hash_mix(h, static_cast<uint64_t>(op.kind));
    h = hash_mix(h, static_cast<uint64_t>(op.type.dtype));
    h = hash_mix(h, op.type.shape.size());
    for (int64_t d : op.type.shape) h = hash_mix(h, static_cast<uint64_t>(d));
    h = hash_mix(h, op.operands.size());
    for (ValueId u : op.operands) h = hash_mix(h, static_cast<uint64_t>(position[u]));
    const Attributes& a = op.attrs;
    h = hash_mix(h, static_cast<uint64_t>(a.parameter_index));
    h = hash_mix(h, double_bits(a.value.f));
    h = hash_mix(h, static_cast<uint64_t>(a.value.i));
    h = hash_mix(h, static_cast<uint64_t>(a.direction));
    h = hash_mix(h, a.dimensions.size());
    for (int64_t d : a.dimensions) h = hash_mix(h, static_cast<uint64_t>(d));
    h = hash_mix(h, static_cast<uint64_t>(a.reduce_kind));
    h = hash_mix(h, double_bits(a.init.f));
    h = hash_mix(h, static_cast<uint64_t>(a.init.i));
  }
  h = hash_mix(h, g.outputs().size());
  for (ValueId v : g.outputs()) h = hash_mix(h, static_cast<uint64_t>(position[v]));
  return h;
}

bool structurally_equal(const Graph& a, const Graph& b) {
  if (a.num_ops() != b.num_ops() || a.outputs().size() != b.outputs().size() ||
      a.parameters().size() != b.parameters().size())
    return false;
  std::vector<ValueId> oa = canonical_order(a), ob = canonical_order(b);
  std::vector<int64_t> pa(oa.size()), pb(ob.size());
  for (size_t i = 0; i < oa.size(); ++i) {
    pa[oa[i]] = static_cast<int64_t>(i);
    pb[ob[i]] = static_cast<int64_t>(i);
  }
  for (size_t i = 0; i < oa.size(); ++i) {
    const Op& x = a.op(oa[i]);
    const Op& y = b.op(ob[i]);
    if (x.kind != y.kind || x.type != y.type || !(x.attrs == y.attrs) || x.operands.size() != y.operands.size())
      return false;
    for (size_t k = 0; k < x.operands.size(); ++k)
      if (pa[x.operands[k]] != pb[y.operands[k]]) return false;
  }
  for (size_t k = 0; k < a.outputs().size(); ++k)
    if (pa[a.outputs()[k]] != pb[b.outputs()[k]]) return false;
  return true;
}

}  // namespace torch_tpu::ir
