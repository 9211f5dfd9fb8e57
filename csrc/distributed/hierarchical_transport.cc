#include "distributed/hierarchical_transport.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "distributed/arguments.h"
#include "distributed/chips.h"

namespace torch_tpu::dist {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

c10d::ReduceOp reduce_op(int redop) { return c10d::ReduceOp(static_cast<RedOp>(redop)); }

constexpr const char* kFailureKey = "tpu_dist/failure";

}  // namespace

Hierarchy::Hierarchy(const std::vector<int>& hosts, int rank) : host(hosts[rank]), host_of_rank(hosts) {
  const int size = static_cast<int>(hosts.size());
  std::set<int> ids(hosts.begin(), hosts.end());
  host_ids.assign(ids.begin(), ids.end());
  host_index_of.resize(size);
  local_index_of.resize(size);
  std::map<int, int> seen;
  for (int r = 0; r < size; ++r) {
    host_index_of[r] = static_cast<int>(std::find(host_ids.begin(), host_ids.end(), hosts[r]) - host_ids.begin());
    local_index_of[r] = seen[hosts[r]]++;
    if (hosts[r] == host) local_ranks.push_back(r);
  }
  local_index = local_index_of[rank];
  const int per_host = static_cast<int>(local_ranks.size());
  host_major = true;
  for (int r = 0; r < size; ++r) {
    host_major = host_major && r == host_index_of[r] * per_host + local_index_of[r];
  }
}

ShmGroup::Options Hierarchy::local_options(const ShmGroup::Options& whole) const {
  ShmGroup::Options o = whole;
  o.rank = local_index;
  o.size = static_cast<int>(local_ranks.size());
  o.group_name = whole.group_name + "/host" + std::to_string(host);
  o.group_ranks.assign(local_ranks.begin(), local_ranks.end());
  o.global_ranks.clear();
  for (int r : local_ranks) o.global_ranks.push_back(whole.global_ranks.empty() ? r : whole.global_ranks[r]);
  return o;
}

HierarchicalTransport::HierarchicalTransport(Hierarchy hierarchy, ShmGroup& local, const vtpu::Topology& topology,
                                             Options options)
    : hier_(std::move(hierarchy)),
      group_(local),
      local_(local, topology, options.small_bytes),
      engine_(local_.engine()),
      opts_(std::move(options)) {
  if (group_.size() > 1) watcher_ = std::thread([this] { watch_local_peers(); });
}

HierarchicalTransport::~HierarchicalTransport() { stop(); }

void HierarchicalTransport::stop() {
  {
    std::lock_guard<std::mutex> lock(watcher_mu_);
    watcher_stop_ = true;
  }
  watcher_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void HierarchicalTransport::after_error() {
  if (group_.failed()) publish_failure();
}

Arrival HierarchicalTransport::local_arrive(OpKind op, const at::Tensor& like, int redop, int64_t numel, int64_t root,
                                            const std::string& what) {
  Descriptor d = describe(op, at::Tensor(), redop, numel, root);
  if (like.defined()) {  // a flat tensor of like's dtype
    d.dtype = static_cast<int32_t>(like.scalar_type());
    d.ndim = 1;
    d.sizes[0] = numel;
  }
  set_chip(d, current_tpu());
  return engine_.arrive(++local_seq_, d, what + " [host-local part]");
}

void HierarchicalTransport::publish_failure() {
  if (failure_published_.exchange(true)) return;
  try {
    const std::string reason = group_.failure();
    // The first root cause wins: later failures are usually its consequences.
    opts_.store->compareSet(kFailureKey, {}, std::vector<uint8_t>(reason.begin(), reason.end()));
  } catch (const std::exception&) {
    // The store may be gone with the rank that hosted it.
  }
}

void HierarchicalTransport::watch_local_peers() {
  pthread_setname_np(pthread_self(), "tpu_dist_watch");
  std::unique_lock<std::mutex> lock(watcher_mu_);
  while (!watcher_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return watcher_stop_; })) {
    if (group_.failed()) {
      publish_failure();
      return;
    }
    const int dead = group_.dead_peer();
    if (dead >= 0) {
      group_.mark_failed(dead, group_.describe_rank(dead) + " died (its process is gone)");
      publish_failure();
      return;
    }
  }
}

