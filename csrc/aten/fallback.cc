// Runs every ATen operator without a dedicated tpu kernel on the chip.
//
// Output shapes and strides come from the operator's meta kernel; outputs are
// allocated in the chip's HBM at once; the computation is queued on the
// current stream, where ATen's CPU kernel runs over host aliases of the
// device buffers. The caller does not wait. Operators whose results the host
// needs now (non-tensor returns) or whose output shapes depend on data (no
// meta kernel: nonzero, unique, masked_select, ...) synchronize and run at once.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <cstring>
#include <sstream>
#include <mutex>
#include <unordered_map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "aten/device.h"
#include "aten/eager_mode.h"
#include "aten/errors.h"
#include "aten/generator.h"
#include "aten/host_alias.h"
#include "aten/matmul_precision.h"
#include "aten/op_cost.h"
#include "aten/portability.h"
#include "aten/tensor_factory.h"

namespace torch_tpu {
namespace {

using c10::IValue;

// One argument as queued work keeps it: tensors as recipes (storage +
// metadata), everything else as a value usable by the CPU kernel.
struct QueuedArg {
  enum class Kind { kValue, kTensor, kTensorList, kOptionalTensorList } kind = Kind::kValue;
  IValue value;
  std::vector<std::optional<TensorRecipe>> tensors;
};

std::string op_label(const c10::FunctionSchema& schema) {
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  return name;
}

// Which argument a return aliases (-1: a fresh tensor), and whether it writes.
struct ReturnAlias {
  int arg = -1;
  bool write = false;
};

const c10::AliasInfo* alias_of(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info && info->beforeSets().empty() && !info->containedTypes().empty()) {
    return &info->containedTypes()[0];  // Tensor(a)[]
  }
  return info;
}

ReturnAlias return_alias(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* r = alias_of(schema.returns()[ret]);
  if (!r || r->beforeSets().empty()) return {};
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = alias_of(schema.arguments()[i]);
    if (a && a->beforeSets() == r->beforeSets()) return {static_cast<int>(i), r->isWrite()};
  }
  return {};
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns()) {
    const auto& type = r.type();
    if (type->kind() == c10::TypeKind::TensorType) continue;
    if (type->kind() == c10::TypeKind::ListType &&
        type->containedType(0)->kind() == c10::TypeKind::TensorType) {
      continue;
    }
    return false;
  }
  return true;
}

// Ops whose meta kernel is missing: learned on first use, then they go
// straight to the synchronous path.
std::mutex no_meta_mu;
std::unordered_set<std::string> ops_without_meta;

bool known_without_meta(const std::string& op) {
  std::lock_guard<std::mutex> lock(no_meta_mu);
  return ops_without_meta.count(op) > 0;
}

// The device the op runs on and a check that its tensors agree about it.
class DeviceCheck {
 public:
  explicit DeviceCheck(const std::string& op) : op_(op) {}
  void tensor(const at::Tensor& t, bool host_allowed) {
    if (!t.defined()) return;
    if (unsupported_on_tpu(t.scalar_type()) && !noted_) {
      note_unsupported(op_, t.scalar_type());
      noted_ = true;
    }
    if (t.device().type() == kTPU) {
      if (index_ < 0) {
        index_ = t.device().index();
      } else if (t.device().index() != index_) {
        TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
                    "devices, tpu:", index_, " and ", t.device(), "! (in ", op_, ")");
      }
      return;
    }
    // Host scalars mix with device tensors, as with CUDA; index lists may be on the host.
    if (t.device().is_cpu() && (t.dim() == 0 || host_allowed)) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu and ",
                t.device(), "! (in ", op_, ": argument of shape ", t.sizes(), " and dtype ",
                t.scalar_type(), " is on ", t.device(), ")");
  }
  void device(const c10::Device& d) {
    if (d.type() == kTPU && index_ < 0) index_ = resolve_index(d.has_index() ? d.index() : -1);
  }
  c10::DeviceIndex index() const { return index_ < 0 ? current_device() : index_; }

 private:
  const std::string& op_;
  c10::DeviceIndex index_ = -1;
  bool noted_ = false;
};

