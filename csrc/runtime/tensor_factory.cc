// tpu tensors over the chips' HBM (see tensor_factory.h).
#include "runtime/tensor_factory.h"

#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <cstring>

#include "defer/defer.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "vtpu/layout.h"

namespace torch_tpu {

void tpu_buffer_bytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t itemsize, size_t* nbytes,
                      uint64_t* physical) {
  *nbytes = at::detail::computeStorageNbytes(sizes, strides, itemsize);
  *physical = vtpu::physical_bytes(sizes.vec(), itemsize);
  if (*nbytes > static_cast<size_t>(c10::multiply_integers(sizes)) * itemsize) {
    // Strides with gaps span more memory than the shape: tile the whole span.
    int64_t span = static_cast<int64_t>(*nbytes / itemsize);
    *physical = std::max(*physical, vtpu::physical_bytes({span}, itemsize));
  }
}

at::Tensor empty_tpu_bytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                           c10::DeviceIndex device, size_t nbytes, uint64_t physical) {
  return tpu_tensor_in(tpu_allocator().allocate_on(device, nbytes, physical), sizes, strides, dtype, nbytes);
}

at::Tensor tpu_tensor_in(c10::DataPtr data, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                         size_t nbytes) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &tpu_allocator(),
                       /*resizable=*/true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

at::Tensor tpu_tensor_over(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                           int64_t offset, c10::ScalarType dtype) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

at::Tensor empty_tpu(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype, c10::DeviceIndex device) {
  chip(device);  // validates the index before anything is allocated
  size_t nbytes;
  uint64_t physical;
  tpu_buffer_bytes(sizes, strides, c10::elementSize(dtype), &nbytes, &physical);
  return empty_tpu_bytes(sizes, strides, dtype, device, nbytes, physical);
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  defer_flush_storage(storage);  // a deferred region may still produce or write it
  auto device = storage->device().index();
  auto data = tpu_allocator().allocate_on(device, nbytes, vtpu::physical_bytes_of_buffer(nbytes));
  size_t keep = std::min(nbytes, storage->nbytes());
  // Queued work reaches the bytes through this StorageImpl when it runs: it must be done
  // with the old ones before they are swapped out (also when shrinking to 0, as FSDP2's
  // reshard does with storage.resize_(0)).
  // A dry run writes no HBM: the old bytes were never computed.
  if (storage->nbytes() > 0 && !dry_run()) synchronize_device(device);
  if (keep > 0 && !dry_run()) std::memcpy(data.get(), storage->data(), keep);
  if (keep > 0 && buffer_undefined(storage->data_ptr())) set_buffer_undefined(data);  // kept bytes: as undefined
  storage->set_data_ptr_noswap(std::move(data));
  storage->set_nbytes(nbytes);
}

void set_metadata(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  size_t needed = at::detail::computeStorageNbytes(sizes, strides, t.itemsize(), offset);
  if (needed > t.storage().nbytes()) resize_storage_bytes(t.storage().unsafeGetStorageImpl(), needed);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

}  // namespace torch_tpu
