// Native tpu kernels: copies between host and chips, scalar reads, fill.
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include "aten/copy_transposed.h"
#include "aten/op_cost.h"
#include "defer/defer.h"
#include "runtime/allocator.h"
#include "runtime/calling_thread.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/errors.h"
#include "runtime/host_alias.h"
#include "runtime/tensor_factory.h"

namespace torch_tpu {
namespace {

constexpr size_t kSnapshotBytes = 1 << 20;

bool is_pinned(const at::Tensor& t) {
  return t.device().is_cpu() && t.numel() > 0 && is_pinned_ptr(t.storage().data());
}

// Queues `dst.copy_(src)` over device memory on `stream` (sized by the bytes
// it writes: clone/contiguous copy into a fresh buffer; see Stream::enqueue_named).
void enqueue_copy(vtpu::Stream& stream, TensorRecipe dst, TensorRecipe src) {
  const uint64_t written = dst.storage.nbytes();
  enqueue_sized(
      stream, "aten::copy_",
      [dst = std::move(dst), src = std::move(src)] {
        AliasBuilder host(c10::kCPU);
        auto d = host.alias(dst);
        auto s = host.alias(src);
        if (!copy_transposed(d, s)) d.copy_(s);
      },
      written);
}

at::Tensor copy_from_tpu(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (dst.is_same(src)) return dst;
  // CPU's copy_ checks, in its order and with its messages: overlaps, then shapes.
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, src);
  const auto broadcast = at::infer_size_dimvector(dst.sizes(), src.sizes());
  TORCH_CHECK(c10::IntArrayRef(broadcast) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(broadcast));
  if (dst.numel() == 0) return dst;
  // Broadcasting copies are expanded first so that both sides have one shape.
  at::Tensor source = src.sizes() == dst.sizes() ? src : src.expand(dst.sizes());
  DeferChecked deferred({&source}, {&dst});  // flushes a pending region this copy reads or writes
  const bool src_tpu = source.device().type() == kTPU;
  const bool dst_tpu = dst.device().type() == kTPU;
  // HBM traffic on each chip involved (a host side moves no HBM bytes).
  if (src_tpu && dst_tpu && source.device() == dst.device()) {
    chip(dst.device().index()).record_cost(transfer_cost(physical_bytes_of(source), physical_bytes_of(dst)));
  } else {
    if (src_tpu) chip(source.device().index()).record_cost(transfer_cost(physical_bytes_of(source), 0));
    if (dst_tpu) chip(dst.device().index()).record_cost(transfer_cost(0, physical_bytes_of(dst)));
  }
  if (dry_run()) {  // priced, not moved
    if (!dst_tpu)
      dry_run_host_read("copying a tpu tensor of shape " + c10::str(source.sizes()) + " to " + dst.device().str());
    mark_undefined(dst);
    return dst;
  }
  if (any_undefined()) {
    if (src_tpu) check_defined(source, "copy_ from " + source.device().str() + " to " + dst.device().str());
    if (dst_tpu) clear_undefined_if_whole(dst);
  }

  if (src_tpu && dst_tpu) {
    auto& dst_stream = current_vtpu_stream(dst.device().index());
    if (source.device() != dst.device()) {
      // Order the copy after the source chip's queued work, and that chip's
      // later work after the copy.
      auto& src_stream = current_vtpu_stream(source.device().index());
      vtpu::Event ready;
      translate_errors([&] {
        ready.record(src_stream);
        ready.block(dst_stream);
      });
      enqueue_copy(dst_stream, TensorRecipe::of(dst), TensorRecipe::of(source));
      vtpu::Event done;
      translate_errors([&] {
        done.record(dst_stream);
        done.block(src_stream);
      });
    } else {
      enqueue_copy(dst_stream, TensorRecipe::of(dst), TensorRecipe::of(source));
    }
    return dst;
  }
  if (dst_tpu) {  // host -> device
    TORCH_CHECK(source.device().is_cpu(), "copy_: cannot copy from ", source.device(), " to ", dst.device());
    auto& stream = current_vtpu_stream(dst.device().index());
    if (non_blocking && is_pinned(src)) {
      enqueue_copy(stream, TensorRecipe::of(dst), TensorRecipe::of(source));
    } else if (source.nbytes() <= kSnapshotBytes) {
      // Pageable memory may change once we return: queue a snapshot.
      at::Tensor snapshot;
      {
        SerialOnCallingThread serial;
        snapshot = source.clone();
      }
      enqueue_copy(stream, TensorRecipe::of(dst), TensorRecipe::of(snapshot));
    } else {
      // Large pageable copies return once done, as cudaMemcpy does: a
      // snapshot would cost a second pass over the data. The worker copies,
      // so the calling thread starts no OpenMP team (calling_thread.h).
      enqueue_copy(stream, TensorRecipe::of(dst), TensorRecipe::of(source));
      synchronize_stream(stream);
    }
    return dst;
  }
  // device -> host
  TORCH_CHECK(dst.device().is_cpu(), "copy_: cannot copy from ", source.device(), " to ", dst.device());
  auto& stream = current_vtpu_stream(source.device().index());
  if (non_blocking && is_pinned(dst)) {
    enqueue_copy(stream, TensorRecipe::of(dst), TensorRecipe::of(source));
    return dst;
  }
  // Copied by the worker, waited for: the calling thread starts no OpenMP team.
  enqueue_copy(stream, TensorRecipe::of(dst), TensorRecipe::of(source));
  synchronize_stream(stream);
  return dst;
}

at::Tensor copy_from_and_resize_tpu(const at::Tensor& src, const at::Tensor& dst) {
  if (dst.sizes() != src.sizes()) dst.resize_(src.sizes());
  return copy_from_tpu(src, dst, false);
}

at::Scalar local_scalar_dense_tpu(const at::Tensor& self) {
  if (dry_run()) dry_run_host_read("reading a tpu tensor's value (.item(), bool(), printing)");
  if (any_undefined()) check_defined(self, "reading a tpu tensor's value (.item(), bool(), printing)");
  auto& stream = current_vtpu_stream(self.device().index());
  synchronize_stream(stream);
  return host_alias(self).item();
}

at::Tensor& fill_scalar_tpu_(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() == 0) return self;
  DeferChecked deferred({}, {&self});
  auto& stream = current_vtpu_stream(self.device().index());
  chip(self.device().index()).record_cost(transfer_cost(0, physical_bytes_of(self)));
  if (dry_run()) {  // priced, not written
    mark_undefined(self);
    return self;
  }
  clear_undefined_if_whole(self);
  // Stream-ordered, as op results: a dropped tensor's block goes back at once for later work on
  // this stream (holding it until the fill ran kept a block per queued `torch.zeros`).
  stream.enqueue_named(
      "aten::fill_",
      [dst = stream_ordered_recipe(self, stream), value] {
        AliasBuilder host(c10::kCPU);
        host.alias(dst).fill_(value);
      },
      0);
  return self;
}

at::Tensor& zero_tpu_(at::Tensor& self) { return fill_scalar_tpu_(self, 0); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from_tpu));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize_tpu));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense_tpu));
  m.impl("fill_.Scalar", TORCH_FN(fill_scalar_tpu_));
  m.impl("zero_", TORCH_FN(zero_tpu_));
}

// Copies resolve lazy conjugate/negation bits themselves (the host copy_ sees
// them through the aliases): PyTorch's Conjugate/Negative fallbacks would
// clone, and the clone would call _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torch_tpu