// The host engine random kernels use for a tpu op's Generator argument.
IValue host_generator(const IValue& v, c10::DeviceIndex device, const std::string& op) {
  at::Generator gen = v.isNone() ? default_generator(device) : v.toGenerator();
  TORCH_CHECK(gen.device().type() == kTPU, op, ": expected a generator on tpu, got one on ", gen.device());
  return IValue(at::check_generator<TPUGeneratorImpl>(gen)->host_engine());
}

bool is_generator_arg(const c10::Argument& a) {
  auto type = a.type();
  if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
  return type->kind() == c10::TypeKind::GeneratorType;
}

IValue map_device(const IValue& v, c10::DeviceType to) {
  if (v.isDevice() && v.toDevice().type() == kTPU) return IValue(c10::Device(to));
  return v;
}

// Converts the op's arguments into queued form; validates devices.
std::vector<QueuedArg> queue_args(const c10::FunctionSchema& schema, c10::ArrayRef<IValue> args,
                                  DeviceCheck& check, const std::string& op) {
  std::vector<QueuedArg> out(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& v = args[i];
    QueuedArg& q = out[i];
    // Host tensors are snapshots: the caller may change them once we return.
    auto recipe = [](const at::Tensor& t) {
      return TensorRecipe::of(t.device().is_cpu() ? t.clone() : t);
    };
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      check.tensor(t, false);
      q.kind = QueuedArg::Kind::kTensor;
      q.tensors.push_back(t.defined() ? std::optional<TensorRecipe>(recipe(t)) : std::nullopt);
    } else if (v.isTensorList()) {
      q.kind = QueuedArg::Kind::kTensorList;
      for (const at::Tensor& t : v.toTensorList()) {
        check.tensor(t, false);
        q.tensors.push_back(recipe(t));
      }
    } else if (v.isOptionalTensorList()) {
      q.kind = QueuedArg::Kind::kOptionalTensorList;
      for (const auto& e : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = e;
        if (t.has_value() && t->defined()) {
          check.tensor(*t, true);
          q.tensors.push_back(recipe(*t));
        } else {
          q.tensors.push_back(std::nullopt);
        }
      }
    } else {
      if (v.isDevice()) check.device(v.toDevice());
      q.value = v;
    }
  }
  c10::DeviceIndex device = check.index();
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_generator_arg(schema.arguments()[i])) {
      out[i].value = host_generator(args[i], device, op);
    } else if (out[i].kind == QueuedArg::Kind::kValue) {
      out[i].value = map_device(out[i].value, c10::kCPU);
    }
  }
  return out;
}

// Rebuilds arguments as tensors of `builder`'s device type.
torch::jit::Stack build_stack(const std::vector<QueuedArg>& args, AliasBuilder& builder) {
  torch::jit::Stack stack;
  stack.reserve(args.size());
  for (const auto& q : args) {
    switch (q.kind) {
      case QueuedArg::Kind::kValue:
        stack.push_back(q.value);
        break;
      case QueuedArg::Kind::kTensor:
        stack.push_back(q.tensors[0] ? builder.alias(*q.tensors[0]) : at::Tensor());
        break;
      case QueuedArg::Kind::kTensorList: {
        c10::List<at::Tensor> list;
        for (const auto& r : q.tensors) list.push_back(builder.alias(*r));
        stack.push_back(std::move(list));
        break;
      }
      case QueuedArg::Kind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (const auto& r : q.tensors) {
          list.push_back(r ? std::optional<at::Tensor>(builder.alias(*r)) : std::nullopt);
        }
        stack.push_back(std::move(list));
        break;
      }
    }
  }
  return stack;
}

