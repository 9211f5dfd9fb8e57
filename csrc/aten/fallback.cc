// Runs every ATen operator without a dedicated tpu kernel on the chip.
//
// Output shapes and strides come from the operator's meta kernel; outputs are
// allocated in the chip's HBM at once; the computation is queued on the
// current stream, where ATen's CPU kernel runs over host aliases of the
// device buffers. The caller does not wait. Operators whose results the host
// needs now (non-tensor returns) or whose output shapes depend on data (no
// meta kernel: nonzero, unique, masked_select, ...) synchronize and run at once.
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "aten/fallback_internal.h"
#include "aten/matmul_precision.h"
#include "aten/meta_cache.h"
#include "aten/op_cost.h"
#include "aten/op_info.h"
#include "aten/portability.h"
#include "aten/random_ops.h"
#include "aten/scalar_class.h"
#include "defer/defer.h"
#include "runtime/allocator.h"
#include "runtime/calling_thread.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/eager_mode.h"
#include "runtime/errors.h"
#include "runtime/generator.h"
#include "runtime/host_alias.h"
#include "runtime/host_result_offer.h"
#include "runtime/kernel_warnings.h"
#include "runtime/tensor_factory.h"

namespace torch_tpu {

// A copy of a contiguous host tensor (a wrapped Python scalar above all: `a * 2.0`) as a
// recipe over a fresh host buffer: one memcpy on this thread, where clone() dispatches
// (~5k instructions for a 0-d tensor). Same sizes and strides as clone() gives a dense
// tensor. An empty recipe (no storage) for anything else: conj/neg views, other layouts.
TensorRecipe dense_host_snapshot(const at::Tensor& t) {
  TensorRecipe r;
  if (t.layout() != c10::kStrided || !t.has_storage() || t.is_conj() || t.is_neg() || !t.is_contiguous()) return r;
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.itemsize();
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(), /*resizable=*/true);
  if (nbytes > 0) std::memcpy(storage.mutable_data(), t.const_data_ptr(), nbytes);
  r.storage = std::move(storage);
  r.sizes.assign(t.sizes().begin(), t.sizes().end());
  r.strides.assign(t.strides().begin(), t.strides().end());
  r.dtype = t.dtype();
  return r;
}

namespace {

using c10::IValue;

thread_local StrictCapture* next_capture = nullptr;

// One argument as queued work keeps it: tensors as recipes (storage +
// metadata), everything else as a value usable by the CPU kernel.
struct QueuedArg {
  enum class Kind { kValue, kTensor, kTensorList, kOptionalTensorList } kind = Kind::kValue;
  IValue value;
  c10::SmallVector<std::optional<TensorRecipe>, 1> tensors;  // one tensor: no heap allocation
};

// What a tpu op's Generator argument becomes in queued work: the host engine
// random kernels draw from (TORCH_TPU_RNG=cpu), or the op's reserved philox
// positions (see philox_generator_arg).
IValue host_generator(const IValue& v, c10::DeviceIndex device, const c10::OperatorHandle& op,
                      c10::ArrayRef<IValue> args, const std::string& label) {
  at::Generator gen = v.isNone() ? default_generator(device) : v.toGenerator();
  TORCH_CHECK(gen.device().type() == kTPU, label, ": expected a generator on tpu, got one on ", gen.device());
  auto* impl = at::check_generator<TPUGeneratorImpl>(gen);
  if (impl->kind() == RngKind::kCpu) return IValue(impl->host_engine());
  return philox_generator_arg(*impl, op, args);
}

bool holds_philox_arg(const std::vector<QueuedArg>& args) {
  for (const auto& q : args)
    if (q.kind == QueuedArg::Kind::kValue && is_philox_arg(q.value)) return true;
  return false;
}

// Whether every tensor argument is contiguous in the default layout. A convolution of
// channels-last operands returns a channels-last result where its meta kernel (and so the HBM
// result) says contiguous: offered the result's block it would need a clone and a copy, one
// more than it takes from a host temporary.
bool tensors_contiguous(const torch::jit::Stack& stack) {
  for (const IValue& v : stack) {
    if (v.isTensor() && !v.toTensor().is_contiguous()) return false;
  }
  return true;
}

// The CPU kernel, or the philox kernel for ops whose positions were reserved.
void call_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, at::Float32MatmulPrecision precision,
                      bool philox) {
  if (philox) return run_philox_op(op, stack);
  call_with_matmul_precision(op, stack, precision);
}

// Converts the op's arguments into queued form; validates devices.
std::vector<QueuedArg> queue_args(const c10::OperatorHandle& handle, c10::ArrayRef<IValue> args, DeviceCheck& check,
                                  const std::string& op) {
  const c10::FunctionSchema& schema = handle.schema();
  std::vector<QueuedArg> out(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& v = args[i];
    QueuedArg& q = out[i];
    const c10::AliasInfo* alias = alias_of(schema.arguments()[i]);
    const bool written = alias && alias->isWrite();
    // Host tensors are snapshots: the caller may change them once we return.
    // Device tensors: the work reaches their bytes in stream order (allocator.h).
    auto recipe = [](const at::Tensor& t) {
      if (!t.device().is_cpu()) return stream_ordered_recipe(t, current_vtpu_stream_unflushed(t.device().index()));
      TensorRecipe r = dense_host_snapshot(t);
      if (!r.storage) r = TensorRecipe::of(t.clone());
      r.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();  // keeps type promotion
      return r;
    };
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      check.tensor(t, false, written);
      q.kind = QueuedArg::Kind::kTensor;
      if (t.defined()) {
        q.tensors.emplace_back(recipe(t));
      } else {
        q.tensors.emplace_back(std::nullopt);
      }
    } else if (v.isTensorList()) {
      q.kind = QueuedArg::Kind::kTensorList;
      for (const at::Tensor& t : v.toTensorList()) {
        check.tensor(t, false, written);
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
      out[i].value = host_generator(args[i], device, handle, args, op);
    } else if (out[i].kind == QueuedArg::Kind::kValue) {
      out[i].value = map_device(out[i].value, c10::kCPU);
    }
  }
  return out;
}

