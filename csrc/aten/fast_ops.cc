// Unboxed strict-mode kernels for the hottest small ops (add/sub/mul/div and their in-place
// forms, sum, mean, amax, index_select, gather).
//
// The boxed fallback (fallback.cc) prices a small op at ~11 k instructions on the calling
// thread beyond Python and autograd: boxing its arguments (each Python-owned tensor's
// refcount 1 -> 2 -> 1 takes the GIL), the meta-cache key over every argument, queued-argument
// conversion and a boxed CPU call on the worker. These kernels take the typed arguments
// instead. The first call of a signature still goes through the fallback, which shapes it
// with the meta kernel, validates it synchronously (TORCH_TPU_VALIDATE_FIRST_CALL) and
// prices it; when it queued the op with the CPU kernel this file calls (the out= overload
// into a fresh result, or the in-place op itself) the outcome is kept per thread under a key
// at least as fine as both the meta cache's and the validation's (device, dtype, sizes,
// strides and offset of every tensor, exact scalars and lists). A later call with that key
// allocates its result from the kept layout, records the kept cost and queues the typed CPU
// kernel over host aliases. Everything else (other modes, a dry run, undefined buffers,
// custom cost functions, host tensors other than 0-d ones, complex or unsupported dtypes,
// in-place arguments sharing storage) takes the fallback as before.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/index_copy_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/isin_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/logical_not_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/minimum_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/where_ops.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "aten/fallback_internal.h"
#include "aten/host_matmul.h"
#include "aten/matmul_precision.h"
#include "aten/op_cost.h"
#include "defer/defer.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/eager_mode.h"
#include "runtime/kernel_warnings.h"
#include "runtime/tensor_factory.h"

