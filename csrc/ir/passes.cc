#include "ir/passes.h"

#include <cstring>
#include <unordered_map>

#include "ir/hash.h"

namespace torch_tpu::ir {

namespace {

// Copies the ops with keep[v] set, operands mapped through `replace` first
// (replace[v] = the op that stands for v; v itself when unchanged).
Graph rebuild(const Graph& g, const std::vector<char>& keep, const std::vector<ValueId>& replace) {
  Graph out;
  std::vector<ValueId> map(static_cast<size_t>(g.num_ops()), -1);
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    if (!keep[v]) continue;
    const Op& op = g.op(v);
    std::vector<ValueId> operands;
    operands.reserve(op.operands.size());
    for (ValueId u : op.operands) operands.push_back(map[replace[u]]);
    map[v] = out.add_op(op.kind, std::move(operands), op.type, op.attrs);
  }
  for (ValueId v : g.outputs()) out.add_output(map[replace[v]]);
  return out;
}

std::vector<ValueId> identity_map(const Graph& g) {
  std::vector<ValueId> r(static_cast<size_t>(g.num_ops()));
  for (ValueId v = 0; v < g.num_ops(); ++v) r[v] = v;
  return r;
}

struct OpKey {
  const Op* op;
  std::vector<ValueId> operands;  // after replacement
};

struct OpKeyHash {
  size_t operator()(const OpKey& k) const {
    uint64_t h = static_cast<uint64_t>(k.op->kind);
    for (ValueId v : k.operands) h = hash_mix(h, static_cast<uint64_t>(v));
    h = hash_mix(h, static_cast<uint64_t>(k.op->type.dtype));
    for (int64_t d : k.op->type.shape) h = hash_mix(h, static_cast<uint64_t>(d));
    uint64_t f;
    std::memcpy(&f, &k.op->attrs.value.f, sizeof f);
    h = hash_mix(h, f);
    h = hash_mix(h, static_cast<uint64_t>(k.op->attrs.value.i));
    for (int64_t d : k.op->attrs.dimensions) h = hash_mix(h, static_cast<uint64_t>(d));
    return static_cast<size_t>(h);
  }
};

struct OpKeyEq {
  bool operator()(const OpKey& a, const OpKey& b) const {
    return a.op->kind == b.op->kind && a.operands == b.operands && a.op->type == b.op->type &&
           a.op->attrs == b.op->attrs;
  }
};

}  // namespace

Graph dead_code_elimination(const Graph& g) {
  std::vector<char> live(static_cast<size_t>(g.num_ops()), 0);
  for (ValueId v : g.outputs()) live[v] = 1;
  for (ValueId v : g.parameters()) live[v] = 1;
  for (ValueId v = g.num_ops() - 1; v >= 0; --v)
    if (live[v])
      for (ValueId u : g.op(v).operands) live[u] = 1;
  return rebuild(g, live, identity_map(g));
}

Graph common_subexpression_elimination(const Graph& g) {
  std::vector<ValueId> replace = identity_map(g);
  std::unordered_map<OpKey, ValueId, OpKeyHash, OpKeyEq> seen;
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    const Op& op = g.op(v);
    if (op.kind == OpKind::kParameter) continue;
    OpKey key{&op, {}};
    for (ValueId u : op.operands) key.operands.push_back(replace[u]);
    auto [it, inserted] = seen.emplace(std::move(key), v);
    if (!inserted) replace[v] = it->second;
  }
  std::vector<char> keep(static_cast<size_t>(g.num_ops()), 1);
  return rebuild(g, keep, replace);
}

std::vector<Pass> default_passes() {
  return {{"cse", common_subexpression_elimination}, {"dce", dead_code_elimination}};
}

Graph run_passes(const Graph& g, const std::vector<Pass>& passes, const DumpHook& dump) {
  Graph cur = g;
  for (const Pass& p : passes) {
    cur = p.run(cur);
    if (dump) dump(p.name, cur);
  }
  return cur;
}

}  // namespace torch_tpu::ir