void HierarchicalTransport::dcn_wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    // gloo names a socket, not a rank: a rank that saw the root cause (a peer's death on
    // its host) publishes it in the store; give it a moment to arrive.
    std::string cause, store_note;
    try {
      for (int i = 0; i < 40 && cause.empty(); ++i) {
        if (opts_.store->check({kFailureKey})) {
          const auto v = opts_.store->get(kFailureKey);
          cause = std::string(v.begin(), v.end());
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    } catch (const c10::Error& store_error) {
      store_note =
          std::string(" (the store could not be asked for the cause: ") + store_error.what_without_backtrace() + ")";
    } catch (const std::exception& store_error) {
      store_note = std::string(" (the store could not be asked for the cause: ") + store_error.what() + ")";
    }
    const std::string msg =
        "tpu_dist " + what + " in group '" + opts_.group_name + "' (rank " + std::to_string(opts_.rank) + "): " +
        (cause.empty() ? std::string("the part across hosts (gloo over TCP) failed: ") + e.what() + store_note
                       : cause + " (reported through the store; gloo: " + e.what() + ")");
    group_.mark_failed(-1, cause.empty() ? msg : cause);
    failure_published_ = true;  // a consequence, not a root cause
    C10_THROW_ERROR(DistBackendError, msg);
  }
}

void HierarchicalTransport::record_dcn(int device, double payload, double ici_bytes, int ici_steps, double dcn_bytes) {
  vtpu::CollectiveCost c;
  c.payload_bytes = payload;
  c.ici_bytes = ici_bytes;
  c.ici_steps = ici_steps;
  c.dcn_bytes = dcn_bytes;
  record_cost(device, c);
}

void HierarchicalTransport::check_spmd(const Call& c) {
  if (!c.desc.spmd) return;
  constexpr int64_t kBytes = sizeof(Descriptor);
  const int n = opts_.size;
  Descriptor mine = c.desc;
  mine.seq = c.seq;
  at::Tensor in = at::empty({kBytes}, at::kByte);
  std::memcpy(in.data_ptr(), &mine, kBytes);
  at::Tensor all = at::empty({n * kBytes}, at::kByte);
  dcn_wait(opts_.flat->_allgather_base(all, in),
           c.what + " [the spmd_safe check across hosts: every rank must issue it inside spmd_safe]");
  std::vector<Descriptor> descs(n);
  for (int r = 0; r < n; ++r) std::memcpy(&descs[r], all.data_ptr<uint8_t>() + r * kBytes, kBytes);
  const std::string disagree = disagreement(descs, c.seq, [&](int r) {
    return "rank " + std::to_string(r) + " (host " + std::to_string(hier_.host_of_rank[r]) + ")";
  });
  TORCH_CHECK(disagree.empty(), "tpu_dist ", c.what, " in group '", opts_.group_name, "': ", disagree);
}

