// Compiled IR regions on a chip: compile (cached), split, price, queue (see region_launch.h).
#include "defer/region_launch.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "defer/defer.h"
#include "defer/lower.h"
#include "exec/compile_cache.h"
#include "ir/passes.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/host_alias.h"
#include "vtpu/cost_model.h"
#include "vtpu/env.h"
#include "vtpu/layout.h"
#include "vtpu/runtime.h"

namespace torch_tpu {

using ir::ValueId;

namespace {

// TORCH_TPU_DEFER_SPLIT_ELEMENTS: results of at least this many elements
// are computed in chunks on the intra-op threads (262144; 0 turns it off).
int64_t split_elements() {
  static const int64_t n = [] {
    const char* v = std::getenv("TORCH_TPU_DEFER_SPLIT_ELEMENTS");
    if (v && std::string(v) == "0") return int64_t{0};
    return vtpu::env_positive_int("TORCH_TPU_DEFER_SPLIT_ELEMENTS", int64_t{1} << 18);
  }();
  return n;
}

// Per value of `g`, the dimension along which it can be computed in chunks
// of its results' leading dimension (-1: needed whole), or an empty vector
// when the region cannot be split (a reshape, results of other lengths, a
// value needed both ways).
// An output that reduces over the leading dimension of length n (sum with init 0, max, min; f32 or f64),
// reached through reshapes and broadcasts that only add or drop size-1 dimensions, none of them read by
// anything else: computed per chunk of rows as a partial result and combined (RegionLaunch::partial_outputs).
// Returns the reduce and its operand, or -1.
ValueId partial_reduce(const ir::Graph& g, ValueId o, int64_t n, const std::vector<int>& uses, ValueId* operand) {
  ValueId v = o;
  while (g.op(v).kind == ir::OpKind::kReshape || g.op(v).kind == ir::OpKind::kBroadcastInDim) {
    const ValueId u = g.op(v).operands[0];
    if (g.type(u).numel() != g.type(v).numel() || uses[u] != 1) return -1;
    v = u;
  }
  const ir::Op& op = g.op(v);
  if (op.kind != ir::OpKind::kReduce || (v != o && uses[v] != 1)) return -1;
  const ir::ElementType dt = op.type.dtype;
  if (dt != ir::ElementType::f32 && dt != ir::ElementType::f64) return -1;
  const ir::ReduceKind k = op.attrs.reduce_kind;
  if (!(k == ir::ReduceKind::kMax || k == ir::ReduceKind::kMin ||
        (k == ir::ReduceKind::kSum && op.attrs.init.f == 0.0)))
    return -1;
  const ValueId u = op.operands[0];
  if (g.type(u).rank() == 0 || g.type(u).shape[0] != n || op.attrs.dimensions.empty() || op.attrs.dimensions[0] != 0)
    return -1;
  *operand = u;
  return v;
}

std::vector<int> split_dims(const ir::Graph& g, int64_t n, std::vector<int>* partial = nullptr) {
  const int kUnset = -2;
  std::vector<int> dim(static_cast<size_t>(g.num_ops()), kUnset);
  auto merge = [&](ValueId u, int d) {
    if (dim[u] == kUnset) dim[u] = d;
    return dim[u] == d;
  };
  std::vector<int> uses(static_cast<size_t>(g.num_ops()), 0);
  for (const ir::Op& op : g.ops())
    for (ValueId u : op.operands) ++uses[u];
  for (ValueId o : g.outputs()) ++uses[o];
  if (partial) partial->clear();
  std::vector<char> chain(static_cast<size_t>(g.num_ops()), 0);  // partial results' ops: shapes kept
  for (size_t j = 0; j < g.outputs().size(); ++j) {
    const ValueId o = g.outputs()[j];
    const ir::TensorType& t = g.type(o);
    if (t.rank() > 0 && t.shape[0] == n && merge(o, 0)) continue;
    ValueId operand = -1;
    const ValueId r = partial && uses[o] == 1 && dim[o] == kUnset ? partial_reduce(g, o, n, uses, &operand) : -1;
    if (r < 0) return {};
    for (ValueId v = o; v != r; v = g.op(v).operands[0]) dim[v] = -1, chain[v] = 1;  // whole shape in every chunk
    dim[r] = -1;
    chain[r] = 1;
    if (!merge(operand, 0)) return {};
    partial->push_back(static_cast<int>(j));
  }
  for (ValueId v = static_cast<ValueId>(g.num_ops()) - 1; v >= 0; --v) {
    const int d = dim[v];
    if (d == kUnset || chain[v]) continue;
    const ir::Op& op = g.op(v);
    if (op.kind == ir::OpKind::kParameter || op.kind == ir::OpKind::kConstant) continue;
    if (op.kind == ir::OpKind::kReshape) {
      if (d >= 0 || !merge(op.operands[0], -1)) return {};
    } else if (op.kind == ir::OpKind::kBroadcastInDim) {
      const ValueId u = op.operands[0];
      int req = -1;
      for (size_t i = 0; i < op.attrs.dimensions.size() && d >= 0; ++i) {
        if (op.attrs.dimensions[i] == d && g.type(u).shape[i] == op.type.shape[d]) req = static_cast<int>(i);
      }
      if (!merge(u, req)) return {};
    } else if (op.kind == ir::OpKind::kReduce) {
      const ValueId u = op.operands[0];
      int req = -1;
      if (d >= 0) {
        int kept = -1;
        for (int64_t i = 0; i < g.type(u).rank(); ++i) {
          if (std::binary_search(op.attrs.dimensions.begin(), op.attrs.dimensions.end(), i)) continue;
          if (++kept == d) req = static_cast<int>(i);
        }
      }
      if (!merge(u, req)) return {};
    } else {
      for (ValueId u : op.operands)
        if (!merge(u, d)) return {};
    }
  }
  for (int& d : dim)
    if (d == kUnset) d = -1;
  return dim;
}

// TORCH_TPU_DEFER_CHUNK_ELEMENTS: elements per result row chunk of a split
// region (262144: 1 MiB of f32 a tensor; smaller chunks measured no faster here). Chunks run one after another on each
// thread, so the intermediates a chunk realizes (x + r read by the three kernels of a layer norm) stay in the core's
// cache instead of streaming through memory, as a TPU keeps them in VMEM.
int64_t chunk_elements() {
  static const int64_t n = vtpu::env_positive_int("TORCH_TPU_DEFER_CHUNK_ELEMENTS", int64_t{1} << 18);
  return n;
}

ir::Graph with_rows(const ir::Graph& g, const std::vector<int>& dim, int64_t rows) {
  ir::Graph out;
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    const ir::Op& op = g.op(v);
    ir::TensorType t = op.type;
    if (dim[v] >= 0) t.shape[dim[v]] = rows;
    out.add_op(op.kind, op.operands, std::move(t), op.attrs);
  }
  out.set_outputs(g.outputs());
  return out;
}

std::shared_ptr<const exec::CompiledRegion> compile_cached(const ir::Graph& g, bool* miss, uint64_t* hash = nullptr) {
  static std::mutex mu;  // so that the miss counter's delta is ours
  std::lock_guard<std::mutex> lock(mu);
  auto& cache = exec::CompileCache::global();
  const uint64_t before = cache.stats().misses;
  auto r = cache.get_or_compile(g, hash);
  *miss = cache.stats().misses != before;
  return r;
}

// The independent parts of `g`: per part, the subgraph of the ops its outputs
// need (parameters and constants are copied into every part that reads
// them), with the whole graph's parameter and output indices. Empty when `g`
// is one part.
struct GraphPart {
  ir::Graph graph;
  std::vector<int> inputs, outputs;
  int64_t work = 0;
};

std::vector<GraphPart> independent_parts(const ir::Graph& g) {
  const size_t n = static_cast<size_t>(g.num_ops());
  std::vector<ValueId> root(n);
  for (size_t v = 0; v < n; ++v) root[v] = static_cast<ValueId>(v);
  auto find = [&](ValueId v) {
    while (root[v] != v) v = root[v] = root[root[v]];
    return v;
  };
  auto shared = [&](ValueId v) {
    const ir::OpKind k = g.op(v).kind;
    return k == ir::OpKind::kParameter || k == ir::OpKind::kConstant;
  };
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    if (shared(v)) continue;
    for (ValueId u : g.op(v).operands)
      if (!shared(u)) root[find(u)] = find(v);
  }
  // Parts in the order of their first output.
  std::vector<ValueId> part_roots;
  std::vector<int> part_of_output;
  for (ValueId o : g.outputs()) {
    const ValueId r = find(o);
    auto it = std::find(part_roots.begin(), part_roots.end(), r);
    part_of_output.push_back(static_cast<int>(it - part_roots.begin()));
    if (it == part_roots.end()) part_roots.push_back(r);
  }
  std::vector<GraphPart> parts;
  if (part_roots.size() < 2) return parts;
  parts.resize(part_roots.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    GraphPart& part = parts[p];
    std::vector<char> live(n, 0);
    for (size_t j = 0; j < g.outputs().size(); ++j)
      if (part_of_output[j] == static_cast<int>(p)) live[g.outputs()[j]] = 1;
    for (ValueId v = g.num_ops() - 1; v >= 0; --v)
      if (live[v])
        for (ValueId u : g.op(v).operands) live[u] = 1;
    std::vector<ValueId> remap(n, -1);
    for (ValueId v = 0; v < g.num_ops(); ++v) {
      if (!live[v]) continue;
      const ir::Op& op = g.op(v);
      std::vector<ValueId> operands;
      for (ValueId u : op.operands) operands.push_back(remap[u]);
      if (op.kind == ir::OpKind::kParameter) part.inputs.push_back(static_cast<int>(op.attrs.parameter_index));
      if (!shared(v)) part.work += op.type.numel();
      remap[v] = part.graph.add_op(op.kind, std::move(operands), op.type, op.attrs);
    }
    std::vector<ValueId> outs;
    for (size_t j = 0; j < g.outputs().size(); ++j) {
      if (part_of_output[j] != static_cast<int>(p)) continue;
      outs.push_back(remap[g.outputs()[j]]);
      part.outputs.push_back(static_cast<int>(j));
    }
    part.graph.set_outputs(outs);
  }
  return parts;
}

}  // namespace

