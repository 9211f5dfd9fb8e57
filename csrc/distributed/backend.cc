#include "distributed/backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <cstdlib>
#include <set>
#include <sstream>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "distributed/p2p.h"
#include "runtime/device.h"
#include "vtpu/runtime.h"

namespace torch_tpu::dist {
namespace {

using c10d::OpType;
using RedOp = c10d::ReduceOp::RedOpType;

size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  try {
    return static_cast<size_t>(vtpu::Runtime::parse_hbm_bytes(v));
  } catch (const std::exception& e) {
    TORCH_CHECK_VALUE(false, name, "='", v, "': ", e.what());
  }
}

std::string describe_tensor(const at::Tensor& t) {
  std::ostringstream os;
  os << dtype_name(static_cast<int32_t>(t.scalar_type())) << t.sizes() << " on " << t.device();
  return os.str();
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist ", op, ": expects one tensor per process (one chip per rank), got ",
              tensors.size());
  return tensors[0];
}

void check_tensor(const at::Tensor& t, const char* op, const char* role) {
  TORCH_CHECK(t.defined(), "tpu_dist ", op, ": ", role, " is undefined");
  TORCH_CHECK(t.layout() == at::kStrided, "tpu_dist ", op, ": ", role, " must be a dense (strided) tensor, got ",
              t.layout(), " ", describe_tensor(t));
  TORCH_CHECK(t.device().type() == kTPU || t.device().is_cpu(), "tpu_dist ", op, ": ", role,
              " must be on tpu or cpu, got ", describe_tensor(t));
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what_a, const char* what_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "tpu_dist ", op, ": ", what_a, " (", describe_tensor(a),
              ") and ", what_b, " (", describe_tensor(b), ") must have the same dtype");
  TORCH_CHECK(a.device() == b.device(), "tpu_dist ", op, ": ", what_a, " (", describe_tensor(a), ") and ", what_b,
              " (", describe_tensor(b), ") must be on the same device");
}

void check_redop(int redop, at::ScalarType dtype, const char* op) {
  const bool integral = at::isIntegralType(dtype, /*includeBool=*/true);
  switch (static_cast<RedOp>(redop)) {
    case RedOp::SUM:
    case RedOp::PRODUCT:
      return;
    case RedOp::MIN:
    case RedOp::MAX:
      TORCH_CHECK(!at::isComplexType(dtype), "tpu_dist ", op, ": ", redop_name(redop), " is not defined for ",
                  dtype);
      return;
    case RedOp::AVG:
      TORCH_CHECK(dtype != at::kBool, "tpu_dist ", op, ": AVG is not defined for bool tensors");
      return;
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      TORCH_CHECK(integral, "tpu_dist ", op, ": ", redop_name(redop), " needs an integer or bool tensor, got ",
                  dtype);
      return;
    case RedOp::PREMUL_SUM:
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "tpu_dist ", op,
                  ": PREMUL_SUM needs a floating-point tensor, got ", dtype);
      return;
    default:
      TORCH_CHECK(false, "tpu_dist ", op, ": unsupported reduce op ", redop);
  }
}

double premul_factor(const c10d::ReduceOp& op) {
  if (op.op_ != RedOp::PREMUL_SUM) return 1.0;
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "tpu_dist: PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) return s->tensor_factor.item<double>();  // synchronizes a tpu factor
  return s->double_factor;
}

int tpu_index(const at::Tensor& t) {
  return t.defined() && t.device().type() == kTPU ? t.device().index() : -1;
}

