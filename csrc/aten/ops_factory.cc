// Native tpu kernels: empty tensors, views, resize_ and set_ (tensor_factory.h makes the tensors).
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/tensor_factory.h"

namespace torch_tpu {
namespace {

void check_options(c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                   c10::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "empty: pin_memory=True is for CPU tensors only; a tpu tensor lives in ",
              "HBM (pin a CPU tensor and copy it with .to(\"tpu\", non_blocking=True))");
  if (layout.has_value() && *layout != c10::kStrided) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu tensors support only the strided layout, got ", *layout,
                                " (sparse and other layouts do not exist on TPU)");
  }
  TORCH_CHECK(!device.has_value() || device->type() == kTPU, "expected a tpu device, got ", *device);
}

c10::DeviceIndex index_of(c10::optional<c10::Device> device) {
  return resolve_index(device.has_value() && device->has_index() ? device->index() : -1);
}

// empty_tpu() for a composite op's result (clone's empty_like), as an op's own results are
// allocated: a block freed in stream order on the current stream if one fits (whatever fills
// the tensor is queued there, or waits for the chip), else a new one after the run-ahead
// bound's wait (wait_run_ahead_before_allocating).
at::Tensor empty_after_run_ahead(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype,
                                 c10::DeviceIndex device) {
  chip(device);  // validates the index before anything waits or is allocated
  size_t nbytes;
  uint64_t physical;
  tpu_buffer_bytes(size, stride, c10::elementSize(dtype), &nbytes, &physical);
  if (nbytes > 0 && !dry_run()) {
    c10::DataPtr block = tpu_allocator().reuse_on(device, nbytes, physical, current_vtpu_stream_unflushed(device));
    if (block) return tpu_tensor_in(std::move(block), size, stride, dtype, nbytes);
  }
  wait_run_ahead_before_allocating(device, nbytes);
  return empty_tpu_bytes(size, stride, dtype, device, nbytes, physical);
}

at::Tensor empty_strided_tpu(c10::IntArrayRef size, c10::IntArrayRef stride, c10::optional<c10::ScalarType> dtype,
                             c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                             c10::optional<bool> pin_memory) {
  check_options(layout, device, pin_memory);
  for (auto s : size) TORCH_CHECK(s >= 0, "empty_strided: negative dimension ", s, " in size ", size);
  return empty_after_run_ahead(size, stride, dtype.value_or(c10::get_default_dtype_as_scalartype()), index_of(device));
}

at::Tensor empty_memory_format_tpu(c10::IntArrayRef size, c10::optional<c10::ScalarType> dtype,
                                   c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                                   c10::optional<bool> pin_memory, c10::optional<c10::MemoryFormat> memory_format) {
  check_options(layout, device, pin_memory);
  for (auto s : size) TORCH_CHECK(s >= 0, "empty: negative dimension ", s, " in size ", size);
  auto t = empty_after_run_ahead(size, c10::contiguous_strides(size),
                                 dtype.value_or(c10::get_default_dtype_as_scalartype()), index_of(device));
  auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  if (format != c10::MemoryFormat::Contiguous) t.unsafeGetTensorImpl()->empty_tensor_restride(format);
  return t;
}

const at::Tensor& resize_tpu_(const at::Tensor& self, c10::IntArrayRef size,
                              c10::optional<c10::MemoryFormat> memory_format) {
  for (auto s : size) TORCH_CHECK(s >= 0, "resize_: negative dimension ", s, " in size ", size);
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  size_t needed =
      at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.itemsize(), self.storage_offset());
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "resize_: unsupported memory format Preserve");
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_tpu_(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                             c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  c10::DimVector strides = stride.data() != nullptr ? c10::DimVector(stride) : c10::contiguous_strides(size);
  size_t needed = at::detail::computeStorageNbytes(size, strides, self.itemsize(), storage_offset);
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides, storage_offset);
  return self;
}

at::Tensor& set_source_tpu_(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_storage_tpu_(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor_tpu_(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_tpu_(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty_tpu_(at::Tensor& self) {
  auto empty = empty_tpu({0}, {1}, self.scalar_type(), self.device().index());
  return set_storage_tpu_(self, empty.storage(), 0, {0}, {});
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format_tpu));
  m.impl("empty_strided", TORCH_FN(empty_strided_tpu));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_tpu_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_tpu_));
  m.impl("set_.source_Storage", TORCH_FN(set_source_tpu_));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor_tpu_));
  m.impl("set_", TORCH_FN(set_empty_tpu_));
}

}  // namespace torch_tpu