// Strict mode raises argument and dtype errors at the call, as CPU does. Meta
// kernels check shapes; what only the CPU kernel checks (unsupported dtypes,
// scalar arguments out of range, casting rules) is learned from the first call
// of each signature, which runs synchronously: the op, every argument's device,
// dtype and rank, and each scalar's kind (type, sign, the widest dtype it fits,
// small integers and strings exactly). A signature whose call failed is not
// remembered, so it raises each time; later calls with a remembered signature
// are queued, and only their data-dependent failures stay asynchronous.
class SignatureKey {
 public:
  explicit SignatureKey(const void* op) : h_(reinterpret_cast<uintptr_t>(op)) {}
  void add(uint64_t v) { h_ = (h_ ^ (v + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2))) * 0xff51afd7ed558ccdull; }
  void tensor(const at::Tensor& t) {
    if (!t.defined()) return add(1);
    add(2 + (t.device().type() == kTPU ? 0 : 1));
    add(static_cast<uint64_t>(t.scalar_type()) << 8 | static_cast<uint64_t>(t.dim()) << 1 |
        t.unsafeGetTensorImpl()->is_wrapped_number());
    add(t.numel() == 0);
  }
  void integer(int64_t v) {
    if (v >= -64 && v < 64) return add(static_cast<uint64_t>(v + 100));  // dims, dtypes, enums: exact
    add(1000 + (v < 0));
    add(magnitude_class(v < 0 ? ~static_cast<uint64_t>(v) : static_cast<uint64_t>(v)));  // sign and range
  }
  void real(double d) { add(2000 + double_class(d)); }
  void value(const IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTensorList()) {
      add(3000 + v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList()) tensor(t);
    } else if (v.isOptionalTensorList()) {
      add(4000 + v.toOptionalTensorList().size());
      for (const auto& e : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = e;
        tensor(t.has_value() ? *t : at::Tensor());
      }
    } else if (v.isBool()) {
      add(5000 + v.toBool());
    } else if (v.isInt()) {
      add(5002), integer(v.toInt());
    } else if (v.isDouble()) {
      real(v.toDouble());
    } else if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      add(5003), real(c.real()), real(c.imag());
    } else if (v.isIntList()) {
      add(6000 + v.toIntList().size());
      for (int64_t i : v.toIntList()) integer(i);
    } else if (v.isDoubleList()) {
      add(7000 + v.toDoubleList().size());
      for (double d : v.toDoubleList()) real(d);
    } else if (v.isBoolList()) {  // output_mask: which results a backward kernel computes and checks
      add(7500 + v.toBoolList().size());
      for (bool b : v.toBoolList()) add(5000 + b);
    } else if (v.isString()) {
      add(8000 + std::hash<std::string>()(v.toStringRef()));
    } else if (v.isDevice()) {
      add(9000 + static_cast<uint64_t>(v.toDevice().type()));
    } else {
      add(10000 + std::hash<std::string>()(v.tagKind()));  // None, generator, ...: by kind
    }
  }
  uint64_t hash() const { return h_; }

 private:
  uint64_t h_;
};

// How a written (out= or in-place) argument overlaps itself and the op's other tensors, as
// the CPU kernel's memory-overlap checks see it: metadata that no meta kernel checks. A
// written tensor is compared with every other tensor argument; an element of a written list
// with the same position of the other lists (foreach ops), to stay linear in the lists.
void add_overlaps(SignatureKey& key, const c10::FunctionSchema& schema, c10::ArrayRef<IValue> args) {
  auto status = [](const at::Tensor& a, const at::Tensor& b) -> uint64_t {
    if (!a.defined() || !b.defined() || !a.has_storage() || !b.has_storage()) return 0;
    return 1 + static_cast<uint64_t>(at::get_overlap_status(a, b));
  };
  auto others = [&](size_t skip, size_t k, bool single, const at::Tensor& w) {
    for (size_t j = 0; j < args.size(); ++j) {
      if (j == skip) continue;
      if (args[j].isTensor()) {
        key.add(status(w, args[j].toTensor()));
      } else if (args[j].isTensorList()) {
        const auto list = args[j].toTensorList();
        if (single) {
          for (const at::Tensor& t : list) key.add(status(w, t));
        } else if (k < list.size()) {
          key.add(status(w, list.get(k)));
        }
      }
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = alias_of(schema.arguments()[i]);
    if (!alias || !alias->isWrite()) continue;
    if (args[i].isTensor()) {
      const at::Tensor& w = args[i].toTensor();
      if (!w.defined()) continue;
      key.add(20000 + static_cast<uint64_t>(at::has_internal_overlap(w)));
      others(i, 0, true, w);
    } else if (args[i].isTensorList()) {
      const auto list = args[i].toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        const at::Tensor w = list.get(k);
        key.add(20000 + static_cast<uint64_t>(at::has_internal_overlap(w)));
        others(i, k, false, w);
      }
    }
  }
}