namespace torch_tpu {
namespace {

constexpr int kMaxWords = 48;
constexpr int kMaxDims = 8;
constexpr size_t kTableSlots = 512;  // per thread, direct-mapped: a collision evicts

// The signature of one call, as words; `ok()` false when the call is not for this path.
class FastKey {
 public:
  // Integer true division and sums of bools follow the default dtype: part of the key.
  explicit FastKey(uint64_t op) {
    add(static_cast<int64_t>(op));
    add(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  }
  void tensor(const at::Tensor& t) {
    if (!ok_) return;
    if (!t.defined() || t.layout() != c10::kStrided || t.is_conj() || t.is_neg() || !t.has_storage() ||
        t.dim() > kMaxDims) {
      return fail();
    }
    const c10::ScalarType dtype = t.scalar_type();
    const bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();  // not counted as float64 use
    if ((unsupported_on_tpu(dtype) && !wrapped) || c10::isComplexType(dtype)) return fail();
    const c10::Device d = t.device();
    if (d.type() == kTPU) {
      // Without values (donated, or written in a dry run): the fallback raises at the call.
      if (any_undefined() && buffer_undefined(t.storage().data_ptr())) return fail();
      if (device_ < 0) device_ = d.index();
      add(1 | static_cast<int64_t>(dtype) << 8 | static_cast<int64_t>(t.dim()) << 16 |
          static_cast<int64_t>(d.index()) << 24);
      for (int64_t s : t.sizes()) add(s);
      for (int64_t s : t.strides()) add(s);
      add(t.storage_offset());
      return;
    }
    // Host scalars (a Python number's wrapped tensor): their value does not decide the result's
    // layout or dtype, nor CPU's argument checks (the validation's key leaves it out too).
    if (d.is_cpu() && t.dim() == 0 && !t.is_conj()) {
      return add(2 | static_cast<int64_t>(dtype) << 8 | static_cast<int64_t>(wrapped) << 16);
    }
    fail();
  }
  void scalar(const c10::Scalar& s) {
    if (s.isFloatingPoint() && !s.isSymbolic()) {
      const double d = s.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      return add(3), add(bits);
    }
    if (s.isIntegral(false) && !s.isSymbolic()) return add(4), add(s.toLong());
    if (s.isBoolean() && !s.isSymbolic()) return add(5), add(s.toBool());
    fail();
  }
  void integer(int64_t v) { add(6), add(v); }
  void boolean(bool b) { add(7 + b); }
  void dims(at::OptionalIntArrayRef dims) {
    if (!dims) return add(9);
    if (dims->size() > kMaxDims) return fail();
    add(10 + static_cast<int64_t>(dims->size()));
    for (int64_t d : *dims) add(d);
  }
  void dtype(std::optional<c10::ScalarType> t) { add(t ? 100 + static_cast<int64_t>(*t) : 99); }
  void real(double d) {
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    add(3), add(bits);
  }
  void none() { add(98); }  // an absent optional (no tensor word's low byte is 98)
  void count(size_t n) { add(200 + static_cast<int64_t>(n)); }

  bool ok() const { return ok_; }
  uint64_t hash() const { return hash_; }
  int size() const { return n_; }
  const int64_t* words() const { return w_; }
  c10::DeviceIndex device() const { return device_; }

 private:
  void add(int64_t v) {
    if (n_ == kMaxWords) return fail();
    w_[n_++] = v;
    hash_ = (hash_ ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    hash_ ^= hash_ >> 29;
  }
  void fail() { ok_ = false; }
  bool ok_ = true;
  int n_ = 0;
  c10::DeviceIndex device_ = -1;
  uint64_t hash_ = 0xcbf29ce484222325ull;
  int64_t w_[kMaxWords];
};

// What the fallback's first call of a signature said.
struct FastEntry {
  uint64_t hash = 0;
  int n = 0;  // 0: empty slot
  int64_t w[kMaxWords];
  bool validated = false;
  c10::DimVector sizes, strides;  // the fresh result's layout (out= ops)
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  size_t nbytes = 0;
  uint64_t physical = 0;
  vtpu::OpCost cost;
  vtpu::CostEstimates estimates;
};

thread_local uint64_t kept_calls = 0;  // calls that took a kept signature, this thread

FastEntry& slot(uint64_t hash) {
  thread_local std::unique_ptr<FastEntry[]> table(new FastEntry[kTableSlots]);
  return table[hash % kTableSlots];
}

enum class Path { kOut, kInPlace };

class FastOp {
 public:
  FastOp(const char* name, const char* overload, Path path)
      : handle_(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)),
        label_(std::string(name) + (*overload ? std::string(".") + overload : std::string())),
        path_(path),
        matmul_(is_matmul_family(handle_)) {}
  uint64_t id() const { return reinterpret_cast<uintptr_t>(&handle_.schema()); }
  const char* label() const { return label_.c_str(); }

  // The kept entry of `key`, or null: the first call of a signature, or one this path must
  // not take now. Everything it skips is per call, not per signature: checked on every call.
  FastEntry* find(const FastKey& key) const {
    if (!key.ok() || !allowed()) return nullptr;
    FastEntry& e = slot(key.hash());
    if (e.n != key.size() || e.hash != key.hash() || std::memcmp(e.w, key.words(), sizeof(int64_t) * e.n) != 0) {
      return nullptr;
    }
    if (!e.validated && validating_first_calls()) return nullptr;  // kept while validation was off
    return &e;
  }
  // Products: the fallback queues their out= kernel, and prices them, by the matmul precision
  // read at the call (the calling thread's override and the global setting): part of the key.
  void precision_key(FastKey& key) const {
    if (!matmul_) return;
    key.integer(static_cast<int64_t>(effective_matmul_precision()));
    key.integer(host_float32_products_exact() ? 1 : 0);
  }

  // The fallback's call; keeps its outcome under `key` when it took this file's path.
  template <typename... Args>
  at::Tensor slow(const FastKey& key, bool keepable, const Args&... args) const {
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    torch::jit::push(stack, args...);
    StrictCapture capture;
    keepable = keepable && key.ok() && allowed();
    capture_next_strict_call(keepable ? &capture : nullptr);
    try {
      tpu_boxed_fallback(handle_, &stack);
    } catch (...) {
      capture_next_strict_call(nullptr);
      throw;
    }
    capture_next_strict_call(nullptr);
    at::Tensor result = stack.back().toTensor();
    if (keepable && capture.queued && capture.op == &handle_.schema() && capture.out_variant == (path_ == Path::kOut)) {
      keep(key, capture, result);
    }
    return result;
  }

  // Queues `work(out recipe)` for a fresh result laid out as `e` says.
  template <typename MakeWork>
  at::Tensor run_out(FastEntry& e, c10::DeviceIndex device, MakeWork&& make_work) const {
    vtpu::Stream& stream = current_vtpu_stream(device);
    // A result the caller dropped while this stream's work still uses it is reused at once in
    // stream order, cache-warm as CPU eager's just-freed buffer: no fresh bytes, no wait.
    c10::DataPtr block = tpu_allocator().reuse_on(device, e.nbytes, e.physical, stream);
    const uint64_t fresh_bytes = block ? 0 : e.nbytes;
    // Otherwise wait for the run-ahead bound before allocating, not after: the wait lets the
    // worker finish with the blocks of results the caller already dropped.
    if (!block) wait_run_ahead_before_allocating(stream, e.nbytes);
    at::Tensor out = block ? tpu_tensor_in(std::move(block), e.sizes, e.strides, e.dtype, e.nbytes)
                           : empty_tpu_bytes(e.sizes, e.strides, e.dtype, device, e.nbytes, e.physical);
    queue(e, stream, device, fresh_bytes, make_work(stream_ordered_recipe(out, stream)));
    return out;
  }
  template <typename Work>
  void run_in_place(FastEntry& e, c10::DeviceIndex device, Work&& work) const {
    queue(e, current_vtpu_stream(device), device, 0, std::forward<Work>(work));
  }

 private:
  void keep(const FastKey& key, const StrictCapture& capture, const at::Tensor& result) const {
    FastEntry& e = slot(key.hash());
    if (path_ == Path::kOut) {
      if (!result.defined() || result.device().type() != kTPU || result.storage_offset() != 0) return;
      e.sizes = c10::DimVector(result.sizes());
      e.strides = c10::DimVector(result.strides());
      e.dtype = result.scalar_type();
      tpu_buffer_bytes(e.sizes, e.strides, result.itemsize(), &e.nbytes, &e.physical);
      if (e.nbytes != result.storage().nbytes()) {
        e.n = 0;
        return;
      }
    }
    e.hash = key.hash();
    e.n = key.size();
    std::memcpy(e.w, key.words(), sizeof(int64_t) * e.n);
    e.validated = capture.validated;
    e.cost = capture.cost;
    e.estimates = capture.estimates;
  }
  template <typename Work>
  void queue(FastEntry& e, vtpu::Stream& stream, c10::DeviceIndex device, uint64_t fresh_bytes, Work&& work) const {
    chip(device).record_cost(e.cost, e.estimates);
    ++kept_calls;
    enqueue_sized(
        stream, label_.c_str(),
        [work = std::forward<Work>(work), issuer = std::this_thread::get_id()] {
          static const std::vector<std::string> none;  // a kept signature's meta kernel warned nothing
          queue_warnings(issuer, run_collecting_warnings(std::cref(work), none));
        },
        fresh_bytes);
  }

  bool allowed() const {
    return eager_mode() == EagerMode::kStrict && !dry_run() && !custom_cost_.has(handle_.schema().name());
  }

  c10::OperatorHandle handle_;
  std::string label_;
  Path path_;
  bool matmul_;
  CustomCostCheck custom_cost_;
};

// A tensor argument as queued work keeps it (host scalars: a snapshot of their value).
TensorRecipe recipe(const at::Tensor& t) {
  if (t.device().type() == kTPU) return stream_ordered_recipe(t, current_vtpu_stream_unflushed(t.device().index()));
  TensorRecipe r = dense_host_snapshot(t);
  if (!r.storage) r = TensorRecipe::of(t.clone());
  r.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
  return r;
}

// Host tensors over the recipes' device bytes, for a CPU kernel on the worker. A fresh alias
// costs a TensorImpl, its version counter and a StorageImpl, allocated and freed per tensor
// (~0.7 k instructions each): the worker keeps a few aliases and reuses one that nothing
// else holds, re-pointed at the recipe (its StorageImpl too when only it holds that).
// Recipes of one storage share one host storage, as AliasBuilder's do (overlap checks).
class Host {
 public:
  at::Tensor operator()(const TensorRecipe& r) {
    const c10::StorageImpl* key = r.storage_identity();
    const c10::Storage* shared = nullptr;
    for (const auto& [k, st] : storages_) {
      if (k == key) shared = &st;
    }
    at::Tensor* free = nullptr;
    for (at::Tensor& t : pool()) {
      if (t.defined() && t.use_count() == 1) {
        free = &t;
        break;
      }
    }
    if (!free) {
      at::Tensor t = fallback_.alias(r);
      for (at::Tensor& slot : pool()) {
        if (!slot.defined()) {
          slot = t;
          break;
        }
      }
      storages_.emplace_back(key, t.storage());
      return t;
    }
    c10::TensorImpl* impl = free->unsafeGetTensorImpl();
    c10::Storage storage;
    if (shared) {
      storage = *shared;
    } else if (r.on_host()) {
      storage = r.storage;  // already host memory (a host scalar's snapshot)
    } else if (impl->storage().use_count() == 1) {
      c10::StorageImpl* own = impl->storage().unsafeGetStorageImpl();
      own->set_data_ptr_noswap(c10::DataPtr(r.data(), c10::Device(c10::kCPU)));
      own->set_nbytes(r.nbytes());
      storage = impl->storage();
    } else {
      storage =
          c10::Storage(c10::Storage::use_byte_size_t(), r.nbytes(), c10::DataPtr(r.data(), c10::Device(c10::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
    }
    if (impl->is_wrapped_number()) impl->set_wrapped_number(false);
    impl->set_storage_and_dtype(storage, r.dtype);
    impl->set_sizes_and_strides(r.sizes, r.strides, r.storage_offset);
    if (r.wrapped_number) impl->set_wrapped_number(true);
    storages_.emplace_back(key, std::move(storage));
    return *free;
  }

 private:
  static std::array<at::Tensor, 6>& pool() {
    thread_local std::array<at::Tensor, 6> aliases;
    return aliases;
  }
  AliasBuilder fallback_{c10::kCPU};
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
  at::AutoDispatchBelowADInplaceOrView below_autograd_;
};

using OptDims = std::optional<c10::DimVector>;
OptDims own(at::OptionalIntArrayRef d) { return d ? OptDims(c10::DimVector(*d)) : std::nullopt; }
at::OptionalIntArrayRef view(const OptDims& d) { return d ? at::OptionalIntArrayRef(*d) : std::nullopt; }

// The generic kernels below take an op's typed arguments; per argument type: its key words,
// its queued form, the host argument the CPU kernel gets on the worker, its boxed form (the
// fallback's first call), the region flushes it needs (defer_and_fuse regions left open by
// another thread's mode) and whether it shares storage with an in-place op's `self`.
template <typename T>
struct Arg;

// Flushes a pending region that writes `t` (DeferChecked's constructor does; its scope is the op's).
void check_read(const at::Tensor& t) { DeferChecked flushed({&t}, {}); }
bool shares(const at::Tensor& self, const at::Tensor& t) {
  return t.defined() && t.has_storage() && self.storage().is_alias_of(t.storage());
}

template <>
struct Arg<at::Tensor> {
  using Queued = TensorRecipe;
  static void key(FastKey& k, const at::Tensor& t) { k.tensor(t); }
  static Queued queue(const at::Tensor& t) { return recipe(t); }
  static at::Tensor host(Host& h, const Queued& q) { return h(q); }
  static c10::IValue box(const at::Tensor& t) { return t; }
  static void check(const at::Tensor& t) { check_read(t); }
  static bool alias(const at::Tensor& self, const at::Tensor& t) { return shares(self, t); }
};
template <>
struct Arg<std::optional<at::Tensor>> {
  using Queued = std::optional<TensorRecipe>;
  static void key(FastKey& k, const std::optional<at::Tensor>& t) { t && t->defined() ? k.tensor(*t) : k.none(); }
  static Queued queue(const std::optional<at::Tensor>& t) {
    return t && t->defined() ? Queued(recipe(*t)) : std::nullopt;
  }
  static std::optional<at::Tensor> host(Host& h, const Queued& q) {
    return q ? std::optional<at::Tensor>(h(*q)) : std::nullopt;
  }
  static c10::IValue box(const std::optional<at::Tensor>& t) { return t; }
  static void check(const std::optional<at::Tensor>& t) {
    if (t) check_read(*t);
  }
  static bool alias(const at::Tensor& self, const std::optional<at::Tensor>& t) { return t && shares(self, *t); }
};
template <>
struct Arg<at::ITensorListRef> {
  using Queued = c10::SmallVector<TensorRecipe, 4>;
  static void key(FastKey& k, const at::ITensorListRef& l) {
    k.count(l.size());
    for (const at::Tensor& t : l) k.tensor(t);
  }
  static Queued queue(const at::ITensorListRef& l) {
    Queued q;
    for (const at::Tensor& t : l) q.push_back(recipe(t));
    return q;
  }
  static std::vector<at::Tensor> host(Host& h, const Queued& q) {
    std::vector<at::Tensor> out;
    out.reserve(q.size());
    for (const TensorRecipe& r : q) out.push_back(h(r));
    return out;
  }
  static c10::IValue box(const at::ITensorListRef& l) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : l) list.push_back(t);
    return list;
  }
  static void check(const at::ITensorListRef& l) {
    for (const at::Tensor& t : l) check_read(t);
  }
  static bool alias(const at::Tensor& self, const at::ITensorListRef& l) {
    for (const at::Tensor& t : l)
      if (shares(self, t)) return true;
    return false;
  }
};
// Plain values: queued and passed as they are.
template <typename T>
struct ValueArg {
  using Queued = T;
  static Queued queue(const T& v) { return v; }
  static const T& host(Host&, const Queued& q) { return q; }
  static c10::IValue box(const T& v) { return v; }
  static void check(const T&) {}
  static bool alias(const at::Tensor&, const T&) { return false; }
};
template <>
struct Arg<c10::Scalar> : ValueArg<c10::Scalar> {
  static void key(FastKey& k, const c10::Scalar& v) { k.scalar(v); }
};
template <>
struct Arg<int64_t> : ValueArg<int64_t> {
  static void key(FastKey& k, int64_t v) { k.integer(v); }
};
template <>
struct Arg<bool> : ValueArg<bool> {
  static void key(FastKey& k, bool v) { k.boolean(v); }
};
template <>
struct Arg<double> : ValueArg<double> {
  static void key(FastKey& k, double v) { k.real(v); }
};
template <>
struct Arg<std::optional<int64_t>> : ValueArg<std::optional<int64_t>> {
  static void key(FastKey& k, std::optional<int64_t> v) { v ? k.integer(*v) : k.none(); }
};
template <>
struct Arg<std::optional<c10::ScalarType>> : ValueArg<std::optional<c10::ScalarType>> {
  static void key(FastKey& k, std::optional<c10::ScalarType> v) { k.dtype(v); }
};
template <>
struct Arg<at::IntArrayRef> {
  using Queued = c10::DimVector;
  static void key(FastKey& k, at::IntArrayRef v) { k.dims(v); }
  static Queued queue(at::IntArrayRef v) { return Queued(v); }
  static at::IntArrayRef host(Host&, const Queued& q) { return q; }
  static c10::IValue box(at::IntArrayRef v) { return v.vec(); }
  static void check(at::IntArrayRef) {}
  static bool alias(const at::Tensor&, at::IntArrayRef) { return false; }
};
template <>
struct Arg<at::OptionalIntArrayRef> {
  using Queued = OptDims;
  static void key(FastKey& k, at::OptionalIntArrayRef v) { k.dims(v); }
  static Queued queue(at::OptionalIntArrayRef v) { return own(v); }
  static at::OptionalIntArrayRef host(Host&, const Queued& q) { return view(q); }
  static c10::IValue box(at::OptionalIntArrayRef v) { return v ? c10::IValue(v->vec()) : c10::IValue(); }
  static void check(at::OptionalIntArrayRef) {}
  static bool alias(const at::Tensor&, at::OptionalIntArrayRef) { return false; }
};

template <typename T>
using ArgOf = Arg<std::decay_t<T>>;

// What the CPU kernel takes for a host argument (a list of host tensors as a list reference).
template <typename X>
const X& pass(const X& x) {
  return x;
}
at::ITensorListRef pass(const std::vector<at::Tensor>& v) { return at::ITensorListRef(at::ArrayRef<at::Tensor>(v)); }

// A functional op `Op` whose CPU kernel the fallback queues as its out= overload `OutOp`
// (the same path as `binary` above, for any argument list of the types above).
template <typename Op, typename OutOp, typename Sig = typename Op::schema>
struct Functional;
template <typename Op, typename OutOp, typename... A>
struct Functional<Op, OutOp, at::Tensor(A...)> {
  static at::Tensor call(A... a) {
    static const FastOp op(Op::name, Op::overload_name, Path::kOut);
    FastKey key(op.id());
    (ArgOf<A>::key(key, a), ...);
    op.precision_key(key);
    if (FastEntry* e = op.find(key)) {
      (ArgOf<A>::check(a), ...);
      DeferChecked scope({}, {});
      return op.run_out(*e, key.device(), [q = std::make_tuple(ArgOf<A>::queue(a)...)](TensorRecipe o) mutable {
        return [q = std::move(q), o = std::move(o)] {
          Host h;
          at::Tensor out = h(o);
          std::apply([&](const auto&... x) { OutOp::call(pass(ArgOf<A>::host(h, x))..., out); }, q);
        };
      });
    }
    return op.slow(key, true, ArgOf<A>::box(a)...);
  }
};

// The out= kernel the worker runs for `OutOp`: ATen's, except the matrix products: bf16 and fp16
// operands widen to float32 where ATen's half kernels are slow (matmul_precision.h), mm
// computes a few rows against a large transposed matrix in host_matmul.h's order, and large
// float32 products run on oneDNN where MKL is slow (host_matmul.h; as the fallback's first call
// does).
template <typename OutOp>
struct WorkerOut : OutOp {};
template <>
struct WorkerOut<at::_ops::mm_out> {
  static at::Tensor& call(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
    if (widens_half_product(a, b)) return out.copy_(at::_ops::mm::call(a.to(at::kFloat), b.to(at::kFloat)));
    if (!mm_few_rows_by_transposed(a, b, out) && !matmul_on_onednn(a, b, out)) at::_ops::mm_out::call(a, b, out);
    return out;
  }
};
template <>
struct WorkerOut<at::_ops::bmm_out> {
  static at::Tensor& call(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
    if (widens_half_product(a, b)) return out.copy_(at::_ops::bmm::call(a.to(at::kFloat), b.to(at::kFloat)));
    return at::_ops::bmm_out::call(a, b, out);
  }
};
template <>
struct WorkerOut<at::_ops::addmm_out> {
  static at::Tensor& call(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                          const at::Scalar& alpha, at::Tensor& out) {
    if (widens_half_product(a, b) && self.scalar_type() == a.scalar_type()) {
      return out.copy_(at::_ops::addmm::call(self.to(at::kFloat), a.to(at::kFloat), b.to(at::kFloat), beta, alpha));
    }
    if (addmm_on_onednn(self, a, b, beta, alpha, out)) return out;
    return at::_ops::addmm_out::call(self, a, b, beta, alpha, out);
  }
};

// An in-place op `Op` (self first): kept when `self` is on the chip and shares no storage
// with its other tensors, as `binary_` above.
template <typename Op, typename Sig = typename Op::schema>
struct InPlace;
template <typename Op, typename... A>
struct InPlace<Op, at::Tensor&(at::Tensor&, A...)> {
  static at::Tensor& call(at::Tensor& self, A... a) {
    static const FastOp op(Op::name, Op::overload_name, Path::kInPlace);
    FastKey key(op.id());
    key.tensor(self);
    (ArgOf<A>::key(key, a), ...);
    const bool alone = key.ok() && self.device().type() == kTPU && !(ArgOf<A>::alias(self, a) || ...);
    if (FastEntry* e = alone ? op.find(key) : nullptr) {
      (ArgOf<A>::check(a), ...);
      DeferChecked scope({}, {&self});
      op.run_in_place(*e, key.device(), [s = recipe(self), q = std::make_tuple(ArgOf<A>::queue(a)...)] {
        Host h;
        at::Tensor t = h(s);
        std::apply([&](const auto&... x) { Op::call(t, pass(ArgOf<A>::host(h, x))...); }, q);
      });
      return self;
    }
    op.slow(key, alone, self, ArgOf<A>::box(a)...);
    return self;
  }
};

// a OP b, with add/sub's alpha as the one `extra` argument.
template <typename OutOp, typename... Extra>
at::Tensor binary(const FastOp& op, const at::Tensor& self, const at::Tensor& other, const Extra&... extra) {
  FastKey key(op.id());
  key.tensor(self), key.tensor(other);
  (key.scalar(extra), ...);
  if (FastEntry* e = op.find(key)) {
    DeferChecked checked({&self, &other}, {});
    return op.run_out(*e, key.device(), [a = recipe(self), b = recipe(other), extra...](TensorRecipe o) {
      return [a = std::move(a), b = std::move(b), extra..., o = std::move(o)] {
        Host h;
        at::Tensor out = h(o);
        OutOp::call(h(a), h(b), extra..., out);
      };
    });
  }
  return op.slow(key, true, self, other, extra...);
}

// In place: `self` is written, so it must be on the chip and share no storage with `other`
// (CPU's overlap checks then decide nothing the key does not hold).
bool writable_alone(const at::Tensor& self, const at::Tensor& other) {
  return self.defined() && other.defined() && self.device().type() == kTPU && self.has_storage() &&
         other.has_storage() && !self.storage().is_alias_of(other.storage());
}

template <typename InPlaceOp, typename... Extra>
at::Tensor& binary_(const FastOp& op, at::Tensor& self, const at::Tensor& other, const Extra&... extra) {
  FastKey key(op.id());
  key.tensor(self), key.tensor(other);
  (key.scalar(extra), ...);
  const bool alone = key.ok() && writable_alone(self, other);
  if (FastEntry* e = alone ? op.find(key) : nullptr) {
    DeferChecked checked({&other}, {&self});
    op.run_in_place(*e, key.device(), [a = recipe(self), b = recipe(other), extra...] {
      Host h;
      at::Tensor s = h(a);
      InPlaceOp::call(s, h(b), extra...);
    });
    return self;
  }
  op.slow(key, alone, self, other, extra...);
  return self;
}

at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const FastOp op("aten::add", "Tensor", Path::kOut);
  return binary<at::_ops::add_out>(op, self, other, alpha);
}
at::Tensor sub_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const FastOp op("aten::sub", "Tensor", Path::kOut);
  return binary<at::_ops::sub_out>(op, self, other, alpha);
}
at::Tensor mul_tensor(const at::Tensor& self, const at::Tensor& other) {
  static const FastOp op("aten::mul", "Tensor", Path::kOut);
  return binary<at::_ops::mul_out>(op, self, other);
}
at::Tensor div_tensor(const at::Tensor& self, const at::Tensor& other) {
  static const FastOp op("aten::div", "Tensor", Path::kOut);
  return binary<at::_ops::div_out>(op, self, other);
}
at::Tensor& add__tensor(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const FastOp op("aten::add_", "Tensor", Path::kInPlace);
  return binary_<at::_ops::add__Tensor>(op, self, other, alpha);
}
at::Tensor& sub__tensor(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const FastOp op("aten::sub_", "Tensor", Path::kInPlace);
  return binary_<at::_ops::sub__Tensor>(op, self, other, alpha);
}
at::Tensor& mul__tensor(at::Tensor& self, const at::Tensor& other) {
  static const FastOp op("aten::mul_", "Tensor", Path::kInPlace);
  return binary_<at::_ops::mul__Tensor>(op, self, other);
}
at::Tensor& div__tensor(at::Tensor& self, const at::Tensor& other) {
  static const FastOp op("aten::div_", "Tensor", Path::kInPlace);
  return binary_<at::_ops::div__Tensor>(op, self, other);
}

// sum / mean of every element: (self, dtype).
template <typename OutOp>
at::Tensor reduce_all(const FastOp& op, const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  FastKey key(op.id());
  key.tensor(self), key.dtype(dtype);
  if (FastEntry* e = op.find(key)) {
    DeferChecked checked({&self}, {});
    return op.run_out(*e, key.device(), [a = recipe(self), dtype](TensorRecipe o) {
      return [a = std::move(a), dtype, o = std::move(o)] {
        Host h;
        at::Tensor out = h(o);
        OutOp::call(h(a), dtype, out);
      };
    });
  }
  return op.slow(key, true, self, dtype);
}

at::Tensor sum_all(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  static const FastOp op("aten::sum", "", Path::kOut);
  return reduce_all<at::_ops::sum_out>(op, self, dtype);
}
at::Tensor mean_all(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  static const FastOp op("aten::mean", "", Path::kOut);
  return reduce_all<at::_ops::mean_dtype_out>(op, self, dtype);
}

// sum / mean over dims: (self, dim, keepdim, dtype).
template <typename OutOp>
at::Tensor reduce_dims(const FastOp& op, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                       std::optional<c10::ScalarType> dtype) {
  FastKey key(op.id());
  key.tensor(self), key.dims(dim), key.boolean(keepdim), key.dtype(dtype);
  if (FastEntry* e = op.find(key)) {
    DeferChecked checked({&self}, {});
    return op.run_out(*e, key.device(), [a = recipe(self), d = own(dim), keepdim, dtype](TensorRecipe o) {
      return [a = std::move(a), d = std::move(d), keepdim, dtype, o = std::move(o)] {
        Host h;
        at::Tensor out = h(o);
        OutOp::call(h(a), view(d), keepdim, dtype, out);
      };
    });
  }
  // The boxed call takes the dims as an optional list (an IValue of the schema's type).
  std::optional<std::vector<int64_t>> boxed_dim;
  if (dim) boxed_dim = dim->vec();
  return op.slow(key, true, self, boxed_dim, keepdim, dtype);
}

at::Tensor sum_dims(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<c10::ScalarType> dtype) {
  static const FastOp op("aten::sum", "dim_IntList", Path::kOut);
  return reduce_dims<at::_ops::sum_IntList_out>(op, self, dim, keepdim, dtype);
}
at::Tensor mean_dims(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                     std::optional<c10::ScalarType> dtype) {
  static const FastOp op("aten::mean", "dim", Path::kOut);
  return reduce_dims<at::_ops::mean_out>(op, self, dim, keepdim, dtype);
}

at::Tensor amax(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  static const FastOp op("aten::amax", "", Path::kOut);
  FastKey key(op.id());
  key.tensor(self), key.dims(dim), key.boolean(keepdim);
  if (FastEntry* e = op.find(key)) {
    DeferChecked checked({&self}, {});
    return op.run_out(*e, key.device(), [a = recipe(self), d = c10::DimVector(dim), keepdim](TensorRecipe o) {
      return [a = std::move(a), d = std::move(d), keepdim, o = std::move(o)] {
        Host h;
        at::Tensor out = h(o);
        at::_ops::amax_out::call(h(a), d, keepdim, out);
      };
    });
  }
  return op.slow(key, true, self, dim.vec(), keepdim);
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  static const FastOp op("aten::index_select", "", Path::kOut);
  FastKey key(op.id());
  key.tensor(self), key.integer(dim), key.tensor(index);
  if (FastEntry* e = op.find(key)) {
    DeferChecked checked({&self, &index}, {});
    return op.run_out(*e, key.device(), [a = recipe(self), dim, i = recipe(index)](TensorRecipe o) {
      return [a = std::move(a), dim, i = std::move(i), o = std::move(o)] {
        Host h;
        at::Tensor out = h(o);
        at::_ops::index_select_out::call(h(a), dim, h(i), out);
      };
    });
  }
  return op.slow(key, true, self, dim, index);
}

at::Tensor gather(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad) {
  static const FastOp op("aten::gather", "", Path::kOut);
  FastKey key(op.id());
  key.tensor(self), key.integer(dim), key.tensor(index), key.boolean(sparse_grad);
  if (FastEntry* e = op.find(key)) {
    DeferChecked checked({&self, &index}, {});
    return op.run_out(*e, key.device(), [a = recipe(self), dim, i = recipe(index), sparse_grad](TensorRecipe o) {
      return [a = std::move(a), dim, i = std::move(i), sparse_grad, o = std::move(o)] {
        Host h;
        at::Tensor out = h(o);
        at::_ops::gather_out::call(h(a), dim, h(i), sparse_grad, out);
      };
    });
  }
  return op.slow(key, true, self, dim, index, sparse_grad);
}

// The generic kernels' ops: (schema name, functional op, its out= overload) and (schema name,
// in-place op). The ops generate's decode step calls most beyond those above; matrix products,
// whose precision handling is the fallback's, and cat (also registered for the fallback's one
// out= call, fallback.cc's comment) included.
#define TORCH_TPU_FAST_FUNCTIONAL(X)                                  \
  X("mm", mm, mm_out)                                                 \
  X("bmm", bmm, bmm_out)                                              \
  X("addmm", addmm, addmm_out)                                        \
  X("cat", cat, cat_out)                                              \
  X("pow.Tensor_Scalar", pow_Tensor_Scalar, pow_Tensor_Scalar_out)    \
  X("rsqrt", rsqrt, rsqrt_out)                                        \
  X("sqrt", sqrt, sqrt_out)                                           \
  X("neg", neg, neg_out)                                              \
  X("abs", abs, abs_out)                                              \
  X("exp", exp, exp_out)                                              \
  X("tanh", tanh, tanh_out)                                           \
  X("sigmoid", sigmoid, sigmoid_out)                                  \
  X("silu", silu, silu_out)                                           \
  X("sin", sin, sin_out)                                              \
  X("cos", cos, cos_out)                                              \
  X("bitwise_not", bitwise_not, bitwise_not_out)                      \
  X("logical_not", logical_not, logical_not_out)                      \
  X("where.self", where_self, where_self_out)                         \
  X("eq.Scalar", eq_Scalar, eq_Scalar_out)                            \
  X("eq.Tensor", eq_Tensor, eq_Tensor_out)                            \
  X("ne.Scalar", ne_Scalar, ne_Scalar_out)                            \
  X("ne.Tensor", ne_Tensor, ne_Tensor_out)                            \
  X("le.Scalar", le_Scalar, le_Scalar_out)                            \
  X("le.Tensor", le_Tensor, le_Tensor_out)                            \
  X("lt.Scalar", lt_Scalar, lt_Scalar_out)                            \
  X("lt.Tensor", lt_Tensor, lt_Tensor_out)                            \
  X("ge.Scalar", ge_Scalar, ge_Scalar_out)                            \
  X("gt.Scalar", gt_Scalar, gt_Scalar_out)                            \
  X("bitwise_or.Tensor", bitwise_or_Tensor, bitwise_or_Tensor_out)    \
  X("bitwise_and.Tensor", bitwise_and_Tensor, bitwise_and_Tensor_out) \
  X("maximum", maximum, maximum_out)                                  \
  X("minimum", minimum, minimum_out)                                  \
  X("argmax", argmax, argmax_out)                                     \
  X("any.dim", any_dim, any_out)                                      \
  X("isin.Tensor_Tensor", isin_Tensor_Tensor, isin_Tensor_Tensor_out) \
  X("_softmax", _softmax, _softmax_out)                               \
  X("cumsum", cumsum, cumsum_out)
#define TORCH_TPU_FAST_IN_PLACE(X) X("index_copy_", index_copy_)

}  // namespace

uint64_t fast_kept_calls() { return kept_calls; }

const std::vector<std::string>& fast_op_labels() {
#define TORCH_TPU_LABEL(name, ...) "aten::" name,
  static const std::vector<std::string> labels = {
      "aten::add.Tensor",  "aten::sub.Tensor",
      "aten::mul.Tensor",  "aten::div.Tensor",
      "aten::add_.Tensor", "aten::sub_.Tensor",
      "aten::mul_.Tensor", "aten::div_.Tensor",
      "aten::sum",         "aten::sum.dim_IntList",
      "aten::mean",        "aten::mean.dim",
      "aten::amax",        "aten::index_select",
      "aten::gather",      TORCH_TPU_FAST_FUNCTIONAL(TORCH_TPU_LABEL) TORCH_TPU_FAST_IN_PLACE(TORCH_TPU_LABEL)};
#undef TORCH_TPU_LABEL
  return labels;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(add_tensor));
  m.impl("sub.Tensor", TORCH_FN(sub_tensor));
  m.impl("mul.Tensor", TORCH_FN(mul_tensor));
  m.impl("div.Tensor", TORCH_FN(div_tensor));
  m.impl("add_.Tensor", TORCH_FN(add__tensor));
  m.impl("sub_.Tensor", TORCH_FN(sub__tensor));
  m.impl("mul_.Tensor", TORCH_FN(mul__tensor));
  m.impl("div_.Tensor", TORCH_FN(div__tensor));
  m.impl("sum", TORCH_FN(sum_all));
  m.impl("sum.dim_IntList", TORCH_FN(sum_dims));
  m.impl("mean", TORCH_FN(mean_all));
  m.impl("mean.dim", TORCH_FN(mean_dims));
  m.impl("amax", TORCH_FN(amax));
  m.impl("index_select", TORCH_FN(index_select));
  m.impl("gather", TORCH_FN(gather));
#define TORCH_TPU_IMPL(name, op, out) \
  m.impl(name, TORCH_FN((Functional<at::_ops::op, WorkerOut<at::_ops::out>>::call)));
  TORCH_TPU_FAST_FUNCTIONAL(TORCH_TPU_IMPL)
#undef TORCH_TPU_IMPL
#define TORCH_TPU_IMPL(name, op) m.impl(name, TORCH_FN((InPlace<at::_ops::op>::call)));
  TORCH_TPU_FAST_IN_PLACE(TORCH_TPU_IMPL)
#undef TORCH_TPU_IMPL
}

}  // namespace torch_tpu
