#include "exec/transpose.h"

#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TRANSPOSE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TRANSPOSE_CLONES
#endif
#define TRANSPOSE_AI inline __attribute__((always_inline))

namespace torch_tpu::exec {
namespace {

// Eight lanes of an element's bits; each ISA clone lowers the shuffles below to its own.
typedef uint16_t Lanes16 __attribute__((vector_size(16)));
typedef uint32_t Lanes32 __attribute__((vector_size(32)));
typedef uint64_t Lanes64 __attribute__((vector_size(64)));
template <typename T>
struct EightLanes;
template <>
struct EightLanes<uint16_t> {
  using type = Lanes16;
};
template <>
struct EightLanes<uint32_t> {
  using type = Lanes32;
};
template <>
struct EightLanes<uint64_t> {
  using type = Lanes64;
};

// out[c][r] = in[r][c] for an 8x8 block, in registers: three butterfly stages
// (swap 4x4 quadrants, then 2x2 pairs, then single elements).
template <typename T>
TRANSPOSE_AI void block8(const T* in, int64_t in_stride, T* out, int64_t out_stride) {
  using V = typename EightLanes<T>::type;
  V a[8], b[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&a[k], in + k * in_stride, sizeof(V));
  for (int k = 0; k < 4; ++k) {
    b[k] = __builtin_shufflevector(a[k], a[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    b[k + 4] = __builtin_shufflevector(a[k], a[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int g = 0; g < 8; g += 4) {
    for (int k = g; k < g + 2; ++k) {
      a[k] = __builtin_shufflevector(b[k], b[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      a[k + 2] = __builtin_shufflevector(b[k], b[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int k = 0; k < 8; k += 2) {
    b[k] = __builtin_shufflevector(a[k], a[k + 1], 0, 8, 2, 10, 4, 12, 6, 14);
    b[k + 1] = __builtin_shufflevector(a[k], a[k + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  }
  for (int k = 0; k < 8; ++k) std::memcpy(out + k * out_stride, &b[k], sizeof(V));
}

// 64x64 tiles (measured best of 8..64 on a 1024x1024 float32 matrix), 8x8 blocks
// inside them, element by element at the ragged edges.
template <typename T>
TRANSPOSE_AI void transpose_tiles(const T* src, int64_t ld, T* dst, int64_t cols, int64_t r0, int64_t r1) {
  constexpr int64_t kTile = 64;
  for (int64_t ib = r0; ib < r1; ib += kTile) {
    const int64_t ie = ib + kTile < r1 ? ib + kTile : r1;
    for (int64_t jb = 0; jb < cols; jb += kTile) {
      const int64_t je = jb + kTile < cols ? jb + kTile : cols;
      int64_t i = ib;
      for (; i + 8 <= ie; i += 8) {
        int64_t j = jb;
        for (; j + 8 <= je; j += 8) block8<T>(src + j * ld + i, ld, dst + i * cols + j, cols);
        for (; j < je; ++j) {
          for (int64_t r = i; r < i + 8; ++r) dst[r * cols + j] = src[j * ld + r];
        }
      }
      for (; i < ie; ++i) {
        for (int64_t j = jb; j < je; ++j) dst[i * cols + j] = src[j * ld + i];
      }
    }
  }
}

TRANSPOSE_CLONES void transpose16(const uint16_t* s, int64_t ld, uint16_t* d, int64_t cols, int64_t r0, int64_t r1) {
  transpose_tiles(s, ld, d, cols, r0, r1);
}
TRANSPOSE_CLONES void transpose32(const uint32_t* s, int64_t ld, uint32_t* d, int64_t cols, int64_t r0, int64_t r1) {
  transpose_tiles(s, ld, d, cols, r0, r1);
}
TRANSPOSE_CLONES void transpose64(const uint64_t* s, int64_t ld, uint64_t* d, int64_t cols, int64_t r0, int64_t r1) {
  transpose_tiles(s, ld, d, cols, r0, r1);
}

}  // namespace

bool transposable_element_size(size_t element_size) {
  return element_size == 2 || element_size == 4 || element_size == 8;
}

void transpose_rows(const void* src, int64_t src_row_stride, void* dst, int64_t cols, size_t element_size,
                    int64_t row_begin, int64_t row_end) {
  switch (element_size) {
    case 2:
      transpose16(static_cast<const uint16_t*>(src), src_row_stride, static_cast<uint16_t*>(dst), cols, row_begin,
                  row_end);
      break;
    case 4:
      transpose32(static_cast<const uint32_t*>(src), src_row_stride, static_cast<uint32_t*>(dst), cols, row_begin,
                  row_end);
      break;
    case 8:
      transpose64(static_cast<const uint64_t*>(src), src_row_stride, static_cast<uint64_t*>(dst), cols, row_begin,
                  row_end);
      break;
    default:
      throw std::invalid_argument("transpose_rows: elements of " + std::to_string(element_size) +
                                  " bytes (2, 4 or 8 expected)");
  }
}

}  // namespace torch_tpu::exec
