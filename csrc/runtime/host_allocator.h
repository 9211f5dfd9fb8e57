// Pinned host memory: ATen's host allocator for PrivateUse1 (the tpu device).
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torch_tpu {

// The allocator `at::getHostAllocator(PrivateUse1)` returns: `tensor.pin_memory()`,
// `torch.empty(..., pin_memory=True)` and DataLoader's pinning allocate from it,
// `torch.accelerator.empty_host_cache()` empties it.
at::HostAllocator& host_allocator();

}  // namespace torch_tpu
