// defer_and_fuse: fusible ops are recorded into the chip's pending IR region
// instead of running; the region is compiled (cached by structure) into fused
// kernels and queued on the chip's stream when something flushes it
// (docs/design.md "Execution").
//
// The hooks below are all the rest of the ATen layer needs to know:
//  - tpu_fallback offers every op to defer_record() in defer_and_fuse mode;
//  - an op that runs strictly first opens a DeferChecked scope with the
//    tensors it reads and writes: the chip's region is flushed when the op
//    reads a tensor the region produces or writes, or writes one it touches;
//    otherwise the op is queued ahead of the region, which is safe because
//    neither touches the other's memory;
//  - any other use of a chip stream (events, collectives, queries) and every
//    synchronization flush the chip's region (defer_before_stream_use,
//    defer_flush_device).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace torch_tpu {

struct OpInfo;

// Records `op` into its chip's pending region when it is fusible and its
// operands allow it; then the result is on the stack and true is returned.
// false: nothing was recorded, the caller runs the op strictly.
bool defer_record(const c10::OperatorHandle& op, torch::jit::Stack* stack, const OpInfo& info);

// While one is alive on a thread, stream use on that thread does not flush:
// the constructor already flushed what the strictly run op conflicts with.
class DeferChecked {
 public:
  // The op's stack arguments (the top `schema.arguments().size()` entries).
  DeferChecked(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // Tensors read and written by a native kernel.
  DeferChecked(std::initializer_list<const at::Tensor*> reads, std::initializer_list<const at::Tensor*> writes);
  ~DeferChecked();
  DeferChecked(const DeferChecked&) = delete;
  DeferChecked& operator=(const DeferChecked&) = delete;
};

// Flush triggers. All are cheap (one atomic load) when nothing is pending.
void defer_before_stream_use(c10::DeviceIndex device);      // no-op inside DeferChecked
void defer_flush_device(c10::DeviceIndex device);           // synchronization, host reads
void defer_flush_storage(const c10::StorageImpl* storage);  // only if a region touches it
void defer_flush_all();                                     // leaving the mode, torch_tpu.debug.flush()

// Counters behind torch_tpu.debug.region_stats().
struct DeferStats {
  uint64_t ops_recorded = 0;          // ATen ops recorded into regions
  uint64_t ops_fused = 0;             // recorded ops in regions that were flushed
  uint64_t regions_flushed = 0;       // regions that reached a flush
  uint64_t regions_run = 0;           // of those, regions with live outputs (compiled or cached, queued)
  uint64_t regions_compiled = 0;      // compile-cache misses
  uint64_t cache_hits = 0;            // compile-cache hits
  uint64_t kernels_launched = 0;      // fused kernels queued
  uint64_t regions_split = 0;         // regions run in cache-sized row chunks (over the host threads)
  uint64_t regions_in_parts = 0;      // regions run as independent parts over the host threads
  uint64_t regions_replayed = 0;      // regions whose results all reached HBM, run with ATen's kernels
  uint64_t single_op_regions = 0;     // of those, regions of one op
  uint64_t outputs_materialized = 0;  // region results given HBM
  uint64_t outputs_dead = 0;          // region results nobody held at the flush
  uint64_t hbm_bytes_avoided = 0;     // physical bytes of results never allocated
  uint64_t hbm_bytes_allocated = 0;   // physical bytes of results allocated at flushes
  uint64_t fallbacks = 0;             // fusible-looking ops run strictly (dtype, layout, view, ...)
  // Why regions were flushed.
  uint64_t flush_conflict = 0;  // a strictly run op read or wrote region memory
  uint64_t flush_sync = 0;      // synchronization, host read, storage resize
  uint64_t flush_stream = 0;    // stream/event use, collective
  uint64_t flush_size_cap = 0;  // TORCH_TPU_DEFER_MAX_OPS reached
  uint64_t flush_view = 0;      // a view of a pending result that the IR cannot express
  uint64_t flush_repeat = 0;    // a repeating op sequence reached an earlier size-cap flush point
  uint64_t flush_other = 0;     // mode change, explicit flush, stream switch
};
DeferStats defer_stats();
void defer_reset_stats();
// Number of ATen ops waiting in pending regions (all chips).
int64_t defer_pending_ops();
// Whether a region of a single recorded op, or one whose results are all still
// held at the flush, runs ATen's kernels op by op instead of compiled kernels
// (default on; TORCH_TPU_DEFER_SINGLE_OP_ATEN=0 turns it off).
void defer_set_single_op_aten(bool enabled);
bool defer_single_op_aten();

}  // namespace torch_tpu
