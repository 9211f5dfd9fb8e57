#include "distributed/backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "distributed/arguments.h"
#include "distributed/chips.h"
#include "distributed/hierarchical_transport.h"
#include "distributed/host_view.h"
#include "distributed/shm_transport.h"
#include "vtpu/runtime.h"

namespace torch_tpu::dist {
namespace {

using c10d::OpType;

size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  try {
    return static_cast<size_t>(vtpu::Runtime::parse_hbm_bytes(v));
  } catch (const std::exception& e) {
    TORCH_CHECK_VALUE(false, name, "='", v, "': ", e.what());
  }
}

// Whether waits for peers spin and yield before sleeping (TORCH_TPU_DIST_SPIN, default 1).
// 0 sleeps at once; with more ranks than cores it measured from 0.7x to 2x, with the load.
bool spin_waits() {
  const char* v = std::getenv("TORCH_TPU_DIST_SPIN");
  if (v == nullptr) return true;
  const std::string s(v);
  TORCH_CHECK(s == "0" || s == "1", "TORCH_TPU_DIST_SPIN must be 0 or 1, not '", s, "'");
  return s == "1";
}

bool spans_hosts(const std::vector<int>& hosts) {
  return std::any_of(hosts.begin(), hosts.end(), [&](int h) { return h != hosts[0]; });
}

}  // namespace

// ---------------------------------------------------------------- TpuBackend

TpuBackend::TpuBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Config config)
    : c10d::Backend(rank, size), config_(std::move(config)) {
  if (config_.buffer_bytes == 0) config_.buffer_bytes = env_bytes("TORCH_TPU_DIST_BUFFER_BYTES", 2 << 20);
  if (config_.p2p_bytes == 0) config_.p2p_bytes = env_bytes("TORCH_TPU_DIST_P2P_BYTES", 1 << 20);
  if (config_.small_bytes == 0) config_.small_bytes = env_bytes("TORCH_TPU_DIST_SMALL_BYTES", 64 << 10);
  ShmGroup::Options o;
  o.rank = rank;
  o.size = size;
  o.timeout = config_.timeout;
  o.group_name = config_.group_name;
  o.global_ranks = config_.global_ranks;
  o.buffer_bytes = config_.buffer_bytes;
  o.p2p_bytes = config_.p2p_bytes;
  const bool multi_host = spans_hosts(config_.hosts);
  // The group spans hosts: shared memory among this host's ranks, gloo (DCN) across.
  TORCH_CHECK(!multi_host || (static_cast<int>(config_.hosts.size()) == size && config_.flat),
              "tpu_dist: a group spanning hosts needs the host of every rank and a gloo group");
  o.spin = spin_waits();
  if (!multi_host) {
    group_ = std::make_unique<ShmGroup>(store, o);
    transport_ = std::make_unique<ShmTransport>(*group_, topology(), config_.small_bytes);
  } else {
    Hierarchy h(config_.hosts, rank);
    auto host_store = c10::make_intrusive<c10d::PrefixStore>("tpu_dist/host" + std::to_string(h.host), store);
    group_ = std::make_unique<ShmGroup>(host_store, h.local_options(o));
    HierarchicalTransport::Options t;
    t.group_name = config_.group_name;
    t.rank = rank;
    t.size = size;
    t.small_bytes = config_.small_bytes;
    t.store = store;
    t.cross = config_.cross;
    t.flat = config_.flat;
    transport_ = std::make_unique<HierarchicalTransport>(std::move(h), *group_, topology(), std::move(t));
  }
  collectives_ = std::make_unique<Executor>("tpu_dist");
}

TpuBackend::~TpuBackend() { shutdown(); }

c10::intrusive_ptr<c10d::Backend::Options> TpuBackend::getBackendOptions() {
  return c10::make_intrusive<Options>("tpu_dist", timeout());
}

void TpuBackend::setTimeout(std::chrono::milliseconds timeout) {
  config_.timeout = timeout;
  group_->set_timeout(timeout);
}

void TpuBackend::shutdown() {
  if (shut_down_.exchange(true)) return;
  transport_->stop();
  collectives_.reset();
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    senders_.clear();
    receivers_.clear();
  }
  group_->close();
}

void TpuBackend::abort() {
  group_->mark_failed(getRank(), "rank " + std::to_string(getRank()) + " aborted the group");
  shutdown();
}