// Meta arguments: tpu tensors become meta tensors (host scalars stay), tpu
// devices become meta, generators are dropped (meta kernels draw nothing).
torch::jit::Stack meta_stack(const c10::FunctionSchema& schema, c10::ArrayRef<IValue> args) {
  AliasBuilder meta(c10::kMeta);
  auto to_meta = [&](const at::Tensor& t) {
    return (t.defined() && t.device().type() == kTPU) ? meta.alias(t) : t;
  };
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

// What the meta kernel said about one returned tensor.
struct TensorMeta {
  bool defined = false;
  c10::DimVector sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};
struct ReturnMeta {
  bool is_list = false;
  std::vector<TensorMeta> tensors;
};
using MetaResult = std::vector<ReturnMeta>;

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

// Meta kernels are slow (many are Python registrations): their results are
// cached per thread, keyed by the op and everything a meta kernel can see.
struct MetaKey {
  const void* op;
  std::vector<int64_t> words;
  bool operator==(const MetaKey& o) const { return op == o.op && words == o.words; }
};
struct MetaKeyHash {
  size_t operator()(const MetaKey& k) const {
    size_t h = std::hash<const void*>()(k.op);
    for (int64_t w : k.words) h = h * 1000003u ^ std::hash<int64_t>()(w);
    return h;
  }
};
constexpr size_t kMetaCacheEntries = 1 << 16;
thread_local std::unordered_map<MetaKey, MetaResult, MetaKeyHash> meta_cache;

class KeyWriter {
 public:
  explicit KeyWriter(std::vector<int64_t>& w) : w_(w) {}
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
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      w_.insert(w_.end(), {12, bits});
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
  std::vector<const void*> storages_;
};

// Runs the meta kernel (or reuses its cached answer). Throws what it throws.
MetaResult meta_result(const c10::OperatorHandle& op, c10::ArrayRef<IValue> args) {
  MetaKey key{&op.schema(), {}};
  key.words.reserve(64);
  KeyWriter writer(key.words);
  bool cacheable = true;
  for (const IValue& v : args) cacheable = cacheable && writer.value(v);
  if (cacheable) {
    auto it = meta_cache.find(key);
    if (it != meta_cache.end()) return it->second;
  }
  torch::jit::Stack meta = meta_stack(op.schema(), args);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
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
  if (cacheable) {
    if (meta_cache.size() >= kMetaCacheEntries) meta_cache.clear();
    meta_cache.emplace(std::move(key), result);
  }
  return result;
}

bool meta_has_lists(const MetaResult& meta) {
  for (const auto& r : meta) {
    if (r.is_list) return true;
  }
  return false;
}

// The out= overload of a functional op: same arguments followed by one
// kwarg-only Tensor(a!) per return ("add.Tensor" -> "add.out"). Cached.
std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const std::string& overload = schema.overload_name();
  for (const std::string& name : {overload.empty() ? std::string("out") : overload + "_out",
                                  std::string("out")}) {
    auto handle = c10::Dispatcher::singleton().findOp({schema.name(), name});
    if (!handle) continue;
    const auto& out = handle->schema();
    const size_t n = schema.arguments().size(), r = schema.returns().size();
    if (out.arguments().size() != n + r || out.returns().size() != r) continue;
    bool same = true;
    for (size_t i = 0; i < n && same; ++i) {
      same = out.arguments()[i].name() == schema.arguments()[i].name() &&
             *out.arguments()[i].type() == *schema.arguments()[i].type();
    }
    for (size_t i = n; i < n + r && same; ++i) {
      const auto* a = out.arguments()[i].alias_info();
      same = a && a->isWrite() && out.arguments()[i].kwarg_only() &&
             out.arguments()[i].type()->kind() == c10::TypeKind::TensorType;
    }
    if (same) return handle;
  }
  return std::nullopt;
}

std::optional<c10::OperatorHandle> out_variant(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::optional<c10::OperatorHandle>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(&op.schema());
  if (it == cache.end()) it = cache.emplace(&op.schema(), find_out_variant(op)).first;
  return it->second;
}

