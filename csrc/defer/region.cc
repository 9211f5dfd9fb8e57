// defer_and_fuse: the per-chip pending region, its flush, the flush hooks and
// the counters (see defer.h).
//
// A region is an ir::Graph being built plus what ties its values to tensors:
// per storage it touches, whether the region only reads it (a parameter per
// distinct layout), produces it (a lazily allocated result: a StorageImpl
// with a null DataPtr that the flush fills in) or writes it in place (the
// value is computed into a temporary and copied back after the kernels ran,
// since the executor's outputs must not overlap its inputs). At the flush,
// results whose storage only the region still holds are dead: they are
// dropped from the outputs and never get HBM.
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sys/mman.h>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "aten/meta_cache.h"
#include "aten/op_info.h"
#include "aten/portability.h"
#include "defer/defer.h"
#include "defer/lower.h"
#include "defer/region_launch.h"
#include "exec/compile_cache.h"
#include "exec/executor.h"
#include "ir/hash.h"
#include "ir/passes.h"
#include "ir/printer.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/eager_mode.h"
#include "runtime/host_alias.h"
#include "vtpu/cost_model.h"
#include "vtpu/env.h"
#include "vtpu/layout.h"

namespace torch_tpu {
namespace defer {
namespace {

// ------------------------------------------------------------------ state

std::atomic<int> g_open_regions{0};    // chips with a pending region
std::atomic<int64_t> g_pending_ops{0};
std::atomic<int> g_rng_regions{0};     // pending regions that draw random numbers
thread_local int tls_checked = 0;      // DeferChecked scopes alive on this thread
thread_local int tls_in_flush = 0;

std::mutex g_stats_mu;
DeferStats g_stats;

template <typename F>
void update_stats(F&& f) {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  f(g_stats);
}

enum class Reason { kConflict, kSync, kStream, kSizeCap, kView, kRepeat, kOther };

// TORCH_TPU_DEFER_MAX_OPS: ATen ops per region before it is flushed (256).
int64_t max_ops() {
  static const int64_t n = vtpu::env_positive_int("TORCH_TPU_DEFER_MAX_OPS", 256);
  return n;
}

const std::string& dump_dir() {
  static const std::string dir = [] {
    const char* v = std::getenv("TORCH_TPU_DUMP_IR");
    return std::string(v ? v : "");
  }();
  return dir;
}

struct Layout {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  static Layout of(const at::Tensor& t) {
    return Layout{t.sizes().vec(), t.strides().vec(), t.storage_offset(), t.scalar_type()};
  }
  bool operator==(const Layout& o) const {
    return dtype == o.dtype && offset == o.offset && sizes == o.sizes && strides == o.strides;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  uint64_t physical() const { return vtpu::physical_bytes(sizes, c10::elementSize(dtype)); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * c10::elementSize(dtype); }
};

struct OpRecord {
  const std::string* label;  // OpInfo's, alive for the process
  std::string source;        // "file.py:12" or ""
};

struct Entry {
  enum class Kind { kRead, kPending, kWritten } kind = Kind::kRead;
  c10::Storage storage;
  Layout layout;          // kPending: the result's; kWritten: the written tensor's
  ValueId value = -1;     // kPending / kWritten: the current value
  int32_t op = -1;        // the recorded op that produced `value`
  std::vector<std::pair<Layout, ValueId>> reads;  // parameters over this storage
};

// Parameter k of a region: a tensor it reads, or a user scalar that changes
// between steps (see ScalarSink).
// A Bernoulli mask a region draws from a tpu generator when it runs.
struct RngDraw {
  at::Generator gen;
  double p = 0.5;
  ir::Shape shape;
  bool draw = true;  // false: zeros (the op that asked for it ran strictly)
};

struct Param {
  TensorRecipe recipe;
  bool scalar = false;
  ir::Scalar value;
  std::optional<RngDraw> rng;  // a mask drawn at run time, in recording order
};

// A region of one recorded op runs ATen's kernel for it: fusion gains
// nothing there, and ATen's kernel for a lone softmax or gelu is faster than
// the executor's. `op` is the op's out= overload, called with the result.
struct Replay {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
};

std::atomic<bool> g_single_op_aten{vtpu::env_flag("TORCH_TPU_DEFER_SINGLE_OP_ATEN", true)};

struct Region {
  explicit Region(c10::Stream s) : stream(s), device(s.device_index()) {}
  c10::Stream stream;
  c10::DeviceIndex device;
  ir::Builder builder;
  std::unordered_map<const c10::StorageImpl*, Entry> storages;
  std::vector<const c10::StorageImpl*> outputs;  // produced or written storages, in order
  std::vector<Param> params;                     // parameter k is params[k]
  std::vector<int32_t> value_op;                 // per value: index in ops, or -1
  std::vector<OpRecord> ops;
  std::optional<Replay> replay;                  // while ops holds one op
  int rng_params = 0;                            // masks drawn when it runs (g_rng_regions)
};

// Detects a repeating op sequence (a training loop) so that regions end at
// the same place in every iteration: a size-cap flush falls wherever the cap
// is reached, at another offset into the loop body each time, which makes
// every region new to the compile cache. The fingerprint of the last kWindow
// recorded ops (label, shapes, dtypes) is remembered at each size-cap flush;
// when the same fingerprint comes back, the region is flushed there again.
struct RepeatDetector {
  static constexpr int kWindow = 32;
  static constexpr uint64_t kBase = 0x100000001b3ULL;
  uint64_t keys[kWindow] = {};
  uint64_t hash = 0, base_pow = 1;  // base_pow = kBase^kWindow once the window is full
  int64_t count = 0;
  std::unordered_set<uint64_t> cut_points;