RegionLaunch plan_region_launch(const ir::Graph& g, bool* miss, bool parts) {
  RegionLaunch l;
  for (ValueId p : g.parameters()) l.input_types.push_back(g.type(p));
  for (ValueId o : g.outputs()) l.output_types.push_back(g.type(o));
  const int threads = at::get_num_threads();
  const ir::TensorType& first = g.type(g.outputs().at(0));
  if (split_elements() > 0 && first.rank() > 0 && first.numel() >= split_elements() && first.shape[0] > 1) {
    const int64_t n = first.shape[0];
    ir::Graph live = ir::dead_code_elimination(g);
    std::vector<int> partial;
    std::vector<int> dim = split_dims(live, n, &partial);
    if (!dim.empty()) {
      const int64_t per_row = first.numel() / n;
      const int64_t cache_rows = std::max<int64_t>(1, chunk_elements() / per_row);
      const int64_t thread_rows = (n + threads - 1) / threads;
      const int64_t rows = std::min(cache_rows, thread_rows);
      if (rows < n) {
        l.n = n;
        l.rows = rows;
        l.chunks = (n + l.rows - 1) / l.rows;
        for (ValueId p : live.parameters()) l.param_dim.push_back(dim[p]);
        l.partial_outputs = partial;
        for (int j : partial) {
          ValueId v = live.outputs()[static_cast<size_t>(j)];
          while (live.op(v).kind != ir::OpKind::kReduce) v = live.op(v).operands[0];
          l.partial_kinds.push_back(live.op(v).attrs.reduce_kind);
        }
        bool miss_last = false;
        l.region = compile_cached(with_rows(live, dim, l.rows), miss);
        const int64_t last_rows = n - l.rows * (l.chunks - 1);
        l.last = last_rows == l.rows ? l.region : compile_cached(with_rows(live, dim, last_rows), &miss_last);
        *miss = *miss || miss_last;
        return l;
      }
    }
  }
  int64_t work = 0;  // elements the region's ops compute: small regions skip the parts analysis
  if (parts && threads > 1 && split_elements() > 0) {
    for (const ir::Op& op : g.ops())
      if (op.kind != ir::OpKind::kParameter && op.kind != ir::OpKind::kConstant) work += op.type.numel();
  }
  if (work >= split_elements() && work > 0) {
    std::vector<GraphPart> gp = independent_parts(g);
    if (!gp.empty()) {
      auto launches = std::make_shared<std::vector<RegionLaunchPart>>(gp.size());
      for (size_t i = 0; i < gp.size(); ++i) {
        bool part_miss = false;
        RegionLaunchPart& p = (*launches)[i];
        p.launch = plan_region_launch(gp[i].graph, &part_miss);
        p.inputs = std::move(gp[i].inputs);
        p.outputs = std::move(gp[i].outputs);
        p.work = gp[i].work;
        *miss = *miss || part_miss;
      }
      l.parts = std::move(launches);
    }
  }
  bool whole_miss = false;
  l.region = compile_cached(g, &whole_miss, &l.graph_hash);
  *miss = *miss || whole_miss;
  return l;
}

