// Groups that span hosts: each collective runs its host-local part through
// shared memory (the slice's ICI) and the part that crosses hosts through gloo
// over TCP (the data-centre network), e.g. all_reduce = local reduce-scatter,
// all_reduce of each shard among the ranks with the same local index on every
// host, local all-gather. Collectives without a hierarchical form run on a
// flat gloo group over the host aliases of the tensors.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <thread>

#include "distributed/backend.h"
#include "runtime/device.h"
#include "vtpu/runtime.h"

namespace torch_tpu::dist {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

c10d::ReduceOp reduce_op(int redop) { return c10d::ReduceOp(static_cast<RedOp>(redop)); }

}  // namespace

Arrival TpuBackend::local_arrive(OpKind op, const at::Tensor& like, int redop, int64_t numel, int64_t root,
                                 const std::string& what) {
  Descriptor d;
  d.op = static_cast<int32_t>(op);
  d.redop = redop;
  d.numel = numel;
  d.root = root;
  if (like.defined()) {
    d.dtype = static_cast<int32_t>(like.scalar_type());
    d.ndim = 1;
    d.sizes[0] = numel;
  }
  const int device = current_device();
  if (device_count() > 0) {
    d.chip = chip(static_cast<c10::DeviceIndex>(device)).global_id();
    d.host = runtime().topology().host_of(d.chip);
  }
  return engine_->arrive(++local_seq_, d, what + " [host-local part]");
}

namespace {
constexpr const char* kFailureKey = "tpu_dist/failure";
}

void TpuBackend::publish_failure() {
  if (failure_published_.exchange(true)) return;
  try {
    const std::string reason = group_->failure();
    // The first root cause wins: later failures are usually its consequences.
    store_->compareSet(kFailureKey, {}, std::vector<uint8_t>(reason.begin(), reason.end()));
  } catch (const std::exception&) {
    // The store may be gone with the rank that hosted it.
  }
}

void TpuBackend::watch_local_peers() {
  pthread_setname_np(pthread_self(), "tpu_dist_watch");
  std::unique_lock<std::mutex> lock(watcher_mu_);
  while (!watcher_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return watcher_stop_; })) {
    if (group_->failed()) {
      publish_failure();
      return;
    }
    const int dead = group_->dead_peer();
    if (dead >= 0) {
      group_->mark_failed(dead, group_->describe_rank(dead) + " died (its process is gone)");
      publish_failure();
      return;
    }
  }
}

void TpuBackend::dcn_wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    // gloo names a socket, not a rank: a rank that saw the root cause (a peer's death on
    // its host) publishes it in the store; give it a moment to arrive.
    std::string cause, store_note;
    try {
      for (int i = 0; i < 40 && cause.empty(); ++i) {
        if (store_->check({kFailureKey})) {
          const auto v = store_->get(kFailureKey);
          cause = std::string(v.begin(), v.end());
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    } catch (const c10::Error& store_error) {
      store_note = std::string(" (the store could not be asked for the cause: ") +
                   store_error.what_without_backtrace() + ")";
    } catch (const std::exception& store_error) {
      store_note = std::string(" (the store could not be asked for the cause: ") + store_error.what() + ")";
    }
    const std::string msg = "tpu_dist " + what + " in group '" + config_.group_name + "' (rank " +
                            std::to_string(getRank()) + "): " +
                            (cause.empty() ? std::string("the part across hosts (gloo over TCP) failed: ") + e.what() + store_note
                                           : cause + " (reported through the store; gloo: " + e.what() + ")");
    group_->mark_failed(-1, cause.empty() ? msg : cause);
    failure_published_ = true;  // a consequence, not a root cause
    C10_THROW_ERROR(DistBackendError, msg);
  }
}

void TpuBackend::record_dcn(int device, double payload, double ici_bytes, int ici_steps, double dcn_bytes) {
  if (device < 0) return;
  vtpu::CollectiveCost c;
  c.payload_bytes = payload;
  c.ici_bytes = ici_bytes;
  c.ici_steps = ici_steps;
  c.dcn_bytes = dcn_bytes;
  chip(static_cast<c10::DeviceIndex>(device)).record_collective(c);
}

