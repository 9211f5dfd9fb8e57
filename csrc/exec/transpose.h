// Transposing copy of a matrix in host memory: the kernel behind tpu copies
// whose source is a transposed view (`x.t().contiguous()`, `y.copy_(x.t())`).
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_tpu::exec {

// Element sizes transpose_rows moves (bytes): 2, 4 and 8.
bool transposable_element_size(size_t element_size);

// Rows [row_begin, row_end) of `dst`, a row-major [rows, cols] matrix, set to
// the transpose of `src`, a [cols, rows] matrix whose rows lie `src_row_stride`
// elements apart (src_row_stride >= rows). Elements are copied bit for bit.
// Throws std::invalid_argument for an element size not transposable. The two
// ranges must not overlap; distinct row ranges may run on different threads.
void transpose_rows(const void* src, int64_t src_row_stride, void* dst, int64_t cols, size_t element_size,
                    int64_t row_begin, int64_t row_end);

}  // namespace torch_tpu::exec