void HierarchicalTransport::all_reduce(const Call& c, const at::Tensor& tensor, int redop, double factor) {
  check_spmd(c);
  if (redop == RedOp::PREMUL_SUM) {
    tensor.mul_(factor);
    redop = RedOp::SUM;
  }
  const at::Tensor data = tensor.reshape({-1});
  const std::string& what = c.what;
  const int device = c.device;
  const int64_t numel = data.numel();
  if (numel == 0) return;
  const int local_op = redop == RedOp::AVG ? RedOp::SUM : redop;
  if (!opts_.cross) {  // hosts with different rank counts: everything on the flat group
    std::vector<at::Tensor> v{data};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(local_op);
    dcn_wait(opts_.flat->allreduce(v, o), what);
    if (redop == RedOp::AVG) divide(data.data_ptr(), numel, data.scalar_type(), opts_.size);
    record_dcn(device, numel * data.element_size(), 0, 0, 2.0 * numel * data.element_size());
    return;
  }
  const int L = group_.size();
  const int H = static_cast<int>(hier_.host_ids.size());
  const int64_t shard = (numel + L - 1) / L;
  at::Tensor buf = data;
  if (shard * L != numel) {
    buf = at::zeros({shard * L}, data.options());
    buf.narrow(0, 0, numel).copy_(data);
  }
  at::Tensor part = buf;
  const size_t es = data.element_size();
  double ici = 0;
  if (L > 1) {
    part = at::empty({shard}, data.options());
    const Arrival a = local_arrive(OpKind::kReduceScatter, data, local_op, shard, -1, what);
    ici += engine_.cost(a, OpKind::kReduceScatter, static_cast<double>(shard * L * es), local_seq_).ici_bytes;
    engine_.reduce_scatter(a, buf.data_ptr(), part.data_ptr(), shard, data.scalar_type(), local_op, what);
  }
  std::vector<at::Tensor> v{part};
  c10d::AllreduceOptions o;
  o.reduceOp = reduce_op(local_op);
  dcn_wait(opts_.cross->allreduce(v, o), what);
  if (redop == RedOp::AVG) divide(part.data_ptr(), shard, data.scalar_type(), opts_.size);
  if (L > 1) {
    const Arrival a = local_arrive(OpKind::kAllGather, data, 0, shard, -1, what);
    ici += engine_.cost(a, OpKind::kAllGather, static_cast<double>(shard * L * es), local_seq_).ici_bytes;
    std::vector<void*> ptrs(L);
    for (int r = 0; r < L; ++r) ptrs[r] = static_cast<char*>(buf.data_ptr()) + r * shard * es;
    engine_.all_gather(a, part.data_ptr(), ptrs, shard, es, what);
  }
  if (!buf.is_same(data)) data.copy_(buf.narrow(0, 0, numel));
  record_dcn(device, numel * es, ici, 2 * (L - 1), 2.0 * (H - 1) / H * shard * es);
}

void HierarchicalTransport::all_gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs) {
  check_spmd(c);
  const int n = opts_.size;
  const int64_t count = input.numel();
  at::Tensor all = outputs.size() == 1 ? outputs[0].reshape({-1}) : at::empty({n * count}, input.options());
  all_gather_into(input.reshape({-1}), all, c.what, c.device);
  if (outputs.size() != 1) {
    for (int r = 0; r < n; ++r) outputs[r].reshape({-1}).copy_(all.narrow(0, r * count, count));
  }
}

void HierarchicalTransport::all_gather_into(const at::Tensor& input, const at::Tensor& output, const std::string& what,
                                            int device) {
  const int64_t m = input.numel();
  const size_t es = input.element_size();
  const int n = opts_.size;
  if (m == 0) return;
  if (!opts_.cross) {
    dcn_wait(opts_.flat->_allgather_base(const_cast<at::Tensor&>(output), const_cast<at::Tensor&>(input)), what);
    record_dcn(device, n * m * es, 0, 0, (n - 1.0) * m * es);
    return;
  }
  const int L = group_.size();
  const int H = static_cast<int>(hier_.host_ids.size());
  // Host block: this host's ranks' inputs, in local order.
  at::Tensor block = input;
  double ici = 0;
  if (L > 1) {
    block = at::empty({L * m}, input.options());
    const Arrival a = local_arrive(OpKind::kAllGather, input, 0, m, -1, what);
    ici = engine_.cost(a, OpKind::kAllGather, static_cast<double>(L * m * es), local_seq_).ici_bytes;
    std::vector<void*> ptrs(L);
    for (int r = 0; r < L; ++r) ptrs[r] = static_cast<char*>(block.data_ptr()) + r * m * es;
    engine_.all_gather(a, input.data_ptr(), ptrs, m, es, what);
  }
  at::Tensor all = hier_.host_major ? output : at::empty({n * m}, input.options());
  at::Tensor flat_block = block.reshape({-1});
  dcn_wait(opts_.cross->_allgather_base(all, flat_block), what);
  if (!hier_.host_major) {
    for (int g = 0; g < n; ++g) {
      const int64_t src = (hier_.host_index_of[g] * L + hier_.local_index_of[g]) * m;
      output.narrow(0, g * m, m).copy_(all.narrow(0, src, m));
    }
  }
  record_dcn(device, n * m * es, ici, L - 1, (H - 1.0) * L * m * es);
}

