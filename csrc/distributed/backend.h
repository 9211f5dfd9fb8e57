// tpu_dist: the c10d backend of torch_tpu. One process per chip; collectives
// between the processes of a host travel through shared memory (the model's
// ICI), ordered with the chips' streams.
//
// Execution: a collective is validated on the calling thread, then queued on
// the group's collective thread, which waits until the tensors' streams have
// reached the point of the call (an event), runs the collective on the
// device memory, and completes the Work. Work::wait() blocks the caller until
// then and raises the collective's error. Sends and receives run on one
// thread per peer, so point-to-point traffic never waits behind collectives.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/collectives.h"
#include "distributed/transport.h"
#include "runtime/host_alias.h"

namespace torch_tpu::dist {

// A Work completed by a tpu_dist thread.
class TpuWork : public c10d::Work {
 public:
  TpuWork(int rank, c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> outputs);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }
  void set_sequence_number(uint64_t seq) { seq_ = seq; }
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  uint64_t seq_ = 0;
};

// One worker thread running tasks in order.
class Executor {
 public:
  explicit Executor(std::string name);
  ~Executor();  // runs what is queued, then joins
  void submit(std::function<void()> task);

 private:
  void run();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

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
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
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
  using Body = std::function<void()>;
  // Queues `body` on `executor` after the current streams of `tensors` reach
  // this point; the returned Work completes when it has run.
  // `devices`: tpu device indices whose current streams the op waits for.
  c10::intrusive_ptr<c10d::Work> launch(Executor& executor, c10d::OpType type, const char* title,
                                        const std::vector<int>& devices, std::vector<at::Tensor> outputs,
                                        uint64_t first_seq, std::function<void(uint64_t)> body);
  void check_usable(const char* op) const;
  Executor& peer_executor(std::map<int, std::unique_ptr<Executor>>& executors, int peer, const char* kind);
  // Records the cost of a collective on the chip of `device` (no-op for host tensors).
  void record(const Arrival& a, OpKind op, double payload_bytes, uint64_t seq, int device);

  // Bodies shared by the list, tensor and coalesced entry points (run on the collective thread).
  // `outputs`: one per rank, or one holding all ranks' blocks.
  void run_all_gather(uint64_t seq, const TensorRecipe& input, const std::vector<TensorRecipe>& outputs,
                      const Descriptor& d, const std::string& what, int device);
  // `inputs`: one per rank, or one holding all ranks' blocks.
  void run_reduce_scatter(uint64_t seq, const std::vector<TensorRecipe>& inputs, const TensorRecipe& output,
                          int redop, double factor, const Descriptor& d, const std::string& what, int device);

  // --- groups spanning hosts (hierarchy.cc): shared memory inside a host, gloo across ---
  struct Hierarchy {
    std::vector<int> host_of_rank;    // group rank -> host id
    std::vector<int> local_ranks;     // group ranks on this host, ascending
    int local_index = 0;              // this rank's index in local_ranks
    std::vector<int> host_ids;        // distinct host ids, ascending
    std::vector<int> host_index_of;   // group rank -> index of its host in host_ids
    std::vector<int> local_index_of;  // group rank -> index among its host's ranks
    bool host_major = false;          // group rank == host_index * ranks_per_host + local_index
  };
  bool multi_host() const { return hier_ != nullptr; }
  // Local sub-collectives of a multi-host collective use their own sequence numbers.
  Arrival local_arrive(OpKind op, const at::Tensor& like, int redop, int64_t numel, int64_t root,
                       const std::string& what);
  void hier_all_reduce(const at::Tensor& data, int redop, const std::string& what, int device);
  void hier_all_gather(const at::Tensor& input, const at::Tensor& output, const std::string& what, int device);
  void hier_reduce_scatter(const at::Tensor& input, const at::Tensor& output, int redop, const std::string& what,
                           int device);
  void hier_broadcast(const at::Tensor& data, int root, const std::string& what, int device);
  void hier_barrier(const std::string& what, int device);
  // Waits for a gloo Work; its errors become DistBackendError naming `what` and fail the group.
  void dcn_wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  void record_dcn(int device, double payload, double ici_bytes, int ici_steps, double dcn_bytes);
  // Posts this rank's failure reason in the store, where ranks on other hosts look for the
  // cause of a gloo error.
  void publish_failure();
  c10::intrusive_ptr<c10d::Store> store_;
  std::atomic<bool> failure_published_{false};
  // Groups spanning hosts: ranks on other hosts cannot see this host's processes, so a
  // watcher posts the death of a local peer in the store at once, whatever this rank is
  // doing (possibly waiting in gloo).
  void watch_local_peers();
  std::thread watcher_;
  std::mutex watcher_mu_;
  std::condition_variable watcher_cv_;
  bool watcher_stop_ = false;

  Config config_;
  std::unique_ptr<Hierarchy> hier_;
  uint64_t local_seq_ = 0;  // collective thread only
  std::unique_ptr<ShmGroup> group_;
  std::unique_ptr<Engine> engine_;
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
