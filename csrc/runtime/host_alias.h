// Device memory seen as host tensors. The vTPU's HBM is host memory, so a
// host (CPU) tensor over the same bytes lets ATen's CPU kernels compute on
// device buffers in place. Only stream workers and synchronized callers may
// touch such aliases.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <unordered_map>
#include <vector>

namespace torch_tpu {

// What queued work needs to rebuild a tensor on the worker: it holds the
// storage (so the memory outlives the work) but not the TensorImpl, which
// may own a Python object.
struct TensorRecipe {
  c10::Storage storage;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
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
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages_;
};

// The host tensor over `t`'s device memory (caller must have synchronized).
at::Tensor host_alias(const at::Tensor& t);

}  // namespace torch_tpu
