// Copies whose source is a transposed matrix, on the host tensors over HBM.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_tpu {

// dst.copy_(src) when `dst` is a contiguous matrix and `src` a transposed one
// (x.t() of a row-major matrix: strides (1, ld), ld >= its row count) of the
// same shape and dtype, with 2-, 4- or 8-byte elements and no overlap: a blocked
// transpose split across the intra-op threads (ATen's CPU kernel for the case
// runs on one thread). Returns false, having done nothing, otherwise.
bool copy_transposed(const at::Tensor& dst, const at::Tensor& src);

}  // namespace torch_tpu