// A tpu tensor laid out as `m` says: a view of the aliased argument, the
// argument itself when written, or a fresh HBM tensor.
at::Tensor tpu_result(const TensorMeta& m, const ReturnAlias& alias, const at::Tensor& aliased,
                      c10::DeviceIndex device) {
  if (alias.arg >= 0 && aliased.defined()) {
    if (alias.write) {
      if (!aliased.sizes().equals(m.sizes) || !aliased.strides().equals(m.strides) ||
          aliased.storage_offset() != m.offset) {
        set_metadata(aliased, m.sizes, m.strides, m.offset);  // an out= argument the op resized
      }
      return aliased;
    }
    return aliased.as_strided(m.sizes, m.strides, m.offset);
  }
  return empty_tpu(m.sizes, m.strides, m.dtype, device);
}

// The tpu tensor(s) aliased by return `r`, or undefined ones.
std::vector<at::Tensor> aliased_tensors(c10::ArrayRef<IValue> args, const ReturnAlias& alias) {
  std::vector<at::Tensor> out;
  if (alias.arg < 0) return out;
  const IValue& v = args[alias.arg];
  if (v.isTensor()) out.push_back(v.toTensor());
  if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
  return out;
}

std::vector<at::Tensor> result_tensors(const std::vector<IValue>& results) {
  std::vector<at::Tensor> out;
  for (const auto& v : results) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) out.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
    }
  }
  return out;
}

// Synchronous path: wait for the chip, run the CPU kernel on host aliases now.
void run_now(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<IValue> args(stack->end() - num_args, stack->end());
  DeviceCheck check(label);
  auto queued = queue_args(schema, args, check, label);
  c10::DeviceIndex device = check.index();
  synchronize_device(device);

  AliasBuilder host(c10::kCPU);
  auto cpu = build_stack(queued, host);
  // out= arguments get fresh host tensors: the CPU kernel may resize them.
  std::vector<bool> is_out(num_args, false);
  for (size_t i = 0; i < num_args; ++i) {
    const auto* a = alias_of(schema.arguments()[i]);
    if (a && a->isWrite() && schema.arguments()[i].kwarg_only() && cpu[i].isTensor()) {
      is_out[i] = true;
      cpu[i] = at::empty({0}, cpu[i].toTensor().options());
    }
  }
  std::vector<IValue> cpu_args(cpu.begin(), cpu.end());
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    call_with_matmul_precision(op, &cpu, at::globalContext().float32MatmulPrecision());
  }
  for (size_t i = 0; i < num_args; ++i) {
    if (!is_out[i]) continue;
    const auto& result = cpu_args[i].toTensor();
    const auto& tpu = args[i].toTensor();
    set_metadata_like(tpu, result);
    host_alias(tpu).copy_(result);
  }
  torch::jit::drop(*stack, num_args);
  for (size_t r = 0; r < cpu.size(); ++r) {
    ReturnAlias alias = return_alias(schema, r);
    auto aliased = aliased_tensors(args, alias);
    auto convert = [&](const at::Tensor& t, size_t k) -> at::Tensor {
      if (!t.defined()) return t;
      if (alias.arg >= 0 && k < aliased.size()) {
        if (alias.write) return aliased[k];
        return aliased[k].as_strided(t.sizes(), t.strides(), t.storage_offset());
      }
      auto out = empty_tpu(t.sizes(), t.strides(), t.scalar_type(), device);
      host_alias(out).copy_(t);  // nothing is queued on a fresh tensor
      return out;
    };
    IValue& v = cpu[r];
    if (v.isTensor()) {
      stack->push_back(convert(v.toTensor(), 0));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      size_t k = 0;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(convert(t, k++));
      stack->push_back(std::move(list));
    } else {
      stack->push_back(v);
    }
  }
  std::vector<IValue> returned(stack->end() - cpu.size(), stack->end());
  chip(device).record_cost(
      op_cost(schema, args, result_tensors(returned), at::globalContext().float32MatmulPrecision()));
}

