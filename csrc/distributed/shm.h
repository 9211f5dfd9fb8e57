// POSIX shared memory and process liveness for tpu_dist: the pieces of the
// host that stand in for ICI between the chips of one host.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace torch_tpu::dist {

// A shared-memory segment mapped into this process. The creator unlinks the
// name once every peer has mapped it, so nothing is left in /dev/shm even if
// the process is killed later; the mapping stays valid until unmapped.
class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates (exclusively) and maps `bytes` bytes, zero-filled. Throws std::runtime_error with errno text.
  static ShmSegment create(const std::string& name, size_t bytes);
  // Maps an existing segment; throws if it is missing or smaller than `min_bytes`.
  static ShmSegment open(const std::string& name, size_t min_bytes);
  void unlink();  // removes the name (idempotent); the mapping stays
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void reset();
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;  // this process created the name and has not unlinked it
};

// Segment names: "/tpudist_p<pid>_<token>_r<rank>" (pid of the creator).
std::string segment_name(pid_t pid, const std::string& token, int rank);
// Unlinks /dev/shm/tpudist_p<pid>_* whose creator process is gone (left by a
// crash between creation and unlink). Returns how many were removed.
int remove_stale_segments();
// Names of this host's tpudist segments (for tests and diagnostics).
std::string list_segments();

// A process as seen from a peer: pid plus its start time, so a recycled pid
// is not mistaken for the original process.
struct ProcessId {
  int64_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  static ProcessId self();
};
// False when the process has exited, is a zombie, or the pid now belongs to
// another process.
bool process_alive(const ProcessId& id);

// Futex on a 32-bit word in shared memory (process-shared, not private).
// Wait returns on a wake, a value change, or after `timeout`.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
void futex_wake_all(std::atomic<uint32_t>* word);

}  // namespace torch_tpu::dist