namespace {

// Scratch for the partial results of a split launch's partial outputs: chunk k's partial of
// partial output i at mem[i] + k * bytes[i] (dense).
struct Partials {
  std::vector<std::unique_ptr<char[]>> mem;
  std::vector<int64_t> bytes;
};

Partials make_partials(const RegionLaunch& l) {
  Partials p;
  for (int j : l.partial_outputs) {
    const ir::TensorType& t = l.output_types[static_cast<size_t>(j)];
    const int64_t b = t.numel() * ir::element_size(t.dtype);
    p.bytes.push_back(b);
    p.mem.emplace_back(new char[static_cast<size_t>(std::max<int64_t>(b * l.chunks, 1))]);
  }
  return p;
}

template <class T>
T combine(ir::ReduceKind k, T a, T b) {
  if (k == ir::ReduceKind::kSum) return a + b;
  if (a != a) return a;  // NaN wins, as in the kernels' reductions
  if (b != b) return b;
  return k == ir::ReduceKind::kMax ? (b > a ? b : a) : (b < a ? b : a);
}

template <class T>
void combine_into(const RegionLaunch& l, size_t i, const char* parts, const exec::Buffer& out) {
  const T* p = reinterpret_cast<const T*>(parts);
  const int64_t n = out.numel();
  const std::vector<int64_t> strides = out.effective_strides();
  const ir::ReduceKind kind = l.partial_kinds[i];
  T* dst = static_cast<T*>(out.data);
  for (int64_t e = 0; e < n; ++e) {
    T acc = p[e];
    for (int64_t k = 1; k < l.chunks; ++k) acc = combine(kind, acc, p[k * n + e]);
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(out.shape.size()) - 1, rem = e; d >= 0; --d) {
      off += (rem % out.shape[d]) * strides[d];
      rem /= out.shape[d];
    }
    dst[off] = acc;
  }
}

