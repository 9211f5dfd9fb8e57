// Element types and shapes of the program IR, and the scalar conversions
// between f32 and the 16-bit float formats (shared by the reference
// interpreter and the executor, so both round the same way).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace torch_tpu::ir {

// Names follow XLA HLO (s32, u8, pred); the StableHLO printer spells them as
// MLIR does (i32, ui8, i1).
enum class ElementType : uint8_t { f32, bf16, f16, f64, s64, s32, s8, u8, pred };
constexpr int kNumElementTypes = 9;

const char* element_type_name(ElementType t);  // "f32", "bf16", ..., "pred"
const char* mlir_type_name(ElementType t);     // "f32", "bf16", ..., "i1"
int64_t element_size(ElementType t);           // bytes in memory; pred is one byte (0/1)
inline bool is_float(ElementType t) {
  return t == ElementType::f32 || t == ElementType::bf16 || t == ElementType::f16 || t == ElementType::f64;
}
inline bool is_pred(ElementType t) { return t == ElementType::pred; }

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& shape);          // 1 for rank 0
std::string shape_str(const Shape& shape);  // "[4,8]", "[]"
// Row-major strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& shape);

struct TensorType {
  ElementType dtype = ElementType::f32;
  Shape shape;
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return ir::numel(shape); }
  std::string str() const;  // "f32[4,8]"
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

// ---- f32 <-> bf16 / f16, round to nearest even, NaN kept quiet. Branch-free
// so loops over them vectorize.

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_bits(f);
  uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (b >> 16) | 0x40u;
  return static_cast<uint16_t>(f != f ? quiet_nan : rounded);
}

// IEEE half, subnormals included. The scaling trick for f32 -> f16 rounds in
// the f32 adder (M. Dukhan's FP16 method); it needs IEEE arithmetic, i.e. no
// -ffast-math.
inline float f16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude = two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized);
  return f32_from_bits(sign | magnitude);
}
inline uint16_t f32_to_f16(float f) {
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// A double rounded to a floating type (f32, bf16, f16 through f32), and an
// int64 wrapped to an integer type's width (pred: != 0).
double round_to_type(double v, ElementType t);
int64_t wrap_to_type(int64_t v, ElementType t);

inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
inline float round_to_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// Integer division and power of the IR (interpreter and tile kernels alike):
// x / 0 is -1 and INT64_MIN / -1 wraps; a negative exponent gives 0 unless
// the base is 1 or -1; products wrap.
inline int64_t int_divide(int64_t a, int64_t b) {
  if (b == 0) return -1;
  if (a == std::numeric_limits<int64_t>::min() && b == -1) return a;
  return a / b;
}
inline int64_t int_power(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t result = 1, b = static_cast<uint64_t>(base);
  while (e) {
    if (e & 1) result *= b;
    b *= b;
    e >>= 1;
  }
  return static_cast<int64_t>(result);
}

}  // namespace torch_tpu::ir
