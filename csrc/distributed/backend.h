// tpu_dist: the c10d backend of torch_tpu. One process per chip; collectives
// between the processes of a host travel through shared memory (the model's
// ICI), ordered with the chips' streams; groups spanning hosts add gloo (DCN).
//
// Execution: every collective is one skeleton (backend_collectives.cc). It is
// validated and described on the calling thread, then issued: queued on the
// group's collective thread, which waits until the tensors' streams have
// reached the point of the call (an event), runs it on the device memory
// through the group's Transport (chosen when the group is built: one host or
// several), and completes the Work. Work::wait() blocks the caller until then
// and raises the collective's error. Sends and receives run on one thread per
// peer, so point-to-point traffic never waits behind collectives.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "distributed/shm_group.h"
#include "distributed/transport.h"
#include "distributed/work.h"

namespace torch_tpu::dist {

class TpuBackend : public c10d::Backend {
 public:
  struct Config {
    std::chrono::milliseconds timeout{60000};
    std::string group_name;
    std::vector<int64_t> global_ranks;
    size_t buffer_bytes = 0;  // 0: TORCH_TPU_DIST_BUFFER_BYTES or 2 MiB (windows that stay in L2/L3 beat larger ones)
    size_t p2p_bytes = 0;     // 0: TORCH_TPU_DIST_P2P_BYTES or 1 MiB
    size_t small_bytes = 0;   // 0: TORCH_TPU_DIST_SMALL_BYTES or 64 KiB
    // Groups spanning hosts: the host id of every group rank, and gloo backends for the
    // part that crosses hosts (DCN): `cross` joins the ranks with this rank's local index
    // on every host (hosts with equal rank counts only), `flat` all ranks of the group.
    std::vector<int> hosts;
    c10::intrusive_ptr<c10d::Backend> cross, flat;
  };

  TpuBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Config config);
  ~TpuBackend() override;

  const std::string getBackendName() const override { return "tpu_dist"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  std::chrono::milliseconds timeout() const { return group_->options().timeout; }
  const Config& config() const { return config_; }

 private:
  // One sequence number of a collective: what this rank publishes at arrival, the tensor
  // its messages name (describe_tensor; empty: none), and its body on the transport.
  struct Step {
    Descriptor desc;
    std::string tensor;
    std::function<void(const Call&)> run;
  };
  // A validated collective. issue() numbers its steps, waits for the current streams of
  // `devices` and runs the steps in order on the collective thread; the Work then
  // completes with `outputs`, or with the first error.
  struct Collective {
    const char* title;  // "tpu_dist:<op>": the profiler keeps the pointer
    c10d::OpType type;
    std::vector<int> devices;  // tpu indices; the first is current on the collective thread
    std::vector<at::Tensor> outputs;
    int device = -1;          // tpu index of the chip that records the cost, -1 for host tensors
    std::vector<Step> steps;  // one, or one per tensor of a coalesced collective
    const char* op() const;   // the title without "tpu_dist:"
  };
  // Raises if the group is unusable; then the caller validates its arguments and adds the steps.
  Collective begin(const char* title, c10d::OpType type) const;
  c10::intrusive_ptr<c10d::Work> issue(Collective collective);
  // Queues `body` on `executor` after the current streams of `devices` reach this point;
  // the returned Work completes when it has run.
  c10::intrusive_ptr<c10d::Work> launch(Executor& executor, c10d::OpType type, const char* title,
                                        const std::vector<int>& devices, std::vector<at::Tensor> outputs,
                                        uint64_t first_seq, std::function<void(uint64_t)> body);
  void check_usable(const char* op) const;
  // check_usable, then the tensor and the peer rank of a send or recv (`role`: "destination", "source").
  at::Tensor& check_p2p(std::vector<at::Tensor>& tensors, int peer, const char* op, const char* role) const;
  Executor& peer_executor(std::map<int, std::unique_ptr<Executor>>& executors, int peer, const char* kind);

  Config config_;
  std::unique_ptr<ShmGroup> group_;
  std::unique_ptr<Transport> transport_;  // chosen at construction: one host or several
  std::unique_ptr<Executor> collectives_;
  std::mutex peers_mu_;
  std::map<int, std::unique_ptr<Executor>> senders_, receivers_;
  std::atomic<uint64_t> seq_{0};
  // Held from a collective's sequence number to its submission, so threads issuing
  // collectives on one group cannot queue them out of sequence order.
  std::mutex issue_mu_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace torch_tpu::dist
