// defer_and_fuse: recording a fusible op into its chip's pending region
// (defer_record, see defer.h and region.h).
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <tuple>

#include "aten/meta_cache.h"
#include "aten/op_info.h"
#include "aten/portability.h"
#include "defer/region.h"
#include "ir/hash.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/eager_mode.h"
#include "runtime/generator.h"
#include "runtime/tensor_factory.h"
#include "vtpu/env.h"

namespace torch_tpu {
namespace defer {
namespace {

// TORCH_TPU_DEFER_MAX_OPS: ATen ops per region before it is flushed (256).
int64_t max_ops() {
  static const int64_t n = vtpu::env_positive_int("TORCH_TPU_DEFER_MAX_OPS", 256);
  return n;
}

std::atomic<bool> g_single_op_aten{vtpu::env_flag("TORCH_TPU_DEFER_SINGLE_OP_ATEN", true)};

// TORCH_TPU_DEFER_REPEAT=0 turns the repeating-sequence detector off.
bool repeat_detection() {
  static const bool on = vtpu::env_flag("TORCH_TPU_DEFER_REPEAT", true);
  return on;
}

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
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
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
    case Entry::Kind::kRead:
      return false;
    case Entry::Kind::kPending:
      if (lay == e.layout) return false;
      return written || !view_value(r, e, lay, false).has_value();
    case Entry::Kind::kWritten:
      return !(lay == e.layout);
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
// is recorded as a parameter from now on. A site is a hash of (source line, op, argument, element type); two
// sites sharing one only cost a parameter where a constant would do (the value is the same either way).
bool site_varies(uint64_t site, const ir::Scalar& v) {
  static std::mutex mu;
  static std::unordered_map<uint64_t, std::pair<ir::Scalar, bool>> sites;
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
    if (!source_.empty() && site_varies(site(arg, t), v)) {
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
    Param param;
    param.rng = RngDraw{gen, p, shape, true};
    auto* impl = at::check_generator<TPUGeneratorImpl>(gen);
    if (impl->kind() == RngKind::kPhilox) {
      // Reserved now, in program order, as strict mode reserves them when it queues the op;
      // before the builder's parameter, as reserving may throw (past offset 2**63 - 1).
      param.rng->philox = true;
      std::tie(param.rng->seed, param.rng->offset) = impl->reserve(static_cast<uint64_t>(ir::numel(shape)));
    }
    ValueId m = b.parameter(ir::ElementType::pred, shape);
    r_.params.push_back(std::move(param));
    if (r_.rng_params++ == 0) g_rng_regions.fetch_add(1);
    return m;
  }

 private:
  uint64_t site(size_t arg, ir::ElementType t) {
    if (!source_hash_) source_hash_ = std::hash<std::string>()(source_) | 1;
    uint64_t h = ir::hash_mix(source_hash_, reinterpret_cast<uintptr_t>(&label_));  // labels live for the process
    return ir::hash_mix(ir::hash_mix(h, arg), static_cast<uint64_t>(t));
  }

  Region& r_;
  const std::string& source_;
  const std::string& label_;
  uint64_t source_hash_ = 0;
};

const c10::OperatorHandle& copy_op() {
  static const c10::OperatorHandle h = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  return h;
}

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
  // A dtype conversion on the chip (the result is a tpu tensor): copy_ into the result, as ATen's _to_copy does.
  if (info.label == "aten::_to_copy") return cache.emplace(&info, copy_op()).first->second;
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

// The region has an op ATen's kernels cannot replay: it runs compiled.
void release_replays(Region& r) {
  if (r.replays.empty()) return;
  r.replays.clear();
  for (auto& [key, e] : r.storages) e.replay_refs = 0;
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
    const MetaResult& meta = meta_result(op, args, info.pointwise);
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
    for (size_t k = params_before; k < r.params.size(); ++k) {
      auto& rng = r.params[k].rng;
      if (!rng || !rng->draw) continue;
      rng->draw = false;
      // Its positions go back: the strict op reserves its own.
      if (rng->philox) at::check_generator<TPUGeneratorImpl>(rng->gen)->set_offset(rng->offset);
    }
    r.value_op.resize(static_cast<size_t>(r.builder.graph().num_ops()), -1);
    count_fallback();
    return false;
  }
  const int32_t op_index = static_cast<int32_t>(r.ops.size());
  r.ops.push_back(OpRecord{&info.label, std::move(source)});
  // Every op so far kept for ATen's kernels, in case no result of the region dies (see Region::replays).
  std::optional<c10::OperatorHandle> out_op;
  if (r.replays.size() == static_cast<size_t>(op_index) && r.rng_params == 0 &&
      g_single_op_aten.load(std::memory_order_relaxed))
    out_op = inplace ? std::optional<c10::OperatorHandle>(op) : out_overload(op, info);
  if (out_op) {
    // tpu tensors as they are now: their metadata may change in place before the flush.
    std::vector<c10::IValue> snapshot(args.begin(), args.end());
    const bool result_first = !inplace && *out_op == copy_op();
    if (result_first) snapshot.assign({args[0], c10::IValue(false)});  // copy_(result, self, non_blocking)
    for (auto& v : snapshot) {
      if (!v.isTensor() || !v.toTensor().defined()) continue;
      if (v.toTensor().device().is_cpu()) {  // a 0-dim CPU operand: its value now (the caller may change it)
        v = v.toTensor().clone();
        continue;
      }
      if (v.toTensor().device().type() != c10::DeviceType::PrivateUse1) continue;
      const at::Tensor& t = v.toTensor();
      at::Tensor alias = tpu_tensor_over(t.storage(), t.sizes(), t.strides(), t.storage_offset(), t.scalar_type());
      auto it = r.storages.find(t.storage().unsafeGetStorageImpl());
      if (it != r.storages.end() && it->second.kind == Entry::Kind::kPending) ++it->second.replay_refs;
      v = std::move(alias);
    }
    r.replays.push_back(Replay{*out_op, std::move(snapshot), nullptr, result_first});
  } else {
    release_replays(r);
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
    if (out_op) r.replays.back().result = key;
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

void defer_set_single_op_aten(bool enabled) { g_single_op_aten.store(enabled); }
bool defer_single_op_aten() { return g_single_op_aten.load(); }

}  // namespace torch_tpu
