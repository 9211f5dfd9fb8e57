// defer_and_fuse: the flush of a chip's pending region (compile, allocate the
// live results, queue the kernels), the flush triggers and the counters (see
// defer.h and region.h).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "aten/op_info.h"
#include "aten/random_ops.h"
#include "defer/region.h"
#include "defer/region_launch.h"
#include "exec/executor.h"
#include "ir/hash.h"
#include "ir/passes.h"
#include "ir/printer.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/tensor_factory.h"

namespace torch_tpu {
namespace defer {

std::atomic<int> g_open_regions{0};  // chips with a pending region
std::atomic<int64_t> g_pending_ops{0};
std::atomic<int> g_rng_regions{0};  // pending regions that draw random numbers
thread_local int tls_in_flush = 0;

std::mutex g_stats_mu;
DeferStats g_stats;

ChipState* find_state(c10::DeviceIndex d) {
  static std::vector<ChipState*>* states = [] {
    auto* v = new std::vector<ChipState*>();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) v->push_back(new ChipState);
    return v;
  }();
  if (d < 0 || static_cast<size_t>(d) >= states->size()) return nullptr;
  return (*states)[d];
}

namespace {

// A region replays ATen's kernels when its dead results' bytes are at most 1/16 of its live ones.
constexpr uint64_t kReplayMaxAvoidedShare = 16;

thread_local int tls_checked = 0;  // DeferChecked scopes alive on this thread

const std::string& dump_dir() {
  static const std::string dir = [] {
    const char* v = std::getenv("TORCH_TPU_DUMP_IR");
    return std::string(v ? v : "");
  }();
  return dir;
}

// ------------------------------------------------------------------ errors

// What a failing region says: the recorded op (and its source line) that an
// IR error points at.
struct ErrorContext {
  ir::Graph graph;  // as recorded
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
        if (name == ir::op_name(graph.op(static_cast<ValueId>(v)).kind) && static_cast<size_t>(v) < value_op.size() &&
            value_op[v] >= 0) {
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
    c10::Storage storage;  // a produced result (written in place by the kernels)
    c10::DataPtr temp;     // or: a temporary copied into `target` afterwards
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
    const RngDraw& rng = *params[k].rng;
    if (rng.draw && rng.philox)
      philox_bernoulli_mask(rng.seed, rng.offset, rng.p, masks[k].get(), n);
    else if (rng.draw)
      draw_bernoulli_mask(rng.gen, rng.p, masks[k].get(), n);
    else
      std::memset(masks[k].get(), 0, static_cast<size_t>(n));
  }
}

bool philox_only(const std::vector<Param>& params) {
  for (const auto& p : params)
    if (p.rng && !p.rng->philox) return false;
  return true;
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
    in.push_back(exec::Buffer::strided(ptr, s.param_types[k].dtype, s.param_types[k].shape,
                                       std::vector<int64_t>(p.strides.begin(), p.strides.end())));
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
// `hash`: the launch's graph_hash when it has one (the recorded graph's, computed by the compile cache).
const char* region_event_name(const ir::Graph& recorded, uint64_t hash) {
  constexpr size_t kMaxNames = 4096;
  static std::mutex mu;
  static std::unordered_map<uint64_t, std::unique_ptr<std::string>> names;
  const uint64_t h = hash ? hash : ir::structural_hash(recorded);
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
  f << "// defer_and_fuse region " << name << ": " << ctx.ops.size() << " recorded ATen ops, " << c.num_kernels()
    << " fused kernels";
  if (l.split()) f << ", run in " << l.chunks << " chunks of " << l.rows << " of " << l.n << " rows";
  f << "\n";
  for (const auto& r : ctx.ops) f << "//   " << ErrorContext::op_text(r) << "\n";
  std::istringstream plan(c.plan().to_string(c.graph()));
  for (std::string line; std::getline(plan, line);) f << "// plan: " << line << "\n";
  f << ir::to_stablehlo(l.split() ? ir::dead_code_elimination(recorded) : c.graph(), name);
}

void count_reason(DeferStats& s, Reason why) {
  switch (why) {
    case Reason::kConflict:
      ++s.flush_conflict;
      break;
    case Reason::kSync:
      ++s.flush_sync;
      break;
    case Reason::kStream:
      ++s.flush_stream;
      break;
    case Reason::kSizeCap:
      ++s.flush_size_cap;
      break;
    case Reason::kView:
      ++s.flush_view;
      break;
    case Reason::kRepeat:
      ++s.flush_repeat;
      break;
    case Reason::kOther:
      ++s.flush_other;
      break;
  }
}

// A scalar parameter's value in its element type's memory format.
void store_scalar(const ir::Scalar& v, ir::ElementType t, uint64_t* slot) {
  using ir::ElementType;
  switch (t) {
    case ElementType::f32: {
      float f = static_cast<float>(v.f);
      std::memcpy(slot, &f, 4);
      break;
    }
    case ElementType::f64:
      std::memcpy(slot, &v.f, 8);
      break;
    case ElementType::bf16: {
      uint16_t h = ir::f32_to_bf16(static_cast<float>(v.f));
      std::memcpy(slot, &h, 2);
      break;
    }
    case ElementType::f16: {
      uint16_t h = ir::f32_to_f16(static_cast<float>(v.f));
      std::memcpy(slot, &h, 2);
      break;
    }
    case ElementType::s64:
      std::memcpy(slot, &v.i, 8);
      break;
    case ElementType::s32: {
      int32_t x = static_cast<int32_t>(v.i);
      std::memcpy(slot, &x, 4);
      break;
    }
    case ElementType::s8: {
      int8_t x = static_cast<int8_t>(v.i);
      std::memcpy(slot, &x, 1);
      break;
    }
    case ElementType::u8:
    case ElementType::pred: {
      uint8_t x = static_cast<uint8_t>(v.i);
      std::memcpy(slot, &x, 1);
      break;
    }
  }
}

struct InFlush {
  InFlush() { ++tls_in_flush; }
  ~InFlush() { --tls_in_flush; }
};

}  // namespace

void flush_locked(ChipState& cs, Reason why) {
  if (!cs.region) return;
  InFlush in_flush;
  std::unique_ptr<Region> r = std::move(cs.region);
  const int64_t num_ops = static_cast<int64_t>(r->ops.size());
  g_open_regions.fetch_sub(1);
  if (r->rng_params) g_rng_regions.fetch_sub(1);
  g_pending_ops.fetch_sub(num_ops);

  std::vector<Entry*> outs, dead_outs;
  uint64_t avoided = 0, live = 0, allocated = 0;
  for (const c10::StorageImpl* key : r->outputs) {
    Entry& e = r->storages.at(key);
    if (e.kind == Entry::Kind::kPending && e.storage.use_count() == 1 + static_cast<size_t>(e.replay_refs)) {
      avoided += e.layout.physical();
      dead_outs.push_back(&e);
      continue;
    }
    live += e.layout.physical();
    outs.push_back(&e);
  }
  const uint64_t dead = dead_outs.size();
  // ATen's kernels op by op unless fusing keeps a sizable share of the bytes out of HBM: the
  // executor's elementwise math is slower than ATen's (a bf16 gelu_backward region that kept one
  // 512-byte bias sum out of HBM ran 1.4-1.7x as long as ATen's kernels, bench/README.md).
  const bool replay =
      !outs.empty() && r->replays.size() == static_cast<size_t>(num_ops) && avoided * kReplayMaxAvoidedShare <= live;
  if (replay) outs.insert(outs.end(), dead_outs.begin(), dead_outs.end());  // ATen writes them too
  auto ctx = std::make_shared<ErrorContext>();
  ctx->ops = std::move(r->ops);  // (given back if the region stays pending)
  ctx->value_op = std::move(r->value_op);
  Launch launch;
  std::string compile_error;
  bool miss = false;
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
        launch = plan_region_launch(ctx->graph, &miss, /*parts=*/true);
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
        if (replay && e->kind == Entry::Kind::kWritten) {  // ATen's in-place kernel writes it
          data.emplace_back();
          continue;
        }
        data.push_back(tpu_allocator().allocate_on(r->device, e->layout.nbytes(), e->layout.physical()));
        allocated += e->layout.physical();
      }
    } catch (const c10::Error& err) {
      Entry* failed = outs[allocating];
      data.clear();
      r->ops = ctx->ops;
      r->value_op = ctx->value_op;
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
      for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i]->kind == Entry::Kind::kPending) outs[i]->storage.set_data_ptr_noswap(std::move(data[i]));
      }
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      c10::StreamGuard on_region_stream(r->stream);  // the flushing thread may be on another stream
      // An op whose kernel raises (an argument its meta kernel let through) leaves its result
      // marked failed and the ops reading it skipped; the rest run, and the flush raises.
      std::unordered_set<const c10::StorageImpl*> failed;
      std::string first_error;
      for (size_t k = 0; k < r->replays.size(); ++k) {
        const Replay& op = r->replays[k];
        torch::jit::Stack stack(op.args.begin(), op.args.end());
        at::Tensor written = op.args[0].isTensor() ? op.args[0].toTensor() : at::Tensor();
        if (op.result) {
          const Entry& e = r->storages.at(op.result);
          at::Tensor out =
              tpu_tensor_over(e.storage, e.layout.sizes, e.layout.strides, e.layout.offset, e.layout.dtype);
          written = out;
          if (op.result_first) {
            stack.insert(stack.begin(), std::move(out));
          } else {
            stack.push_back(std::move(out));
          }
        }
        const bool reads_failed =
            !failed.empty() && std::any_of(op.args.begin(), op.args.end(), [&](const c10::IValue& v) {
              return v.isTensor() && v.toTensor().has_storage() &&
                     failed.count(v.toTensor().storage().unsafeGetStorageImpl());
            });
        std::string why;
        if (reads_failed) {
          why = "it reads the result of a deferred op that raised";
        } else {
          try {
            op.op.callBoxed(&stack);  // the tpu fallback queues ATen's kernel (tls_in_flush: not recorded)
            continue;
          } catch (const c10::Error& e) {
            why = e.what_without_backtrace();
          } catch (const std::exception& e) {
            why = e.what();
          }
        }
        const std::string op_text = ErrorContext::op_text(ctx->ops[k]);
        if (first_error.empty()) first_error = why + " (" + op_text + ", deferred by defer_and_fuse)";
        if (!written.defined()) continue;
        failed.insert(written.storage().unsafeGetStorageImpl());
        // An in-place op that raised left its tensor as it was: the user's values stay readable.
        if (op.result)
          mark_failed(written, op_text + " (deferred by defer_and_fuse) raised when its region ran: " + why);
      }
      update_stats([&](DeferStats& s) {
        ++s.regions_flushed;
        ++s.regions_run;
        ++s.regions_replayed;
        if (num_ops == 1) ++s.single_op_regions;
        s.ops_fused += static_cast<uint64_t>(num_ops);
        s.outputs_materialized += outs.size() - dead;
        s.outputs_dead += dead;
        s.hbm_bytes_allocated += allocated;
        count_reason(s, why);
      });
      TORCH_CHECK(first_error.empty(), first_error);
      return;
    }
    auto run = std::make_shared<RunState>();
    run->launch = launch;
    run->ctx = ctx;
    run->params = std::move(r->params);
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
        o.target.sizes.assign(e.layout.sizes.begin(), e.layout.sizes.end());
        o.target.strides.assign(e.layout.strides.begin(), e.layout.strides.end());
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
      // A dry run prices the fused region and allocates its live outputs, computing nothing.
      if (!dry_run())
        stream.enqueue_named(region_event_name(ctx->graph, launch.graph_hash), [run] { run_region(*run); });
    }
  } else if (r->rng_params && !philox_only(r->params)) {
    // Nothing it computes is used, but strict mode would have drawn its
    // random numbers: the generator advances the same way (philox
    // generators advanced when the ops were recorded).
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
        if (launch.parts) ++s.regions_in_parts;
      }
    }
  });
}

namespace {

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

using namespace defer;

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

}  // namespace torch_tpu
