// The shared-memory protocol under both transports of a tpu_dist process group: one segment per
// rank, mapped by every rank of the group. Each rank writes only its own
// segment (header, descriptors, data buffers, p2p mailboxes) and reads its
// peers'. Progress is a per-rank monotonic step counter; waiting is a futex on
// the awaited rank's doorbell, with liveness checks of every rank waited on
// and a deadline, so a dead or stalled rank raises instead of hanging.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "distributed/shm.h"

namespace torch_tpu::dist {

constexpr int kMaxDims = 8;

// What a rank says about the collective it enters; all ranks compare them.
struct Descriptor {
  uint64_t seq = 0;
  int32_t op = 0;     // OpKind
  int32_t redop = 0;  // c10d::ReduceOp::RedOpType
  int32_t dtype = 0;  // at::ScalarType
  int32_t chip = -1;  // global chip id of the tensor, -1 for host tensors
  int32_t host = 0;   // host id of the chip
  int32_t ndim = 0;
  int32_t spmd = 0;   // 1: issued inside spmd_safe, so the sizes must agree too
  int64_t numel = 0;  // elements that must agree across ranks (per op)
  int64_t root = -1;
  int64_t tag = 0;
  int64_t sizes[kMaxDims] = {};
};

enum class PeerState : uint32_t { kRunning = 0, kClosed = 1, kFailed = 2 };

struct Header;

// Raised (as c10::DistBackendError) when a peer died, stalled past the timeout
// or failed itself; the group is unusable afterwards.
class ShmGroup {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::chrono::milliseconds timeout{60000};
    std::string group_name;
    std::vector<int64_t> global_ranks;  // shm rank -> global rank (empty: identity)
    std::vector<int64_t> group_ranks;   // shm rank -> rank in the c10d group (empty: identity;
                                        // differs when the group spans hosts)
    size_t buffer_bytes = 2 << 20;      // each of the two collective buffers
    size_t p2p_bytes = 1 << 20;         // mailbox per destination
    bool spin = true;                   // waits spin and yield before sleeping on the futex
  };

  // Rendezvous through `store`: creates this rank's segment, maps the peers',
  // then unlinks its own name once all ranks have mapped it.
  ShmGroup(const c10::intrusive_ptr<c10d::Store>& store, Options options);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  const Options& options() const { return opts_; }
  void set_timeout(std::chrono::milliseconds t) { opts_.timeout = t; }
  // "rank 2 (global rank 5, pid 123)" for messages.
  std::string describe_rank(int r) const;

  // --- collective protocol: only the group's collective thread calls these ---
  uint64_t step() const { return step_; }
  void publish();  // step += 1, made visible to peers, wakes waiters
  // Waits until rank r (or every rank) has published `step`. `what` names the
  // collective for error messages.
  void wait_rank(int r, uint64_t step, const std::string& what);
  void wait_all(uint64_t step, const std::string& what);
  Descriptor& my_descriptor(uint64_t seq);
  const Descriptor& descriptor(int r, uint64_t seq) const;
  // 2*size int64 per rank, double-buffered by seq parity (alltoall splits, ...).
  int64_t* my_counts(uint64_t seq);
  const int64_t* counts(int r, uint64_t seq) const;
  void set_current(uint64_t seq);  // what this rank is doing, for peers' timeout messages
  char* buffer(int r, int parity) const;
  size_t buffer_bytes() const { return opts_.buffer_bytes; }
  // Before writing into our buffer `parity`: waits until every rank has
  // finished reading its previous contents; after reading: records that.
  void acquire_buffer(int parity, const std::string& what);
  void release_buffer(int parity);  // call right after the publish() that ends the reads

  // --- point to point: a byte ring per (sender, receiver) in the sender's segment ---
  char* mailbox(int sender, int receiver) const;
  size_t mailbox_bytes() const { return opts_.p2p_bytes; }
  std::atomic<uint64_t>& p2p_written(int sender, int receiver) const;  // bytes ever written
  std::atomic<uint64_t>& p2p_read(int receiver, int sender) const;     // bytes ever consumed
  void ring_doorbell();                                                // after changing our p2p counters
  // Waits until `ready()` (re-checked whenever `r` rings its doorbell), checking r's health.
  void wait_for(int r, const std::function<bool()>& ready, const std::string& what);

  // --- failure ---
  // Marks this rank failed because of `culprit` and wakes everyone waiting on it.
  void mark_failed(int culprit, const std::string& reason);
  bool failed() const;
  std::string failure() const;
  void close();  // normal shutdown: peers still waiting on us are told we left
  // A peer whose process is gone without having closed the group, or -1.
  int dead_peer() const;

 private:
  Header& header(int r) const;
  // Throws DistBackendError if a rank in `ranks` (or all, when empty) failed,
  // left or died, or if `deadline` passed while waiting for `waiting_for`.
  void check_health(int waiting_for, bool all, const std::string& what, std::chrono::steady_clock::time_point start);
  // Marks this rank failed because of `culprit` and throws DistBackendError(where: cause).
  [[noreturn]] void raise(int culprit, const std::string& where, const std::string& cause);
  template <typename Ready>
  void wait_impl(int r, bool all, Ready ready, const std::string& what);

  Options opts_;
  size_t counts_offset_ = 0, p2p_counters_offset_ = 0, buffers_offset_ = 0, mailboxes_offset_ = 0, segment_bytes_ = 0;
  std::vector<ShmSegment> segments_;  // index = rank
  std::vector<ProcessId> pids_;
  uint64_t step_ = 0;
  uint64_t buffer_free_step_[2] = {0, 0};
  mutable std::mutex failure_mu_;
  std::string failure_;
};

}  // namespace torch_tpu::dist
