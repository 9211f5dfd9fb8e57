// The transport of a tpu_dist process group: how its collectives move data.
// TpuBackend picks one when the group is built: ShmTransport (the shared-memory
// ring engine) when the group lives on one host, HierarchicalTransport (shared
// memory inside each host, gloo across hosts) when it spans hosts. A collective
// is validated and described once in the backend, then issued on either.
//
// Collectives run on the group's collective thread, in sequence order, on
// contiguous host tensors (device memory seen through host aliases). Each
// transport records the collective's cost on the chip of `Call::device`.
// Errors: argument disagreements between ranks raise RuntimeError, a dead,
// stalled or failed peer raises c10::DistBackendError naming it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/shm_group.h"

namespace torch_tpu::dist {

// One collective as the backend issues it.
struct Call {
  uint64_t seq = 0;
  Descriptor desc;   // what this rank publishes at arrival
  std::string what;  // names the collective in errors: "all_reduce (collective #3, float32[4] on tpu:0)"
  int device = -1;   // tpu index of the chip that records the cost; -1 for host tensors
};

// The bytes of an all_to_all, by peer: counts[q] sent to q and counts[n + q] received
// from q, packed in rank order at the offsets.
struct Splits {
  std::vector<int64_t> counts, send_offsets, recv_offsets;
  int64_t send_total = 0, recv_total = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // In place. AVG divides by the group size; PREMUL_SUM multiplies `data` by `factor`, then sums.
  virtual void all_reduce(const Call& c, const at::Tensor& data, int redop, double factor) = 0;
  virtual void broadcast(const Call& c, const at::Tensor& data, int root) = 0;
  // The reduced result lands in `data` on root only (other ranks' `data` is unchanged).
  virtual void reduce(const Call& c, const at::Tensor& data, int redop, double factor, int root) = 0;
  // `outputs`: one per rank, or one holding all ranks' blocks in rank order.
  virtual void all_gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs) = 0;
  // `input`: one block of `output`'s size per rank; `redop` is not PREMUL_SUM (the caller scales).
  virtual void reduce_scatter(const Call& c, const at::Tensor& input, const at::Tensor& output, int redop) = 0;
  // Root: outputs[r] receives rank r's input. Others: `outputs` is empty.
  virtual void gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs, int root) = 0;
  // Root: inputs[r] goes to rank r. Others: `inputs` is empty. Everyone: `output` receives its part.
  virtual void scatter(const Call& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output, int root) = 0;
  // `input` and `output`: byte tensors packed as `splits` says.
  virtual void all_to_all(const Call& c, const at::Tensor& input, const at::Tensor& output, const Splits& splits) = 0;
  virtual void barrier(const Call& c) = 0;

  // Point to point, on the peer's own thread; `what` names the transfer in errors.
  virtual void send(int dst, int tag, const at::Tensor& data, const std::string& what) = 0;
  virtual void recv(int src, int tag, const at::Tensor& data, const std::string& what) = 0;

  // After an operation raised: lets ranks elsewhere learn the cause.
  virtual void after_error() {}
  // Stops the transport's own threads; called first at shutdown.
  virtual void stop() {}
};

}  // namespace torch_tpu::dist