uint64_t signature_key(const c10::OperatorHandle& op, c10::ArrayRef<IValue> args, const OpInfo& info) {
  SignatureKey key(&op.schema());
  for (const IValue& v : args) key.value(v);
  if (info.writes_args) add_overlaps(key, op.schema(), args);
  return key.hash();
}

constexpr size_t kValidatedSignatures = 1 << 16;
thread_local std::unordered_set<uint64_t> validated_signatures;

// Off with TORCH_TPU_VALIDATE_FIRST_CALL=0 (every strict call queued at once, as before).
std::atomic<bool>& validate_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("TORCH_TPU_VALIDATE_FIRST_CALL");
    return !(v && std::string(v) == "0");
  }()};
  return on;
}
bool validate_first_calls() { return validate_flag().load(std::memory_order_relaxed); }

// Runs `work` on `stream`'s worker after the work queued before it and waits for it; its failure
// is raised here with the CPU kernel's own exception type and message, its warnings (but those in
// `known`) are given here. An earlier op's failure stays for the next synchronization rather than
// being raised at an unrelated op.
template <typename Work>
void run_on_worker_and_wait(vtpu::Stream& stream, const std::string& label, Work&& work,
                            std::vector<std::string> known = {}) {
  struct Outcome {
    std::exception_ptr failure;
    std::vector<c10::Warning> warnings;
  };
  auto outcome = std::make_shared<Outcome>();
  stream.enqueue_named(label.c_str(), [work = std::forward<Work>(work), known = std::move(known), outcome] {
    try {
      run_collecting_warnings(std::cref(work), known, outcome->warnings);
    } catch (...) {
      outcome->failure = std::current_exception();
    }
  });
  wait_stream_idle(stream);
  rewarn(outcome->warnings);  // at the call, on the calling thread, before a failure as on CPU
  if (outcome->failure) std::rethrow_exception(outcome->failure);
}

// Queues `work` on `stream`; a signature not yet seen on this thread runs now
// (on the stream, waited for) and its failure is raised here with the CPU
// kernel's own exception type and message. `fresh_bytes`: HBM bytes of the
// results allocated for it (bounds host run-ahead, vtpu::Stream::enqueue_named).
// `extras` (the call's meta-cache entry, or null) remembers a passed validation.
// One closure per op: `work` is moved into the queued one (no second std::function).
template <typename Work>
void enqueue_or_validate(vtpu::Stream& stream, const std::string& label, uint64_t key, bool validate,
                         MetaExtras* extras, uint64_t fresh_bytes, Work&& work) {
  std::vector<std::string> known = last_meta_warnings();
  if (!validate) {
    enqueue_sized(
        stream, label.c_str(),
        [work = std::forward<Work>(work), known = std::move(known), issuer = std::this_thread::get_id()] {
          queue_warnings(issuer, run_collecting_warnings(std::cref(work), known));
        },
        fresh_bytes);
    return;
  }
  run_on_worker_and_wait(stream, label, std::forward<Work>(work), std::move(known));
  if (validated_signatures.size() >= kValidatedSignatures) validated_signatures.clear();
  validated_signatures.insert(key);
  if (extras) extras->validated = true;
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

// A view of `aliased`'s storage with the given layout and dtype (view_as_real,
// view_as_complex and view(dtype) change the dtype; as_strided cannot).
at::Tensor view_of(const at::Tensor& aliased, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset,
                   c10::ScalarType dtype) {
  if (dtype == aliased.scalar_type()) return aliased.as_strided(sizes, strides, offset);
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(aliased.storage()), aliased.key_set(),
                                                             c10::scalarTypeToTypeMeta(dtype));
  view.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return view;
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
    return view_of(aliased, m.sizes, m.strides, m.offset, m.dtype);
  }
  return empty_tpu(m.sizes, m.strides, m.dtype, device);
}

// The blocks of the results an op allocates afresh (returns that alias no argument), in
// order: a block freed in stream order on the current stream where one fits, else a new one.
class FreshBlocks {
 public:
  FreshBlocks(const MetaResult& meta, const OpInfo& info, c10::DeviceIndex device) {
    for (size_t r = 0; r < meta.size(); ++r) {
      if (info.returns[r].arg >= 0) continue;
      for (const TensorMeta& m : meta[r].tensors) {
        if (!m.defined) continue;
        if (!stream_) stream_ = &current_vtpu_stream(device);
        size_t nbytes = 0;
        uint64_t physical = 0;
        tpu_buffer_bytes(m.sizes, m.strides, c10::elementSize(m.dtype), &nbytes, &physical);
        reused_.push_back({tpu_allocator().reuse_on(device, nbytes, physical, *stream_), nbytes});
        if (!reused_.back().first) fresh_bytes_ += nbytes;
      }
    }
  }
  // HBM bytes of the results that take a new block.
  uint64_t fresh_bytes() const { return fresh_bytes_; }
  vtpu::Stream* stream() const { return stream_; }
  // The next fresh result, laid out as `m` says.
  at::Tensor take(const TensorMeta& m, c10::DeviceIndex device) {
    auto& [block, nbytes] = reused_[next_++];
    if (!block) return empty_tpu(m.sizes, m.strides, m.dtype, device);
    return tpu_tensor_in(std::move(block), m.sizes, m.strides, m.dtype, nbytes);
  }

 private:
  vtpu::Stream* stream_ = nullptr;
  c10::SmallVector<std::pair<c10::DataPtr, size_t>, 2> reused_;  // (reused block or empty, nbytes)
  uint64_t fresh_bytes_ = 0;
  size_t next_ = 0;
};