// The partials of every chunk combined, in chunk order, into their outputs.
void combine_partials(const RegionLaunch& l, const Partials& p, const std::vector<exec::Buffer>& out) {
  for (size_t i = 0; i < l.partial_outputs.size(); ++i) {
    const exec::Buffer& o = out[static_cast<size_t>(l.partial_outputs[i])];
    if (o.dtype == ir::ElementType::f64)
      combine_into<double>(l, i, p.mem[i].get(), o);
    else
      combine_into<float>(l, i, p.mem[i].get(), o);
  }
}

// Chunk k of a split launch (the whole launch when it is not split); `partials` takes the
// chunk's partial results (RegionLaunch::partial_outputs).
void run_chunk(const RegionLaunch& l, int64_t k, const std::vector<exec::Buffer>& in,
               const std::vector<exec::Buffer>& out, const Partials* partials) {
  if (!l.split()) {
    exec::run(*l.region, in, out);
    return;
  }
  const int64_t start = k * l.rows;
  const int64_t rows = std::min(l.rows, l.n - start);
  auto slice = [&](const exec::Buffer& b, int d) {
    exec::Buffer c = b;
    c.strides = b.effective_strides();
    c.data = static_cast<char*>(b.data) + start * c.strides[d] * ir::element_size(b.dtype);
    c.shape[d] = rows;
    return c;
  };
  std::vector<exec::Buffer> ci, co;
  for (size_t i = 0; i < in.size(); ++i) ci.push_back(l.param_dim[i] < 0 ? in[i] : slice(in[i], l.param_dim[i]));
  co.resize(out.size());
  std::vector<char> partial(out.size(), 0);
  for (size_t i = 0; i < l.partial_outputs.size(); ++i) {  // (a partial result may have rank 0: not sliced)
    const size_t j = static_cast<size_t>(l.partial_outputs[i]);
    partial[j] = 1;
    co[j] = exec::Buffer::contiguous(partials->mem[i].get() + k * partials->bytes[i], out[j].dtype, out[j].shape);
  }
  for (size_t j = 0; j < out.size(); ++j)
    if (!partial[j]) co[j] = slice(out[j], 0);
  exec::run(rows == l.rows ? *l.region : *l.last, ci, co);
}

