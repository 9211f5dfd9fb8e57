#include "exec/buffer.h"

#include <stdexcept>

namespace torch_tpu::exec {

std::vector<int64_t> Buffer::effective_strides() const {
  if (strides.empty()) return ir::contiguous_strides(shape);
  if (strides.size() != shape.size())
    throw std::invalid_argument("[buffer] " + std::to_string(strides.size()) + " strides for shape " +
                                ir::shape_str(shape));
  return strides;
}

bool Buffer::is_contiguous() const {
  if (strides.empty()) return true;
  std::vector<int64_t> want = ir::contiguous_strides(shape);
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && strides[d] != want[d]) return false;
  return true;
}

std::string Buffer::str() const {
  std::string s = type().str();
  if (!strides.empty()) s += " strides " + ir::shape_str(strides);
  return s;
}

}  // namespace torch_tpu::exec