  // Adds op key k; returns the fingerprint of the window (0 until it is full).
  uint64_t push(uint64_t k) {
    const int slot = static_cast<int>(count % kWindow);
    const uint64_t oldest = count >= kWindow ? keys[slot] : 0;
    hash = hash * kBase + k - oldest * base_pow;
    if (count < kWindow) base_pow *= kBase;
    keys[slot] = k;
    ++count;
    return count >= kWindow ? (hash | 1) : 0;
  }
  void remember(uint64_t fp) {
    if (!fp) return;
    if (cut_points.size() >= 4096) cut_points.clear();
    cut_points.insert(fp);
  }
  bool seen(uint64_t fp) const { return fp && cut_points.count(fp) != 0; }
};

// TORCH_TPU_DEFER_REPEAT=0 turns the repeating-sequence detector off.
bool repeat_detection() {
  static const bool on = vtpu::env_flag("TORCH_TPU_DEFER_REPEAT", true);
  return on;
}

struct ChipState {
  std::recursive_mutex mu;
  std::unique_ptr<Region> region;
  RepeatDetector repeat;
};

// One per chip, created on first use and never destroyed (pending regions
// hold storages whose deleters need the chip at exit).
ChipState* find_state(c10::DeviceIndex d) {
  static std::vector<ChipState*>* states = [] {
    auto* v = new std::vector<ChipState*>();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) v->push_back(new ChipState);
    return v;
  }();
  if (d < 0 || static_cast<size_t>(d) >= states->size()) return nullptr;
  return (*states)[d];
}

// ------------------------------------------------------------------ errors

// What a failing region says: the recorded op (and its source line) that an
// IR error points at.
struct ErrorContext {
  ir::Graph graph;               // as recorded
  std::vector<int32_t> value_op;
  std::vector<OpRecord> ops;

  static std::string op_text(const OpRecord& r) {
    return *r.label + (r.source.empty() ? std::string() : " at " + r.source);
  }

  // The recorded op an IR message ("[tanh] ...", "... (at %12)") points at.
  int32_t blame(const std::string& what) const {
    size_t pct = what.find('%');
    if (pct != std::string::npos) {
      long v = std::strtol(what.c_str() + pct + 1, nullptr, 10);
      if (v >= 0 && static_cast<size_t>(v) < value_op.size() && value_op[v] >= 0) return value_op[v];
    }
    if (!what.empty() && what[0] == '[') {
      std::string name = what.substr(1, what.find(']') - 1);
      for (int64_t v = 0; v < graph.num_ops(); ++v) {
        if (name == ir::op_name(graph.op(static_cast<ValueId>(v)).kind) &&
            static_cast<size_t>(v) < value_op.size() && value_op[v] >= 0) {
          return value_op[v];
        }
      }
    }
    return -1;
  }

