#include "aten/meta_cache.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>

#include <cstring>
#include <optional>
#include <unordered_map>

#include "aten/op_info.h"
#include "aten/scalar_class.h"
#include "ir/hash.h"
#include "runtime/device.h"
#include "runtime/host_alias.h"
#include "runtime/kernel_warnings.h"

namespace torch_tpu {
namespace {

using c10::IValue;

TensorMeta describe(const at::Tensor& t) {
  TensorMeta m;
  if (!t.defined()) return m;
  m.defined = true;
  m.sizes = c10::DimVector(t.sizes());
  m.strides = c10::DimVector(t.strides());
  m.offset = t.storage_offset();
  m.dtype = t.scalar_type();
  return m;
}

// Meta arguments: tpu tensors become meta tensors (host scalars stay), tpu
// devices become meta, generators are dropped (meta kernels draw nothing).
torch::jit::Stack meta_stack(const c10::FunctionSchema& schema, c10::ArrayRef<IValue> args) {
  AliasBuilder meta(c10::kMeta);
  auto to_meta = [&](const at::Tensor& t) { return (t.defined() && t.device().type() == kTPU) ? meta.alias(t) : t; };
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& v = args[i];
    if (is_generator_arg(schema.arguments()[i])) {
      stack.emplace_back();
    } else if (v.isTensor()) {
      stack.push_back(to_meta(v.toTensor()));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(to_meta(t));
      stack.push_back(std::move(list));
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& e : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = e;
        list.push_back(t.has_value() ? std::optional<at::Tensor>(to_meta(*t)) : std::nullopt);
      }
      stack.push_back(std::move(list));
    } else {
      stack.push_back(map_device(v, c10::kMeta));
    }
  }
  return stack;
}

// Meta kernels are slow (many are Python registrations): their results are
// cached per thread, keyed by the op and everything a meta kernel can see.
struct MetaKey {
  const void* op;
  std::vector<int64_t> words;
  bool operator==(const MetaKey& o) const { return op == o.op && words == o.words; }
};
struct MetaKeyHash {
  size_t operator()(const MetaKey& k) const {
    uint64_t h = reinterpret_cast<uintptr_t>(k.op);
    for (int64_t w : k.words) h = ir::hash_mix(h, static_cast<uint64_t>(w));
    return static_cast<size_t>(h);
  }
};
constexpr size_t kMetaCacheEntries = 1 << 16;
// A meta kernel's warnings are the op's host-side warnings: given at every
// call, cached hits included, as CPU gives them.
struct MetaEntry {
  MetaResult result;
  std::vector<c10::Warning> warnings;
  MetaExtras extras;
};
thread_local std::unordered_map<MetaKey, MetaEntry, MetaKeyHash> meta_cache;
thread_local std::vector<std::string> last_warnings;
thread_local uint64_t meta_kernel_calls = 0;
thread_local MetaExtras* last_extras = nullptr;

class Buffer : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { warnings.push_back(w); }
  std::vector<c10::Warning> warnings;
};

const MetaResult& given(MetaEntry& e, bool cached) {
  last_extras = cached ? &e.extras : nullptr;
  if (!last_warnings.empty()) last_warnings.clear();
  if (e.warnings.empty()) return e.result;
  for (const auto& w : e.warnings) last_warnings.push_back(w.msg());
  rewarn(e.warnings);
  return e.result;
}

