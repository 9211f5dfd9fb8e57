// Running compiled IR regions on a chip, shared by defer_and_fuse
// (flush.cc) and torch.compile programs (program_region.cc): compile
// through the process-wide CompileCache, split large regions into row chunks
// for the intra-op threads, price the kernels in the cost model, and queue a
// region over tpu tensors on the chip's stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <memory>
#include <string>
#include <vector>

#include "exec/buffer.h"
#include "exec/executor.h"
#include "ir/graph.h"

namespace torch_tpu {

// How a region runs: as one call of the executor, or split along the
// leading dimension of its results into cache-sized chunks that run on the
// intra-op threads (the executor runs a region on the calling thread; a TPU's
// TensorCores work on the whole array at once).
struct RegionLaunchPart;

struct RegionLaunch {
  std::shared_ptr<const exec::CompiledRegion> region;  // whole, or a chunk of `rows` rows
  std::shared_ptr<const exec::CompiledRegion> last;    // the last chunk, when shorter
  int64_t n = 0, rows = 0, chunks = 1;
  std::vector<int> param_dim;  // per parameter: the dimension chunked, or -1 (read whole)
  // Outputs that reduce over the chunked rows (a bias gradient's column sum next to the
  // activation gradient it is summed from): each chunk computes its own partial result into
  // a scratch buffer, and the partials are combined in chunk order after the chunks ran.
  std::vector<int> partial_outputs;                       // output indices
  std::vector<ir::ReduceKind> partial_kinds;              // how their partials combine
  std::vector<ir::TensorType> input_types, output_types;  // of the whole region
  // Independent parts (connected components) of a region that cannot be split
  // whole (results of different lengths: an activation's gradient next to a
  // weight's): each part is planned on its own (and split when it can), and
  // the parts and their chunks run as tasks over the intra-op threads.
  // `region` is then the whole region, for pricing and introspection only.
  std::shared_ptr<const std::vector<RegionLaunchPart>> parts;
  // ir::structural_hash of the graph planned, when `region` is that graph compiled whole (not
  // split): the flush names the region's profiler event by it without hashing again. 0: unknown.
  uint64_t graph_hash = 0;
  bool split() const { return chunks > 1; }
};

struct RegionLaunchPart {
  RegionLaunch launch;
  std::vector<int> inputs, outputs;  // the whole region's parameter / output index of each of the part's
  int64_t work = 0;                  // elements its ops compute (the task scheduler's cost)
};

// The compiled form of `g` (CompileCache::global()): whole, or in chunks when
// its results are large (TORCH_TPU_DEFER_SPLIT_ELEMENTS) and the host has
// threads to spare. *miss: whether anything was compiled (not cached).
// Throws std::invalid_argument naming the op when the graph is malformed.
// With `parts`, a large region that cannot be split whole runs as independent
// parts (RegionLaunch::parts); only for regions whose outputs never alias
// their inputs (defer_and_fuse's: fresh results, in-place writes to temporaries).
RegionLaunch plan_region_launch(const ir::Graph& g, bool* miss, bool parts = false);

// Runs the launch on the calling thread (chunks on the intra-op threads).
void run_region_launch(const RegionLaunch& l, const std::vector<exec::Buffer>& in,
                       const std::vector<exec::Buffer>& out);

// Cost-model accounting of the launch's kernels on `device`.
void record_region_costs(c10::DeviceIndex device, const RegionLaunch& l);

// Values computed on a reduced shape (mean, rsqrt(var + eps), ...) that reach a
// much larger kernel through broadcast_in_dim: made extra outputs, they are
// computed once per row instead of at every element of the consumer.
std::vector<ir::ValueId> row_statistics(const ir::Graph& g);

// Queues `l` on the current stream of `device`: inputs[k] is parameter k (tpu
// tensors of the parameter types, any strides; or a 0-dim CPU tensor, whose
// value is read now), outputs[j] receives output j
// (dense tpu tensors, any order of dimensions in memory); outputs beyond outputs.size() go to per-run host
// scratch (row statistics). Storages stay alive until the work ran. Errors are
// sticky on the stream, named `name`.
void enqueue_region(const RegionLaunch& l, c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
                    const std::vector<at::Tensor>& outputs, std::string name);

// dsts[i].copy_(srcs[i]) for every pair, in order, as one item on the current
// stream of `device` (a program's write-back of updated parameters and optimizer
// state). Pairs of the same dtype, shape and dense strides are byte copies in the
// queued item; any other pair goes through ATen's copy_ before it is queued.
void enqueue_copies(c10::DeviceIndex device, const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

}  // namespace torch_tpu