  std::string describe(const std::string& what) const {
    std::ostringstream s;
    int32_t k = blame(what);
    if (k >= 0) {
      s << op_text(ops[k]) << " (defer_and_fuse, fused region of " << ops.size() << " ops): " << what;
    } else {
      s << "defer_and_fuse region of " << ops.size() << " ops (";
      for (size_t i = 0; i < ops.size() && i < 8; ++i) s << (i ? ", " : "") << op_text(ops[i]);
      if (ops.size() > 8) s << ", ...";
      s << "): " << what;
    }
    return s.str();
  }
};

// ------------------------------------------------------------------ flush

using Launch = RegionLaunch;

struct RunState {
  Launch launch;
  std::vector<Param> params;
  std::vector<uint64_t> scalars;  // memory of scalar parameters, one slot each
  std::vector<ir::TensorType> param_types;
  struct Out {
    c10::Storage storage;      // a produced result (written in place by the kernels)
    c10::DataPtr temp;         // or: a temporary copied into `target` afterwards
    TensorRecipe target;
    std::unique_ptr<char[]> scratch;  // or: a per-row statistic realized once (see row_statistics)
    ir::TensorType type;
  };
  std::vector<Out> outs;
  std::shared_ptr<const ErrorContext> ctx;
};

// Draws the region's masks in recording order, as strict mode's bernoulli_
// calls would at this point of the stream. Each param's mask goes to masks[k].
void draw_masks(const std::vector<Param>& params, std::vector<std::unique_ptr<uint8_t[]>>& masks) {
  masks.resize(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    if (!params[k].rng) continue;
    const int64_t n = ir::numel(params[k].rng->shape);
    masks[k].reset(new uint8_t[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    if (params[k].rng->draw) draw_bernoulli_mask(params[k].rng->gen, params[k].rng->p, masks[k].get(), n);
    else std::memset(masks[k].get(), 0, static_cast<size_t>(n));
  }
}

void run_region(RunState& s) {
  std::vector<exec::Buffer> in, out;
  in.reserve(s.params.size());
  std::vector<std::unique_ptr<uint8_t[]>> masks;
  draw_masks(s.params, masks);
  for (size_t k = 0; k < s.params.size(); ++k) {
    if (s.params[k].rng) {
      in.push_back(exec::Buffer::contiguous(masks[k].get(), s.param_types[k].dtype, s.param_types[k].shape));
      continue;
    }
    if (s.params[k].scalar) {
      in.push_back(exec::Buffer::contiguous(&s.scalars[k], s.param_types[k].dtype, {}));
      continue;
    }
    const TensorRecipe& p = s.params[k].recipe;
    char* base = static_cast<char*>(const_cast<void*>(p.storage.data()));
    void* ptr = base + p.storage_offset * static_cast<int64_t>(p.dtype.itemsize());
    in.push_back(exec::Buffer::strided(ptr, s.param_types[k].dtype, s.param_types[k].shape, p.strides));
  }
  for (auto& o : s.outs) {
    void* ptr = o.temp ? o.temp.get() : o.scratch ? o.scratch.get() : o.storage.mutable_data();
    out.push_back(exec::Buffer::contiguous(ptr, o.type.dtype, o.type.shape));
  }
  try {
    run_region_launch(s.launch, in, out);
  } catch (const std::exception& e) {
    throw std::runtime_error(s.ctx->describe(e.what()));
  }
  for (auto& o : s.outs) {
    if (!o.temp) continue;
    AliasBuilder host(c10::kCPU);
    at::Tensor dst = host.alias(o.target);
    at::Tensor src = at::from_blob(o.temp.get(), dst.sizes(), at::TensorOptions().dtype(o.target.dtype));
    dst.copy_(src);
  }
}

// The profiler's name for a region's device event: "defer_and_fuse
// region_<structural hash>", the hash TORCH_TPU_DUMP_IR's file names carry.
// Names live as long as the process (the stream keeps a const char*); past
// kMaxNames distinct structures (shapes changing every step) regions share
// one generic name.
const char* region_event_name(const ir::Graph& recorded) {
  constexpr size_t kMaxNames = 4096;
  static std::mutex mu;
  static std::unordered_map<uint64_t, std::unique_ptr<std::string>> names;
  const uint64_t h = ir::structural_hash(recorded);
  std::lock_guard<std::mutex> lock(mu);
  auto it = names.find(h);
  if (it != names.end()) return it->second->c_str();
  if (names.size() >= kMaxNames) return "defer_and_fuse region";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "defer_and_fuse region_%016llx", static_cast<unsigned long long>(h));
  return names.emplace(h, std::make_unique<std::string>(buf)).first->second->c_str();
}

void dump_region(const ir::Graph& recorded, const Launch& l, const ErrorContext& ctx) {
  const exec::CompiledRegion& c = *l.region;
  static std::mutex mu;
  static std::unordered_set<uint64_t> seen;
  static int counter = 0;
  const uint64_t h = ir::structural_hash(recorded);
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(h).second) return;
  std::error_code ec;
  std::filesystem::create_directories(dump_dir(), ec);
  char name[64];
  std::snprintf(name, sizeof(name), "region_%04d_%016llx", counter++, static_cast<unsigned long long>(h));
  std::ofstream f(std::filesystem::path(dump_dir()) / (std::string(name) + ".mlir"));
  f << "// defer_and_fuse region " << name << ": " << ctx.ops.size() << " recorded ATen ops, "
    << c.num_kernels() << " fused kernels";
  if (l.split()) f << ", run in " << l.chunks << " chunks of " << l.rows << " of " << l.n << " rows";
  f << "\n";
  for (const auto& r : ctx.ops) f << "//   " << ErrorContext::op_text(r) << "\n";
  std::istringstream plan(c.plan().to_string(c.graph()));
  for (std::string line; std::getline(plan, line);) f << "// plan: " << line << "\n";
  f << ir::to_stablehlo(l.split() ? ir::dead_code_elimination(recorded) : c.graph(), name);
}

void count_reason(DeferStats& s, Reason why) {
  switch (why) {
    case Reason::kConflict: ++s.flush_conflict; break;
    case Reason::kSync: ++s.flush_sync; break;
    case Reason::kStream: ++s.flush_stream; break;
    case Reason::kSizeCap: ++s.flush_size_cap; break;
    case Reason::kView: ++s.flush_view; break;
    case Reason::kRepeat: ++s.flush_repeat; break;
    case Reason::kOther: ++s.flush_other; break;
  }
}

// A scalar parameter's value in its element type's memory format.
void store_scalar(const ir::Scalar& v, ir::ElementType t, uint64_t* slot) {
  using ir::ElementType;
  switch (t) {
    case ElementType::f32: { float f = static_cast<float>(v.f); std::memcpy(slot, &f, 4); break; }
    case ElementType::f64: std::memcpy(slot, &v.f, 8); break;
    case ElementType::bf16: { uint16_t h = ir::f32_to_bf16(static_cast<float>(v.f)); std::memcpy(slot, &h, 2); break; }
    case ElementType::f16: { uint16_t h = ir::f32_to_f16(static_cast<float>(v.f)); std::memcpy(slot, &h, 2); break; }
    case ElementType::s64: std::memcpy(slot, &v.i, 8); break;
    case ElementType::s32: { int32_t x = static_cast<int32_t>(v.i); std::memcpy(slot, &x, 4); break; }
    case ElementType::s8: { int8_t x = static_cast<int8_t>(v.i); std::memcpy(slot, &x, 1); break; }
    case ElementType::u8:
    case ElementType::pred: { uint8_t x = static_cast<uint8_t>(v.i); std::memcpy(slot, &x, 1); break; }
  }
}

struct InFlush {
  InFlush() { ++tls_in_flush; }
  ~InFlush() { --tls_in_flush; }
};

// Compiles and queues the chip's region; results nobody holds are dropped.
// Caller holds cs.mu. On an allocation failure the region stays pending (the
// caller may free memory and retry) and torch.OutOfMemoryError names the op.
void flush_locked(ChipState& cs, Reason why) {
  if (!cs.region) return;
  InFlush in_flush;
  std::unique_ptr<Region> r = std::move(cs.region);
  const int64_t num_ops = static_cast<int64_t>(r->ops.size());
  g_open_regions.fetch_sub(1);
  if (r->rng_params) g_rng_regions.fetch_sub(1);
  g_pending_ops.fetch_sub(num_ops);

  std::vector<Entry*> outs;
  uint64_t avoided = 0, dead = 0, allocated = 0;
  for (const c10::StorageImpl* key : r->outputs) {
    Entry& e = r->storages.at(key);
    if (e.kind == Entry::Kind::kPending && e.storage.use_count() == 1) {
      avoided += e.layout.physical();
      ++dead;
      continue;
    }
    outs.push_back(&e);
  }
  auto ctx = std::make_shared<ErrorContext>();
  ctx->ops = r->ops;
  ctx->value_op = r->value_op;
  Launch launch;
  std::string compile_error;
  bool miss = false;
  const bool replay = r->replay && num_ops == 1 && outs.size() == 1 && outs[0]->kind == Entry::Kind::kPending;
  if (!outs.empty()) {
    std::vector<ValueId> extra;
    if (!replay) {
      ctx->graph = r->builder.graph();
      std::vector<ValueId> values;
      for (Entry* e : outs) values.push_back(e->value);
      ctx->graph.set_outputs(values);
      extra = row_statistics(ctx->graph);
      if (!extra.empty()) {
        values.insert(values.end(), extra.begin(), extra.end());
        ctx->graph.set_outputs(values);
      }
      try {
        launch = plan_region_launch(ctx->graph, &miss);
      } catch (const std::exception& e) {
        compile_error = ctx->describe(e.what());
      }
    }
    // Memory for the live results (and temporaries for in-place writes).
    std::vector<c10::DataPtr> data;
    size_t allocating = 0;
    try {
      for (; allocating < outs.size(); ++allocating) {
        Entry* e = outs[allocating];
        data.push_back(tpu_allocator().allocate_on(r->device, e->layout.nbytes(), e->layout.physical()));
        allocated += e->layout.physical();
      }
    } catch (const c10::Error& err) {
      Entry* failed = outs[allocating];
      data.clear();
      g_open_regions.fetch_add(1);
      g_pending_ops.fetch_add(num_ops);
      if (r->rng_params) g_rng_regions.fetch_add(1);
      cs.region = std::move(r);
      const std::string what = err.what_without_backtrace();
      const std::string op = failed->op >= 0 ? ErrorContext::op_text(ctx->ops[failed->op]) : "a fused region";
      if (dynamic_cast<const c10::OutOfMemoryError*>(&err)) {
        TORCH_CHECK_WITH(OutOfMemoryError, false, what, " (allocating the result of ", op,
                         ", deferred by defer_and_fuse)");
      }
      TORCH_CHECK(false, what, " (allocating the result of ", op, ", deferred by defer_and_fuse)");
    }
    if (replay) {
      Entry& e = *outs[0];
      e.storage.set_data_ptr_noswap(std::move(data[0]));
      torch::jit::Stack stack(r->replay->args.begin(), r->replay->args.end());
      at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(e.storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
          c10::scalarTypeToTypeMeta(e.layout.dtype));
      out.unsafeGetTensorImpl()->set_sizes_and_strides(e.layout.sizes, e.layout.strides, e.layout.offset);
      stack.push_back(std::move(out));
      {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        r->replay->op.callBoxed(&stack);  // the tpu fallback queues ATen's kernel (tls_in_flush: not recorded)
      }
      update_stats([&](DeferStats& s) {
        ++s.regions_flushed;
        ++s.regions_run;
        ++s.single_op_regions;
        s.ops_fused += 1;
        s.outputs_materialized += 1;
        s.hbm_bytes_allocated += allocated;
        count_reason(s, why);
      });
      return;
    }
    auto run = std::make_shared<RunState>();
    run->launch = launch;
    run->ctx = ctx;
    run->params = r->params;
    for (ValueId p : ctx->graph.parameters()) run->param_types.push_back(ctx->graph.type(p));
    run->scalars.assign(run->params.size(), 0);
    for (size_t k = 0; k < run->params.size(); ++k) {
      if (run->params[k].scalar) store_scalar(run->params[k].value, run->param_types[k].dtype, &run->scalars[k]);
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      Entry& e = *outs[i];
      RunState::Out o;
      o.type = ctx->graph.type(e.value);
      if (e.kind == Entry::Kind::kPending) {
        e.storage.set_data_ptr_noswap(std::move(data[i]));
        o.storage = e.storage;
      } else {
        o.temp = std::move(data[i]);
        o.target.storage = e.storage;
        o.target.sizes = e.layout.sizes;
        o.target.strides = e.layout.strides;
        o.target.storage_offset = e.layout.offset;
        o.target.dtype = c10::scalarTypeToTypeMeta(e.layout.dtype);
      }
      run->outs.push_back(std::move(o));
    }
    for (ValueId v : extra) {
      RunState::Out o;
      o.type = ctx->graph.type(v);
      o.scratch.reset(new char[static_cast<size_t>(o.type.numel() * ir::element_size(o.type.dtype))]);
      run->outs.push_back(std::move(o));
    }
    vtpu::Stream& stream = vtpu_stream(r->stream);
    if (!compile_error.empty()) {
      // Sticky, like any failed queued op: raised at the next synchronization.
      int32_t k = ctx->blame(compile_error);
      stream.enqueue(k >= 0 ? *ctx->ops[k].label : std::string("defer_and_fuse region"),
                     [msg = compile_error] { throw std::runtime_error(msg); });
    } else {
      record_region_costs(r->device, launch);
      if (!dump_dir().empty()) dump_region(ctx->graph, launch, *ctx);
      stream.enqueue_named(region_event_name(ctx->graph), [run] { run_region(*run); });
    }
  } else if (r->rng_params) {
    // Nothing it computes is used, but strict mode would have drawn its
    // random numbers: the generator advances the same way.
    vtpu_stream(r->stream).enqueue_named("defer_and_fuse region (random draws)", [params = r->params] {
      std::vector<std::unique_ptr<uint8_t[]>> masks;
      draw_masks(params, masks);
    });
  }
  update_stats([&](DeferStats& s) {
    ++s.regions_flushed;
    s.ops_fused += static_cast<uint64_t>(num_ops);
    s.outputs_dead += dead;
    s.hbm_bytes_avoided += avoided;
    s.hbm_bytes_allocated += allocated;
    count_reason(s, why);
    if (!outs.empty()) {
      ++s.regions_run;
      s.outputs_materialized += outs.size();
      if (launch.region) {
        (miss ? s.regions_compiled : s.cache_hits) += 1;
        s.kernels_launched += static_cast<uint64_t>(launch.region->num_kernels());
        if (launch.split()) ++s.regions_split;
      }
    }
  });
}

void flush_chip(c10::DeviceIndex d, Reason why) {
  ChipState* cs = find_state(d);
  if (!cs) return;
  std::lock_guard<std::recursive_mutex> lock(cs->mu);
  flush_locked(*cs, why);
}

// Flushes t's chip when the region produces or writes t's memory (a read),
// or touches it at all (a write).
void flush_if_conflict(const at::Tensor& t, bool write) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !t.has_storage()) return;
  ChipState* cs = find_state(t.device().index());
  if (!cs) return;
  std::lock_guard<std::recursive_mutex> lock(cs->mu);
  if (!cs->region) return;
  auto it = cs->region->storages.find(t.storage().unsafeGetStorageImpl());
  if (it == cs->region->storages.end()) return;
  if (write || it->second.kind != Entry::Kind::kRead) flush_locked(*cs, Reason::kConflict);
}

template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isOptionalTensorList()) {
    for (const auto& e : v.toOptionalTensorList()) {
      std::optional<at::Tensor> t = e;
      if (t.has_value()) f(*t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

// ------------------------------------------------------------------ recording

// The address a pending result's storage shows until the flush gives it
// HBM: unique per storage (data_ptr() tells storages apart, torch.save and
// Python's storage objects reject null) and inaccessible (PROT_NONE), so a
// read that skipped the flush faults instead of returning garbage.
void* pending_address() {
  constexpr size_t kSpan = size_t{1} << 36, kStep = 4096;
  static char* base = [] {
    void* p = mmap(nullptr, kSpan, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? static_cast<char*>(nullptr) : static_cast<char*>(p);
  }();
  static std::atomic<uint64_t> next{0};
  if (!base) return nullptr;
  return base + (next.fetch_add(1, std::memory_order_relaxed) % (kSpan / kStep)) * kStep;
}

at::Tensor pending_tensor(const ir::Shape& sizes, c10::ScalarType dtype, c10::DeviceIndex device) {
  auto meta = c10::scalarTypeToTypeMeta(dtype);
  size_t nbytes = static_cast<size_t>(ir::numel(sizes)) * meta.itemsize();
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(pending_address(), c10::Device(c10::DeviceType::PrivateUse1, device)),
                       &tpu_allocator(), /*resizable=*/true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(c10::IntArrayRef(sizes));
  return t;
}

bool is_contiguous(const c10::DimVector& sizes, const c10::DimVector& strides) {
  int64_t expect = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= sizes[i];
  }
  return true;
}

// A view `lay` of a produced value, expressed in the IR when it is the same
// memory read through broadcast (stride 0 or size 1) dimensions and a
// row-major reshape; nullopt otherwise (slices, transposes). With emit false
// only checks.
std::optional<ValueId> view_value(Region& r, const Entry& e, const Layout& lay, bool emit) {
  if (lay.dtype != e.layout.dtype || lay.offset != 0) return std::nullopt;
  std::vector<int64_t> kept_sizes, kept_dims;
  for (size_t d = 0; d < lay.sizes.size(); ++d) {
    if (lay.sizes[d] == 1 || lay.strides[d] == 0) continue;
    kept_sizes.push_back(lay.sizes[d]);
    kept_dims.push_back(static_cast<int64_t>(d));
  }
  int64_t expect = 1;
  for (size_t i = kept_dims.size(); i-- > 0;) {
    if (lay.strides[kept_dims[i]] != expect) return std::nullopt;
    expect *= kept_sizes[i];
  }
  if (expect != e.layout.numel()) return std::nullopt;
  if (!emit) return ValueId{-1};
  ValueId v = e.value;
  if (kept_sizes != e.layout.sizes) v = r.builder.reshape(v, kept_sizes);
  if (kept_sizes == lay.sizes) return v;
  return r.builder.broadcast_in_dim(v, lay.sizes, kept_dims);
}

// Whether reading (or writing) t needs the region flushed first: a view of a
// produced value the IR cannot express, or memory written in place read
// through another layout.
bool needs_flush(Region& r, const at::Tensor& t, bool written) {
  auto it = r.storages.find(t.storage().unsafeGetStorageImpl());
  if (it == r.storages.end()) return false;
  const Entry& e = it->second;
  const Layout lay = Layout::of(t);
  switch (e.kind) {
    case Entry::Kind::kRead: return false;
    case Entry::Kind::kPending:
      if (lay == e.layout) return false;
      return written || !view_value(r, e, lay, false).has_value();
    case Entry::Kind::kWritten: return !(lay == e.layout);
  }
  return true;
}

ValueId read(Region& r, const at::Tensor& t) {
  const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
  const Layout lay = Layout::of(t);
  auto it = r.storages.find(key);
  if (it == r.storages.end()) {
    it = r.storages.emplace(key, Entry{}).first;
    it->second.storage = t.storage();
  }
  Entry& e = it->second;
  if (e.kind != Entry::Kind::kRead) {
    if (lay == e.layout) return e.value;
    auto v = e.kind == Entry::Kind::kPending ? view_value(r, e, lay, true) : std::nullopt;
    TORCH_INTERNAL_ASSERT(v.has_value(), "defer_and_fuse: unexpected layout of a region tensor");
    return *v;
  }
  for (const auto& [l, v] : e.reads)
    if (l == lay) return v;
  ValueId p = r.builder.parameter(*ir_type(lay.dtype), ir::Shape(lay.sizes.begin(), lay.sizes.end()));
  r.params.push_back(Param{TensorRecipe::of(t)});
  e.reads.emplace_back(lay, p);
  return p;
}

void write(Region& r, const at::Tensor& self, ValueId v, int32_t op) {
  const c10::StorageImpl* key = self.storage().unsafeGetStorageImpl();
  Entry& e = r.storages.at(key);  // self was read first
  if (e.kind == Entry::Kind::kRead) {
    e.kind = Entry::Kind::kWritten;
    e.layout = Layout::of(self);
    r.outputs.push_back(key);
  }
  e.value = v;
  e.op = op;
}

// Whether the user scalar at `site` has taken another value before: then it
// is recorded as a parameter from now on. Sites are "file:line|op|arg|type".
bool site_varies(const std::string& site, const ir::Scalar& v) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::pair<ir::Scalar, bool>> sites;
  std::lock_guard<std::mutex> lock(mu);
  if (sites.size() > 65536) sites.clear();
  auto [it, inserted] = sites.try_emplace(site, v, false);
  if (inserted) return false;
  if (!it->second.second && !(it->second.first == v)) it->second.second = true;
  return it->second.second;
}

class SiteSink final : public ScalarSink {
 public:
  SiteSink(Region& r, const std::string& source, const std::string& label) : r_(r), source_(source), label_(label) {}
  ValueId scalar(ir::Builder& b, size_t arg, const ir::Scalar& v, ir::ElementType t) override {
    // Without a Python source line (autograd's worker thread) a site cannot
    // be told apart from others: constants.
    if (!source_.empty() &&
        site_varies(source_ + "|" + label_ + "|" + std::to_string(arg) + "|" + ir::element_type_name(t), v)) {
      ValueId p = b.parameter(t, {});
      Param param;
      param.scalar = true;
      param.value = v;
      r_.params.push_back(std::move(param));
      return p;
    }
    return ir::is_float(t) ? b.constant(v.f, t) : b.constant_int(v.i, t);
  }

  ValueId bernoulli_mask(ir::Builder& b, const ir::Shape& shape, double p, const at::Generator& gen) override {
    ValueId m = b.parameter(ir::ElementType::pred, shape);
    Param param;
    param.rng = RngDraw{gen, p, shape, true};
    r_.params.push_back(std::move(param));
    if (r_.rng_params++ == 0) g_rng_regions.fetch_add(1);
    return m;
  }

 private:
  Region& r_;
  const std::string& source_;
  const std::string& label_;
};

// The out= overload of a functional op: OpInfo's ("add.out"), or one named
// "grad_input" (gelu_backward, threshold_backward, ...): same arguments plus
// one kwarg-only Tensor(a!).
std::optional<c10::OperatorHandle> out_overload(const c10::OperatorHandle& op, const OpInfo& info) {
  if (info.out_variant) return info.out_variant;
  static std::mutex mu;
  static std::unordered_map<const OpInfo*, std::optional<c10::OperatorHandle>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(&info);
  if (it != cache.end()) return it->second;
  std::optional<c10::OperatorHandle> found;
  const auto& schema = op.schema();
  auto h = c10::Dispatcher::singleton().findOp({schema.name(), "grad_input"});
  if (h && schema.returns().size() == 1) {
    const auto& o = h->schema();
    const size_t na = schema.arguments().size();
    bool same = o.arguments().size() == na + 1 && o.returns().size() == 1;
    for (size_t i = 0; i < na && same; ++i) {
      same = o.arguments()[i].name() == schema.arguments()[i].name() &&
             *o.arguments()[i].type() == *schema.arguments()[i].type();
    }
    const c10::AliasInfo* a = same ? o.arguments()[na].alias_info() : nullptr;
    if (same && a && a->isWrite() && o.arguments()[na].kwarg_only()) found = h;
  }
  cache.emplace(&info, found);
  return found;
}

LowerFn lowering_for(const OpInfo& info) {
  thread_local std::unordered_map<const OpInfo*, LowerFn> cache;
  auto it = cache.find(&info);
  if (it != cache.end()) return it->second;
  LowerFn fn = find_lowering(info.label);
  cache.emplace(&info, fn);
  return fn;
}

void count_fallback() {
  update_stats([](DeferStats& s) { ++s.fallbacks; });
}

}  // namespace
}  // namespace defer

