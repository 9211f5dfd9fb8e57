#include "ir/fusion.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace torch_tpu::ir {

DimMap identity_map(int64_t rank) {
  DimMap m(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) m[d] = static_cast<int32_t>(d);
  return m;
}

DimMap compose_broadcast(const DimMap& result_map, const Op& op, const Shape& operand_shape) {
  DimMap m(result_map.size(), -1);
  const auto& dims = op.attrs.dimensions;
  for (size_t d = 0; d < result_map.size(); ++d) {
    int32_t r = result_map[d];
    if (r < 0) continue;
    for (size_t k = 0; k < dims.size(); ++k)
      if (dims[k] == r && operand_shape[k] == op.type.shape[r]) m[d] = static_cast<int32_t>(k);
  }
  return m;
}

namespace {

int op_cost(OpKind k) {
  if (k == OpKind::kBroadcastInDim || k == OpKind::kConstant) return 0;
  return is_transcendental(k) ? 4 : 1;
}

struct Candidate {
  Shape iteration_shape;
  std::vector<ValueId> reduces;
  std::vector<int64_t> reduce_dimensions;
  std::vector<ValueId> roots;  // non-reduce roots
  std::set<ValueId> body;
  std::set<ValueId> reads;
  std::set<std::pair<ValueId, DimMap>> read_maps;
};

class Planner {
 public:
  Planner(const Graph& g, const FusionOptions& opt) : g_(g), opt_(opt) {}

  FusionPlan run() {
    const int64_t n = g_.num_ops();
    live_.assign(n, 0);
    realized_.assign(n, 0);
    is_output_.assign(n, 0);
    for (ValueId v : g_.outputs()) live_[v] = is_output_[v] = 1;
    for (ValueId v = n - 1; v >= 0; --v)
      if (live_[v])
        for (ValueId u : g_.op(v).operands) live_[u] = 1;
    users_.assign(n, {});
    for (ValueId v = 0; v < n; ++v)
      if (live_[v])
        for (ValueId u : g_.op(v).operands)
          if (users_[u].empty() || users_[u].back() != v) users_[u].push_back(v);

    for (ValueId v = 0; v < n; ++v) {
      if (!live_[v]) continue;
      const Op& op = g_.op(v);
      if (is_output_[v] || op.kind == OpKind::kParameter || op.kind == OpKind::kReduce) realized_[v] = 1;
      if (op.kind == OpKind::kReshape) realized_[v] = realized_[op.operands[0]] = 1;
      // Unfused: every computed value in memory; broadcasts stay index maps
      // (stride 0), as eager broadcasting reads them.
      if (!opt_.fuse && op.kind != OpKind::kConstant && op.kind != OpKind::kBroadcastInDim) realized_[v] = 1;
    }
    if (opt_.fuse) decide_duplication();
    build_kernels();
    return finish();
  }

 private:
  // Forward over the graph: an inline value needed by several kernels is
  // realized unless recomputing it is cheap. Producers are decided first, so
  // the cost of a value's expression is known when it is weighed.
  //
  // The kernels that would inline a value are its nearest realized consumers.
  // They are computed once, backwards, from the initial realized set: a value
  // realized later in the forward pass is upstream of every value still to
  // be decided, so it cannot change their consumers. Two roots are enough to
  // know "several", which keeps this linear.
  void decide_duplication() {
    const int64_t n = g_.num_ops();
    std::vector<std::vector<ValueId>> roots(static_cast<size_t>(n));
    for (ValueId v = n - 1; v >= 0; --v) {
      if (!live_[v]) continue;
      std::vector<ValueId>& r = roots[v];
      auto add = [&r](ValueId x) {
        if (r.size() < 2 && std::find(r.begin(), r.end(), x) == r.end()) r.push_back(x);
      };
      for (ValueId u : users_[v]) {
        if (realized_[u])
          add(u);
        else
          for (ValueId x : roots[u]) add(x);
      }
    }
    for (ValueId v = 0; v < n; ++v) {
      if (!live_[v] || realized_[v]) continue;
      OpKind k = g_.op(v).kind;
      if (k == OpKind::kConstant || !is_fusible(k)) continue;
      if (roots[v].size() >= 2 && !duplicable(v)) realized_[v] = 1;
    }
  }

  // Cheap to recompute: at most max_duplicate_cost, at most one full-size
  // read. The walk stops as soon as the answer is no.
  bool duplicable(ValueId v) const {
    int cost = 0, full_reads = 0, visited = 0;
    const int64_t size = g_.type(v).numel();
    std::set<ValueId> seen{v};
    std::vector<ValueId> stack{v};
    while (!stack.empty()) {
      ValueId x = stack.back();
      stack.pop_back();
      cost += op_cost(g_.op(x).kind);
      if (cost > opt_.max_duplicate_cost || ++visited > 4 * opt_.max_duplicate_cost + 16) return false;
      for (ValueId u : g_.op(x).operands) {
        if (!seen.insert(u).second) continue;
        if (realized_[u]) {
          if (g_.type(u).numel() >= size && ++full_reads > 1) return false;
        } else {
          stack.push_back(u);
        }
      }
    }
    return true;
  }