// The tpu tensor(s) aliased by return `r`, or undefined ones.
std::vector<at::Tensor> aliased_tensors(c10::ArrayRef<IValue> args, const ReturnAlias& alias) {
  std::vector<at::Tensor> out;
  if (alias.arg < 0) return out;
  const IValue& v = args[alias.arg];
  if (v.isTensor()) out.push_back(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
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

// Calls whose meta kernel disagrees with the CPU kernel, though the op's others agree:
// factories into an out= of the right element count but another shape or strides (CPU
// fills it as it is; the meta reference resizes it), nansum over dim=[] (CPU reduces
// every dimension; the meta kernel none).
bool meta_disagrees_here(const OpInfo& info, const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  if (info.meta_check == OpInfo::MetaCheck::kNone) return false;
  const size_t n = schema.arguments().size();
  auto arg = [&](size_t i) -> const IValue& { return stack[stack.size() - n + i]; };
  // Whether one of the tensor arguments at `positions` is defined and not of `dtype`.
  auto other_dtype = [&](std::initializer_list<size_t> positions, at::ScalarType dtype) {
    return std::any_of(positions.begin(), positions.end(), [&](size_t i) {
      return arg(i).isTensor() && arg(i).toTensor().defined() && arg(i).toTensor().scalar_type() != dtype;
    });
  };
  if (info.meta_check == OpInfo::MetaCheck::kFactoryOut) {
    const IValue& out = arg(n - 1);
    if (!out.isTensor()) return false;
    const at::Tensor& t = out.toTensor();
    return t.defined() && t.numel() > 0 && (t.dim() != 1 || !t.is_contiguous());
  }
  if (info.meta_check == OpInfo::MetaCheck::kLayerNormDtype) {  // input, normalized_shape, weight, bias, eps
    if (dry_run()) return false;                                // no CPU results to take shapes from
    const at::ScalarType dtype = arg(0).toTensor().scalar_type();
    return (dtype != at::kFloat && dtype != at::kDouble) || other_dtype({2, 3}, dtype);
  }
  if (info.meta_check == OpInfo::MetaCheck::kGroupNormDtype) {  // input, weight, bias, N, C, HxW, ...
    if (dry_run() || !arg(0).isTensor()) return false;
    return other_dtype({1, 2}, arg(0).toTensor().scalar_type());
  }
  if (info.meta_check == OpInfo::MetaCheck::kBatchNormBackwardMask) {  // ..., output_mask
    if (dry_run()) return false;  // nothing reads the values of a dry run's grad_input
    const IValue& mask = arg(n - 1);
    return mask.isBoolList() && !mask.toBoolList().empty() && !mask.toBoolList().get(0);
  }
  if (info.meta_check == OpInfo::MetaCheck::kBatchNormTraining) {
    // input, weight, bias, running_mean, running_var, training, momentum, eps
    if (dry_run()) return false;  // no CPU results to take shapes from
    // Evaluation: CPU's save_mean/save_invstd are empty, the meta kernel's [C]. Other dtypes:
    // CPU's save_mean follows a reduced-precision input, mixed parameters raise on CPU only.
    if (!arg(5).isBool() || !arg(5).toBool() || !arg(0).isTensor()) return true;
    const at::Tensor& x = arg(0).toTensor();
    if (x.scalar_type() != at::kFloat || x.dim() < 2 || x.size(1) == 0 || x.numel() / x.size(1) < 2) return true;
    if (other_dtype({1, 2, 3, 4}, at::kFloat)) return true;
    // Result strides: both take the input's layout, but not alike for other strides or for
    // channels-last with size-1 dims.
    if (x.strides() == c10::IntArrayRef(c10::contiguous_strides(x.sizes()))) return false;
    const bool size_one = std::find(x.sizes().begin(), x.sizes().end(), 1) != x.sizes().end();
    return x.dim() != 4 || size_one || x.strides() != c10::IntArrayRef(c10::get_channels_last_strides_2d(x.sizes()));
  }
  for (size_t i = 0; i < n; ++i) {  // kEmptyDims
    if (schema.arguments()[i].name() == "dim" && arg(i).isIntList() && arg(i).toIntList().empty()) return true;
  }
  return false;
}

// The op's cost-model figures: a function of its signature (the meta key: shapes, dtypes,
// scalar values) and, for MXU work only, the matmul precision (`precision()` reads it: the
// global setting's lookup costs more than the rest of a cached call's pricing). Worked out
// once per cached signature, with its roofline estimates; custom cost functions
// (set_custom_op_cost) are asked every call. Recorded on `chip`.
template <typename Precision>
void record_priced(vtpu::Chip& chip, MetaExtras* extras, bool custom_priced, const c10::FunctionSchema& schema,
                   c10::ArrayRef<IValue> args, const std::vector<IValue>& results, const Precision& precision) {
  const bool cacheable = extras && !custom_priced;
  if (cacheable && extras->priced && (!extras->cost.mxu || extras->precision == static_cast<int8_t>(precision()))) {
    return chip.record_cost(extras->cost, extras->estimates);
  }
  vtpu::OpCost cost = op_cost(schema, args, result_tensors(results), precision());
  if (!cacheable) return chip.record_cost(cost);
  extras->cost = cost;
  extras->priced = true;
  extras->precision = static_cast<int8_t>(precision());
  extras->estimates = vtpu::CostEstimates{};
  chip.record_cost(extras->cost, extras->estimates);
}

void strict_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const OpInfo& info) {
  StrictCapture* const capture = std::exchange(next_capture, nullptr);
  const auto& schema = op.schema();
  const std::string& label = info.label;
  const bool meta_anyway = info.meta_disagrees && dry_run();  // no CPU results to take shapes from
  if (!info.returns_only_tensors || (info.no_meta.load(std::memory_order_relaxed) && !meta_anyway) ||
      meta_disagrees_here(info, op.schema(), *stack)) {
    run_now(op, stack, label);
    return;
  }
  const size_t num_args = schema.arguments().size();
  c10::ArrayRef<IValue> args(&*(stack->end() - num_args), num_args);

  DeviceCheck check(label);
  auto queued = queue_args(op, args, check, label);
  const bool philox = holds_philox_arg(queued);
  c10::DeviceIndex device = check.index();

  // Shapes, strides and argument errors come from the meta kernel, here.
  const MetaResult* meta_ptr;
  try {
    meta_ptr = &meta_result(op, args, info.pointwise);
  } catch (const std::exception& e) {
    // No meta kernel (or one raising from Python): remember, and run now.
    // Other meta errors may be stricter than the CPU kernel (data-dependent
    // checks): the real kernel decides, raising the CPU's own error.
    bool no_meta = dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr ||
                   std::string(e.what()).find("NotImplementedError") != std::string::npos;
    if (no_meta) info.no_meta = true;
    run_now(op, stack, label);
    return;
  }
  const MetaResult& meta = *meta_ptr;
  MetaExtras* const extras = last_meta_extras();  // this signature's cached pricing and validation

  // Allocate results now; the work fills them later. Results the caller dropped while this
  // stream's work still uses them are reused in stream order; for the rest, first the
  // run-ahead wait, which lets the worker release the blocks of such results.
  FreshBlocks blocks(meta, info, device);
  const uint64_t fresh_bytes = blocks.fresh_bytes();
  wait_run_ahead_before_allocating(device, fresh_bytes);
  std::vector<IValue> results;
  std::vector<TensorRecipe> fresh;                    // results the work must copy into
  std::vector<std::pair<size_t, size_t>> fresh_slot;  // (return, list index)
  for (size_t r = 0; r < meta.size(); ++r) {
    const ReturnAlias& alias = info.returns[r];
    auto aliased = aliased_tensors(args, alias);
    auto make = [&](const TensorMeta& m, size_t k) {
      if (!m.defined) return at::Tensor();
      at::Tensor base = k < aliased.size() ? aliased[k] : at::Tensor();
      if (alias.arg >= 0) return tpu_result(m, alias, base, device);
      at::Tensor t = blocks.take(m, device);
      fresh.push_back(stream_ordered_recipe(t, *blocks.stream()));
      fresh_slot.emplace_back(r, k);
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
  // Arguments the op writes (out=) may have been resized above: refresh their recipes.
  for (size_t i = 0; i < num_args && info.writes_args; ++i) {
    const auto* written = alias_of(schema.arguments()[i]);
    if (written && written->isWrite() && queued[i].kind == QueuedArg::Kind::kTensor && queued[i].tensors[0] &&
        args[i].isTensor() && args[i].toTensor().device().type() == kTPU) {
      const at::Tensor& w = args[i].toTensor();
      queued[i].tensors[0] = stream_ordered_recipe(w, current_vtpu_stream_unflushed(w.device().index()));
    }
  }

  bool pure_view = fresh.empty();
  for (size_t r = 0; r < meta.size() && pure_view; ++r) pure_view = !info.returns[r].write;
  if (!(pure_view && !info.writes_args)) {
    auto& stream = current_vtpu_stream(device);
    // The precision matters to products only (their CPU kernel's passes, their cost).
    const auto precision = info.matmul ? effective_matmul_precision() : at::Float32MatmulPrecision::HIGHEST;
    const bool custom_priced = info.custom_cost.has(schema.name());
    record_priced(chip(device), extras, custom_priced, schema, args, results,
                  [&] { return info.matmul ? precision : effective_matmul_precision(); });
    if (dry_run()) {  // shaped, allocated and priced; not computed
      // Arguments it writes now hold values nobody computed (fresh results already do).
      if (info.writes_args) {
        for (size_t i = 0; i < num_args; ++i) {
          const auto* a = alias_of(schema.arguments()[i]);
          if (!a || !a->isWrite()) continue;
          if (args[i].isTensor()) mark_undefined(args[i].toTensor());
          if (args[i].isTensorList())
            for (const at::Tensor& t : args[i].toTensorList()) mark_undefined(t);
        }
      }
      torch::jit::drop(*stack, num_args);
      for (auto& v : results) stack->push_back(std::move(v));
      return;
    }
    // With an out= overload the CPU kernel writes straight into HBM.
    // (Not for products at reduced precision, nor at HIGHEST under a lower
    // global setting: their passes need temporaries.)
    std::optional<c10::OperatorHandle> out_op;
    const bool exact_cpu_kernel =
        info.matmul && precision == at::Float32MatmulPrecision::HIGHEST && host_float32_products_exact();
    if (!philox && !fresh.empty() && fresh.size() == schema.returns().size() && !meta_has_lists(meta) &&
        (exact_cpu_kernel || !info.matmul) && info.meta_check != OpInfo::MetaCheck::kLayerNormDtype &&
        !info.offer_results) {
      // (native_layer_norm.out and convolution.out are generated wrappers that copy: not them)
      out_op = info.out_variant;
    }
    // A signature validated before is remembered in its meta-cache entry too (whose key is
    // finer: exact scalars, strides, offsets and shared storages): a repeated call skips the hash.
    uint64_t key = 0;
    bool validate = false;
    if (validate_first_calls() && !(extras && extras->validated)) {
      key = signature_key(op, args, info);
      validate = !validated_signatures.count(key);
      if (!validate && extras) extras->validated = true;
    }
    // Reported once the work is queued (validation raises past it).
    auto report = [&] {
      if (!capture || !extras || !extras->priced || philox || custom_priced || !last_meta_warnings().empty()) {
        return;
      }
      capture->op = &schema;
      capture->queued = true;
      capture->out_variant = out_op.has_value();
      capture->validated = extras->validated;
      capture->cost = extras->cost;
      capture->estimates = extras->estimates;
    };
    if (out_op) {
      enqueue_or_validate(stream, label, key, validate, extras, fresh_bytes,
                          [op = *out_op, matmul = info.matmul, queued = std::move(queued), fresh = std::move(fresh)] {
                            AliasBuilder host(c10::kCPU);
                            auto cpu = build_stack(queued, host);
                            for (const auto& r : fresh) cpu.push_back(host.alias(r));
                            at::AutoDispatchBelowADInplaceOrView below_autograd;
                            if (matmul)
                              return call_with_matmul_precision(op, &cpu, at::Float32MatmulPrecision::HIGHEST);
                            op.callBoxed(&cpu);
                          });
      report();
      torch::jit::drop(*stack, num_args);
      for (auto& v : results) stack->push_back(std::move(v));
      return;
    }
    const bool layer_norm = info.meta_check == OpInfo::MetaCheck::kLayerNormDtype;
    enqueue_or_validate(stream, label, key, validate, extras, fresh_bytes,
                        [op, queued = std::move(queued), fresh = std::move(fresh), fresh_slot = std::move(fresh_slot),
                         precision, philox, layer_norm, offer = info.offer_results] {
                          AliasBuilder host(c10::kCPU);
                          auto cpu = build_stack(queued, host);
                          at::AutoDispatchBelowADInplaceOrView below_autograd;
                          if (layer_norm && layer_norm_into_hbm(cpu, fresh, host)) return;
                          c10::SmallVector<at::Tensor, 3> targets;
                          for (const TensorRecipe& f : fresh) targets.push_back(host.alias(f));
                          std::optional<HostResultOffer> offered;
                          if (offer && tensors_contiguous(cpu)) offered.emplace(targets);
                          call_host_kernel(op, &cpu, precision, philox);
                          if (offered) offered->close();
                          for (size_t i = 0; i < fresh.size(); ++i) {
                            auto [r, k] = fresh_slot[i];
                            const IValue& v = cpu[r];
                            at::Tensor result = v.isTensor() ? v.toTensor() : v.toTensorList().get(k);
                            if (offered && is_written_in_place(result, targets[i])) continue;
                            // Served the target's memory but laid out otherwise: through a copy.
                            const bool in_target = offered && storages_overlap(result, targets[i]);
                            targets[i].copy_(in_target ? result.clone() : result);
                          }
                          if (offered) {
                            cpu.clear();
                            offered->check_released(op.schema().name());
                          }
                        });
    if (!layer_norm) report();
  }
  torch::jit::drop(*stack, num_args);
  for (auto& v : results) stack->push_back(std::move(v));
}

// Ops that overwrite `self` without reading it (random fills, fill_): an undefined
// self (written in a dry run) is fine for them, and defined afterwards.
bool overwrites_self(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (schema.arguments().empty() || !schema.is_mutable({c10::SchemaArgType::input, 0})) return false;
  return op.hasTag(at::Tag::nondeterministic_seeded) || schema.name() == "aten::fill_";
}

// Outside a dry run, an op must not read values a dry run never computed.
void check_args_defined(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const OpInfo& info,
                        bool skip_self) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  bool view_only = !schema.is_mutable() && !schema.returns().empty();
  for (const auto& r : schema.returns()) view_only = view_only && r.alias_info() && !r.alias_info()->isWrite();
  if (view_only) return;  // a view reads no values
  const size_t n = arguments.size();
  for (size_t i = 0; i < n; ++i) {
    const IValue& v = stack[stack.size() - n + i];
    if (arguments[i].is_out()) {  // written whole, not read
      if (v.isTensor()) clear_undefined_if_whole(v.toTensor());
      continue;
    }
    if (i == 0 && skip_self) continue;
    if (v.isTensor()) {
      check_defined(v.toTensor(), info.label);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) check_defined(t, info.label);
    } else if (v.isList()) {
      for (const IValue& e : v.toListRef())
        if (e.isTensor()) check_defined(e.toTensor(), info.label);
    }
  }
}

// TorchScript builds a Tensor?[] argument as a list whose element type is its own
// Optional[Tensor] object, not the one eager lists carry, so isOptionalTensorList() is false
// for it (CPU's unboxing accepts either). Rebuilt as the list every path here expects.
void normalize_optional_tensor_lists(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const size_t n = schema.arguments().size();
  for (size_t i = 0; i < n; ++i) {
    IValue& v = (*stack)[stack->size() - n + i];
    if (!v.isList() || v.isOptionalTensorList() || v.isTensorList()) continue;
    const auto* list_type = schema.arguments()[i].type()->castRaw<c10::ListType>();
    const auto* elem = list_type ? list_type->getElementType()->castRaw<c10::OptionalType>() : nullptr;
    if (!elem || elem->getElementType()->kind() != c10::TypeKind::TensorType) continue;
    c10::List<std::optional<at::Tensor>> list;
    for (const IValue& e : v.toListRef()) list.push_back(e.isNone() ? std::nullopt : std::optional(e.toTensor()));
    v = IValue(std::move(list));
  }
}

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  if (info.has_optional_tensor_list) normalize_optional_tensor_lists(op.schema(), stack);
  TORCH_CHECK_NOT_IMPLEMENTED(!info.sparse, info.label,
                              ": sparse tensors are not supported on tpu (TPUs "
                              "have no sparse layouts); use dense tensors");
  if (any_undefined() && !dry_run()) {
    const bool overwrite = overwrites_self(op);
    check_args_defined(op, *stack, info, overwrite);
    if (overwrite) {
      at::Tensor self = (*stack)[stack->size() - op.schema().arguments().size()].toTensor();
      clear_undefined_if_whole(self);  // the fill below writes every element
    }
  }
  TORCH_CHECK_NOT_IMPLEMENTED(!info.quantized, info.label,
                              ": quantized tensors are not supported on tpu (TPUs have no "
                              "quantized layouts); quantize on the CPU, or use int8 tensors with explicit scales");
  const EagerMode mode = eager_mode();
  if (mode == EagerMode::kDeferAndFuse && defer_record(op, stack, info)) return;
  DeferChecked deferred(op, *stack);  // flushes a pending region this op reads or writes
  if (mode == EagerMode::kDebug) {
    debug_fallback(op, stack, info.label);
  } else {
    strict_fallback(op, stack, info);
  }
}

}  // namespace

