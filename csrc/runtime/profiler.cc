// The tpu device in torch.profiler: a Kineto activity profiler registered
// through PyTorch's PrivateUse1 profiler registry, fed by the chip's trace
// hooks (vtpu/trace.h). See profiler.h.
//
// Trace layout: one process per chip, named "tpu:N (estimated <gen> time)",
// with tracks for ops, record_function ranges, collectives and an HBM counter.
// Device timestamps are estimated: an op starts when it is issued or when the
// chip's previous op ends, whichever is later, and lasts the cost model's
// time for the chosen generation. Measured vTPU (host) run times go in args.
#define USE_KINETO 1
#include "runtime/profiler.h"

#include <c10/util/Exception.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

#include "runtime/device.h"
#include "vtpu/counters.h"
#include "vtpu/spec.h"
#include "vtpu/trace.h"

namespace torch_tpu::profiler {
namespace {

using Clock = std::chrono::system_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// One priced op (or collective) as recorded on the host.
struct DeviceOp {
  int chip = 0;
  int64_t stream = -1;       // vtpu stream id, -1 when it ran synchronously
  std::string label;         // stream label ("aten::mm"); empty: the host op's name
  uint64_t corr = 0;         // Kineto correlation id of the issuing host op (0: none)
  int32_t range = -1;        // innermost record_function range, index into ranges
  int64_t issued_ns = 0;     // system clock, when priced
  int64_t run_start_ns = 0;  // measured on the stream worker; 0 when not queued or not run yet
  int64_t run_end_ns = 0;
  bool collective = false;
  vtpu::OpCost cost;
  vtpu::CollectiveCost coll;
};

struct Range {
  uint64_t user_corr;  // Kineto correlation id of the record_function
  int32_t parent;
};

struct HbmSample {
  int chip;
  int64_t ns;
  uint64_t bytes;
  bool initial;  // taken when the session started
};

// Thread-local state of the hooks; `session` tells stale values apart.
struct ThreadState {
  uint64_t session = 0;
  std::vector<uint64_t> corr;   // Kineto correlation ids of the host ops entered
  std::vector<int32_t> ranges;  // record_function ranges entered
  int pending_chip = -1;        // the last op priced here, not yet matched to a queued item
  size_t pending_op = 0;
};
thread_local ThreadState tls;

class Recorder {
 public:
  static Recorder& get() {
    static Recorder* r = new Recorder();  // never destroyed: hooks may fire during exit
    return *r;
  }

  void start() {
    std::vector<HbmSample> initial;
    try {
      const int64_t t = now_ns();
      for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
        initial.push_back(HbmSample{i, t, chip(i).hbm().stats().allocated_bytes, true});
      }
    } catch (const std::exception&) {
      // A bad topology environment: torch_tpu's own calls raise it.
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++session_;
      ops_.clear();
      ranges_.clear();
      hbm_ = std::move(initial);
      outstanding_ = 0;
      accepting_ = true;
      // Stream workers time with steady_clock; the trace uses the system clock.
      steady_to_system_ns_ = now_ns() - std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now().time_since_epoch())
                                            .count();
    }
    vtpu::trace::install(&kHooks);
  }

  // Stops taking new work, waits (briefly) for queued traced work to report
  // its measured time, then uninstalls the hooks.
  void stop() {
    std::unique_lock<std::mutex> lock(mu_);
    accepting_ = false;
    // Bounded: queued work may wait on something the caller holds (the GIL).
    cv_.wait_for(lock, std::chrono::seconds(1), [this] { return outstanding_ == 0; });
    lock.unlock();
    vtpu::trace::install(nullptr);
  }

  // Correlation ids, forwarded by Kineto on the thread that runs the host op.
  void push_corr(uint64_t id) {
    sync_thread();
    tls.corr.push_back(id);
  }
  void pop_corr() {
    if (tls.session == session_ && !tls.corr.empty()) tls.corr.pop_back();
  }
  void push_range(uint64_t user_corr) {
    sync_thread();
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t parent = tls.ranges.empty() ? -1 : tls.ranges.back();
    ranges_.push_back(Range{user_corr, parent});
    tls.ranges.push_back(static_cast<int32_t>(ranges_.size() - 1));
  }
  void pop_range() {
    if (tls.session == session_ && !tls.ranges.empty()) tls.ranges.pop_back();
  }