  // The ops a root evaluates and the realized values it loads (with the map
  // each is indexed by).
  Candidate make_candidate(ValueId r) const {
    Candidate c;
    const Op& op = g_.op(r);
    ValueId start = r;
    if (op.kind == OpKind::kReduce) {
      c.reduces.push_back(r);
      c.reduce_dimensions = op.attrs.dimensions;
      c.body.insert(r);
      start = op.operands[0];
      c.iteration_shape = g_.type(start).shape;
    } else {
      c.roots.push_back(r);
      c.iteration_shape = op.type.shape;
    }
    std::set<std::pair<ValueId, DimMap>> seen;
    std::vector<std::pair<ValueId, DimMap>> stack{
        {start, identity_map(static_cast<int64_t>(c.iteration_shape.size()))}};
    while (!stack.empty()) {
      auto [x, map] = stack.back();
      stack.pop_back();
      if (!seen.insert({x, map}).second) continue;
      const Op& xo = g_.op(x);
      if (realized_[x] && !(x == r && op.kind != OpKind::kReduce)) {
        c.reads.insert(x);
        c.read_maps.insert({x, map});
        continue;
      }
      c.body.insert(x);
      if (xo.kind == OpKind::kBroadcastInDim) {
        stack.push_back({xo.operands[0], compose_broadcast(map, xo, g_.type(xo.operands[0]).shape)});
      } else {
        for (ValueId u : xo.operands) stack.push_back({u, map});
      }
    }
    return c;
  }

  // The value whose memory `v` views (itself unless a reshape).
  ValueId view_base(ValueId v) const {
    while (g_.op(v).kind == OpKind::kReshape) v = g_.op(v).operands[0];
    return v;
  }

  // The kernel whose memory a realized value lives in (following views), or -1.
  int source_kernel(ValueId v) const { return kernel_of_[view_base(v)]; }

  bool depends_on(int from, int target, std::vector<char>& seen) const {
    if (from == target) return true;
    if (seen[from]) return false;
    seen[from] = 1;
    for (ValueId x : cands_[from].reads) {
      int k = source_kernel(x);
      if (k >= 0 && depends_on(k, target, seen)) return true;
    }
    return false;
  }

  bool try_merge(int k, const Candidate& c) {
    Candidate& K = cands_[k];
    if (K.iteration_shape != c.iteration_shape) return false;
    if (!K.reduces.empty() && !c.reduces.empty() && K.reduce_dimensions != c.reduce_dimensions) return false;
    const DimMap id = identity_map(static_cast<int64_t>(c.iteration_shape.size()));
    bool benefit = false;
    std::set<ValueId> k_roots(K.roots.begin(), K.roots.end());
    for (const auto& [x, map] : c.read_maps) {
      if (std::find(K.reduces.begin(), K.reduces.end(), x) != K.reduces.end()) return false;
      // A view (reshape) of a value k computes is read from k's memory, which
      // k writes while it runs (a reduction only at its end): another kernel.
      if (x != view_base(x) && (k_roots.count(view_base(x)) ||
                                std::find(K.reduces.begin(), K.reduces.end(), view_base(x)) != K.reduces.end()))
        return false;
      if (k_roots.count(x)) {
        if (map != id) return false;
        benefit = true;
      }
      if (K.reads.count(x)) benefit = true;
    }
    for (ValueId x : c.body)
      if (K.body.count(x) && op_cost(g_.op(x).kind) > 0) benefit = true;
    if (!benefit) return false;
    // Merging must not make k wait for a kernel that itself waits for k.
    for (ValueId x : c.reads) {
      int s = source_kernel(x);
      if (s < 0 || s == k) continue;
      std::vector<char> seen(cands_.size(), 0);
      if (depends_on(s, k, seen)) return false;
    }
    for (ValueId x : c.roots) K.roots.push_back(x);
    for (ValueId x : c.reduces) K.reduces.push_back(x);
    if (K.reduce_dimensions.empty()) K.reduce_dimensions = c.reduce_dimensions;
    K.body.insert(c.body.begin(), c.body.end());
    for (const auto& rm : c.read_maps) {
      if (k_roots.count(rm.first)) continue;  // now computed in the kernel
      K.reads.insert(rm.first);
      K.read_maps.insert(rm);
    }
    for (ValueId x : c.roots) {
      K.reads.erase(x);
      for (auto it = K.read_maps.begin(); it != K.read_maps.end();)
        it = it->first == x ? K.read_maps.erase(it) : std::next(it);
    }
    return true;
  }