using namespace defer;

bool defer_record(const c10::OperatorHandle& op, torch::jit::Stack* stack, const OpInfo& info) {
  if (tls_in_flush > 0) return false;  // a flush running an op with ATen's kernel
  LowerFn fn = lowering_for(info);
  if (!fn) return false;
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  if (schema.returns().size() != 1) return false;
  c10::ArrayRef<c10::IValue> args(&*(stack->end() - n), n);

  // Functional ops, or in-place ops on `self` (returned). No out=, no views.
  bool inplace = false;
  for (size_t i = 0; i < n; ++i) {
    const c10::AliasInfo* a = alias_of(schema.arguments()[i]);
    if (a && a->isWrite()) {
      if (i != 0) return false;
      inplace = true;
    }
  }
  if (inplace ? info.returns[0].arg != 0 : info.returns[0].arg >= 0) return false;

  std::vector<Operand> operands(n);
  c10::DeviceIndex device = -1;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    Operand& o = operands[i];
    o.ivalue = &v;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      if (!ir_type(t.scalar_type()) || t.is_conj() || t.is_neg()) return false;
      if (t.device().type() == c10::DeviceType::PrivateUse1) {
        if (device >= 0 && t.device().index() != device) return false;
        if (t.numel() == 0) return false;
        device = t.device().index();
        o.kind = Operand::Kind::kTensor;
        o.tensor = t;
      } else if (t.device().is_cpu() && t.dim() == 0) {
        o.kind = Operand::Kind::kScalar;
        o.tensor = t;
        o.scalar = t.item();
      } else {
        return false;
      }
    } else if (v.isDouble() || v.isInt() || v.isBool()) {
      o.kind = Operand::Kind::kScalar;
      o.scalar = v.toScalar();
    } else if (v.isTensorList() || v.isOptionalTensorList() || v.isComplexDouble()) {
      return false;
    }
  }
  if (device < 0 || (inplace && operands[0].kind != Operand::Kind::kTensor)) return false;

  // Result shape and dtype from the meta kernel, which also raises argument
  // errors (then the strict path raises them again, as strict mode would).
  std::vector<ir::TensorType> outs;
  std::vector<c10::ScalarType> out_dtypes;
  try {
    const MetaResult& meta = meta_result(op, args);
    for (const auto& rm : meta) {
      if (rm.is_list || rm.tensors.size() != 1 || !rm.tensors[0].defined) return false;
      const TensorMeta& m = rm.tensors[0];
      auto et = ir_type(m.dtype);
      if (!et) return false;
      if (!inplace && (m.offset != 0 || !is_contiguous(m.sizes, m.strides))) return false;
      ir::Shape shape(m.sizes.begin(), m.sizes.end());
      if (ir::numel(shape) == 0) return false;
      outs.push_back(ir::TensorType{*et, shape});
      out_dtypes.push_back(m.dtype);
    }
  } catch (...) {
    return false;
  }
  if (outs.size() != 1) return false;

  std::string source = source_line();  // before taking the chip's lock: it may take the GIL
  const c10::Stream stream = current_stream(device);
  ChipState* cs = find_state(device);
  if (!cs) return false;
  std::lock_guard<std::recursive_mutex> lock(cs->mu);
  if (cs->region && cs->region->stream != stream) flush_locked(*cs, Reason::kOther);
  if (cs->region) {
    bool flush = false;
    for (size_t i = 0; i < n && !flush; ++i) {
      if (operands[i].kind == Operand::Kind::kTensor)
        flush = needs_flush(*cs->region, operands[i].tensor, inplace && i == 0);
    }
    if (flush) flush_locked(*cs, Reason::kView);
  }
  // An in-place op on memory the region does not produce or write is
  // computed into a temporary and copied back: worth it only when it
  // consumes a sizable result of the region (which then need not reach HBM),
  // not for x.mul_(2) or x.mul_(pending_scalar): ATen's in-place kernel runs.
  if (inplace) {
    bool record = false;
    for (size_t i = 0; i < n && cs->region && !record; ++i) {
      if (operands[i].kind != Operand::Kind::kTensor) continue;
      auto it = cs->region->storages.find(operands[i].tensor.storage().unsafeGetStorageImpl());
      if (it == cs->region->storages.end() || it->second.kind == Entry::Kind::kRead) continue;
      record = i == 0 || operands[i].tensor.numel() * 8 >= operands[0].tensor.numel();
    }
    if (!record) return false;
  }
  if (!cs->region) {
    cs->region = std::make_unique<Region>(stream);
    g_open_regions.fetch_add(1);
  }
  Region& r = *cs->region;
  for (auto& o : operands)
    if (o.kind == Operand::Kind::kTensor) o.value = read(r, o.tensor);

  SiteSink sink(r, source, info.label);
  const size_t params_before = r.params.size();
  Lowering L(r.builder, operands, outs, out_dtypes, &sink);
  bool lowered = false;
  try {
    fn(L);
    lowered = L.results.size() == outs.size();
  } catch (const NotFusible&) {
  } catch (const c10::Error&) {
    // An argument error (a dim out of range, ...): the op runs strictly,
    // which reports it as strict mode does; no warning on top.
  } catch (const std::exception& e) {
    TORCH_WARN_ONCE("defer_and_fuse: could not record ", info.label, " (it runs strictly): ", e.what());
  }
  if (!lowered) {
    // The op runs strictly and draws its own numbers: masks its lowering
    // added must not draw (their parameters stay, unused).
    for (size_t k = params_before; k < r.params.size(); ++k)
      if (r.params[k].rng) r.params[k].rng->draw = false;
    r.value_op.resize(static_cast<size_t>(r.builder.graph().num_ops()), -1);
    count_fallback();
    return false;
  }
  const int32_t op_index = static_cast<int32_t>(r.ops.size());
  r.ops.push_back(OpRecord{&info.label, std::move(source)});
  std::optional<c10::OperatorHandle> out_op;
  if (op_index == 0 && !inplace && r.rng_params == 0 && g_single_op_aten.load(std::memory_order_relaxed))
    out_op = out_overload(op, info);
  if (out_op) {
    // tpu tensors as they are now: their metadata may change in place before the flush.
    std::vector<c10::IValue> snapshot(args.begin(), args.end());
    for (auto& v : snapshot) {
      if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().device().type() != c10::DeviceType::PrivateUse1)
        continue;
      const at::Tensor& t = v.toTensor();
      at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(t.storage()), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t.dtype());
      alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
      v = std::move(alias);
    }
    r.replay = Replay{*out_op, std::move(snapshot)};
  } else {
    r.replay.reset();
  }
  r.value_op.resize(static_cast<size_t>(r.builder.graph().num_ops()), op_index);

  at::Tensor result;
  if (inplace) {
    result = operands[0].tensor;
    write(r, result, L.results[0], op_index);
  } else {
    result = pending_tensor(outs[0].shape, out_dtypes[0], device);
    const c10::StorageImpl* key = result.storage().unsafeGetStorageImpl();
    Entry& e = r.storages[key];
    e.kind = Entry::Kind::kPending;
    e.storage = result.storage();
    e.layout = Layout::of(result);
    e.value = L.results[0];
    e.op = op_index;
    r.outputs.push_back(key);
  }
  for (const auto& o : operands) {  // what would not port to a TPU, as the strict path reports it
    if (o.kind == Operand::Kind::kTensor && unsupported_on_tpu(o.tensor.scalar_type())) {
      note_unsupported(info.label, o.tensor.scalar_type());
      break;
    }
  }
  torch::jit::drop(*stack, n);
  stack->push_back(std::move(result));
  g_pending_ops.fetch_add(1);
  update_stats([](DeferStats& s) { ++s.ops_recorded; });
  if (repeat_detection()) {
    uint64_t key = ir::hash_mix(reinterpret_cast<uintptr_t>(&info.label), static_cast<uint64_t>(inplace));
    for (const auto& o : operands) {
      if (o.kind != Operand::Kind::kTensor) continue;
      key = ir::hash_mix(key, static_cast<uint64_t>(o.tensor.scalar_type()));
      for (int64_t d : o.tensor.sizes()) key = ir::hash_mix(key, static_cast<uint64_t>(d));
    }
    const uint64_t fp = cs->repeat.push(key);
    if (static_cast<int64_t>(r.ops.size()) >= max_ops()) {
      cs->repeat.remember(fp);
      flush_locked(*cs, Reason::kSizeCap);
    } else if (cs->repeat.seen(fp)) {
      flush_locked(*cs, Reason::kRepeat);
    }
  } else if (static_cast<int64_t>(r.ops.size()) >= max_ops()) {
    flush_locked(*cs, Reason::kSizeCap);
  }
  return true;
}