  struct Snapshot {
    std::vector<DeviceOp> ops;
    std::vector<Range> ranges;
    std::vector<HbmSample> hbm;
  };
  Snapshot snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return Snapshot{ops_, ranges_, hbm_};
  }

  RecorderStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    RecorderStats s;
    s.recording = vtpu::trace::hooks() != nullptr;
    for (const auto& op : ops_) (op.collective ? s.collectives : s.ops) += 1;
    s.hbm_samples = hbm_.size();
    s.ranges = ranges_.size();
    s.session = session_;
    return s;
  }

 private:
  Recorder() = default;

  void sync_thread() {
    if (tls.session != session_) {
      tls = ThreadState{};
      tls.session = session_;
    }
  }

  DeviceOp new_op(int chip) {
    sync_thread();
    DeviceOp op;
    op.chip = chip;
    op.corr = tls.corr.empty() ? 0 : tls.corr.back();
    op.range = tls.ranges.empty() ? -1 : tls.ranges.back();
    op.issued_ns = now_ns();
    return op;
  }

  static void on_cost(int chip, const vtpu::OpCost& cost) {
    Recorder& r = get();
    DeviceOp op = r.new_op(chip);
    op.cost = cost;
    std::lock_guard<std::mutex> lock(r.mu_);
    if (!r.accepting_) return;
    r.ops_.push_back(std::move(op));
    tls.pending_chip = chip;
    tls.pending_op = r.ops_.size() - 1;
  }

  static void on_collective(int chip, const vtpu::CollectiveCost& cost, const char* name) {
    Recorder& r = get();
    DeviceOp op = r.new_op(chip);
    op.collective = true;
    op.coll = cost;
    if (name) op.label = name;
    std::lock_guard<std::mutex> lock(r.mu_);
    if (r.accepting_) r.ops_.push_back(std::move(op));
  }

  // The item queued right after an op was priced on this thread runs that op.
  // Event markers are never priced: they must not take a synchronously run op's place.
  static uint64_t on_enqueue(int chip, int64_t stream, const char* name) {
    Recorder& r = get();
    if (tls.session != r.session_ || tls.pending_chip != chip) return 0;
    if (std::strcmp(name, "event_record") == 0 || std::strcmp(name, "event_wait") == 0) return 0;
    tls.pending_chip = -1;
    std::lock_guard<std::mutex> lock(r.mu_);
    if (!r.accepting_ || tls.pending_op >= r.ops_.size()) return 0;
    DeviceOp& op = r.ops_[tls.pending_op];
    op.stream = stream;
    op.label = name;
    ++r.outstanding_;
    return (r.session_.load() << 32) | (tls.pending_op + 1);
  }

  static void on_ran(uint64_t token, std::chrono::steady_clock::time_point start,
                     std::chrono::steady_clock::time_point end) {
    Recorder& r = get();
    auto ns = [&r](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count() +
             r.steady_to_system_ns_;
    };
    std::lock_guard<std::mutex> lock(r.mu_);
    const size_t index = static_cast<size_t>(token & 0xffffffffu) - 1;
    if ((token >> 32) != r.session_ || index >= r.ops_.size()) return;
    r.ops_[index].run_start_ns = ns(start);
    r.ops_[index].run_end_ns = ns(end);
    if (r.outstanding_ > 0 && --r.outstanding_ == 0) r.cv_.notify_all();
  }

  static void on_hbm(int chip, uint64_t bytes) {
    Recorder& r = get();
    const int64_t t = now_ns();
    std::lock_guard<std::mutex> lock(r.mu_);
    if (r.accepting_) r.hbm_.push_back(HbmSample{chip, t, bytes, false});
  }

  static const vtpu::trace::Hooks kHooks;

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> session_{0};  // changes only in start(), before the hooks are installed
  bool accepting_ = false;
  uint64_t outstanding_ = 0;
  int64_t steady_to_system_ns_ = 0;
  std::vector<DeviceOp> ops_;
  std::vector<Range> ranges_;
  std::vector<HbmSample> hbm_;
};