// The parts of a launch and their chunks as tasks, largest first, taken by
// the intra-op threads one at a time.
void run_parts(const std::vector<RegionLaunchPart>& parts, const std::vector<exec::Buffer>& in,
               const std::vector<exec::Buffer>& out) {
  std::vector<std::vector<exec::Buffer>> ins(parts.size()), outs(parts.size());
  std::vector<Partials> partials(parts.size());
  struct Task {
    size_t part;
    int64_t chunk, work;
  };
  std::vector<Task> tasks;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (int i : parts[p].inputs) ins[p].push_back(in[static_cast<size_t>(i)]);
    for (int j : parts[p].outputs) outs[p].push_back(out[static_cast<size_t>(j)]);
    const RegionLaunch& l = parts[p].launch;
    partials[p] = make_partials(l);
    for (int64_t k = 0; k < l.chunks; ++k) tasks.push_back(Task{p, k, parts[p].work / l.chunks});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.work > b.work; });
  std::atomic<size_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tasks.size()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (size_t k; (k = next.fetch_add(1)) < tasks.size();) {
      const Task& t = tasks[k];
      run_chunk(parts[t.part].launch, t.chunk, ins[t.part], outs[t.part], &partials[t.part]);
    }
  });
  for (size_t p = 0; p < parts.size(); ++p) combine_partials(parts[p].launch, partials[p], outs[p]);
}

}  // namespace

void run_region_launch(const RegionLaunch& l, const std::vector<exec::Buffer>& in,
                       const std::vector<exec::Buffer>& out) {
  if (l.parts) {
    run_parts(*l.parts, in, out);
    return;
  }
  if (!l.split()) {
    exec::run(*l.region, in, out);
    return;
  }
  const Partials partials = make_partials(l);
  at::parallel_for(0, l.chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) run_chunk(l, k, in, out, &partials);
  });
  combine_partials(l, partials, out);
}

// The HBM bytes each reads
// and writes (values kept in tiles cost nothing), one VPU op per element per
// arithmetic IR op.
// A split region is priced as the whole: chunk figures times the number of
// rows over the chunk's, except parameters every chunk reads whole.
void record_region_costs(c10::DeviceIndex device, const RegionLaunch& l) {
  const exec::CompiledRegion& c = *l.region;
  const ir::Graph& g = c.graph();
  const double scale = l.split() ? static_cast<double>(l.n) / static_cast<double>(l.rows) : 1.0;
  auto bytes = [&](ValueId v) {
    const ir::TensorType& t = g.type(v);
    double b = static_cast<double>(vtpu::physical_bytes(t.shape, ir::element_size(t.dtype)));
    const ir::Op& op = g.op(v);
    bool whole = op.kind == ir::OpKind::kParameter && l.split() && l.param_dim[op.attrs.parameter_index] < 0;
    return whole ? b : b * scale;
  };
  for (const auto& k : c.plan().kernels) {
    vtpu::OpCost cost;
    for (ValueId v : k.reads) cost.bytes_read += bytes(v);
    for (ValueId v : k.writes) cost.bytes_written += bytes(v);
    for (ValueId v : k.ops) {
      const ir::Op& op = g.op(v);
      if (op.type.dtype == ir::ElementType::f64) cost.emulated = true;
      if (op.kind == ir::OpKind::kReduce) {
        cost.flops += static_cast<double>(g.type(op.operands[0]).numel()) * scale;
      } else if (ir::is_elementwise(op.kind) && op.kind != ir::OpKind::kConvert) {
        cost.flops += static_cast<double>(op.type.numel()) * scale;
      }
    }
    chip(device).record_cost(cost);
  }
}