void HierarchicalTransport::reduce_scatter(const Call& c, const at::Tensor& blocks, const at::Tensor& result,
                                           int redop) {
  check_spmd(c);
  const at::Tensor input = blocks.reshape({-1});
  const at::Tensor output = result.reshape({-1});
  const std::string& what = c.what;
  const int device = c.device;
  const int64_t m = output.numel();
  const size_t es = output.element_size();
  const int n = opts_.size;
  if (m == 0) return;
  const int local_op = redop == RedOp::AVG ? RedOp::SUM : redop;
  if (!opts_.cross) {
    at::Tensor tmp = input.clone();
    std::vector<at::Tensor> v{tmp};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(local_op);
    dcn_wait(opts_.flat->allreduce(v, o), what);
    output.copy_(tmp.narrow(0, opts_.rank * m, m));
    if (redop == RedOp::AVG) divide(output.data_ptr(), m, output.scalar_type(), n);
    record_dcn(device, n * m * es, 0, 0, 2.0 * n * m * es);
    return;
  }
  const int L = group_.size();
  const int H = static_cast<int>(hier_.host_ids.size());
  // Reorder blocks as [local index][host index][m]: local rank l reduces the blocks of every
  // host's rank l, then the hosts reduce-scatter those among themselves.
  at::Tensor ordered = at::empty({L * H * m}, input.options());
  for (int g = 0; g < n; ++g) {
    const int64_t dst = (hier_.local_index_of[g] * H + hier_.host_index_of[g]) * m;
    ordered.narrow(0, dst, m).copy_(input.narrow(0, g * m, m));
  }
  at::Tensor part = ordered;
  double ici = 0;
  if (L > 1) {
    part = at::empty({H * m}, input.options());
    const Arrival a = local_arrive(OpKind::kReduceScatter, input, local_op, H * m, -1, what);
    ici = engine_.cost(a, OpKind::kReduceScatter, static_cast<double>(L * H * m * es), local_seq_).ici_bytes;
    engine_.reduce_scatter(a, ordered.data_ptr(), part.data_ptr(), H * m, input.scalar_type(), local_op, what);
  }
  std::vector<at::Tensor> v{part};
  c10d::AllreduceOptions o;
  o.reduceOp = reduce_op(local_op);
  dcn_wait(opts_.cross->allreduce(v, o), what);  // then keep this host's block
  output.copy_(part.narrow(0, hier_.host_index_of[opts_.rank] * m, m));
  if (redop == RedOp::AVG) divide(output.data_ptr(), m, output.scalar_type(), n);
  record_dcn(device, n * m * es, ici, L - 1, 2.0 * (H - 1) / H * H * m * es);
}

void HierarchicalTransport::broadcast(const Call& c, const at::Tensor& data, int root) {
  check_spmd(c);
  const std::string& what = c.what;
  const int device = c.device;
  const int64_t bytes = data.numel() * data.element_size();
  if (!opts_.cross) {
    std::vector<at::Tensor> v{data};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    dcn_wait(opts_.flat->broadcast(v, o), what);
    record_dcn(device, bytes, 0, 0, bytes);
    return;
  }
  const int root_local = hier_.local_index_of[root];
  if (hier_.local_index == root_local) {
    std::vector<at::Tensor> v{data};
    c10d::BroadcastOptions o;
    o.rootRank = hier_.host_index_of[root];
    dcn_wait(opts_.cross->broadcast(v, o), what);
  }
  const int L = group_.size();
  if (L > 1) {
    const Arrival a = local_arrive(OpKind::kBroadcast, data, 0, data.numel(), root_local, what);
    engine_.broadcast(a, data.data_ptr(), bytes, root_local, what);
  }
  record_dcn(device, bytes, L > 1 ? bytes : 0, L - 1, bytes);
}