std::vector<int> tpu_indices(const std::vector<at::Tensor>& tensors) {
  std::vector<int> out;
  for (const auto& t : tensors) {
    const int d = tpu_index(t);
    if (d >= 0 && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

Descriptor describe(OpKind op, const at::Tensor& t, int redop, int64_t numel, int64_t root) {
  Descriptor d;
  d.op = static_cast<int32_t>(op);
  d.redop = redop;
  d.numel = numel;
  d.root = root;
  if (t.defined()) {
    d.dtype = static_cast<int32_t>(t.scalar_type());
    d.ndim = static_cast<int32_t>(std::min<int64_t>(t.dim(), kMaxDims));
    for (int i = 0; i < d.ndim; ++i) d.sizes[i] = t.size(i);
    const int dev = tpu_index(t);
    if (dev >= 0) {
      d.chip = chip(static_cast<c10::DeviceIndex>(dev)).global_id();
      d.host = runtime().topology().host_of(d.chip);
    }
  }
  return d;
}

std::string what_of(const char* op, uint64_t seq, const at::Tensor& t) {
  std::ostringstream os;
  os << op << " (collective #" << seq;
  if (t.defined()) os << ", " << describe_tensor(t);
  os << ")";
  return os.str();
}

// A contiguous host view of a tensor's memory; outputs that are not
// contiguous are computed in a temporary and copied back by commit().
class HostView {
 public:
  HostView(AliasBuilder& builder, const TensorRecipe& recipe, bool read) : view_(builder.alias(recipe)) {
    if (view_.is_contiguous()) {
      flat_ = view_;
    } else {
      flat_ = read ? view_.contiguous() : at::empty(view_.sizes(), view_.options());
    }
  }
  void* data() { return flat_.data_ptr(); }
  at::Tensor& flat() { return flat_; }
  int64_t nbytes() const { return static_cast<int64_t>(flat_.numel() * flat_.element_size()); }
  void commit() {
    if (!flat_.is_same(view_)) view_.copy_(flat_);
  }

 private:
  at::Tensor view_;
  at::Tensor flat_;
};

std::vector<TensorRecipe> recipes(const std::vector<at::Tensor>& ts) {
  std::vector<TensorRecipe> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(TensorRecipe::of(t));
  return out;
}

}  // namespace

// ---------------------------------------------------------------- TpuWork

TpuWork::TpuWork(int rank, OpType type, const char* profiling_title, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, profiling_title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void TpuWork::complete(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

// ---------------------------------------------------------------- Executor

Executor::Executor(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { run(); });
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Executor::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void Executor::run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

// Whether waits for peers spin and yield before sleeping (TORCH_TPU_DIST_SPIN, default 1).
// 0 sleeps at once; with more ranks than cores it measured from 0.7x to 2x, with the load.
static bool spin_waits() {
  const char* v = std::getenv("TORCH_TPU_DIST_SPIN");
  if (v == nullptr) return true;
  const std::string s(v);
  TORCH_CHECK(s == "0" || s == "1", "TORCH_TPU_DIST_SPIN must be 0 or 1, not '", s, "'");
  return s == "1";
}

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
  c10::intrusive_ptr<c10d::Store> shm_store = store;
  if (!config_.hosts.empty() &&
      std::any_of(config_.hosts.begin(), config_.hosts.end(), [&](int h) { return h != config_.hosts[0]; })) {
    // The group spans hosts: shared memory among this host's ranks, gloo (DCN) across.
    TORCH_CHECK(static_cast<int>(config_.hosts.size()) == size && config_.flat,
                "tpu_dist: a group spanning hosts needs the host of every rank and a gloo group");
    hier_ = std::make_unique<Hierarchy>();
    Hierarchy& h = *hier_;
    h.host_of_rank = config_.hosts;
    std::set<int> ids(config_.hosts.begin(), config_.hosts.end());
    h.host_ids.assign(ids.begin(), ids.end());
    h.host_index_of.resize(size);
    h.local_index_of.resize(size);
    std::map<int, int> seen;
    for (int r = 0; r < size; ++r) {
      h.host_index_of[r] = static_cast<int>(std::find(h.host_ids.begin(), h.host_ids.end(), config_.hosts[r]) -
                                            h.host_ids.begin());
      h.local_index_of[r] = seen[config_.hosts[r]]++;
      if (config_.hosts[r] == config_.hosts[rank]) h.local_ranks.push_back(r);
    }
    h.local_index = h.local_index_of[rank];
    const int per_host = static_cast<int>(h.local_ranks.size());
    h.host_major = true;
    for (int r = 0; r < size; ++r) {
      h.host_major = h.host_major && r == h.host_index_of[r] * per_host + h.local_index_of[r];
    }
    o.rank = h.local_index;
    o.size = per_host;
    o.group_name = config_.group_name + "/host" + std::to_string(config_.hosts[rank]);
    o.group_ranks.assign(h.local_ranks.begin(), h.local_ranks.end());
    o.global_ranks.clear();
    for (int r : h.local_ranks) {
      o.global_ranks.push_back(config_.global_ranks.empty() ? r : config_.global_ranks[r]);
    }
    shm_store = c10::make_intrusive<c10d::PrefixStore>(
        "tpu_dist/host" + std::to_string(config_.hosts[rank]), store);
  }
  o.spin = spin_waits();
  store_ = store;
  group_ = std::make_unique<ShmGroup>(shm_store, o);
  engine_ = std::make_unique<Engine>(*group_, runtime().topology(), config_.small_bytes);
  collectives_ = std::make_unique<Executor>("tpu_dist");
  if (multi_host() && group_->size() > 1) watcher_ = std::thread([this] { watch_local_peers(); });
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
  {
    std::lock_guard<std::mutex> lock(watcher_mu_);
    watcher_stop_ = true;
  }
  watcher_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
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
    C10_THROW_ERROR(DistBackendError, std::string("tpu_dist ") + op + ": group '" + config_.group_name +
                                          "' was shut down");
  }
  if (group_->failed()) {
    C10_THROW_ERROR(DistBackendError, std::string("tpu_dist ") + op + ": group '" + config_.group_name +
                                          "' is unusable after an earlier failure: " + group_->failure());
  }
}

Executor& TpuBackend::peer_executor(std::map<int, std::unique_ptr<Executor>>& executors, int peer,
                                    const char* kind) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto& e = executors[peer];
  if (!e) e = std::make_unique<Executor>(std::string("tpu_dist_") + kind + std::to_string(peer));
  return *e;
}

c10::intrusive_ptr<c10d::Work> TpuBackend::launch(Executor& executor, OpType type, const char* title,
                                                  const std::vector<int>& devices, std::vector<at::Tensor> outputs,
                                                  uint64_t first_seq, std::function<void(uint64_t)> body) {
  std::vector<vtpu::Event> ready;
  for (int d : devices) {
    vtpu::Event ev;
    ev.record(current_vtpu_stream(static_cast<c10::DeviceIndex>(d)));
    ready.push_back(std::move(ev));
  }
  const int device = devices.empty() ? -1 : devices.front();
  auto work = c10::make_intrusive<TpuWork>(getRank(), type, title, std::move(outputs));
  work->set_sequence_number(first_seq);
  executor.submit([this, work, ready = std::move(ready), device, first_seq, body = std::move(body)]() {
    try {
      if (device >= 0) set_current_device(static_cast<c10::DeviceIndex>(device));
      for (const auto& ev : ready) ev.synchronize();
      body(first_seq);
      work->complete(nullptr);
    } catch (...) {
      if (multi_host() && group_->failed()) publish_failure();
      work->complete(std::current_exception());
    }
  });
  return work;
}

void TpuBackend::record(const Arrival& a, OpKind op, double payload_bytes, uint64_t seq, int device) {
  if (device < 0) return;
  chip(static_cast<c10::DeviceIndex>(device)).record_collective(engine_->cost(a, op, payload_bytes, seq), op_name(op));
}

// ---------------------------------------------------------------- collectives

c10::intrusive_ptr<c10d::Work> TpuBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  check_usable("all_reduce");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& t = single(tensors, "all_reduce");
  check_tensor(t, "all_reduce", "tensor");
  const int redop = opts.reduceOp.op_;
  check_redop(redop, t.scalar_type(), "all_reduce");
  const double factor = premul_factor(opts.reduceOp);
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kAllReduce, t, redop, t.numel(), -1);
  const std::string what = what_of("all_reduce", seq, t);
  const int device = tpu_index(t);
  return launch(*collectives_, OpType::ALLREDUCE, "tpu_dist:all_reduce", tpu_indices({t}), {t}, seq,
                [this, r = TensorRecipe::of(t), d, what, device, redop, factor](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/true);
                  int op = redop;
                  if (multi_host()) {
                    if (redop == RedOp::PREMUL_SUM) v.flat().mul_(factor);
                    hier_all_reduce(v.flat().reshape({-1}), redop == RedOp::PREMUL_SUM ? RedOp::SUM : redop,
                                    what, device);
                    v.commit();
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, d, what);
                  record(a, OpKind::kAllReduce, v.nbytes(), seq, device);
                  if (redop == RedOp::PREMUL_SUM) {
                    v.flat().mul_(factor);
                    op = RedOp::SUM;
                  }
                  engine_->all_reduce(a, v.data(), v.flat().numel(), v.flat().scalar_type(), op, what);
                  v.commit();
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  check_usable("all_reduce_coalesced");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  TORCH_CHECK(!tensors.empty(), "tpu_dist all_reduce_coalesced: no tensors");
  const int redop = opts.reduceOp.op_;
  for (const auto& t : tensors) {
    check_tensor(t, "all_reduce_coalesced", "tensor");
    check_same(t, tensors[0], "all_reduce_coalesced", "a tensor", "the first tensor");
  }
  check_redop(redop, tensors[0].scalar_type(), "all_reduce_coalesced");
  const double factor = premul_factor(opts.reduceOp);
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  const uint64_t seq = ++seq_;
  Descriptor d = describe(OpKind::kAllReduce, tensors[0], redop, total, -1);
  d.ndim = 1;
  d.sizes[0] = total;
  const std::string what = what_of("all_reduce_coalesced", seq, tensors[0]);
  const int device = tpu_index(tensors[0]);
  return launch(*collectives_, OpType::ALLREDUCE_COALESCED, "tpu_dist:all_reduce_coalesced", tpu_indices(tensors),
                tensors, seq, [this, rs = recipes(tensors), d, what, device, redop, factor, total](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  std::vector<at::Tensor> views;
                  for (const auto& r : rs) views.push_back(b.alias(r));
                  at::Tensor flat = at::empty({total}, views[0].options());
                  int64_t off = 0;
                  for (auto& v : views) {
                    flat.narrow(0, off, v.numel()).view(v.sizes()).copy_(v);
                    off += v.numel();
                  }
                  int op = redop;
                  if (redop == RedOp::PREMUL_SUM) {
                    flat.mul_(factor);
                    op = RedOp::SUM;
                  }
                  if (multi_host()) {
                    hier_all_reduce(flat, op, what, device);
                  } else {
                    const Arrival a = engine_->arrive(seq, d, what);
                    record(a, OpKind::kAllReduce, flat.numel() * flat.element_size(), seq, device);
                    engine_->all_reduce(a, flat.data_ptr(), total, flat.scalar_type(), op, what);
                  }
                  off = 0;
                  for (auto& v : views) {
                    v.copy_(flat.narrow(0, off, v.numel()).view(v.sizes()));
                    off += v.numel();
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  check_usable("broadcast");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& t = single(tensors, "broadcast");
  check_tensor(t, "broadcast", "tensor");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "tpu_dist broadcast: root rank ", opts.rootRank,
              " is out of range for a group of ", getSize());
  TORCH_CHECK(opts.rootTensor == 0, "tpu_dist broadcast: root tensor must be 0, got ", opts.rootTensor);
  const uint64_t seq = ++seq_;
  const int root = static_cast<int>(opts.rootRank);
  const Descriptor d = describe(OpKind::kBroadcast, t, 0, t.numel(), root);
  const std::string what = what_of("broadcast", seq, t);
  const int device = tpu_index(t);
  return launch(*collectives_, OpType::BROADCAST, "tpu_dist:broadcast", tpu_indices({t}), {t}, seq,
                [this, r = TensorRecipe::of(t), d, what, device, root](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/getRank() == root);
                  if (multi_host()) {
                    hier_broadcast(v.flat(), root, what, device);
                    if (getRank() != root) v.commit();
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, d, what);
                  record(a, OpKind::kBroadcast, v.nbytes(), seq, device);
                  engine_->broadcast(a, v.data(), v.nbytes(), root, what);
                  if (getRank() != root) v.commit();
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_usable("reduce");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& t = single(tensors, "reduce");
  check_tensor(t, "reduce", "tensor");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "tpu_dist reduce: root rank ", opts.rootRank,
              " is out of range for a group of ", getSize());
  const int redop = opts.reduceOp.op_;
  check_redop(redop, t.scalar_type(), "reduce");
  const double factor = premul_factor(opts.reduceOp);
  const uint64_t seq = ++seq_;
  const int root = static_cast<int>(opts.rootRank);
  const Descriptor d = describe(OpKind::kReduce, t, redop, t.numel(), root);
  const std::string what = what_of("reduce", seq, t);
  const int device = tpu_index(t);
  return launch(*collectives_, OpType::REDUCE, "tpu_dist:reduce", tpu_indices({t}), {t}, seq,
                [this, r = TensorRecipe::of(t), d, what, device, redop, factor, root](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/true);
                  if (multi_host()) {
                    at::Tensor t = getRank() == root ? v.flat() : v.flat().clone();
                    if (redop == RedOp::PREMUL_SUM) t.mul_(factor);
                    c10d::ReduceOptions o;
                    o.reduceOp = c10d::ReduceOp(static_cast<RedOp>(
                        redop == RedOp::PREMUL_SUM || redop == RedOp::AVG ? RedOp::SUM : redop));
                    o.rootRank = root;
                    std::vector<at::Tensor> ts{t};
                    dcn_wait(config_.flat->reduce(ts, o), what);
                    if (getRank() == root) {
                      if (redop == RedOp::AVG) divide(t.data_ptr(), t.numel(), t.scalar_type(), getSize());
                      v.commit();
                    }
                    record_dcn(device, v.nbytes(), 0, 0, v.nbytes());
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, d, what);
                  record(a, OpKind::kReduce, v.nbytes(), seq, device);
                  int op = redop;
                  at::Tensor input = v.flat();
                  if (redop == RedOp::PREMUL_SUM) {
                    input = input.mul(factor);  // a copy: non-roots keep their tensor
                    op = RedOp::SUM;
                  }
                  engine_->reduce(a, input.data_ptr(), v.data(), input.numel(), input.scalar_type(), op, root, what);
                  if (getRank() == root) v.commit();
                });
}

void TpuBackend::run_all_gather(uint64_t seq, const TensorRecipe& input, const std::vector<TensorRecipe>& outputs,
                                const Descriptor& d, const std::string& what, int device) {
  AliasBuilder b(c10::kCPU);
  HostView in(b, input, /*read=*/true);
  std::vector<HostView> outs;
  outs.reserve(outputs.size());
  for (const auto& r : outputs) outs.emplace_back(b, r, /*read=*/false);
  const int n = getSize();
  const int64_t count = in.flat().numel();
  const size_t es = in.flat().element_size();
  std::vector<void*> ptrs(n);
  for (int r = 0; r < n; ++r) {
    ptrs[r] = outs.size() == 1 ? static_cast<char*>(outs[0].data()) + r * count * es : outs[r].data();
  }
  if (multi_host()) {
    at::Tensor all = outs.size() == 1 ? outs[0].flat().reshape({-1}) : at::empty({n * count}, in.flat().options());
    hier_all_gather(in.flat().reshape({-1}), all, what, device);
    if (outs.size() != 1) {
      for (int r = 0; r < n; ++r) outs[r].flat().reshape({-1}).copy_(all.narrow(0, r * count, count));
    }
    for (auto& o : outs) o.commit();
    return;
  }
  const Arrival a = engine_->arrive(seq, d, what);
  record(a, OpKind::kAllGather, static_cast<double>(n * count * es), seq, device);
  engine_->all_gather(a, in.data(), ptrs, count, es, what);
  for (auto& o : outs) o.commit();
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  check_usable("all_gather");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& in = single(inputs, "all_gather");
  check_tensor(in, "all_gather", "input");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "tpu_dist all_gather: ",
              "expects one list of ", getSize(), " output tensors, got ", outputs.size(), " list(s) of ",
              outputs.empty() ? 0 : outputs[0].size());
  for (const auto& o : outputs[0]) {
    check_tensor(o, "all_gather", "output");
    check_same(o, in, "all_gather", "an output", "the input");
    TORCH_CHECK(o.numel() == in.numel(), "tpu_dist all_gather: every output must have the input's ", in.numel(),
                " elements; got ", describe_tensor(o), " for input ", describe_tensor(in));
  }
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kAllGather, in, 0, in.numel(), -1);
  const std::string what = what_of("all_gather", seq, in);
  const int device = tpu_index(in);
  std::vector<at::Tensor> all = outputs[0];
  all.push_back(in);
  return launch(*collectives_, OpType::ALLGATHER, "tpu_dist:all_gather", tpu_indices(all), outputs[0], seq,
                [this, ri = TensorRecipe::of(in), ro = recipes(outputs[0]), d, what, device](uint64_t seq) {
                  run_all_gather(seq, ri, ro, d, what, device);
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  check_usable("all_gather_into_tensor");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  check_tensor(input, "all_gather_into_tensor", "input");
  check_tensor(output, "all_gather_into_tensor", "output");
  check_same(output, input, "all_gather_into_tensor", "the output", "the input");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "tpu_dist all_gather_into_tensor: the output (",
              describe_tensor(output), ") must hold ", getSize(), " x the input's ", input.numel(),
              " elements (input ", describe_tensor(input), ")");
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kAllGather, input, 0, input.numel(), -1);
  const std::string what = what_of("all_gather_into_tensor", seq, input);
  const int device = tpu_index(input);
  return launch(*collectives_, OpType::_ALLGATHER_BASE, "tpu_dist:all_gather_into_tensor",
                tpu_indices({output, input}), {output}, seq,
                [this, ri = TensorRecipe::of(input), ro = TensorRecipe::of(output), d, what, device](uint64_t seq) {
                  run_all_gather(seq, ri, {ro}, d, what, device);
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  check_usable("all_gather_coalesced");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist all_gather_coalesced: ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  std::vector<at::Tensor> all, outs;
  std::vector<TensorRecipe> ins;
  std::vector<std::vector<TensorRecipe>> out_recipes;
  std::vector<Descriptor> ds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "all_gather_coalesced", "input");
    TORCH_CHECK(static_cast<int>(outputs[i].size()) == getSize(), "tpu_dist all_gather_coalesced: output list ", i,
                " has ", outputs[i].size(), " tensors, expected ", getSize());
    for (const auto& o : outputs[i]) {
      check_same(o, inputs[i], "all_gather_coalesced", "an output", "its input");
      TORCH_CHECK(o.numel() == inputs[i].numel(), "tpu_dist all_gather_coalesced: output ", describe_tensor(o),
                  " does not match input ", describe_tensor(inputs[i]));
      all.push_back(o);
      outs.push_back(o);
    }
    all.push_back(inputs[i]);
    ins.push_back(TensorRecipe::of(inputs[i]));
    out_recipes.push_back(recipes(outputs[i]));
    ds.push_back(describe(OpKind::kAllGather, inputs[i], 0, inputs[i].numel(), -1));
  }
  const uint64_t first = seq_.fetch_add(inputs.size()) + 1;
  const int device = inputs.empty() ? -1 : tpu_index(inputs[0]);
  return launch(*collectives_, OpType::ALLGATHER_COALESCED, "tpu_dist:all_gather_coalesced", tpu_indices(all), outs,
                first, [this, ins, out_recipes, ds, device](uint64_t first) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    const std::string what = "all_gather_coalesced (collective #" + std::to_string(first + i) + ")";
                    run_all_gather(first + i, ins[i], out_recipes[i], ds[i], what, device);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  check_usable("all_gather_into_tensor_coalesced");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist all_gather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  std::vector<Descriptor> ds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "all_gather_into_tensor_coalesced", "input");
    check_tensor(outputs[i], "all_gather_into_tensor_coalesced", "output");
    check_same(outputs[i], inputs[i], "all_gather_into_tensor_coalesced", "an output", "its input");
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(), "tpu_dist all_gather_into_tensor_coalesced: ",
                "output ", describe_tensor(outputs[i]), " must hold ", getSize(), " x input ",
                describe_tensor(inputs[i]));
    ds.push_back(describe(OpKind::kAllGather, inputs[i], 0, inputs[i].numel(), -1));
  }
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  const uint64_t first = seq_.fetch_add(inputs.size()) + 1;
  const int device = inputs.empty() ? -1 : tpu_index(inputs[0]);
  return launch(*collectives_, OpType::COALESCED, "tpu_dist:all_gather_into_tensor_coalesced", tpu_indices(all),
                outputs, first,
                [this, ins = recipes(inputs), outs = recipes(outputs), ds, device](uint64_t first) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    const std::string what =
                        "all_gather_into_tensor_coalesced (collective #" + std::to_string(first + i) + ")";
                    run_all_gather(first + i, ins[i], {outs[i]}, ds[i], what, device);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  check_usable("gather");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& in = single(inputs, "gather");
  check_tensor(in, "gather", "input");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "tpu_dist gather: root rank ", root, " is out of range for a group of ",
              getSize());
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "tpu_dist gather: the root expects one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) {
      check_tensor(o, "gather", "output");
      check_same(o, in, "gather", "an output", "the input");
      TORCH_CHECK(o.numel() == in.numel(), "tpu_dist gather: output ", describe_tensor(o), " does not match input ",
                  describe_tensor(in));
    }
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "tpu_dist gather: only the root passes output tensors");
  }
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kGather, in, 0, in.numel(), root);
  const std::string what = what_of("gather", seq, in);
  const int device = tpu_index(in);
  std::vector<at::Tensor> all = outs;
  all.push_back(in);
  return launch(*collectives_, OpType::GATHER, "tpu_dist:gather", tpu_indices(all), outs, seq,
                [this, ri = TensorRecipe::of(in), ro = recipes(outs), d, what, device, root](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, ri, /*read=*/true);
                  std::vector<HostView> hs;
                  std::vector<void*> ptrs(getSize(), nullptr);
                  for (const auto& r : ro) hs.emplace_back(b, r, /*read=*/false);
                  for (size_t i = 0; i < hs.size(); ++i) ptrs[i] = hs[i].data();
                  if (multi_host()) {
                    std::vector<std::vector<at::Tensor>> outs(1);
                    if (getRank() != root) outs.clear();
                    for (auto& h : hs) outs[0].push_back(h.flat());
                    std::vector<at::Tensor> ins{v.flat()};
                    c10d::GatherOptions o;
                    o.rootRank = root;
                    dcn_wait(config_.flat->gather(outs, ins, o), what);
                    for (auto& h : hs) h.commit();
                    record_dcn(device, v.nbytes(), 0, 0, v.nbytes());
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, d, what);
                  record(a, OpKind::kGather, static_cast<double>(v.nbytes() * getSize()), seq, device);
                  engine_->gather(a, v.data(), ptrs, v.nbytes(), root, what);
                  for (auto& h : hs) h.commit();
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  check_usable("scatter");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& out = single(outputs, "scatter");
  check_tensor(out, "scatter", "output");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "tpu_dist scatter: root rank ", root,
              " is out of range for a group of ", getSize());
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "tpu_dist scatter: the root expects one list of ", getSize(), " input tensors");
    for (const auto& i : inputs[0]) {
      check_tensor(i, "scatter", "input");
      check_same(i, out, "scatter", "an input", "the output");
      TORCH_CHECK(i.numel() == out.numel(), "tpu_dist scatter: input ", describe_tensor(i),
                  " does not match output ", describe_tensor(out));
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "tpu_dist scatter: only the root passes input tensors");
  }
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kScatter, out, 0, out.numel(), root);
  const std::string what = what_of("scatter", seq, out);
  const int device = tpu_index(out);
  std::vector<at::Tensor> all = ins;
  all.push_back(out);
  return launch(*collectives_, OpType::SCATTER, "tpu_dist:scatter", tpu_indices(all), {out}, seq,
                [this, ro = TensorRecipe::of(out), ri = recipes(ins), d, what, device, root](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, ro, /*read=*/false);
                  std::vector<HostView> hs;
                  std::vector<const void*> ptrs(getSize(), nullptr);
                  for (const auto& r : ri) hs.emplace_back(b, r, /*read=*/true);
                  for (size_t i = 0; i < hs.size(); ++i) ptrs[i] = hs[i].data();
                  if (multi_host()) {
                    std::vector<std::vector<at::Tensor>> ins(1);
                    if (getRank() != root) ins.clear();
                    for (auto& h : hs) ins[0].push_back(h.flat());
                    std::vector<at::Tensor> outs{v.flat()};
                    c10d::ScatterOptions o;
                    o.rootRank = root;
                    dcn_wait(config_.flat->scatter(outs, ins, o), what);
                    v.commit();
                    record_dcn(device, v.nbytes(), 0, 0, v.nbytes());
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, d, what);
                  record(a, OpKind::kScatter, static_cast<double>(v.nbytes() * getSize()), seq, device);
                  engine_->scatter(a, ptrs, v.data(), v.nbytes(), root, what);
                  v.commit();
                });
}

