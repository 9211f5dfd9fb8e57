#include "runtime/host_alias.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

namespace torch_tpu {

namespace {
void copy_metadata(const at::Tensor& t, TensorRecipe& r) {
  r.sizes.assign(t.sizes().begin(), t.sizes().end());
  r.strides.assign(t.strides().begin(), t.strides().end());
  r.storage_offset = t.storage_offset();
  r.dtype = t.dtype();
  r.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
  r.conj = t.is_conj();
  r.neg = t.is_neg();
}
}  // namespace

TensorRecipe TensorRecipe::of(const at::Tensor& t) {
  TensorRecipe r;
  r.storage = t.storage();
  copy_metadata(t, r);
  return r;
}

TensorRecipe TensorRecipe::of_unowned(const at::Tensor& t) {
  TensorRecipe r;
  const c10::Storage& s = t.storage();
  r.unowned_data = const_cast<void*>(s.data());
  r.unowned_nbytes = s.nbytes();
  r.unowned_storage = s.unsafeGetStorageImpl();
  copy_metadata(t, r);
  return r;
}

at::Tensor AliasBuilder::alias(const TensorRecipe& r) {
  const c10::StorageImpl* key = r.storage_identity();
  const c10::Storage* found = nullptr;
  for (const auto& [k, s] : storages_) {
    if (k == key) found = &s;
  }
  if (!found) {
    c10::Storage s;
    size_t nbytes = r.nbytes();
    if (target_ == c10::DeviceType::Meta) {
      s = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                       c10::GetAllocator(c10::kMeta),
                       /*resizable=*/true);
    } else if (r.on_host()) {
      s = r.storage;  // already host memory
    } else {
      // Non-owning: the recipe's storage, or its stream's order, keeps the memory alive.
      s = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(r.data(), c10::Device(c10::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
    }
    storages_.emplace_back(key, std::move(s));
    found = &storages_.back().second;
  }
  auto key_set = c10::DispatchKeySet(target_ == c10::DeviceType::Meta ? c10::DispatchKey::Meta : c10::DispatchKey::CPU);
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(*found), key_set, r.dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes, r.strides, r.storage_offset);
  if (r.wrapped_number) t.unsafeGetTensorImpl()->set_wrapped_number(true);
  if (r.conj) t._set_conj(true);
  if (r.neg) t._set_neg(true);
  return t;
}

at::Tensor host_alias(const at::Tensor& t) {
  AliasBuilder builder(c10::DeviceType::CPU);
  return builder.alias(t);
}

}  // namespace torch_tpu
