// aten::record_stream for tpu tensors: the block's free waits for the stream's work (CUDA's
// semantics; kernels queued by torch_tpu's ops already order their own frees).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "runtime/allocator.h"

namespace torch_tpu {
namespace {

void record_stream_tpu(at::Tensor& self, c10::Stream stream) {
  tpu_allocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("record_stream", TORCH_FN(record_stream_tpu)); }

}  // namespace torch_tpu
