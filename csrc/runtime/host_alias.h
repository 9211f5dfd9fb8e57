// Device memory seen as host tensors. The vTPU's HBM is host memory, so a
// host (CPU) tensor over the same bytes lets ATen's CPU kernels compute on
// device buffers in place. Only stream workers and synchronized callers may
// touch such aliases.
#pragma once

#include <ATen/core/DimVector.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>

#include <utility>

namespace torch_tpu {

// What queued work needs to rebuild a tensor on the worker: it holds the
// storage (so the memory outlives the work) but not the TensorImpl, which
// may own a Python object. An unowned recipe keeps only the storage's bytes
// and identity, for work whose stream orders the memory's reuse
// (stream_ordered_recipe in allocator.h).
struct TensorRecipe {
  c10::Storage storage;  // empty in an unowned recipe
  void* unowned_data = nullptr;
  size_t unowned_nbytes = 0;
  const c10::StorageImpl* unowned_storage = nullptr;
  c10::DimVector sizes;  // inline up to 5 dimensions: no heap allocation per op
  c10::DimVector strides;
  int64_t storage_offset = 0;
  caffe2::TypeMeta dtype;
  bool wrapped_number = false;
  bool conj = false;  // lazy conjugate / negation bits (views of complex tensors)
  bool neg = false;

  static TensorRecipe of(const at::Tensor& t);
  static TensorRecipe of_unowned(const at::Tensor& t);

  void* data() const { return storage ? const_cast<void*>(storage.data()) : unowned_data; }
  size_t nbytes() const { return storage ? storage.nbytes() : unowned_nbytes; }
  // The storage's identity (recipes of one storage share one alias storage).
  const c10::StorageImpl* storage_identity() const {
    return storage ? storage.unsafeGetStorageImpl() : unowned_storage;
  }
  bool on_host() const { return storage && storage.device_type() == c10::kCPU; }
};

// Builds aliases of tensors on another device type (CPU over the same bytes,
// or Meta with the same metadata), preserving which of them share storage.
class AliasBuilder {
 public:
  explicit AliasBuilder(c10::DeviceType target) : target_(target) {}
  at::Tensor alias(const TensorRecipe& recipe);
  at::Tensor alias(const at::Tensor& t) { return alias(TensorRecipe::of(t)); }

 private:
  c10::DeviceType target_;
  // An op has a handful of storages: a linear search over an inline array beats a hash map.
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
};

// The host tensor over `t`'s device memory (caller must have synchronized).
at::Tensor host_alias(const at::Tensor& t);

}  // namespace torch_tpu