void strict_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label) {
  const auto& schema = op.schema();
  if (!returns_only_tensors(schema) || known_without_meta(label)) {
    run_now(op, stack, label);
    return;
  }
  const size_t num_args = schema.arguments().size();
  c10::ArrayRef<IValue> args(&*(stack->end() - num_args), num_args);

  DeviceCheck check(label);
  auto queued = queue_args(schema, args, check, label);
  c10::DeviceIndex device = check.index();

  // Shapes, strides and argument errors come from the meta kernel, here.
  MetaResult meta;
  try {
    meta = meta_result(op, args);
  } catch (const std::exception& e) {
    // No meta kernel (or one raising from Python): remember, and run now.
    // Other meta errors may be stricter than the CPU kernel (data-dependent
    // checks): the real kernel decides, raising the CPU's own error.
    bool no_meta = dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr ||
                   std::string(e.what()).find("NotImplementedError") != std::string::npos;
    if (no_meta) {
      std::lock_guard<std::mutex> lock(no_meta_mu);
      ops_without_meta.insert(label);
    }
    run_now(op, stack, label);
    return;
  }

  // Allocate results now; the work fills them later.
  std::vector<IValue> results;
  std::vector<TensorRecipe> fresh;      // results the work must copy into
  std::vector<std::pair<size_t, size_t>> fresh_slot;  // (return, list index)
  for (size_t r = 0; r < meta.size(); ++r) {
    ReturnAlias alias = return_alias(schema, r);
    auto aliased = aliased_tensors(args, alias);
    auto make = [&](const TensorMeta& m, size_t k) {
      if (!m.defined) return at::Tensor();
      at::Tensor base = k < aliased.size() ? aliased[k] : at::Tensor();
      at::Tensor t = tpu_result(m, alias, base, device);
      if (alias.arg < 0) {
        fresh.push_back(TensorRecipe::of(t));
        fresh_slot.emplace_back(r, k);
      }
      return t;
    };
    if (!meta[r].is_list) {
      results.emplace_back(make(meta[r].tensors[0], 0));
    } else {
      c10::List<at::Tensor> list;
      for (size_t k = 0; k < meta[r].tensors.size(); ++k) list.push_back(make(meta[r].tensors[k], k));
      results.emplace_back(std::move(list));
    }
  }
  // out= arguments may have been resized by the meta kernel: refresh recipes.
  for (size_t i = 0; i < num_args; ++i) {
    if (queued[i].kind == QueuedArg::Kind::kTensor && queued[i].tensors[0] && args[i].isTensor() &&
        args[i].toTensor().device().type() == kTPU) {
      queued[i].tensors[0] = TensorRecipe::of(args[i].toTensor());
    }
  }

  bool pure_view = fresh.empty();
  for (size_t r = 0; r < meta.size() && pure_view; ++r) pure_view = !return_alias(schema, r).write;
  bool writes_args = false;
  for (const auto& a : schema.arguments()) writes_args |= (alias_of(a) && alias_of(a)->isWrite());
  if (!(pure_view && !writes_args)) {
    auto& stream = current_vtpu_stream(device);
    const auto precision = at::globalContext().float32MatmulPrecision();
    chip(device).record_cost(op_cost(schema, args, result_tensors(results), precision));
    // With an out= overload the CPU kernel writes straight into HBM.
    // (Not for products at reduced precision: their passes need temporaries.)
    std::optional<c10::OperatorHandle> out_op;
    if (!fresh.empty() && fresh.size() == schema.returns().size() && !meta_has_lists(meta) &&
        (precision == at::Float32MatmulPrecision::HIGHEST || !is_matmul_family(op))) {
      out_op = out_variant(op);
    }
    if (out_op) {
      stream.enqueue(label, [op = *out_op, queued = std::move(queued), fresh = std::move(fresh)] {
        AliasBuilder host(c10::kCPU);
        auto cpu = build_stack(queued, host);
        for (const auto& r : fresh) cpu.push_back(host.alias(r));
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        op.callBoxed(&cpu);
      });
      torch::jit::drop(*stack, num_args);
      for (auto& v : results) stack->push_back(std::move(v));
      return;
    }
    stream.enqueue(label, [op, queued = std::move(queued), fresh = std::move(fresh),
                           fresh_slot = std::move(fresh_slot), precision] {
      AliasBuilder host(c10::kCPU);
      auto cpu = build_stack(queued, host);
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      call_with_matmul_precision(op, &cpu, precision);
      for (size_t i = 0; i < fresh.size(); ++i) {
        auto [r, k] = fresh_slot[i];
        const IValue& v = cpu[r];
        at::Tensor result = v.isTensor() ? v.toTensor() : v.toTensorList().get(k);
        host.alias(fresh[i]).copy_(result);
      }
    });
  }
  torch::jit::drop(*stack, num_args);
  for (auto& v : results) stack->push_back(std::move(v));
}