std::vector<ValueId> row_statistics(const ir::Graph& g) {
  std::vector<ValueId> extra;
  if (g.outputs().empty() || g.type(g.outputs()[0]).rank() == 0) return extra;
  const int64_t n = g.type(g.outputs()[0]).shape[0];
  std::vector<char> live(static_cast<size_t>(g.num_ops()), 0), is_out(live.size(), 0);
  for (ValueId o : g.outputs()) live[o] = is_out[o] = 1;
  for (ValueId v = static_cast<ValueId>(g.num_ops()) - 1; v >= 0; --v) {
    if (!live[v]) continue;
    for (ValueId u : g.op(v).operands) live[u] = 1;
  }
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    const ir::Op& op = g.op(v);
    if (!live[v] || op.kind != ir::OpKind::kBroadcastInDim) continue;
    ValueId u = op.operands[0];
    while (g.op(u).kind == ir::OpKind::kBroadcastInDim &&  // keepdim's size-1 dimensions
           g.type(g.op(u).operands[0]).numel() == g.type(u).numel()) {
      u = g.op(u).operands[0];
    }
    const ir::Op& uo = g.op(u);
    const ir::TensorType& ut = uo.type;
    if (is_out[u] || !ir::is_elementwise(uo.kind) || ut.rank() == 0 || ut.shape[0] != n ||
        op.type.numel() < 8 * ut.numel()) {
      continue;
    }
    is_out[u] = 1;
    extra.push_back(u);
  }
  return extra;
}

namespace {

struct QueuedRegion {
  RegionLaunch launch;
  std::vector<TensorRecipe> inputs, outputs;
  // Host 0-dim inputs (a CPU scalar tensor such as an optimizer's step count):
  // their value, read when the region is queued, as eager reads it at the call.
  std::vector<int> host_slot;  // per input: index in host_values, or -1
  std::vector<std::array<char, 16>> host_values;
  std::string name;
};

void run_queued(const QueuedRegion& q) {
  std::vector<exec::Buffer> in, out;
  std::vector<std::unique_ptr<char[]>> scratch;
  for (size_t k = 0; k < q.inputs.size(); ++k) {
    if (q.host_slot[k] >= 0) {
      in.push_back(exec::Buffer::contiguous(const_cast<char*>(q.host_values[q.host_slot[k]].data()),
                                            q.launch.input_types[k].dtype, {}));
      continue;
    }
    const TensorRecipe& r = q.inputs[k];
    char* base = static_cast<char*>(const_cast<void*>(r.storage.data()));
    in.push_back(exec::Buffer::strided(base + r.storage_offset * static_cast<int64_t>(r.dtype.itemsize()),
                                       q.launch.input_types[k].dtype, q.launch.input_types[k].shape,
                                       std::vector<int64_t>(r.strides.begin(), r.strides.end())));
  }
  for (size_t j = 0; j < q.launch.output_types.size(); ++j) {
    const ir::TensorType& t = q.launch.output_types[j];
    void* ptr;
    if (j < q.outputs.size()) {
      const TensorRecipe& r = q.outputs[j];
      ptr = static_cast<char*>(r.storage.mutable_data()) + r.storage_offset * static_cast<int64_t>(r.dtype.itemsize());
      out.push_back(
          exec::Buffer::strided(ptr, t.dtype, t.shape, std::vector<int64_t>(r.strides.begin(), r.strides.end())));
    } else {
      scratch.emplace_back(new char[static_cast<size_t>(std::max<int64_t>(1, t.numel() * ir::element_size(t.dtype)))]);
      ptr = scratch.back().get();
      out.push_back(exec::Buffer::contiguous(ptr, t.dtype, t.shape));
    }
  }
  try {
    run_region_launch(q.launch, in, out);
  } catch (const std::exception& e) {
    throw std::runtime_error(q.name + ": " + e.what());
  }
}

}  // namespace