void TpuBackend::check_usable(const char* op) const {
  if (shut_down_.load()) {
    C10_THROW_ERROR(DistBackendError,
                    std::string("tpu_dist ") + op + ": group '" + config_.group_name + "' was shut down");
  }
  if (group_->failed()) {
    C10_THROW_ERROR(DistBackendError, std::string("tpu_dist ") + op + ": group '" + config_.group_name +
                                          "' is unusable after an earlier failure: " + group_->failure());
  }
}

Executor& TpuBackend::peer_executor(std::map<int, std::unique_ptr<Executor>>& executors, int peer, const char* kind) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto& e = executors[peer];
  if (!e) e = std::make_unique<Executor>(std::string("tpu_dist_") + kind + std::to_string(peer));
  return *e;
}

// ---------------------------------------------------------------- the skeleton

TpuBackend::Collective TpuBackend::begin(const char* title, OpType type) const {
  Collective c{title, type};
  check_usable(c.op());
  return c;
}

const char* TpuBackend::Collective::op() const { return title + std::strlen("tpu_dist:"); }

c10::intrusive_ptr<c10d::Work> TpuBackend::issue(Collective c) {
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  const uint64_t first = seq_.fetch_add(c.steps.size()) + 1;
  return launch(*collectives_, c.type, c.title, c.devices, std::move(c.outputs), first,
                [this, op = c.op(), device = c.device, steps = std::move(c.steps)](uint64_t first) {
                  for (size_t i = 0; i < steps.size(); ++i) {
                    const uint64_t seq = first + i;
                    steps[i].run(Call{seq, steps[i].desc, what_of(op, seq, steps[i].tensor), device});
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::launch(Executor& executor, OpType type, const char* title,
                                                  const std::vector<int>& devices, std::vector<at::Tensor> outputs,
                                                  uint64_t first_seq, std::function<void(uint64_t)> body) {
  std::vector<vtpu::Event> ready = stream_points(devices);
  const int device = devices.empty() ? -1 : devices.front();
  auto work = c10::make_intrusive<TpuWork>(getRank(), type, title, std::move(outputs));
  work->set_sequence_number(first_seq);
  executor.submit([this, work, ready = std::move(ready), device, first_seq, body = std::move(body)]() {
    try {
      make_current(device);
      for (const auto& ev : ready) ev.synchronize();
      body(first_seq);
      work->complete(nullptr);
    } catch (...) {
      transport_->after_error();
      work->complete(std::current_exception());
    }
  });
  return work;
}

// ---------------------------------------------------------------- point to point

at::Tensor& TpuBackend::check_p2p(std::vector<at::Tensor>& tensors, int peer, const char* op, const char* role) const {
  check_usable(op);
  at::Tensor& t = single(tensors, op);
  check_tensor(t, op, "tensor");
  TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "tpu_dist ", op, ": ", role, " rank ", peer,
              " is invalid for rank ", getRank(), " of a group of ", getSize());
  return t;
}

c10::intrusive_ptr<c10d::Work> TpuBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor& t = check_p2p(tensors, dst, "send", "destination");
  const std::string what =
      "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ", " + describe_tensor(t) + ")";
  const int device = tpu_index(t);
  return launch(peer_executor(senders_, dst, "send"), OpType::SEND, "tpu_dist:send", tpu_indices({t}), {t}, 0,
                [this, r = TensorRecipe::of(t), dst, tag, what, device](uint64_t) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/true);
                  vtpu::CollectiveCost c;
                  c.payload_bytes = static_cast<double>(v.nbytes());
                  c.ici_bytes = c.payload_bytes;
                  c.ici_steps = 1;
                  record_cost(device, c);
                  transport_->send(dst, tag, v.flat(), what);
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor& t = check_p2p(tensors, src, "recv", "source");
  const std::string what =
      "recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ", " + describe_tensor(t) + ")";
  return launch(peer_executor(receivers_, src, "recv"), OpType::RECV, "tpu_dist:recv", tpu_indices({t}), {t}, 0,
                [this, r = TensorRecipe::of(t), src, tag, what](uint64_t) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/false);
                  transport_->recv(src, tag, v.flat(), what);
                  v.commit();
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu_dist: recv from any source is not supported; pass src=");
}

}  // namespace torch_tpu::dist