void HierarchicalTransport::barrier(const Call& c) {
  check_spmd(c);
  const std::string& what = c.what;
  const int device = c.device;
  if (group_.size() > 1) local_arrive(OpKind::kBarrier, at::Tensor(), 0, 0, -1, what);
  auto& dcn = opts_.cross ? opts_.cross : opts_.flat;
  dcn_wait(dcn->barrier(c10d::BarrierOptions()), what);
  if (group_.size() > 1) local_arrive(OpKind::kBarrier, at::Tensor(), 0, 0, -1, what);
  record_dcn(device, 0, 0, 2 * (group_.size() - 1), 0);
}

// ---------------------------------------------------------------- on the flat gloo group

void HierarchicalTransport::reduce(const Call& c, const at::Tensor& data, int redop, double factor, int root) {
  check_spmd(c);
  at::Tensor t = opts_.rank == root ? data : data.clone();
  if (redop == RedOp::PREMUL_SUM) t.mul_(factor);
  c10d::ReduceOptions o;
  o.reduceOp = reduce_op(redop == RedOp::PREMUL_SUM || redop == RedOp::AVG ? RedOp::SUM : redop);
  o.rootRank = root;
  std::vector<at::Tensor> ts{t};
  dcn_wait(opts_.flat->reduce(ts, o), c.what);
  if (opts_.rank == root && redop == RedOp::AVG) divide(t.data_ptr(), t.numel(), t.scalar_type(), opts_.size);
  const double bytes = static_cast<double>(data.numel() * data.element_size());
  record_dcn(c.device, bytes, 0, 0, bytes);
}

void HierarchicalTransport::gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs,
                                   int root) {
  check_spmd(c);
  std::vector<std::vector<at::Tensor>> outs(1, outputs);
  if (opts_.rank != root) outs.clear();
  std::vector<at::Tensor> ins{input};
  c10d::GatherOptions o;
  o.rootRank = root;
  dcn_wait(opts_.flat->gather(outs, ins, o), c.what);
  const double bytes = static_cast<double>(input.numel() * input.element_size());
  record_dcn(c.device, bytes, 0, 0, bytes);
}

void HierarchicalTransport::scatter(const Call& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output,
                                    int root) {
  check_spmd(c);
  std::vector<std::vector<at::Tensor>> ins(1, inputs);
  if (opts_.rank != root) ins.clear();
  std::vector<at::Tensor> outs{output};
  c10d::ScatterOptions o;
  o.rootRank = root;
  dcn_wait(opts_.flat->scatter(outs, ins, o), c.what);
  const double bytes = static_cast<double>(output.numel() * output.element_size());
  record_dcn(c.device, bytes, 0, 0, bytes);
}

void HierarchicalTransport::all_to_all(const Call& c, const at::Tensor& input, const at::Tensor& output,
                                       const Splits& splits) {
  check_spmd(c);
  const int n = opts_.size;
  std::vector<int64_t> send(splits.counts.begin(), splits.counts.begin() + n);
  std::vector<int64_t> recv(splits.counts.begin() + n, splits.counts.end());
  at::Tensor in = input, out = output;
  dcn_wait(opts_.flat->alltoall_base(out, in, recv, send, c10d::AllToAllOptions()), c.what);
  const double bytes = static_cast<double>(splits.send_total);
  record_dcn(c.device, bytes, 0, 0, bytes);
}

// ---------------------------------------------------------------- point to point

void HierarchicalTransport::send(int dst, int tag, const at::Tensor& data, const std::string& what) {
  if (hier_.host_of_rank[dst] == hier_.host) return local_.send(hier_.local_index_of[dst], tag, data, what);
  std::vector<at::Tensor> ts{data};
  dcn_wait(opts_.flat->send(ts, dst, tag), what);
}

void HierarchicalTransport::recv(int src, int tag, const at::Tensor& data, const std::string& what) {
  if (hier_.host_of_rank[src] == hier_.host) return local_.recv(hier_.local_index_of[src], tag, data, what);
  std::vector<at::Tensor> ts{data};
  dcn_wait(opts_.flat->recv(ts, src, tag), what);
}

}  // namespace torch_tpu::dist
