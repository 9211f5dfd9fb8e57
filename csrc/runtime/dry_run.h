// Dry-run mode of the tpu device (torch_tpu.estimate.dry_run()).
//
// In a dry run every op still goes through its normal path: output metadata
// from the meta kernels, results allocated in the chip's HBM (the caching
// allocator, so peak physical bytes are exact), and the cost model prices the
// op into the chip's counters exactly as in a real run. Only the computation
// is left out: nothing is queued on the streams, copies and fills are priced
// but skipped, so no byte of HBM is ever written (the HBM is an mmap
// MAP_NORESERVE region: untouched pages take no host memory).
//
// Reading values on the host (.item(), .cpu(), printing, ops whose output
// shape depends on data) raises RuntimeError: a dry run has no data.
#pragma once

#include <string>

namespace torch_tpu {

// Process-wide (not thread-local): autograd runs backward on its own thread.
bool dry_run();
void set_dry_run(bool enabled);

// Raises RuntimeError saying that `what` needs tensor values, which a dry run
// does not compute.
[[noreturn]] void dry_run_host_read(const std::string& what);

}  // namespace torch_tpu