void TpuBackend::run_reduce_scatter(uint64_t seq, const std::vector<TensorRecipe>& inputs, const TensorRecipe& output,
                                    int redop, double factor, const Descriptor& d, const std::string& what,
                                    int device) {
  AliasBuilder b(c10::kCPU);
  HostView out(b, output, /*read=*/false);
  const int n = getSize();
  const int64_t count = out.flat().numel();
  at::Tensor in;
  if (inputs.size() == 1) {
    HostView v(b, inputs[0], /*read=*/true);
    in = v.flat();
    if (redop == RedOp::PREMUL_SUM) in = in.mul(factor);
  } else {
    in = at::empty({n * count}, out.flat().options());
    for (int r = 0; r < n; ++r) in.narrow(0, r * count, count).copy_(b.alias(inputs[r]).reshape({-1}));
    if (redop == RedOp::PREMUL_SUM) in.mul_(factor);
  }
  if (multi_host()) {
    hier_reduce_scatter(in.reshape({-1}), out.flat().reshape({-1}), redop == RedOp::PREMUL_SUM ? RedOp::SUM : redop,
                        what, device);
    out.commit();
    return;
  }
  const Arrival a = engine_->arrive(seq, d, what);
  record(a, OpKind::kReduceScatter, static_cast<double>(in.numel() * in.element_size()), seq, device);
  engine_->reduce_scatter(a, in.data_ptr(), out.data(), count, in.scalar_type(),
                          redop == RedOp::PREMUL_SUM ? RedOp::SUM : redop, what);
  out.commit();
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  check_usable("reduce_scatter");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  at::Tensor& out = single(outputs, "reduce_scatter");
  check_tensor(out, "reduce_scatter", "output");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "tpu_dist reduce_scatter: expects one list of ", getSize(), " input tensors");
  for (const auto& i : inputs[0]) {
    check_tensor(i, "reduce_scatter", "input");
    check_same(i, out, "reduce_scatter", "an input", "the output");
    TORCH_CHECK(i.numel() == out.numel(), "tpu_dist reduce_scatter: input ", describe_tensor(i),
                " does not match output ", describe_tensor(out));
  }
  const int redop = opts.reduceOp.op_;
  check_redop(redop, out.scalar_type(), "reduce_scatter");
  const double factor = premul_factor(opts.reduceOp);
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kReduceScatter, out, redop, out.numel(), -1);
  const std::string what = what_of("reduce_scatter", seq, out);
  const int device = tpu_index(out);
  std::vector<at::Tensor> all = inputs[0];
  all.push_back(out);
  return launch(*collectives_, OpType::REDUCE_SCATTER, "tpu_dist:reduce_scatter", tpu_indices(all), {out}, seq,
                [this, ri = recipes(inputs[0]), ro = TensorRecipe::of(out), redop, factor, d, what,
                 device](uint64_t seq) { run_reduce_scatter(seq, ri, ro, redop, factor, d, what, device); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_usable("reduce_scatter_tensor");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  check_tensor(input, "reduce_scatter_tensor", "input");
  check_tensor(output, "reduce_scatter_tensor", "output");
  check_same(output, input, "reduce_scatter_tensor", "the output", "the input");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "tpu_dist reduce_scatter_tensor: the input (",
              describe_tensor(input), ") must hold ", getSize(), " x the output's ", output.numel(),
              " elements (output ", describe_tensor(output), ")");
  const int redop = opts.reduceOp.op_;
  check_redop(redop, output.scalar_type(), "reduce_scatter_tensor");
  const double factor = premul_factor(opts.reduceOp);
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kReduceScatter, output, redop, output.numel(), -1);
  const std::string what = what_of("reduce_scatter_tensor", seq, input);
  const int device = tpu_index(output);
  return launch(*collectives_, OpType::_REDUCE_SCATTER_BASE, "tpu_dist:reduce_scatter_tensor",
                tpu_indices({output, input}), {output}, seq,
                [this, ri = TensorRecipe::of(input), ro = TensorRecipe::of(output), redop, factor, d, what,
                 device](uint64_t seq) { run_reduce_scatter(seq, {ri}, ro, redop, factor, d, what, device); });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  check_usable("reduce_scatter_tensor_coalesced");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  const int redop = opts.reduceOp.op_;
  std::vector<Descriptor> ds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "reduce_scatter_tensor_coalesced", "input");
    check_tensor(outputs[i], "reduce_scatter_tensor_coalesced", "output");
    check_same(outputs[i], inputs[i], "reduce_scatter_tensor_coalesced", "an output", "its input");
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(), "tpu_dist reduce_scatter_tensor_coalesced: ",
                "input ", describe_tensor(inputs[i]), " must hold ", getSize(), " x output ",
                describe_tensor(outputs[i]));
    check_redop(redop, outputs[i].scalar_type(), "reduce_scatter_tensor_coalesced");
    ds.push_back(describe(OpKind::kReduceScatter, outputs[i], redop, outputs[i].numel(), -1));
  }
  const double factor = premul_factor(opts.reduceOp);
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  const uint64_t first = seq_.fetch_add(inputs.size()) + 1;
  const int device = inputs.empty() ? -1 : tpu_index(inputs[0]);
  return launch(*collectives_, OpType::REDUCE_SCATTER_TENSOR_COALESCED, "tpu_dist:reduce_scatter_tensor_coalesced",
                tpu_indices(all), outputs, first,
                [this, ins = recipes(inputs), outs = recipes(outputs), ds, redop, factor, device](uint64_t first) {
                  for (size_t i = 0; i < ins.size(); ++i) {
                    const std::string what =
                        "reduce_scatter_tensor_coalesced (collective #" + std::to_string(first + i) + ")";
                    run_reduce_scatter(first + i, {ins[i]}, outs[i], redop, factor, ds[i], what, device);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const c10d::AllToAllOptions& opts) {
  check_usable("all_to_all_single");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  check_tensor(input, "all_to_all_single", "input");
  check_tensor(output, "all_to_all_single", "output");
  check_same(output, input, "all_to_all_single", "the output", "the input");
  const int n = getSize();
  const int64_t es = input.element_size();
  auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& given, const char* role) {
    std::vector<int64_t> rows(n);
    if (given.empty()) {
      const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
      TORCH_CHECK(dim0 % n == 0, "tpu_dist all_to_all_single: the ", role, " (", describe_tensor(t),
                  ") must split evenly along dim 0 into ", n, " parts when no split sizes are given");
      std::fill(rows.begin(), rows.end(), dim0 / n);
    } else {
      TORCH_CHECK(static_cast<int>(given.size()) == n, "tpu_dist all_to_all_single: ", role, " split sizes need ",
                  n, " entries, got ", given.size());
      int64_t sum = 0;
      for (auto s : given) {
        TORCH_CHECK(s >= 0, "tpu_dist all_to_all_single: negative ", role, " split size ", s);
        sum += s;
      }
      TORCH_CHECK(t.dim() > 0 && sum == t.size(0), "tpu_dist all_to_all_single: ", role, " split sizes sum to ",
                  sum, " but the ", role, " (", describe_tensor(t), ") has ", t.dim() > 0 ? t.size(0) : 0,
                  " rows");
      rows = given;
    }
    const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_bytes = dim0 == 0 ? 0 : t.numel() / dim0 * es;
    std::vector<int64_t> bytes(n);
    for (int q = 0; q < n; ++q) bytes[q] = rows[q] * row_bytes;
    return bytes;
  };
  const std::vector<int64_t> send = splits(input, input_split_sizes, "input");
  const std::vector<int64_t> recv = splits(output, output_split_sizes, "output");
  std::vector<int64_t> counts(2 * n), send_off(n), recv_off(n);
  int64_t so = 0, ro = 0;
  for (int q = 0; q < n; ++q) {
    counts[q] = send[q];
    counts[n + q] = recv[q];
    send_off[q] = so;
    recv_off[q] = ro;
    so += send[q];
    ro += recv[q];
  }
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kAllToAll, input, 0, input.numel(), -1);
  const std::string what = what_of("all_to_all_single", seq, input);
  const int device = tpu_index(input);
  return launch(*collectives_, OpType::ALLTOALL_BASE, "tpu_dist:all_to_all_single", tpu_indices({output, input}),
                {output}, seq,
                [this, ri = TensorRecipe::of(input), ro_ = TensorRecipe::of(output), counts, send_off, recv_off, d,
                 what, device, so](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  HostView in(b, ri, /*read=*/true);
                  HostView out(b, ro_, /*read=*/false);
                  if (multi_host()) {
                    const int n = getSize();
                    std::vector<int64_t> send(counts.begin(), counts.begin() + n), recv(counts.begin() + n, counts.end());
                    at::Tensor o8 = out.flat().reshape({-1}).view(at::kByte);
                    at::Tensor i8 = in.flat().reshape({-1}).view(at::kByte);
                    dcn_wait(config_.flat->alltoall_base(o8, i8, recv, send, c10d::AllToAllOptions()), what);
                    out.commit();
                    record_dcn(device, static_cast<double>(so), 0, 0, static_cast<double>(so));
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, d, what, counts.data());
                  record(a, OpKind::kAllToAll, static_cast<double>(so), seq, device);
                  engine_->all_to_all(a, seq, in.data(), send_off, out.data(), recv_off, what);
                  out.commit();
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  check_usable("all_to_all");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
              "tpu_dist all_to_all: expects ", n, " input and ", n, " output tensors, got ", inputs.size(), " and ",
              outputs.size());
  for (int q = 0; q < n; ++q) {
    check_tensor(inputs[q], "all_to_all", "input");
    check_tensor(outputs[q], "all_to_all", "output");
    check_same(inputs[q], inputs[0], "all_to_all", "an input", "the first input");
    check_same(outputs[q], inputs[0], "all_to_all", "an output", "the first input");
  }
  const int64_t es = inputs[0].element_size();
  std::vector<int64_t> counts(2 * n), send_off(n), recv_off(n);
  int64_t so = 0, ro = 0;
  for (int q = 0; q < n; ++q) {
    counts[q] = inputs[q].numel() * es;
    counts[n + q] = outputs[q].numel() * es;
    send_off[q] = so;
    recv_off[q] = ro;
    so += counts[q];
    ro += counts[n + q];
  }
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kAllToAll, inputs[0], 0, so / std::max<int64_t>(es, 1), -1);
  const std::string what = what_of("all_to_all", seq, inputs[0]);
  const int device = tpu_index(inputs[0]);
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  return launch(*collectives_, OpType::ALLTOALL, "tpu_dist:all_to_all", tpu_indices(all), outputs, seq,
                [this, ri = recipes(inputs), ro_ = recipes(outputs), counts, send_off, recv_off, d, what, device, so,
                 ro](uint64_t seq) {
                  AliasBuilder b(c10::kCPU);
                  const int n = getSize();
                  std::vector<at::Tensor> ins, outs;
                  for (const auto& r : ri) ins.push_back(b.alias(r));
                  for (const auto& r : ro_) outs.push_back(b.alias(r));
                  const auto opts = ins[0].options();
                  at::Tensor in = at::empty({so}, opts.dtype(at::kByte));
                  at::Tensor out = at::empty({ro}, opts.dtype(at::kByte));
                  for (int q = 0; q < n; ++q) {
                    if (counts[q] > 0) {
                      in.narrow(0, send_off[q], counts[q]).view(ins[q].scalar_type()).copy_(ins[q].reshape({-1}));
                    }
                  }
                  if (multi_host()) {
                    std::vector<int64_t> send(counts.begin(), counts.begin() + n), recv(counts.begin() + n, counts.end());
                    dcn_wait(config_.flat->alltoall_base(out, in, recv, send, c10d::AllToAllOptions()), what);
                    record_dcn(device, static_cast<double>(so), 0, 0, static_cast<double>(so));
                  } else {
                    const Arrival a = engine_->arrive(seq, d, what, counts.data());
                    record(a, OpKind::kAllToAll, static_cast<double>(so), seq, device);
                    engine_->all_to_all(a, seq, in.data_ptr(), send_off, out.data_ptr(), recv_off, what);
                  }
                  for (int q = 0; q < n; ++q) {
                    if (counts[n + q] > 0) {
                      outs[q].copy_(out.narrow(0, recv_off[q], counts[n + q])
                                        .view(outs[q].scalar_type())
                                        .view(outs[q].sizes()));
                    }
                  }
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::barrier(const c10d::BarrierOptions& opts) {
  check_usable("barrier");
  std::lock_guard<std::mutex> issue(issue_mu_);  // sequence numbers in submission order
  const uint64_t seq = ++seq_;
  const Descriptor d = describe(OpKind::kBarrier, at::Tensor(), 0, 0, -1);
  const std::string what = "barrier (collective #" + std::to_string(seq) + ")";
  // Like a device barrier: wait for the work queued on this rank's current chip first.
  std::vector<int> devices;
  if (opts.device.has_value() && opts.device->type() == kTPU) {
    devices.push_back(opts.device->has_index() ? opts.device->index() : current_device());
  } else if (device_count() > 0) {
    devices.push_back(current_device());
  }
  Descriptor bd = d;
  const int device = devices.empty() ? -1 : devices.front();
  if (device >= 0) {
    bd.chip = chip(static_cast<c10::DeviceIndex>(device)).global_id();
    bd.host = runtime().topology().host_of(bd.chip);
  }
  return launch(*collectives_, OpType::BARRIER, "tpu_dist:barrier", devices, {}, seq,
                [this, bd, what, device](uint64_t seq) {
                  if (multi_host()) {
                    hier_barrier(what, device);
                    return;
                  }
                  const Arrival a = engine_->arrive(seq, bd, what);
                  record(a, OpKind::kBarrier, 0, seq, device);
                });
}

// ---------------------------------------------------------------- point to point

c10::intrusive_ptr<c10d::Work> TpuBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_usable("send");
  at::Tensor& t = single(tensors, "send");
  check_tensor(t, "send", "tensor");
  TORCH_CHECK(dst >= 0 && dst < getSize() && dst != getRank(), "tpu_dist send: destination rank ", dst,
              " is invalid for rank ", getRank(), " of a group of ", getSize());
  const std::string what = "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ", " +
                           describe_tensor(t) + ")";
  const int device = tpu_index(t);
  const int32_t dtype = static_cast<int32_t>(t.scalar_type());
  return launch(peer_executor(senders_, dst, "send"), OpType::SEND, "tpu_dist:send", tpu_indices({t}), {t}, 0,
                [this, r = TensorRecipe::of(t), dst, tag, what, device, dtype](uint64_t) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/true);
                  if (device >= 0) {
                    vtpu::CollectiveCost c;
                    c.payload_bytes = static_cast<double>(v.nbytes());
                    c.ici_bytes = c.payload_bytes;
                    c.ici_steps = 1;
                    chip(static_cast<c10::DeviceIndex>(device)).record_collective(c);
                  }
                  if (multi_host() && hier_->host_of_rank[dst] != hier_->host_of_rank[getRank()]) {
                    std::vector<at::Tensor> ts{v.flat()};
                    dcn_wait(config_.flat->send(ts, dst, tag), what);
                    return;
                  }
                  p2p_send(*group_, multi_host() ? hier_->local_index_of[dst] : dst, tag, dtype, v.data(), v.nbytes(),
                           what);
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_usable("recv");
  at::Tensor& t = single(tensors, "recv");
  check_tensor(t, "recv", "tensor");
  TORCH_CHECK(src >= 0 && src < getSize() && src != getRank(), "tpu_dist recv: source rank ", src,
              " is invalid for rank ", getRank(), " of a group of ", getSize());
  const std::string what = "recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ", " +
                           describe_tensor(t) + ")";
  const int32_t dtype = static_cast<int32_t>(t.scalar_type());
  return launch(peer_executor(receivers_, src, "recv"), OpType::RECV, "tpu_dist:recv", tpu_indices({t}), {t}, 0,
                [this, r = TensorRecipe::of(t), src, tag, what, dtype](uint64_t) {
                  AliasBuilder b(c10::kCPU);
                  HostView v(b, r, /*read=*/false);
                  if (multi_host() && hier_->host_of_rank[src] != hier_->host_of_rank[getRank()]) {
                    std::vector<at::Tensor> ts{v.flat()};
                    dcn_wait(config_.flat->recv(ts, src, tag), what);
                    v.commit();
                    return;
                  }
                  p2p_recv(*group_, multi_host() ? hier_->local_index_of[src] : src, tag, dtype, v.data(), v.nbytes(),
                           what);
                  v.commit();
                });
}

c10::intrusive_ptr<c10d::Work> TpuBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu_dist: recv from any source is not supported; pass src=");
}

}  // namespace torch_tpu::dist