void TpuBackend::hier_all_reduce(const at::Tensor& data, int redop, const std::string& what, int device) {
  const int64_t numel = data.numel();
  if (numel == 0) return;
  const int local_op = redop == RedOp::AVG ? RedOp::SUM : redop;
  if (!config_.cross) {  // hosts with different rank counts: everything on the flat group
    std::vector<at::Tensor> v{data};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(local_op);
    dcn_wait(config_.flat->allreduce(v, o), what);
    if (redop == RedOp::AVG) divide(data.data_ptr(), numel, data.scalar_type(), getSize());
    record_dcn(device, numel * data.element_size(), 0, 0, 2.0 * numel * data.element_size());
    return;
  }
  const int L = group_->size();
  const int H = static_cast<int>(hier_->host_ids.size());
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
    ici += engine_->cost(a, OpKind::kReduceScatter, static_cast<double>(shard * L * es), local_seq_).ici_bytes;
    engine_->reduce_scatter(a, buf.data_ptr(), part.data_ptr(), shard, data.scalar_type(), local_op, what);
  }
  std::vector<at::Tensor> v{part};
  c10d::AllreduceOptions o;
  o.reduceOp = reduce_op(local_op);
  dcn_wait(config_.cross->allreduce(v, o), what);
  if (redop == RedOp::AVG) divide(part.data_ptr(), shard, data.scalar_type(), getSize());
  if (L > 1) {
    const Arrival a = local_arrive(OpKind::kAllGather, data, 0, shard, -1, what);
    ici += engine_->cost(a, OpKind::kAllGather, static_cast<double>(shard * L * es), local_seq_).ici_bytes;
    std::vector<void*> ptrs(L);
    for (int r = 0; r < L; ++r) ptrs[r] = static_cast<char*>(buf.data_ptr()) + r * shard * es;
    engine_->all_gather(a, part.data_ptr(), ptrs, shard, es, what);
  }
  if (!buf.is_same(data)) data.copy_(buf.narrow(0, 0, numel));
  record_dcn(device, numel * es, ici, 2 * (L - 1), 2.0 * (H - 1) / H * shard * es);
}

void TpuBackend::hier_all_gather(const at::Tensor& input, const at::Tensor& output, const std::string& what,
                                 int device) {
  const int64_t m = input.numel();
  const size_t es = input.element_size();
  const int n = getSize();
  if (m == 0) return;
  if (!config_.cross) {
    dcn_wait(config_.flat->_allgather_base(const_cast<at::Tensor&>(output), const_cast<at::Tensor&>(input)), what);
    record_dcn(device, n * m * es, 0, 0, (n - 1.0) * m * es);
    return;
  }
  const int L = group_->size();
  const int H = static_cast<int>(hier_->host_ids.size());
  // Host block: this host's ranks' inputs, in local order.
  at::Tensor block = input;
  double ici = 0;
  if (L > 1) {
    block = at::empty({L * m}, input.options());
    const Arrival a = local_arrive(OpKind::kAllGather, input, 0, m, -1, what);
    ici = engine_->cost(a, OpKind::kAllGather, static_cast<double>(L * m * es), local_seq_).ici_bytes;
    std::vector<void*> ptrs(L);
    for (int r = 0; r < L; ++r) ptrs[r] = static_cast<char*>(block.data_ptr()) + r * m * es;
    engine_->all_gather(a, input.data_ptr(), ptrs, m, es, what);
  }
  at::Tensor all = hier_->host_major ? output : at::empty({n * m}, input.options());
  at::Tensor flat_block = block.reshape({-1});
  dcn_wait(config_.cross->_allgather_base(all, flat_block), what);
  if (!hier_->host_major) {
    for (int g = 0; g < n; ++g) {
      const int64_t src = (hier_->host_index_of[g] * L + hier_->local_index_of[g]) * m;
      output.narrow(0, g * m, m).copy_(all.narrow(0, src, m));
    }
  }
  record_dcn(device, n * m * es, ici, L - 1, (H - 1.0) * L * m * es);
}

