// The vTPU of this process: topology, visible chips, per-chip HBM and streams.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vtpu/counters.h"
#include "vtpu/hbm_allocator.h"
#include "vtpu/stream.h"
#include "vtpu/topology.h"
#include "vtpu/trace.h"

namespace vtpu {

class Chip {
 public:
  Chip(int index, int global_id, const Topology& topology, uint64_t hbm_bytes);
  int index() const { return index_; }          // local index: tpu:<index>
  int global_id() const { return global_id_; }  // chip id in the slice
  Coord coords() const { return topology_.coords(global_id_); }
  const ChipSpec& spec() const { return topology_.spec(); }
  HbmAllocator& hbm() { return hbm_; }
  Stream& default_stream() { return stream(0); }
  // Stream ids: 0 is the default stream; new_stream() hands out 1, 2, ...
  Stream& stream(int64_t id);  // throws std::out_of_range for unknown ids
  int64_t new_stream();
  void synchronize();  // every stream of the chip; throws AsyncError
  void wait_idle();    // every stream of the chip; leaves errors pending
  // Cost-model accounting of the ops issued to this chip.
  void record_cost(const OpCost& cost) {
    counters_.record(cost);
    if (const trace::Hooks* h = trace::hooks()) h->cost(index_, cost);  // a profiler records
  }
  // The same with the cost's estimates worked out before; recomputed here when they were
  // made for another spec (or not at all).
  void record_cost(const OpCost& cost, CostEstimates& cached) {
    if (cached.own != &counters_.spec()) cached = counters_.estimates(cost);
    counters_.record(cost, cached);
    if (const trace::Hooks* h = trace::hooks()) h->cost(index_, cost);
  }
  // `name`: a static string naming the collective for profiler traces, or null.
  void record_collective(const CollectiveCost& cost, const char* name = nullptr) {
    counters_.record_collective(cost);
    if (const trace::Hooks* h = trace::hooks()) h->collective(index_, cost, name);
  }
  CounterSnapshot counters();  // host_seconds summed over the chip's streams
  void reset_counters();

 private:
  int index_;
  int global_id_;
  const Topology& topology_;
  HbmAllocator hbm_;
  ChipCounters counters_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_;  // created lazily
};

class Runtime {
 public:
  // Built once on first use from the environment:
  //   TORCH_TPU_TOPOLOGY / TPU_ACCELERATOR_TYPE (default "v6e-8"),
  //   TORCH_TPU_SLICES (default 1): slices joined over DCN,
  //   TORCH_TPU_HOST_ID (default 0): which host this process is, counted over all
  //     slices (host h is in slice h / hosts per slice),
  //   TPU_VISIBLE_CHIPS: comma-separated chip ids of the slice this process sees,
  //   TORCH_TPU_HBM_BYTES: HBM capacity override per chip.
  // Throws std::invalid_argument on bad values.
  static Runtime& get();
  const Topology& topology() const { return topology_; }
  int device_count() const { return static_cast<int>(chips_.size()); }
  int slice() const { return slice_; }  // the slice of this process's chips
  int host() const { return host_; }    // TORCH_TPU_HOST_ID, over all slices
  Chip& chip(int index);                // throws std::out_of_range naming the valid range

  // The environment parsers, public so they can be tested without a restart.
  // TORCH_TPU_HBM_BYTES: "17179869184", "16GiB", "512MiB", "16GB".
  static uint64_t parse_hbm_bytes(const std::string& value);
  // TPU_VISIBLE_CHIPS: "0,2,3"; ids in [0, num_chips), no repeats; "" = none.
  static std::vector<int> parse_visible_chips(const std::string& value, int num_chips);

 private:
  Runtime();
  Topology topology_;
  int host_ = 0;
  int slice_ = 0;
  std::vector<std::unique_ptr<Chip>> chips_;
};

}  // namespace vtpu
