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
// may own a Python object.
struct TensorRecipe {
  c10::Storage storage;
  c10::DimVector sizes;  // inline up to 5 dimensions: no heap allocation per op
  c10::DimVector strides;
  int64_t storage_offset = 0;
  caffe2::TypeMeta dtype;
  bool wrapped_number = false;
  bool conj = false;  // lazy conjugate / negation bits (views of complex tensors)
  bool neg = false;

  static TensorRecipe of(const at::Tensor& t);
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