namespace defer {
namespace {

// Whether a strictly run op may draw from a generator: it must not run
// ahead of a pending region's draws (they would swap numbers with it).
bool draws_random_numbers(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return true;
  for (const auto& a : op.schema().arguments()) {
    c10::TypePtr t = a.real_type();
    if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) return true;
  }
  return false;
}

void flush_rng_regions() {
  for (c10::DeviceIndex d = 0; find_state(d) != nullptr; ++d) {
    ChipState* cs = find_state(d);
    std::lock_guard<std::recursive_mutex> lock(cs->mu);
    if (cs->region && cs->region->rng_params) flush_locked(*cs, Reason::kConflict);
  }
}

}  // namespace
}  // namespace defer

DeferChecked::DeferChecked(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (g_rng_regions.load(std::memory_order_relaxed) > 0 && draws_random_numbers(op)) flush_rng_regions();
  if (g_open_regions.load(std::memory_order_relaxed) > 0) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    for (size_t i = 0; i < n; ++i) {
      const c10::AliasInfo* a = alias_of(schema.arguments()[i]);
      const bool write = a && a->isWrite();
      for_each_tensor(stack[stack.size() - n + i], [&](const at::Tensor& t) { flush_if_conflict(t, write); });
    }
  }
  ++tls_checked;  // last: a throwing flush leaves the count alone
}

