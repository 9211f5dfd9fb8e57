#include "aten/copy_transposed.h"

#include <ATen/Parallel.h>

#include "exec/transpose.h"

namespace torch_tpu {
namespace {

constexpr int64_t kStripRows = 64;              // the kernel's tile height
constexpr int64_t kBytesPerThread = 256 << 10;  // below this a second thread costs more than it saves

bool disjoint(const at::Tensor& dst, const at::Tensor& src) {
  const auto* d = static_cast<const char*>(dst.const_data_ptr());
  const auto* s = static_cast<const char*>(src.const_data_ptr());
  const int64_t item = src.element_size();
  const int64_t src_span = ((src.size(0) - 1) * src.stride(0) + (src.size(1) - 1) * src.stride(1) + 1) * item;
  return d + dst.numel() * item <= s || s + src_span <= d;
}

}  // namespace

bool copy_transposed(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.dim() != 2 || src.dim() != 2 || dst.sizes() != src.sizes() || dst.scalar_type() != src.scalar_type())
    return false;
  const int64_t rows = dst.size(0), cols = dst.size(1);
  if (rows < 2 || cols < 2 || !dst.is_contiguous()) return false;
  if (src.stride(0) != 1 || src.stride(1) < rows) return false;
  if (!exec::transposable_element_size(src.element_size())) return false;
  if (dst.is_conj() || src.is_conj() || dst.is_neg() || src.is_neg()) return false;
  if (!src.has_storage() || !dst.has_storage() || !disjoint(dst, src)) return false;

  const void* from = src.const_data_ptr();
  void* to = dst.mutable_data_ptr();
  const int64_t ld = src.stride(1);
  const size_t item = src.element_size();
  const int64_t strips = (rows + kStripRows - 1) / kStripRows;
  const int64_t strip_bytes = kStripRows * cols * static_cast<int64_t>(item);
  const int64_t grain = std::max<int64_t>(1, kBytesPerThread / strip_bytes);
  at::parallel_for(0, strips, grain, [&](int64_t begin, int64_t end) {
    exec::transpose_rows(from, ld, to, cols, item, begin * kStripRows, std::min(rows, end * kStripRows));
  });
  return true;
}

}  // namespace torch_tpu
