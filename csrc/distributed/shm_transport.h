// The transport of a group on one host: the shared-memory ring engine, and
// point-to-point mailboxes, over the group's ShmGroup.
#pragma once

#include "distributed/ring_engine.h"
#include "distributed/transport.h"

namespace torch_tpu::dist {

class ShmTransport : public Transport {
 public:
  ShmTransport(ShmGroup& group, const vtpu::Topology& topology, size_t small_bytes)
      : group_(group), engine_(group, topology, small_bytes) {}

  void all_reduce(const Call& c, const at::Tensor& data, int redop, double factor) override;
  void broadcast(const Call& c, const at::Tensor& data, int root) override;
  void reduce(const Call& c, const at::Tensor& data, int redop, double factor, int root) override;
  void all_gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs) override;
  void reduce_scatter(const Call& c, const at::Tensor& input, const at::Tensor& output, int redop) override;
  void gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs, int root) override;
  void scatter(const Call& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output, int root) override;
  void all_to_all(const Call& c, const at::Tensor& input, const at::Tensor& output, const Splits& splits) override;
  void barrier(const Call& c) override;
  void send(int dst, int tag, const at::Tensor& data, const std::string& what) override;
  void recv(int src, int tag, const at::Tensor& data, const std::string& what) override;

  // For a transport built on this one (the host-local part of HierarchicalTransport).
  Engine& engine() { return engine_; }

 private:
  // The arrival step, then the collective's cost recorded on the chip of c.device.
  Arrival arrive(const Call& c, double payload_bytes, const int64_t* counts = nullptr);

  ShmGroup& group_;
  Engine engine_;
};

}  // namespace torch_tpu::dist
