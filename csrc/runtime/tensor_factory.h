// Creating and re-shaping tpu tensors (shared by native ops and the fallback).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace torch_tpu {

// A tpu tensor with `sizes`/`strides` on tpu:<device>, its storage taken from
// the chip's HBM and accounted in physical (tiled) bytes.
at::Tensor empty_tpu(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype, c10::DeviceIndex device);

// The bytes empty_tpu() takes for that layout: the storage's `nbytes` and the HBM bytes it
// is accounted in (`physical`, tiled).
void tpu_buffer_bytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t itemsize, size_t* nbytes,
                      uint64_t* physical);
// empty_tpu() with those bytes worked out before (tpu_buffer_bytes of the same layout).
at::Tensor empty_tpu_bytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                           c10::DeviceIndex device, size_t nbytes, uint64_t physical);
// Same, in a block the caller took from the tpu allocator (`data`, `nbytes` long).
at::Tensor tpu_tensor_in(c10::DataPtr data, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                         size_t nbytes);

// A tpu tensor over an existing tpu storage (sharing it) with this layout.
at::Tensor tpu_tensor_over(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                           int64_t offset, c10::ScalarType dtype);

// Grows (or shrinks) a tpu storage to `nbytes`, keeping its contents.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

// Gives tpu tensor `t` these sizes, strides and offset, growing its storage
// when they do not fit.
void set_metadata(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset);

}  // namespace torch_tpu