void enqueue_region(const RegionLaunch& l, c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
                    const std::vector<at::Tensor>& outputs, std::string name) {
  TORCH_CHECK(l.region, name, ": region not compiled");
  if (any_undefined() && !dry_run())
    for (const auto& t : inputs) check_defined(t, name);
  TORCH_CHECK(inputs.size() == l.input_types.size(), name, ": expected ", l.input_types.size(), " inputs, got ",
              inputs.size());
  TORCH_CHECK(outputs.size() <= l.output_types.size(), name, ": expected at most ", l.output_types.size(),
              " outputs, got ", outputs.size());
  auto check = [&](const at::Tensor& t, const ir::TensorType& want, const char* what, size_t k, bool out) {
    const bool host_scalar = !out && t.defined() && t.device().is_cpu() && t.dim() == 0;
    TORCH_CHECK(host_scalar ||
                    (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == device),
                name, ": ", what, " ", k, " must be a tensor on tpu:", static_cast<int>(device),
                out ? "" : " or a 0-dim CPU tensor");
    auto et = defer::ir_type(t.scalar_type());
    TORCH_CHECK(et && *et == want.dtype && ir::Shape(t.sizes().begin(), t.sizes().end()) == want.shape, name, ": ",
                what, " ", k, " is ", t.scalar_type(), t.sizes(), ", the region expects ", want.str());
    TORCH_CHECK(!out || t.is_non_overlapping_and_dense(), name, ": output ", k,
                " must be dense and non-overlapping, got strides ", t.strides());
  };
  auto q = std::make_shared<QueuedRegion>();
  q->launch = l;
  q->name = std::move(name);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const at::Tensor& t = inputs[k];
    check(t, l.input_types[k], "input", k, false);
    if (t.device().is_cpu()) {
      std::array<char, 16> v{};
      std::memcpy(v.data(), t.const_data_ptr(), t.element_size());
      q->host_slot.push_back(static_cast<int>(q->host_values.size()));
      q->host_values.push_back(v);
      q->inputs.emplace_back();
      continue;
    }
    defer_flush_storage(t.storage().unsafeGetStorageImpl());
    q->host_slot.push_back(-1);
    q->inputs.push_back(TensorRecipe::of(t));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    check(outputs[k], l.output_types[k], "output", k, true);
    defer_flush_storage(outputs[k].storage().unsafeGetStorageImpl());
    q->outputs.push_back(TensorRecipe::of(outputs[k]));
  }
  defer_before_stream_use(device);
  record_region_costs(device, l);
  vtpu_stream(current_stream(device)).enqueue(q->name, [q] { run_queued(*q); });
}

void enqueue_copies(c10::DeviceIndex device, const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs) {
  TORCH_CHECK(dsts.size() == srcs.size(), "copy_: ", dsts.size(), " destinations for ", srcs.size(), " sources");
  if (any_undefined() && !dry_run())
    for (const auto& t : srcs) check_defined(t, "copy_");
  struct Pair {
    TensorRecipe dst, src;
    size_t bytes;
  };
  auto pairs = std::make_shared<std::vector<Pair>>();
  vtpu::OpCost cost;
  auto queue_batch = [&] {
    if (pairs->empty()) return;
    defer_before_stream_use(device);
    chip(device).record_cost(cost);
    vtpu_stream(current_stream(device))
        .enqueue("aten::copy_ (" + std::to_string(pairs->size()) + " tensors, batched)", [pairs] {
          for (const Pair& p : *pairs) {
            auto* dst = static_cast<char*>(p.dst.storage.mutable_data()) +
                        p.dst.storage_offset * static_cast<int64_t>(p.dst.dtype.itemsize());
            const auto* src = static_cast<const char*>(p.src.storage.data()) +
                              p.src.storage_offset * static_cast<int64_t>(p.src.dtype.itemsize());
            std::memmove(dst, src, p.bytes);
          }
        });
    pairs = std::make_shared<std::vector<Pair>>();
    cost = vtpu::OpCost{};
  };
  for (size_t i = 0; i < dsts.size(); ++i) {
    const at::Tensor& d = dsts[i];
    const at::Tensor& s = srcs[i];
    const bool bytes = d.device().type() == c10::DeviceType::PrivateUse1 && d.device().index() == device &&
                       s.device() == d.device() && d.scalar_type() == s.scalar_type() && d.sizes() == s.sizes() &&
                       d.strides() == s.strides() && d.is_non_overlapping_and_dense() && !d.is_conj() && !s.is_conj() &&
                       !d.is_neg() && !s.is_neg() && !d.storage().is_alias_of(s.storage());
    if (!bytes) {
      queue_batch();  // keeps the order of the copies
      const_cast<at::Tensor&>(d).copy_(s);
      continue;
    }
    defer_flush_storage(d.storage().unsafeGetStorageImpl());
    defer_flush_storage(s.storage().unsafeGetStorageImpl());
    pairs->push_back(Pair{TensorRecipe::of(d), TensorRecipe::of(s), static_cast<size_t>(d.numel()) * d.element_size()});
    const double phys = static_cast<double>(vtpu::physical_bytes(
        std::vector<int64_t>(d.sizes().begin(), d.sizes().end()), static_cast<int64_t>(d.element_size())));
    cost.bytes_read += phys;
    cost.bytes_written += phys;
  }
  queue_batch();
}

}  // namespace torch_tpu