// --- debug mode ----------------------------------------------------------

std::string describe(const IValue& v) {
  std::ostringstream out;
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) {
      out << "None";
      return;
    }
    out << c10::toString(t.scalar_type()) << t.sizes() << " " << t.device();
  };
  if (v.isTensor()) {
    tensor(v.toTensor());
  } else if (v.isTensorList()) {
    const char* sep = "";
    out << "[";
    for (const at::Tensor& t : v.toTensorList()) out << sep, tensor(t), sep = ", ";
    out << "]";
  } else if (v.isOptionalTensorList()) {
    const char* sep = "";
    out << "[";
    for (const auto& e : v.toOptionalTensorList()) {
      std::optional<at::Tensor> t = e;
      out << sep;
      tensor(t.has_value() ? *t : at::Tensor());
      sep = ", ";
    }
    out << "]";
  } else {
    out << v;
  }
  return out.str();
}

std::string signature(const std::string& label, const std::vector<IValue>& args) {
  std::string s = label + "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + describe(args[i]);
  return s + ")";
}

// First index outside [low, high) of an integer index tensor, if any.
std::optional<int64_t> out_of_range(const at::Tensor& index, int64_t low, int64_t high) {
  if (!index.defined() || index.numel() == 0 || !c10::isIntegralType(index.scalar_type(), false)) {
    return std::nullopt;
  }
  at::Tensor host = index.device().type() == kTPU ? host_alias(index) : index;
  at::Tensor bad = host.lt(low).logical_or(host.ge(high));
  if (!bad.any().item<bool>()) return std::nullopt;
  return host.flatten().index({bad.flatten()})[0].item<int64_t>();
}

// Bounds of the index ops DESIGN.md lists; the chip has been synchronized.
void check_index_bounds(const std::string& name, const std::vector<IValue>& args) {
  auto tensor = [&](size_t i) { return i < args.size() && args[i].isTensor() ? args[i].toTensor() : at::Tensor(); };
  auto dim_size = [](const at::Tensor& t, int64_t dim) { return t.dim() == 0 ? 1 : t.size(c10::maybe_wrap_dim(dim, t.dim())); };
  auto fail = [&](int64_t bad, int64_t size, const std::string& what) {
    TORCH_CHECK_INDEX(false, name, ": index ", bad, " is out of bounds for ", what, " with size ", size);
  };
  if (name == "aten::index_select" || name == "aten::gather" || name == "aten::scatter" ||
      name == "aten::scatter_add" || name == "aten::scatter_reduce") {
    const at::Tensor self = tensor(0), index = tensor(2);
    if (!self.defined() || !args[1].isInt()) return;
    const int64_t dim = args[1].toInt();
    const int64_t size = dim_size(self, dim);
    if (auto bad = out_of_range(index, 0, size)) fail(*bad, size, "dimension " + std::to_string(dim));
  } else if (name == "aten::embedding" || name == "aten::embedding_dense_backward") {
    const at::Tensor weight = tensor(0), indices = tensor(1);
    if (weight.defined() && weight.dim() > 0) {
      if (auto bad = out_of_range(indices, 0, weight.size(0))) fail(*bad, weight.size(0), "embedding rows");
    }
  } else if (name == "aten::take") {
    const at::Tensor self = tensor(0);
    if (auto bad = out_of_range(tensor(1), -self.numel(), self.numel())) fail(*bad, self.numel(), "the flattened input");
  } else if (name == "aten::index" || name == "aten::index_put" || name == "aten::_index_put_impl" ||
             name == "aten::index_put_") {
    const at::Tensor self = tensor(0);
    if (!self.defined() || args.size() < 2 || !args[1].isOptionalTensorList()) return;
    int64_t dim = 0;
    for (const auto& e : args[1].toOptionalTensorList()) {
      std::optional<at::Tensor> idx = e;
      if (idx.has_value() && idx->defined() && idx->scalar_type() == at::kBool) {
        dim += idx->dim();
        continue;
      }
      if (idx.has_value() && idx->defined() && dim < self.dim()) {
        const int64_t size = self.size(dim);
        if (auto bad = out_of_range(*idx, -size, size)) fail(*bad, size, "dimension " + std::to_string(dim));
      }
      ++dim;
    }
  }
}

