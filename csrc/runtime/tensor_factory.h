// Creating and re-shaping tpu tensors (shared by native ops and the fallback).
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_tpu {

// A tpu tensor with `sizes`/`strides` on tpu:<device>, its storage taken from
// the chip's HBM and accounted in physical (tiled) bytes.
at::Tensor empty_tpu(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype, c10::DeviceIndex device);

// Grows (or shrinks) a tpu storage to `nbytes`, keeping its contents.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

// Gives tpu tensor `t` these sizes, strides and offset, growing its storage
// when they do not fit.
void set_metadata(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset);

}  // namespace torch_tpu