void TpuBackend::hier_reduce_scatter(const at::Tensor& input, const at::Tensor& output, int redop,
                                     const std::string& what, int device) {
  const int64_t m = output.numel();
  const size_t es = output.element_size();
  const int n = getSize();
  if (m == 0) return;
  const int local_op = redop == RedOp::AVG ? RedOp::SUM : redop;
  if (!config_.cross) {
    at::Tensor tmp = input.clone();
    std::vector<at::Tensor> v{tmp};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(local_op);
    dcn_wait(config_.flat->allreduce(v, o), what);
    output.copy_(tmp.narrow(0, getRank() * m, m));
    if (redop == RedOp::AVG) divide(output.data_ptr(), m, output.scalar_type(), n);
    record_dcn(device, n * m * es, 0, 0, 2.0 * n * m * es);
    return;
  }
  const int L = group_->size();
  const int H = static_cast<int>(hier_->host_ids.size());
  // Reorder blocks as [local index][host index][m]: local rank l reduces the blocks of every
  // host's rank l, then the hosts reduce-scatter those among themselves.
  at::Tensor ordered = at::empty({L * H * m}, input.options());
  for (int g = 0; g < n; ++g) {
    const int64_t dst = (hier_->local_index_of[g] * H + hier_->host_index_of[g]) * m;
    ordered.narrow(0, dst, m).copy_(input.narrow(0, g * m, m));
  }
  at::Tensor part = ordered;
  double ici = 0;
  if (L > 1) {
    part = at::empty({H * m}, input.options());
    const Arrival a = local_arrive(OpKind::kReduceScatter, input, local_op, H * m, -1, what);
    ici = engine_->cost(a, OpKind::kReduceScatter, static_cast<double>(L * H * m * es), local_seq_).ici_bytes;
    engine_->reduce_scatter(a, ordered.data_ptr(), part.data_ptr(), H * m, input.scalar_type(), local_op, what);
  }
  std::vector<at::Tensor> v{part};
  c10d::AllreduceOptions o;
  o.reduceOp = reduce_op(local_op);
  dcn_wait(config_.cross->allreduce(v, o), what);  // then keep this host's block
  output.copy_(part.narrow(0, hier_->host_index_of[getRank()] * m, m));
  if (redop == RedOp::AVG) divide(output.data_ptr(), m, output.scalar_type(), n);
  record_dcn(device, n * m * es, ici, L - 1, 2.0 * (H - 1) / H * H * m * es);
}

void TpuBackend::hier_broadcast(const at::Tensor& data, int root, const std::string& what, int device) {
  const int64_t bytes = data.numel() * data.element_size();
  if (!config_.cross) {
    std::vector<at::Tensor> v{data};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    dcn_wait(config_.flat->broadcast(v, o), what);
    record_dcn(device, bytes, 0, 0, bytes);
    return;
  }
  const int root_local = hier_->local_index_of[root];
  if (hier_->local_index == root_local) {
    std::vector<at::Tensor> v{data};
    c10d::BroadcastOptions o;
    o.rootRank = hier_->host_index_of[root];
    dcn_wait(config_.cross->broadcast(v, o), what);
  }
  const int L = group_->size();
  if (L > 1) {
    const Arrival a = local_arrive(OpKind::kBroadcast, data, 0, data.numel(), root_local, what);
    engine_->broadcast(a, data.data_ptr(), bytes, root_local, what);
  }
  record_dcn(device, bytes, L > 1 ? bytes : 0, L - 1, bytes);
}

void TpuBackend::hier_barrier(const std::string& what, int device) {
  if (group_->size() > 1) local_arrive(OpKind::kBarrier, at::Tensor(), 0, 0, -1, what);
  auto& dcn = config_.cross ? config_.cross : config_.flat;
  dcn_wait(dcn->barrier(c10d::BarrierOptions()), what);
  if (group_->size() > 1) local_arrive(OpKind::kBarrier, at::Tensor(), 0, 0, -1, what);
  record_dcn(device, 0, 0, 2 * (group_->size() - 1), 0);
}

}  // namespace torch_tpu::dist