void check_results_finite(const std::string& label, const torch::jit::Stack& stack, size_t num_returns) {
  for (size_t r = stack.size() - num_returns; r < stack.size(); ++r) {
    auto check = [&](const at::Tensor& t) {
      if (!t.defined() || !c10::isFloatingType(t.scalar_type()) || t.numel() == 0) return;
      at::Tensor host = t.device().type() == kTPU ? host_alias(t) : t;
      TORCH_CHECK(host.isfinite().all().item<bool>(), label, " produced NaN or Inf (TORCH_TPU_CHECK_FINITE=1): output ",
                  c10::toString(t.scalar_type()), t.sizes());
    };
    if (stack[r].isTensor()) check(stack[r].toTensor());
    if (stack[r].isTensorList()) for (const at::Tensor& t : stack[r].toTensorList()) check(t);
  }
}

// Runs the op synchronously on the calling thread, checking what debug mode
// promises; errors carry the op, its arguments and the Python source line.
void debug_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<IValue> args(stack->end() - num_args, stack->end());
  try {
    DeviceCheck check(label);
    for (const auto& v : args) {
      if (v.isTensor()) check.tensor(v.toTensor(), true);
    }
    synchronize_device(check.index());
    check_index_bounds(schema.name(), args);
    run_now(op, stack, label);
    synchronize_device(check.index());
    if (check_finite()) check_results_finite(label, *stack, schema.returns().size());
  } catch (c10::Error& e) {
    const std::string where = source_line();
    e.add_context("[tpu debug mode] in " + signature(label, args) + (where.empty() ? "" : " at " + where));
    throw;
  }
}

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string label = op_label(op.schema());
  TORCH_CHECK_NOT_IMPLEMENTED(label.find("sparse") == std::string::npos,
                              label, ": sparse tensors are not supported on tpu (TPUs have no "
                              "sparse layouts); use dense tensors");
  if (eager_mode() == EagerMode::kDebug) {
    debug_fallback(op, stack, label);
  } else {
    strict_fallback(op, stack, label);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
}

}  // namespace torch_tpu

namespace torch_tpu {
// ATen routes convolutions of unknown backends to *_overrideable stubs; the
// fallback runs the real CPU convolution over device buffers instead.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
}
}  // namespace torch_tpu

namespace torch_tpu {
namespace {
// Sparse layouts on tpu: a clear error instead of "could not run ... Sparsetpu".
void sparse_not_supported(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op_label(op.schema()),
                              ": sparse tensors are not supported on tpu (TPUs have no sparse "
                              "layouts); use dense (strided) tensors");
}
}  // namespace
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_not_supported>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_not_supported>());
}
}  // namespace torch_tpu
