// The transport of a group that spans hosts: each collective runs its
// host-local part through shared memory (the slice's ICI) and the part that
// crosses hosts through gloo over TCP (the data-centre network), e.g.
// all_reduce = local reduce-scatter, all_reduce of each shard among the ranks
// with the same local index on every host, local all-gather. Collectives
// without a hierarchical form run on a flat gloo group over the host aliases
// of the tensors.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "distributed/shm_transport.h"
#include "distributed/transport.h"

namespace torch_tpu::dist {

// Where the ranks of a group spanning hosts live.
struct Hierarchy {
  Hierarchy(const std::vector<int>& hosts, int rank);  // `hosts`: the host id of every group rank
  // The options of this host's ShmGroup, from those of the whole group.
  ShmGroup::Options local_options(const ShmGroup::Options& whole) const;

  int host = 0;                     // this rank's host id
  std::vector<int> host_of_rank;    // group rank -> host id
  std::vector<int> local_ranks;     // group ranks on this host, ascending
  int local_index = 0;              // this rank's index in local_ranks
  std::vector<int> host_ids;        // distinct host ids, ascending
  std::vector<int> host_index_of;   // group rank -> index of its host in host_ids
  std::vector<int> local_index_of;  // group rank -> index among its host's ranks
  bool host_major = false;          // group rank == host_index * ranks_per_host + local_index
};

class HierarchicalTransport : public Transport {
 public:
  struct Options {
    std::string group_name;
    int rank = 0;  // in the whole group
    int size = 1;
    size_t small_bytes = 0;                 // of the local ring engine
    c10::intrusive_ptr<c10d::Store> store;  // the whole group's: failure reports across hosts
    // gloo groups: `cross` joins the ranks with this rank's local index on every host
    // (hosts with equal rank counts only; else null), `flat` all ranks of the group.
    c10::intrusive_ptr<c10d::Backend> cross, flat;
  };
  HierarchicalTransport(Hierarchy hierarchy, ShmGroup& local, const vtpu::Topology& topology, Options options);
  ~HierarchicalTransport() override;

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
  void after_error() override;
  void stop() override;

 private:
  // Inside spmd_safe (c.desc.spmd): every rank's descriptor, gathered over the flat gloo
  // group, must agree (shapes included) before data moves; else the same RuntimeError on
  // every rank. Outside it only the host-local parts are checked.
  void check_spmd(const Call& c);
  // Local sub-collectives use their own sequence numbers.
  Arrival local_arrive(OpKind op, const at::Tensor& like, int redop, int64_t numel, int64_t root,
                       const std::string& what);
  // all_gather into one tensor holding all ranks' blocks.
  void all_gather_into(const at::Tensor& input, const at::Tensor& output, const std::string& what, int device);
  // Waits for a gloo Work; its errors become DistBackendError naming `what` and fail the group.
  void dcn_wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  void record_dcn(int device, double payload, double ici_bytes, int ici_steps, double dcn_bytes);
  // Posts this rank's failure reason in the store, where ranks on other hosts look for the
  // cause of a gloo error.
  void publish_failure();
  // Ranks on other hosts cannot see this host's processes, so a watcher posts the death of
  // a local peer in the store at once, whatever this rank is doing (possibly waiting in gloo).
  void watch_local_peers();

  Hierarchy hier_;
  ShmGroup& group_;
  ShmTransport local_;  // this host's ranks: p2p between them, and its engine for the local parts
  Engine& engine_;      // local_'s
  Options opts_;
  uint64_t local_seq_ = 0;  // collective thread only
  std::atomic<bool> failure_published_{false};
  std::thread watcher_;
  std::mutex watcher_mu_;
  std::condition_variable watcher_cv_;
  bool watcher_stop_ = false;
};

}  // namespace torch_tpu::dist
