// Host kernels that allocate their own results write them straight into the op's HBM results.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <string>

namespace torch_tpu {

// While one is open on a thread, the process's CPU allocator hands the first allocation of
// exactly an offered result's byte count made on that thread (a tensor's, or a raw buffer's:
// oneDNN's go through raw_allocate) that result's own HBM memory, instead of host memory the
// fallback then copies into HBM. mkldnn's convolution allocates its output itself (its out=
// overload is a generated wrapper that copies), and the copy cost 4-8 % of a convolution
// (ops.py's conv2d: a 4 MiB output took 47 us to copy after a 1 ms kernel).
//
// Only results whose byte count no other offered result shares are offered, so a returned
// result can only land in its own block. A kernel buffer of the same size that takes a block
// first must be released before the kernel returns; the result is then copied in as before.
// check_released() verifies that: a block still held by anything but the kernel's returned
// result (a kernel that caches what it allocated) stays out of every allocator's hands for good,
// offers stop for the process, and it raises. For kernels that keep nothing they allocate past
// the call: the fallback's convolutions of operands in the default layout. `results`: host
// aliases of the op's fresh results (undefined ones skipped).
class HostResultOffer {
 public:
  explicit HostResultOffer(c10::ArrayRef<at::Tensor> results);
  ~HostResultOffer();  // closes it
  HostResultOffer(const HostResultOffer&) = delete;
  HostResultOffer& operator=(const HostResultOffer&) = delete;

  // Stops serving allocations on this thread (before the caller allocates its own copies).
  void close();
  // After the kernel's returned tensors are dropped: throws std::runtime_error naming `op` when
  // a block it took is still held (see above).
  void check_released(const std::string& op);

  struct Slot {
    void* data;
    size_t nbytes;
    bool taken = false;
  };
  // The slot that serves an allocation of `nbytes`, marked taken; null when none does.
  Slot* take(size_t nbytes);

 private:
  c10::SmallVector<Slot, 3> slots_;
  HostResultOffer* previous_;
  bool open_ = false;
};

// Whether `result`, returned by the kernel, already is `target` (a fresh result's host alias):
// the same memory, sizes, strides and dtype. Then no copy is needed.
bool is_written_in_place(const at::Tensor& result, const at::Tensor& target);
// Whether the storages of `a` and `b` share bytes. A result served an offered block has a storage
// of its own over the target's bytes, which at::get_overlap_status does not see as an alias:
// laid out otherwise, it is copied into the target through a clone.
bool storages_overlap(const at::Tensor& a, const at::Tensor& b);

}  // namespace torch_tpu
