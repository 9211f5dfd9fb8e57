// exec::transpose_rows: every element where it belongs, for each element size,
// ragged edges, a source row stride above the row count, and split row ranges.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "exec/transpose.h"

namespace {

using torch_tpu::exec::transposable_element_size;
using torch_tpu::exec::transpose_rows;

// dst [rows, cols] from src [cols, ld]; the rows split at `split` (two calls).
template <typename T>
void check(int64_t rows, int64_t cols, int64_t ld, int64_t split) {
  std::vector<T> src(static_cast<size_t>(cols * ld));
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<T>(k * 2654435761u + 1);
  const T sentinel = static_cast<T>(0x5a5a5a5a5a5a5a5aull);
  std::vector<T> dst(static_cast<size_t>(rows * cols) + 8, sentinel);
  transpose_rows(src.data(), ld, dst.data(), cols, sizeof(T), 0, split);
  transpose_rows(src.data(), ld, dst.data(), cols, sizeof(T), split, rows);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      ASSERT_EQ(dst[i * cols + j], src[j * ld + i]) << "rows " << rows << " cols " << cols << " ld " << ld << " at ("
                                                    << i << ", " << j << "), " << sizeof(T) << " bytes";
    }
  }
  for (size_t k = static_cast<size_t>(rows * cols); k < dst.size(); ++k)
    ASSERT_EQ(dst[k], sentinel) << "wrote past the end";
}

template <typename T>
void check_shapes() {
  const int64_t shapes[][2] = {{2, 2}, {8, 8}, {9, 7}, {64, 64}, {65, 130}, {3, 200}, {200, 3}, {128, 96}};
  for (const auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1];
    check<T>(rows, cols, rows, rows);
    check<T>(rows, cols, rows + 5, rows / 2);
    check<T>(rows, cols, rows, 64 < rows ? 64 : rows / 2);
  }
}

TEST(Transpose, TwoByteElements) { check_shapes<uint16_t>(); }
TEST(Transpose, FourByteElements) { check_shapes<uint32_t>(); }
TEST(Transpose, EightByteElements) { check_shapes<uint64_t>(); }

TEST(Transpose, OtherElementSizesRejected) {
  EXPECT_FALSE(transposable_element_size(1));
  EXPECT_FALSE(transposable_element_size(16));
  EXPECT_TRUE(transposable_element_size(4));
  uint8_t a[4] = {}, b[4] = {};
  EXPECT_THROW(transpose_rows(a, 2, b, 2, 1, 0, 2), std::invalid_argument);
}

}  // namespace