void set_validate_first_calls(bool on) { validate_flag().store(on); }
void capture_next_strict_call(StrictCapture* capture) { next_capture = capture; }
bool validating_first_calls() { return validate_first_calls(); }

// Whether a synchronous kernel over `args` is worth the worker's intra-op pool: ATen's loops
// split from at::internal::GRAIN_SIZE elements; below it the round trip costs more than a second
// thread saves (a 64x64 nonzero: 25 us on the worker, 14-24 on the calling thread).
bool worth_a_team(const std::vector<IValue>& args) {
  int64_t largest = 0;
  auto see = [&](const at::Tensor& t) {
    if (t.defined()) largest = std::max(largest, t.numel());
  };
  for (const IValue& v : args) {
    if (v.isTensor()) see(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) see(t);
  }
  return largest >= at::internal::GRAIN_SIZE;
}

// Whether tensor argument `i` shares memory with another tensor argument.
bool overlaps_another_argument(const std::vector<IValue>& args, size_t i) {
  const at::Tensor& t = args[i].toTensor();
  auto overlaps = [&](const at::Tensor& other) {
    if (!t.defined() || !other.defined() || !t.has_storage() || !other.has_storage()) return false;
    const auto status = at::get_overlap_status(t, other);
    return status == at::MemOverlapStatus::Full || status == at::MemOverlapStatus::Partial;
  };
  for (size_t j = 0; j < args.size(); ++j) {
    if (j == i) continue;
    if (args[j].isTensor() && overlaps(args[j].toTensor())) return true;
    if (args[j].isTensorList())
      for (const at::Tensor& other : args[j].toTensorList())
        if (overlaps(other)) return true;
  }
  return false;
}

