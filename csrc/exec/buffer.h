// A view of memory the executor reads or writes: pointer, element type,
// shape and strides in elements. Strides may be anything for inputs (0 for
// an expanded dimension, negative, transposed); outputs must not overlap
// each other or the inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/types.h"

namespace torch_tpu::exec {

struct Buffer {
  void* data = nullptr;
  ir::ElementType dtype = ir::ElementType::f32;
  ir::Shape shape;
  std::vector<int64_t> strides;  // elements; empty means row-major contiguous

  static Buffer contiguous(void* data, ir::ElementType dtype, ir::Shape shape) {
    return Buffer{data, dtype, std::move(shape), {}};
  }
  static Buffer strided(void* data, ir::ElementType dtype, ir::Shape shape, std::vector<int64_t> strides) {
    return Buffer{data, dtype, std::move(shape), std::move(strides)};
  }

  int64_t numel() const { return ir::numel(shape); }
  ir::TensorType type() const { return ir::TensorType{dtype, shape}; }
  // The strides to use: `strides`, or row-major ones when it is empty.
  std::vector<int64_t> effective_strides() const;
  // Row-major dense (size-1 dimensions may have any stride).
  bool is_contiguous() const;
  std::string str() const;  // "f32[4,8] strides [8,1]"
};

}  // namespace torch_tpu::exec