  void build_kernels() {
    kernel_of_.assign(g_.num_ops(), -1);
    for (ValueId r = 0; r < g_.num_ops(); ++r) {
      if (!live_[r] || !realized_[r]) continue;
      OpKind k = g_.op(r).kind;
      if (k == OpKind::kParameter || k == OpKind::kReshape) continue;
      Candidate c = make_candidate(r);
      int merged = -1;
      if (opt_.fuse)
        for (int i = 0; i < static_cast<int>(cands_.size()) && merged < 0; ++i)
          if (try_merge(i, c)) merged = i;
      if (merged < 0) {
        merged = static_cast<int>(cands_.size());
        cands_.push_back(std::move(c));
      }
      kernel_of_[r] = merged;
    }
  }

  FusionPlan finish() {
    const int nk = static_cast<int>(cands_.size());
    // Which roots must reach memory: outputs, reshape operands, values other
    // kernels read.
    std::vector<char> needed(g_.num_ops(), 0);
    for (ValueId v = 0; v < g_.num_ops(); ++v) {
      if (!live_[v]) continue;
      if (is_output_[v]) needed[v] = 1;
      if (g_.op(v).kind == OpKind::kReshape) needed[g_.op(v).operands[0]] = 1;
    }
    for (const Candidate& c : cands_)
      for (ValueId x : c.reads) needed[x] = 1;
    // Kernel order: topological over read dependencies, stable.
    std::vector<std::set<int>> deps(nk);
    for (int i = 0; i < nk; ++i)
      for (ValueId x : cands_[i].reads) {
        int s = source_kernel(x);
        if (s >= 0 && s != i) deps[i].insert(s);
      }
    std::vector<int> order, placed(nk, 0);
    while (static_cast<int>(order.size()) < nk) {
      size_t before = order.size();
      for (int i = 0; i < nk; ++i) {
        if (placed[i]) continue;
        bool ready = true;
        for (int d : deps[i]) ready &= placed[d] != 0;
        if (ready) {
          placed[i] = 1;
          order.push_back(i);
          break;
        }
      }
      if (order.size() == before) throw std::logic_error("[fusion] kernel dependency cycle");
    }
    FusionPlan plan;
    plan.writer.assign(g_.num_ops(), -1);
    std::vector<int> new_index(nk);
    for (int i = 0; i < nk; ++i) new_index[order[i]] = i;
    for (int i : order) {
      const Candidate& c = cands_[i];
      FusedKernel k;
      k.iteration_shape = c.iteration_shape;
      k.reduces = c.reduces;
      k.reduce_dimensions = c.reduce_dimensions;
      k.ops.assign(c.body.begin(), c.body.end());
      k.reads.assign(c.reads.begin(), c.reads.end());
      std::set<ValueId> writes;
      for (ValueId x : c.roots)
        if (needed[x]) writes.insert(x);
      for (ValueId x : c.reduces) writes.insert(x);
      k.writes.assign(writes.begin(), writes.end());
      for (ValueId x : k.ops)
        if (!writes.count(x)) k.internal.push_back(x);
      for (ValueId x : k.writes) plan.writer[x] = new_index[i];
      plan.kernels.push_back(std::move(k));
    }
    for (ValueId v = 0; v < g_.num_ops(); ++v)
      if (live_[v] && g_.op(v).kind == OpKind::kReshape) plan.views.push_back(v);
    return plan;
  }

  const Graph& g_;
  FusionOptions opt_;
  std::vector<char> live_, realized_, is_output_;
  std::vector<std::vector<ValueId>> users_;
  std::vector<Candidate> cands_;
  std::vector<int> kernel_of_;
};

std::string ids(const std::vector<ValueId>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " %" : "%") + std::to_string(v[i]);
  return s.empty() ? "-" : s;
}

}  // namespace

FusionPlan plan_fusion(const Graph& g, const FusionOptions& options) { return Planner(g, options).run(); }

std::string FusionPlan::to_string(const Graph& g) const {
  std::ostringstream out;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const FusedKernel& k = kernels[i];
    out << "kernel " << i << " " << (k.has_reduce() ? "reduce" : "loop") << shape_str(k.iteration_shape);
    if (k.has_reduce()) out << " over " << shape_str(k.reduce_dimensions);
    out << ": " << k.ops.size() << " ops";
    std::string names;
    for (ValueId v : k.ops) names += std::string(" ") + op_name(g.op(v).kind);
    out << " (" << names.substr(names.empty() ? 0 : 1) << ")";
    out << "; reads " << ids(k.reads) << "; writes " << ids(k.writes) << "; internal " << ids(k.internal) << "\n";
  }
  if (!views.empty()) out << "views " << ids(views) << "\n";
  return out.str();
}

}  // namespace torch_tpu::ir