class KeyWriter {
 public:
  // doubles_by_class: a pointwise op's outputs take their shapes from the tensors and their
  // dtypes from the scalars' types, never from a double's value; its checks look at a value's
  // sign or range (softshrink's lambda) or at two values' order (a min above a max). So
  // those doubles are keyed by double_class and by their order, and an optimizer's step sizes,
  // new every step, do not run the (Python, ~100 us) meta kernel every call.
  KeyWriter(std::vector<int64_t>& w, bool doubles_by_class) : w_(w), doubles_by_class_(doubles_by_class) {}
  void tensor(const at::Tensor& t) {
    if (!t.defined()) return w_.push_back(0);
    const bool device = t.device().type() == kTPU;
    w_.push_back(device ? 1 : 2);
    w_.push_back(static_cast<int64_t>(t.scalar_type()));
    w_.push_back(t.dim());
    for (auto s : t.sizes()) w_.push_back(s);
    if (!device) return w_.push_back(t.unsafeGetTensorImpl()->is_wrapped_number());
    for (auto s : t.strides()) w_.push_back(s);
    w_.push_back(t.storage_offset());
    // Which earlier tensor shares the storage: overlap checks depend on it.
    const void* storage = t.storage().unsafeGetStorageImpl();
    int64_t shared = -1;
    for (size_t i = 0; i < storages_.size(); ++i) {
      if (storages_[i] == storage) shared = static_cast<int64_t>(i);
    }
    storages_.push_back(storage);
    w_.push_back(shared);
    w_.push_back(static_cast<int64_t>(t.storage().nbytes()));
  }
  // False for argument kinds we do not key on (the op is then not cached).
  bool value(const IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isNone()) {
      w_.push_back(10);
    } else if (v.isInt()) {
      w_.insert(w_.end(), {11, v.toInt()});
    } else if (v.isDouble()) {
      const double d = v.toDouble();
      if (doubles_by_class_) {
        const int64_t order = !previous_double_ ? 0 : *previous_double_ < d ? 1 : *previous_double_ > d ? 2 : 3;
        w_.insert(w_.end(), {12, static_cast<int64_t>(double_class(d)), order});
        previous_double_ = d;
      } else {
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        w_.insert(w_.end(), {12, bits});
      }
    } else if (v.isBool()) {
      w_.insert(w_.end(), {13, v.toBool()});
    } else if (v.isIntList()) {
      w_.push_back(14);
      for (auto i : v.toIntList()) w_.push_back(i);
      w_.push_back(-7);
    } else if (v.isDevice()) {
      w_.insert(w_.end(), {15, static_cast<int64_t>(v.toDevice().type()), v.toDevice().index()});
    } else if (v.isGenerator()) {
      w_.push_back(16);
    } else if (v.isTensorList()) {
      w_.push_back(17);
      for (const at::Tensor& t : v.toTensorList()) tensor(t);
      w_.push_back(-7);
    } else if (v.isOptionalTensorList()) {
      w_.push_back(18);
      for (const auto& e : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = e;
        tensor(t.has_value() ? *t : at::Tensor());
      }
      w_.push_back(-7);
    } else if (v.isBoolList()) {
      w_.push_back(19);
      for (bool b : v.toBoolList()) w_.push_back(b);
      w_.push_back(-7);
    } else if (v.isDoubleList()) {
      w_.push_back(20);
      for (double d : v.toDoubleList()) {
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        w_.push_back(bits);
      }
      w_.push_back(-7);
    } else if (v.isString()) {
      w_.push_back(21);
      for (char c : v.toStringRef()) w_.push_back(c);
      w_.push_back(-7);
    } else {
      return false;  // complex scalars, storages, objects, ...
    }
    return true;
  }

 private:
  std::vector<int64_t>& w_;
  const bool doubles_by_class_;
  std::optional<double> previous_double_;
  std::vector<const void*> storages_;
};

}  // namespace

bool meta_has_lists(const MetaResult& meta) {
  for (const auto& r : meta) {
    if (r.is_list) return true;
  }
  return false;
}

// Runs the meta kernel (or reuses its cached answer). Throws what it throws.
const MetaResult& meta_result(const c10::OperatorHandle& op, c10::ArrayRef<IValue> args, bool pointwise) {
  // The key is written into a buffer kept per thread: a hit allocates nothing.
  thread_local MetaKey key;
  key.op = &op.schema();
  key.words.clear();
  // Factories without a dtype argument follow the default dtype.
  key.words.push_back(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  KeyWriter writer(key.words, pointwise);
  bool cacheable = true;
  for (const IValue& v : args) cacheable = cacheable && writer.value(v);
  if (cacheable) {
    auto it = meta_cache.find(key);
    if (it != meta_cache.end()) return given(it->second, true);
  }
  MetaKey owned = key;  // the meta kernel may call back in here
  torch::jit::Stack meta = meta_stack(op.schema(), args);
  Buffer buffer;  // a meta kernel that fails drops its warnings: the CPU kernel that decides gives its own
  last_warnings.clear();
  {
    c10::WarningUtils::WarningHandlerGuard buffered(&buffer);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    // Shape bookkeeping, not the user's op: keep it out of torch.profiler.
    at::DisableRecordFunctionGuard not_profiled;
    ++meta_kernel_calls;
    op.callBoxed(&meta);
  }
  MetaResult result(meta.size());
  for (size_t r = 0; r < meta.size(); ++r) {
    if (meta[r].isTensor()) {
      result[r].tensors.push_back(describe(meta[r].toTensor()));
    } else {
      result[r].is_list = true;
      for (const at::Tensor& t : meta[r].toTensorList()) result[r].tensors.push_back(describe(t));
    }
  }
  MetaEntry entry{std::move(result), std::move(buffer.warnings), {}};
  if (!cacheable) {
    thread_local MetaEntry uncached;
    uncached = std::move(entry);
    return given(uncached, false);
  }
  if (meta_cache.size() >= kMetaCacheEntries) meta_cache.clear();
  return given(meta_cache.emplace(std::move(owned), std::move(entry)).first->second, true);
}

const std::vector<std::string>& last_meta_warnings() { return last_warnings; }

uint64_t meta_kernel_calls_on_this_thread() { return meta_kernel_calls; }

MetaExtras* last_meta_extras() { return last_extras; }

}  // namespace torch_tpu