const vtpu::trace::Hooks Recorder::kHooks{&Recorder::on_cost, &Recorder::on_collective, &Recorder::on_enqueue,
                                          &Recorder::on_ran, &Recorder::on_hbm};

std::mutex g_generation_mu;
std::string g_generation;  // empty: the topology's

const vtpu::ChipSpec& chosen_spec() {
  std::string g;
  {
    std::lock_guard<std::mutex> lock(g_generation_mu);
    g = g_generation;
  }
  if (!g.empty()) return vtpu::spec_for(g);
  if (const char* env = std::getenv("TORCH_TPU_PROFILER_GENERATION"); env && *env) {
    try {
      return vtpu::spec_for(env);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("TORCH_TPU_PROFILER_GENERATION: ") + e.what());
    }
  }
  return runtime().topology().spec();
}

// Trace process id of chip N: above any Linux pid (pid_max <= 2^22), and
// clear of 0-15, which Kineto names after the host process.
constexpr int64_t kChipPidBase = int64_t{1} << 24;
// Track (Kineto resource) ids inside a chip's process.
constexpr int32_t kOpsTrack = 1;
constexpr int32_t kRangesTrack = 2;
constexpr int32_t kCollectivesTrack = 3;
constexpr int32_t kHbmTrack = 4;

std::string device_op_name(const DeviceOp& op, const libkineto::ITraceActivity* host) {
  std::string base = op.label;
  if (base.empty()) base = host ? host->name() : std::string("op");
  if (base.rfind("aten::", 0) == 0) base = base.substr(6);
  base = base.substr(0, base.find('.'));  // without the overload: "mm.out" runs for aten::mm
  // Not the host op's own name: key_averages() groups rows by name.
  return "tpu::" + base;
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(bool enabled) : enabled_(enabled) {}

  void start() override {
    if (enabled_) Recorder::get().start();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    if (enabled_) Recorder::get().stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(
        logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start_time,
                    int64_t end_time) override {
    if (!enabled_) return;
    try {
      build(logger, linked, start_time);
    } catch (const std::exception& e) {
      // Kineto has no way to raise from here: warn, so the user sees it.
      errors_.push_back(std::string("torch_tpu profiler: ") + e.what());
      TORCH_WARN("torch_tpu profiler: no tpu device tracks in this trace: ", e.what());
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override {
    if (enabled_) Recorder::get().push_corr(id);
  }
  void popCorrelationId() override {
    if (enabled_) Recorder::get().pop_corr();
  }
  void pushUserCorrelationId(uint64_t id) override {
    if (enabled_) Recorder::get().push_range(id);
  }
  void popUserCorrelationId() override {
    if (enabled_) Recorder::get().pop_range();
  }

 private:
  libkineto::GenericTraceActivity& add(libkineto::ActivityType type, const std::string& name, int chip, int32_t track,
                                       int64_t start, int64_t end) {
    buffer_->emplace_activity(buffer_->span, type, name);
    auto& a = libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
    a.device = static_cast<int32_t>(kChipPidBase + chip);
    a.resource = track;
    a.startTime = start;
    a.endTime = end;
    return a;
  }

  void build(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback& linked,
             int64_t start_time) {
    Recorder::Snapshot snap = Recorder::get().snapshot();
    const vtpu::ChipSpec& spec = chosen_spec();
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_time, start_time, "tpu");
    buffer_->gpuOpCount = -1;

    std::set<int> chips;
    std::map<int, int64_t> op_cursor, coll_cursor;  // estimated end of each chip's last op
    // (range, chip) -> (start of the first device op issued inside it, sum of their estimated
    // durations). The range lasts that sum: the device time of what ran inside it, not the host
    // time between its first and last op (ops start when issued, so gaps are host time).
    std::map<std::pair<int32_t, int>, std::pair<int64_t, int64_t>> spans;
    // Per chip, device ops by issue time: (issued, begin, duration), for ranges whose host interval
    // is known (ops issued by autograd's device threads inside it count too).
    std::map<int, std::vector<std::array<int64_t, 3>>> issued;
    int64_t last_ts = start_time;
    for (const DeviceOp& op : snap.ops) {
      chips.insert(op.chip);
      const libkineto::ITraceActivity* host = op.corr ? linked(static_cast<int32_t>(op.corr)) : nullptr;
      const double seconds =
          op.collective ? vtpu::collective_seconds(spec, op.coll) : vtpu::estimate(spec, op.cost).total_seconds;
      const int64_t dur = std::llround(seconds * 1e9);
      int64_t& cursor = (op.collective ? coll_cursor : op_cursor)[op.chip];
      const int64_t begin = std::max(op.issued_ns, cursor);
      cursor = begin + dur;
      last_ts = std::max(last_ts, cursor);
      std::string name = op.collective ? "tpu_dist::" + (!op.label.empty() ? op.label
                                                         : host            ? host->name()
                                                                           : std::string("collective"))
                                       : device_op_name(op, host);
      auto& a = add(libkineto::ActivityType::CONCURRENT_KERNEL, name, op.chip,
                    op.collective ? kCollectivesTrack : kOpsTrack, begin, begin + dur);
      a.id = static_cast<int32_t>(op.corr);
      a.linked = host;
      if (op.corr) {
        a.flow.id = static_cast<uint32_t>(op.corr);
        a.flow.type = libkineto::kLinkAsyncCpuGpu;
        a.flow.start = false;
      }
      a.addMetadataQuoted("device", "tpu:" + std::to_string(op.chip));
      a.addMetadataQuoted("estimated for", spec.generation);
      a.addMetadata("estimated us", seconds * 1e6);
      if (op.collective) {
        a.addMetadata("payload bytes", op.coll.payload_bytes);
        a.addMetadata("ICI bytes", op.coll.ici_bytes);
        a.addMetadata("DCN bytes", op.coll.dcn_bytes);
      } else {
        a.addMetadata("flops", op.cost.flops);
        a.addMetadata("HBM bytes", op.cost.bytes_read + op.cost.bytes_written);
        if (op.stream >= 0) a.addMetadata("stream", op.stream);
      }
      if (op.run_end_ns > 0) {  // measured: the vTPU running the op on host cores
        a.addMetadata("vTPU queued us", (op.run_start_ns - op.issued_ns) / 1e3);
        a.addMetadata("vTPU measured us", (op.run_end_ns - op.run_start_ns) / 1e3);
      }
      issued[op.chip].push_back({op.issued_ns, begin, dur});
      for (int32_t r = op.range; r >= 0 && r < static_cast<int32_t>(snap.ranges.size()); r = snap.ranges[r].parent) {
        auto it = spans.find({r, op.chip});
        if (it == spans.end()) {
          spans.emplace(std::make_pair(r, op.chip), std::make_pair(begin, dur));
        } else {
          it->second.first = std::min(it->second.first, begin);
          it->second.second += dur;
        }
      }
    }
    // Ranges with a host interval: the device ops issued on each chip during it, from any thread.
    std::map<int, std::vector<int64_t>> prefix;  // chip -> prefix sums of durations by issue time
    for (auto& [chip, v] : issued) {
      std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
      auto& p = prefix[chip];
      p.assign(1, 0);
      for (const auto& e : v) p.push_back(p.back() + e[2]);
    }
    for (int32_t r = 0; r < static_cast<int32_t>(snap.ranges.size()); ++r) {
      const libkineto::ITraceActivity* host = linked(static_cast<int32_t>(snap.ranges[r].user_corr));
      if (host == nullptr || host->duration() <= 0) continue;
      const int64_t lo = host->timestamp(), hi = host->timestamp() + host->duration();
      for (const auto& [chip, v] : issued) {
        auto cmp = [](const std::array<int64_t, 3>& e, int64_t t) { return e[0] < t; };
        const size_t a = std::lower_bound(v.begin(), v.end(), lo, cmp) - v.begin();
        const size_t b = std::lower_bound(v.begin(), v.end(), hi, cmp) - v.begin();
        const auto key = std::make_pair(r, chip);
        if (a >= b) continue;
        const int64_t total = prefix[chip][b] - prefix[chip][a];
        auto it = spans.find(key);
        const int64_t start = it == spans.end() ? v[a][1] : std::min(it->second.first, v[a][1]);
        spans[key] = std::make_pair(start, total);
      }
    }
    for (const auto& [key, span] : spans) {
      const auto& range = snap.ranges[key.first];
      const libkineto::ITraceActivity* host = linked(static_cast<int32_t>(range.user_corr));
      auto& a = add(libkineto::ActivityType::GPU_USER_ANNOTATION, host ? host->name() : std::string("range"),
                    key.second, kRangesTrack, span.first, span.first + span.second);
      a.id = static_cast<int32_t>(range.user_corr);
      a.linked = host;
    }
    // A chip gets a process when it ran ops or allocated/freed during the session.
    for (const HbmSample& s : snap.hbm) {
      if (!s.initial) chips.insert(s.chip);
    }
    for (const HbmSample& s : snap.hbm) {
      if (!chips.count(s.chip)) continue;
      auto& a = add(libkineto::ActivityType::MTIA_COUNTERS, "HBM allocated", s.chip, kHbmTrack, s.ns, s.ns);
      a.addCounterValue("bytes", static_cast<double>(s.bytes));
    }
    for (int chip : chips) {
      const std::string label = "tpu:" + std::to_string(chip) + " (estimated " + spec.generation + " time)";
      const int64_t pid = kChipPidBase + chip;
      logger.handleDeviceInfo(libkineto::DeviceInfo{pid, pid, label, "TPU " + spec.generation + " (estimated)"},
                              start_time);
      logger.handleResourceInfo(
          libkineto::ResourceInfo{kOpsTrack, kOpsTrack, pid, "ops (estimated " + spec.generation + " time)"},
          start_time);
      logger.handleResourceInfo(libkineto::ResourceInfo{kRangesTrack, kRangesTrack, pid, "record_function ranges"},
                                start_time);
      logger.handleResourceInfo(
          libkineto::ResourceInfo{kCollectivesTrack, kCollectivesTrack, pid, "collectives (estimated ICI/DCN time)"},
          start_time);
      logger.handleResourceInfo(libkineto::ResourceInfo{kHbmTrack, kHbmTrack, pid, "HBM allocated (bytes)"},
                                start_time);
    }
    for (const auto& a : buffer_->activities) a->log(logger);
    buffer_->span.endTime = last_ts;
  }

  bool enabled_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return types_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types, const libkineto::Config&) override {
    // Only profilers asking for device activity (ProfilerActivity.PrivateUse1) record.
    return std::make_unique<Session>(activity_types.count(libkineto::ActivityType::CONCURRENT_KERNEL) > 0);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"torch_tpu"};
  std::set<libkineto::ActivityType> types_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                           libkineto::ActivityType::GPU_USER_ANNOTATION};
};

}  // namespace

void set_generation(const std::string& generation) {
  if (!generation.empty()) vtpu::spec_for(generation);  // throws, listing the valid names
  std::lock_guard<std::mutex> lock(g_generation_mu);
  g_generation = generation;
}

std::string generation() { return chosen_spec().generation; }

std::string generation_setting() {
  std::lock_guard<std::mutex> lock(g_generation_mu);
  return g_generation;
}

RecorderStats recorder_stats() { return Recorder::get().stats(); }

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

}  // namespace torch_tpu::profiler
