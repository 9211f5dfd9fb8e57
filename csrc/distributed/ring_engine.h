// The shared-memory ring engine of tpu_dist: the collective algorithms among
// the ranks of one host, over one ShmGroup. They run on host memory (device
// buffers seen through host aliases) on the group's collective thread, in the
// same order on every rank.
//
// Every collective starts with an arrival step: each rank publishes a
// descriptor (op, reduce op, dtype, element count, root, chip; the sizes too
// inside spmd_safe) and waits for all ranks' descriptors; any disagreement
// raises the same RuntimeError on every rank before data moves. Reductions use a ring (reduce-scatter, then
// all-gather) in an order that follows the torus rings of the chips the ranks
// run on; data moves through double-buffered windows of the ranks' segments.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distributed/collectives.h"
#include "distributed/shm_group.h"
#include "vtpu/counters.h"
#include "vtpu/topology.h"

namespace torch_tpu::dist {

// "all_reduce(SUM, float32[2, 3] numel 6) #4", with " [spmd_safe]" when issued inside it.
std::string summary(const Descriptor& d);
// Whether two ranks' descriptors of collective `seq` agree on what the op uses (op, dtype,
// reduce op, element count, root) and, with `shapes`, on the tensor's sizes.
bool descriptors_agree(const Descriptor& a, const Descriptor& b, uint64_t seq, bool shapes);
// Empty when every rank's descriptor (by rank) agrees, shapes included when any rank issued it
// inside spmd_safe; else the message listing each rank (`rank_name(r)`) with its summary.
std::string disagreement(const std::vector<Descriptor>& descs, uint64_t seq,
                         const std::function<std::string(int)>& rank_name);

// The ranks of a collective after the arrival step.
struct Arrival {
  std::vector<Descriptor> descs;  // by rank
  std::vector<int> order;         // ring position -> rank
  std::vector<int> position;      // rank -> ring position
};

class Engine {
 public:
  Engine(ShmGroup& group, const vtpu::Topology& topology, size_t small_bytes)
      : g_(group), topology_(topology), small_bytes_(small_bytes) {}

  // Publishes `d` (and `counts`, 2*size values, when given) and checks all ranks agree.
  Arrival arrive(uint64_t seq, const Descriptor& d, const std::string& what, const int64_t* counts = nullptr);

  // In place on `data` (contiguous, numel elements). AVG divides by the group
  // size; PREMUL_SUM must be applied by the caller (then SUM).
  void all_reduce(const Arrival& a, void* data, int64_t numel, at::ScalarType dtype, int redop,
                  const std::string& what);
  // `input`: size*count elements (block r for rank r); `output`: count elements.
  void reduce_scatter(const Arrival& a, const void* input, void* output, int64_t count, at::ScalarType dtype, int redop,
                      const std::string& what);
  // `outputs[r]` receives rank r's `count` elements.
  void all_gather(const Arrival& a, const void* input, const std::vector<void*>& outputs, int64_t count,
                  size_t element_size, const std::string& what);
  void broadcast(const Arrival& a, void* data, int64_t bytes, int root, const std::string& what);
  // Reduced result lands in `output` on root only; `input` is unchanged.
  void reduce(const Arrival& a, const void* input, void* output, int64_t numel, at::ScalarType dtype, int redop,
              int root, const std::string& what);
  // Root: outputs[r] receives rank r's bytes. Others: outputs ignored.
  void gather(const Arrival& a, const void* input, const std::vector<void*>& outputs, int64_t bytes, int root,
              const std::string& what);
  // Root: inputs[r] goes to rank r. Everyone: output receives its part.
  void scatter(const Arrival& a, const std::vector<const void*>& inputs, void* output, int64_t bytes, int root,
               const std::string& what);
  // send_counts/offsets and recv_counts/offsets in bytes, indexed by peer.
  // Every rank's counts come from the arrival (a.descs and counts published).
  void all_to_all(const Arrival& a, uint64_t seq, const void* input, const std::vector<int64_t>& send_offsets,
                  void* output, const std::vector<int64_t>& recv_offsets, const std::string& what);

  // Cost-model description of an op over these ranks (payload on this rank).
  vtpu::CollectiveCost cost(const Arrival& a, OpKind op, double payload_bytes, uint64_t seq);

 private:
  // Ring reduce-scatter of one window: position c's block window
  // [starts[c] + offset, + lens[c]) is reduced into our buffer sub-slot of our position.
  // Returns (parity, sub-slot elements) of the window.
  void ring_reduce_window(const Arrival& a, const char* input, const std::vector<int64_t>& starts,
                          const std::vector<int64_t>& lens, int64_t offset, int64_t slot_elems, int parity,
                          at::ScalarType dtype, int redop, const std::string& what);
  int next_parity() { return static_cast<int>(window_++ & 1); }

  ShmGroup& g_;
  const vtpu::Topology& topology_;
  size_t small_bytes_;
  uint64_t window_ = 0;
};

}  // namespace torch_tpu::dist