DeferChecked::DeferChecked(std::initializer_list<const at::Tensor*> reads,
                           std::initializer_list<const at::Tensor*> writes) {
  if (g_open_regions.load(std::memory_order_relaxed) > 0) {
    for (const at::Tensor* t : reads) flush_if_conflict(*t, false);
    for (const at::Tensor* t : writes) flush_if_conflict(*t, true);
  }
  ++tls_checked;
}

DeferChecked::~DeferChecked() { --tls_checked; }

void defer_before_stream_use(c10::DeviceIndex device) {
  if (tls_checked > 0 || tls_in_flush > 0 || g_open_regions.load(std::memory_order_relaxed) == 0) return;
  flush_chip(device, Reason::kStream);
}

void defer_flush_device(c10::DeviceIndex device) {
  if (tls_in_flush > 0 || g_open_regions.load(std::memory_order_relaxed) == 0) return;
  flush_chip(device, Reason::kSync);
}

void defer_flush_storage(const c10::StorageImpl* storage) {
  if (tls_in_flush > 0 || g_open_regions.load(std::memory_order_relaxed) == 0 || !storage) return;
  ChipState* cs = find_state(storage->device().index());
  if (!cs) return;
  std::lock_guard<std::recursive_mutex> lock(cs->mu);
  if (cs->region && cs->region->storages.count(storage)) flush_locked(*cs, Reason::kSync);
}

void defer_flush_all() {
  if (tls_in_flush > 0 || g_open_regions.load(std::memory_order_relaxed) == 0) return;
  for (c10::DeviceIndex d = 0; find_state(d) != nullptr; ++d) flush_chip(d, Reason::kOther);
}

DeferStats defer_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  return g_stats;
}

void defer_reset_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  g_stats = DeferStats{};
}

int64_t defer_pending_ops() { return g_pending_ops.load(); }

void defer_set_single_op_aten(bool enabled) { g_single_op_aten.store(enabled); }
bool defer_single_op_aten() { return g_single_op_aten.load(); }

}  // namespace torch_tpu
