#include "ir/types.h"

#include <stdexcept>

namespace torch_tpu::ir {

const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return "f32";
    case ElementType::bf16:
      return "bf16";
    case ElementType::f16:
      return "f16";
    case ElementType::f64:
      return "f64";
    case ElementType::s64:
      return "s64";
    case ElementType::s32:
      return "s32";
    case ElementType::s8:
      return "s8";
    case ElementType::u8:
      return "u8";
    case ElementType::pred:
      return "pred";
  }
  throw std::invalid_argument("unknown element type");
}

const char* mlir_type_name(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return "f32";
    case ElementType::bf16:
      return "bf16";
    case ElementType::f16:
      return "f16";
    case ElementType::f64:
      return "f64";
    case ElementType::s64:
      return "i64";
    case ElementType::s32:
      return "i32";
    case ElementType::s8:
      return "i8";
    case ElementType::u8:
      return "ui8";
    case ElementType::pred:
      return "i1";
  }
  throw std::invalid_argument("unknown element type");
}

int64_t element_size(ElementType t) {
  switch (t) {
    case ElementType::f64:
    case ElementType::s64:
      return 8;
    case ElementType::f32:
    case ElementType::s32:
      return 4;
    case ElementType::bf16:
    case ElementType::f16:
      return 2;
    case ElementType::s8:
    case ElementType::u8:
    case ElementType::pred:
      return 1;
  }
  throw std::invalid_argument("unknown element type");
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

double round_to_type(double v, ElementType t) {
  switch (t) {
    case ElementType::f64:
      return v;
    case ElementType::f32:
      return static_cast<double>(static_cast<float>(v));
    case ElementType::bf16:
      return round_to_bf16(static_cast<float>(v));
    case ElementType::f16:
      return round_to_f16(static_cast<float>(v));
    default:
      throw std::invalid_argument("round_to_type: not a floating type");
  }
}

int64_t wrap_to_type(int64_t v, ElementType t) {
  switch (t) {
    case ElementType::s64:
      return v;
    case ElementType::s32:
      return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v)));
    case ElementType::s8:
      return static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint64_t>(v)));
    case ElementType::u8:
      return static_cast<uint8_t>(static_cast<uint64_t>(v));
    case ElementType::pred:
      return v != 0;
    default:
      throw std::invalid_argument("wrap_to_type: not an integer type");
  }
}

std::string TensorType::str() const { return std::string(element_type_name(dtype)) + shape_str(shape); }

}  // namespace torch_tpu::ir