// Synchronous path: wait for the chip, run the CPU kernel on host aliases now.
void run_now(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& label) {
  if (dry_run()) dry_run_host_read(label + " (it runs on the host at once: data-dependent or host results)");
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<IValue> args(stack->end() - num_args, stack->end());
  DeviceCheck check(label);
  auto queued = queue_args(op, args, check, label);
  const bool philox = holds_philox_arg(queued);
  c10::DeviceIndex device = check.index();
  synchronize_device(device);

  // out= arguments get fresh host tensors: the CPU kernel may resize them. One that shares
  // memory with another argument keeps it, so that CPU's kernel sees the overlap it rejects.
  std::vector<bool> is_out(num_args, false);
  for (size_t i = 0; i < num_args; ++i) {
    const auto* a = alias_of(schema.arguments()[i]);
    is_out[i] = a && a->isWrite() && schema.arguments()[i].kwarg_only() && args[i].isTensor() &&
                !overlaps_another_argument(args, i);
  }
  struct HostCall {
    torch::jit::Stack cpu;
    std::vector<IValue> cpu_args;  // the stack's arguments, as the kernel got them
  };
  auto call = std::make_shared<HostCall>();
  const auto precision = effective_matmul_precision();
  auto run_kernel = [call, op, queued = std::move(queued), is_out, precision, philox] {
    AliasBuilder host(c10::kCPU);
    call->cpu = build_stack(queued, host);
    for (size_t i = 0; i < is_out.size(); ++i) {
      if (!is_out[i] || !call->cpu[i].isTensor()) continue;
      // A host tensor of the out= argument's own geometry and values: the CPU kernel
      // decides whether to resize it (and warns as on CPU), a view keeps its strides.
      const at::Tensor alias = call->cpu[i].toTensor();
      at::Tensor fresh = at::empty_strided(alias.sizes(), alias.strides(), alias.options());
      if (alias.numel() > 0) fresh.copy_(alias);
      call->cpu[i] = fresh;
    }
    call->cpu_args.assign(call->cpu.begin(), call->cpu.end());
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    // A tpu op on either thread: no CPU autocast (the calling thread's torch.autocast("cpu")).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    call_host_kernel(op, &call->cpu, precision, philox);
  };
  // A kernel large enough to split runs on the stream's worker, whose OpenMP team is idle now
  // (batch_norm of 8M float32: 4.4 ms on this thread alone, 2.0 ms on CPU eager's two threads);
  // a smaller one here, saving the round trip. The debug mode's kernels run here.
  auto& stream = current_vtpu_stream(device);
  const bool on_worker =
      eager_mode() != EagerMode::kDebug && !vtpu::Stream::on_any_worker_thread() && worth_a_team(args);
  if (on_worker) {
    run_on_worker_and_wait(stream, label, std::move(run_kernel));
  } else {
    SerialOnCallingThread serial;  // no second OpenMP team beside the worker's (calling_thread.h)
    run_kernel();
  }
  torch::jit::Stack& cpu = call->cpu;
  // Host results into HBM: (tpu destination, host result) pairs, copied on the worker too.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (size_t i = 0; i < num_args; ++i) {
    if (!is_out[i]) continue;
    const auto& result = call->cpu_args[i].toTensor();
    const auto& tpu = args[i].toTensor();
    // out= semantics: resized only when the shape differs (keeping its storage offset), to the
    // strides CPU's kernel gave it (nonzero's are column-major); a view keeps its strides.
    if (!tpu.sizes().equals(result.sizes())) {
      tpu.resize_(result.sizes());
      if (!tpu.strides().equals(result.strides()) && result.is_non_overlapping_and_dense()) {
        tpu.as_strided_(result.sizes(), result.strides(), tpu.storage_offset());
      }
    }
    copies.emplace_back(tpu, result);
  }
  torch::jit::drop(*stack, num_args);
  for (size_t r = 0; r < cpu.size(); ++r) {
    const ReturnAlias& alias = op_info(op).returns[r];
    auto aliased = aliased_tensors(args, alias);
    auto convert = [&](const at::Tensor& t, size_t k) -> at::Tensor {
      if (!t.defined()) return t;
      if (alias.arg >= 0 && k < aliased.size()) {
        if (alias.write) return aliased[k];
        return view_of(aliased[k], t.sizes(), t.strides(), t.storage_offset(), t.scalar_type());
      }
      auto out = empty_tpu(t.sizes(), t.strides(), t.scalar_type(), device);
      copies.emplace_back(out, t);  // nothing is queued on a fresh tensor
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
  // Written before the call returns, as the kernel's own results would be.
  auto copy_all = [copies = std::move(copies)] {
    for (const auto& [tpu, host] : copies) {
      at::Tensor target = host_alias(tpu);
      if (!is_written_in_place(host, target)) target.copy_(host);
    }
  };
  if (on_worker) {
    run_on_worker_and_wait(stream, label, std::move(copy_all));
  } else {
    SerialOnCallingThread serial;
    copy_all();
  }
  std::vector<IValue> returned(stack->end() - cpu.size(), stack->end());
  chip(device).record_cost(op_cost(schema, args, result_tensors(returned), precision));
}

void tpu_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { tpu_fallback(op, stack); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>()); }

}  // namespace torch_tpu

namespace torch_tpu {
// ATen routes convolutions of unknown backends to *_overrideable stubs; the
// fallback runs the real CPU convolution over device buffers instead.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  // CompositeExplicitAutograd, but it rejects devices other than CPU/CUDA/XPU.
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  // CompositeExplicitAutograd's math_group_norm calls .view and rejects the channels-last
  // activations that diffusers' attention blocks hand to GroupNorm; CPU's kernel takes any strides.
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  // PrivateUse1 gets the default-backend composite of native_layer_norm, which rounds its mean/rstd
  // intermediates to the input dtype (bf16: ~45 % of elements differ from CPU) and, through
  // native_batch_norm's host results, waits for the chip at every call. CPU's kernel instead, in
  // every mode (defer_and_fuse too: the composite's pieces do not fuse, and the mode must not change
  // values). Same for the other default-backend composites below (each step rounded to the dtype);
  // the audit is in docs/adding-an-op.md.
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  m.impl("addr", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  m.impl("addr.out", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  m.impl("mish_backward", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  // Structured: their CompositeExplicitAutogradNonFunctional kernel calls the out= overload with a
  // 0-d out, which the CPU kernel resizes through the unreduced shape (and warns). Functional here.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  m.impl("smooth_l1_loss", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  // Structured ops whose functional form PrivateUse1 would get from a generic
  // wrapper (meta, then the out= kernel): the CPU kernel itself, so that its
  // checks and warnings happen once, as on CPU.
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
  // The same for hot small ops (cat, gather, mm, bmm, addmm: fast_ops.cc, whose first call per
  // signature comes here): the generic wrapper runs the structured meta on tpu tensors,
  // allocates through the dispatcher and then dispatches the out= overload (cat 64x64: 24k
  // instructions on the calling thread); the fallback's cached meta and its out= kernel on
  // the worker do it in one call.
}
}  // namespace torch_tpu

namespace torch_tpu {
namespace {
// Sparse layouts on tpu: a clear error instead of "could not run ... Sparsetpu".
void sparse_not_supported(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op_info(op).label,
                              ": sparse tensors are not supported on tpu (TPUs have no sparse "
                              "layouts); use dense (strided) tensors");
}
}  // namespace
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_not_supported>());
}
// Quantized layouts: the same, for ops on quantized tpu tensors.
void quantized_not_supported(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op_info(op).label,
                              ": quantized tensors are not supported on tpu (TPUs have no quantized "
                              "layouts); quantize on the CPU, or use int8 tensors with explicit scales");
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_not_supported>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_not_supported>());
}
}  // namespace torch_tpu
