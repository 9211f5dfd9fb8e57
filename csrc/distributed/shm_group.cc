#include "distributed/shm_group.h"

#include <c10/util/Exception.h>
#include <immintrin.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <random>
#include <sstream>
#include <thread>

namespace torch_tpu::dist {

constexpr uint32_t kMagic = 0x44555054;  // "TPUD"
constexpr uint32_t kVersion = 1;

struct alignas(64) Header {
  std::atomic<uint32_t> magic;
  uint32_t version;
  int32_t rank;
  int32_t world;
  uint64_t segment_bytes;
  uint64_t buffer_bytes;
  uint64_t p2p_bytes;
  int64_t pid;
  uint64_t start_time;
  alignas(64) std::atomic<uint64_t> progress;
  std::atomic<uint64_t> current_seq;  // collective this rank is in (diagnostics)
  alignas(64) std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<uint32_t> state;
  int32_t failed_rank;
  char reason[512];
  alignas(64) Descriptor desc[2];
};

namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::string random_token() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::ostringstream os;
  os << std::hex << gen();
  return os.str();
}

std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

void store_wait(c10d::Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                const std::string& what) {
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, "tpu_dist: rendezvous of " + what + " failed: " + e.what());
  }
}

}  // namespace

ShmGroup::ShmGroup(const c10::intrusive_ptr<c10d::Store>& store, Options options) : opts_(std::move(options)) {
  const int n = opts_.size;
  TORCH_CHECK(n >= 1 && opts_.rank >= 0 && opts_.rank < n, "tpu_dist: rank ", opts_.rank,
              " is out of range for a group of ", n);
  opts_.buffer_bytes = align_up(std::max<size_t>(opts_.buffer_bytes, 64 * 1024), 4096);
  opts_.p2p_bytes = align_up(std::max<size_t>(opts_.p2p_bytes, 64 * 1024), 4096);
  counts_offset_ = align_up(sizeof(Header), 64);
  p2p_counters_offset_ = align_up(counts_offset_ + 2 * 2 * n * sizeof(int64_t), 64);
  buffers_offset_ = align_up(p2p_counters_offset_ + 2 * n * sizeof(std::atomic<uint64_t>), 4096);
  mailboxes_offset_ = buffers_offset_ + 2 * opts_.buffer_bytes;
  segment_bytes_ = mailboxes_offset_ + n * opts_.p2p_bytes;
  const std::string what = "group '" + opts_.group_name + "'";

  static std::once_flag cleaned;
  std::call_once(cleaned, [] { remove_stale_segments(); });

  std::string token;
  if (opts_.rank == 0) {
    token = random_token();
    store->set("tpu_dist/token", to_bytes(token));
  } else {
    store_wait(*store, {"tpu_dist/token"}, opts_.timeout, what);
    token = to_string(store->get("tpu_dist/token"));
  }

  // Our segment: header, counts, p2p counters, buffers, mailboxes.
  const ProcessId me = ProcessId::self();
  ShmSegment own = ShmSegment::create(segment_name(static_cast<pid_t>(me.pid), token, opts_.rank), segment_bytes_);
  char* base = static_cast<char*>(own.data());
  auto* h = new (base) Header();
  h->version = kVersion;
  h->rank = opts_.rank;
  h->world = n;
  h->segment_bytes = segment_bytes_;
  h->buffer_bytes = opts_.buffer_bytes;
  h->p2p_bytes = opts_.p2p_bytes;
  h->pid = me.pid;
  h->start_time = me.start_time;
  h->failed_rank = -1;
  auto* counters = reinterpret_cast<std::atomic<uint64_t>*>(base + p2p_counters_offset_);
  for (int i = 0; i < 2 * n; ++i) new (&counters[i]) std::atomic<uint64_t>(0);
  h->magic.store(kMagic, std::memory_order_release);

  segments_.resize(n);
  pids_.resize(n);
  segments_[opts_.rank] = std::move(own);
  pids_[opts_.rank] = me;
  store->set("tpu_dist/segment/" + std::to_string(opts_.rank), to_bytes(segments_[opts_.rank].name()));

  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back("tpu_dist/segment/" + std::to_string(r));
  store_wait(*store, keys, opts_.timeout, what);
  for (int r = 0; r < n; ++r) {
    if (r == opts_.rank) continue;
    segments_[r] = ShmSegment::open(to_string(store->get(keys[r])), segment_bytes_);
    Header& peer = header(r);
    TORCH_CHECK(peer.magic.load(std::memory_order_acquire) == kMagic && peer.version == kVersion && peer.world == n &&
                    peer.rank == r && peer.segment_bytes == segment_bytes_,
                "tpu_dist: the shared-memory segment of ", describe_rank(r), " in ", what,
                " does not match this rank's layout (different torch_tpu versions or TORCH_TPU_DIST_* "
                "settings across ranks?)");
    pids_[r] = ProcessId{peer.pid, peer.start_time};
  }

  // Every rank mapped every segment: the names can go (nothing stays in /dev/shm).
  store->set("tpu_dist/mapped/" + std::to_string(opts_.rank), to_bytes("1"));
  keys.clear();
  for (int r = 0; r < n; ++r) keys.push_back("tpu_dist/mapped/" + std::to_string(r));
  store_wait(*store, keys, opts_.timeout, what);
  segments_[opts_.rank].unlink();
}

ShmGroup::~ShmGroup() { close(); }

Header& ShmGroup::header(int r) const { return *static_cast<Header*>(segments_[r].data()); }

std::string ShmGroup::describe_rank(int r) const {
  const int64_t label = r < static_cast<int>(opts_.group_ranks.size()) ? opts_.group_ranks[r] : r;
  std::string s = "rank " + std::to_string(label);
  std::string extra;
  if (!opts_.global_ranks.empty() && r < static_cast<int>(opts_.global_ranks.size()) &&
      opts_.global_ranks[r] != label) {
    extra = "global rank " + std::to_string(opts_.global_ranks[r]);
  }
  if (r < static_cast<int>(pids_.size()) && pids_[r].pid > 0) {
    extra += (extra.empty() ? "" : ", ") + std::string("pid ") + std::to_string(pids_[r].pid);
  }
  return extra.empty() ? s : s + " (" + extra + ")";
}

void ShmGroup::publish() {
  Header& h = header(opts_.rank);
  ++step_;
  h.progress.store(step_, std::memory_order_seq_cst);
  ring_doorbell();
}

void ShmGroup::ring_doorbell() {
  Header& h = header(opts_.rank);
  h.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&h.doorbell);
}

void ShmGroup::raise(int culprit, const std::string& where, const std::string& cause) {
  mark_failed(culprit, cause);
  C10_THROW_ERROR(DistBackendError, where + ": " + cause);
}

namespace {
std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << std::chrono::duration<double>(ms).count() << " s";
  return os.str();
}
}  // namespace

void ShmGroup::check_health(int waiting_for, bool all, const std::string& what,
                            std::chrono::steady_clock::time_point start) {
  const int64_t me =
      opts_.rank < static_cast<int>(opts_.group_ranks.size()) ? opts_.group_ranks[opts_.rank] : opts_.rank;
  const std::string where =
      "tpu_dist " + what + " in group '" + opts_.group_name + "' (rank " + std::to_string(me) + ")";
  for (int r = 0; r < opts_.size; ++r) {
    if (r == opts_.rank || (!all && r != waiting_for)) continue;
    Header& h = header(r);
    const auto state = static_cast<PeerState>(h.state.load(std::memory_order_acquire));
    if (state == PeerState::kFailed) {
      const int culprit = h.failed_rank >= 0 ? h.failed_rank : r;
      const std::string reason(h.reason, strnlen(h.reason, sizeof(h.reason)));
      raise(culprit, where, reason + (culprit != r ? " (reported by " + describe_rank(r) + ")" : ""));
    }
    if (state == PeerState::kClosed) {
      raise(r, where, describe_rank(r) + " left the group (destroyed its process group or exited) during " + what);
    }
    if (!process_alive(pids_[r])) {
      raise(r, where, describe_rank(r) + " died (its process is gone) during " + what);
    }
  }
  if (std::chrono::steady_clock::now() - start > opts_.timeout) {
    std::string peer_state;
    if (waiting_for >= 0) {
      Header& h = header(waiting_for);
      peer_state = "; it is at collective #" + std::to_string(h.current_seq.load()) + ", step " +
                   std::to_string(h.progress.load()) + " (this rank: collective #" +
                   std::to_string(header(opts_.rank).current_seq.load()) + ", step " + std::to_string(step_) + ")";
    }
    raise(waiting_for, where,
          "timed out after " + seconds_text(opts_.timeout) + " waiting for " +
              (waiting_for >= 0 ? describe_rank(waiting_for) : std::string("the other ranks")) + " in " + what +
              peer_state +
              ". A rank is stalled or called a different sequence of collectives (the timeout is the one "
              "passed to init_process_group/new_group, or TORCH_TPU_DIST_TIMEOUT)");
  }
}

template <typename Ready>
void ShmGroup::wait_impl(int r, bool all, Ready ready, const std::string& what) {
  if (ready()) return;
  // Without spinning (TORCH_TPU_DIST_SPIN=0) the CPU goes straight to whoever needs it.
  const int spins = opts_.spin ? 256 : 0;
  const int yields = opts_.spin ? 16 : 0;
  for (int i = 0; i < spins; ++i) {
    _mm_pause();
    if (ready()) return;
  }
  const auto start = std::chrono::steady_clock::now();
  auto last_check = start;
  for (int round = 0;; ++round) {
    Header& h = header(r);
    const uint32_t bell = h.doorbell.load(std::memory_order_seq_cst);
    if (ready()) return;
    if (round < yields) {
      std::this_thread::yield();
    } else {
      h.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (!ready()) futex_wait(&h.doorbell, bell, std::chrono::microseconds(20000));
      h.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
    if (ready()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check > std::chrono::milliseconds(20)) {
      last_check = now;
      check_health(r, all, what, start);
    }
    if (failed()) C10_THROW_ERROR(DistBackendError, failure());
  }
}

void ShmGroup::wait_rank(int r, uint64_t step, const std::string& what) {
  if (r == opts_.rank) return;
  Header& h = header(r);
  wait_impl(
      r, /*all=*/true, [&] { return h.progress.load(std::memory_order_acquire) >= step; }, what);
}

void ShmGroup::wait_all(uint64_t step, const std::string& what) {
  for (int k = 1; k < opts_.size; ++k) wait_rank((opts_.rank + k) % opts_.size, step, what);
}

void ShmGroup::wait_for(int r, const std::function<bool()>& ready, const std::string& what) {
  wait_impl(r, /*all=*/false, ready, what);
}

Descriptor& ShmGroup::my_descriptor(uint64_t seq) { return header(opts_.rank).desc[seq & 1]; }

const Descriptor& ShmGroup::descriptor(int r, uint64_t seq) const { return header(r).desc[seq & 1]; }

int64_t* ShmGroup::my_counts(uint64_t seq) {
  return reinterpret_cast<int64_t*>(static_cast<char*>(segments_[opts_.rank].data()) + counts_offset_) +
         (seq & 1) * 2 * opts_.size;
}

const int64_t* ShmGroup::counts(int r, uint64_t seq) const {
  return reinterpret_cast<const int64_t*>(static_cast<char*>(segments_[r].data()) + counts_offset_) +
         (seq & 1) * 2 * opts_.size;
}

void ShmGroup::set_current(uint64_t seq) { header(opts_.rank).current_seq.store(seq); }

char* ShmGroup::buffer(int r, int parity) const {
  return static_cast<char*>(segments_[r].data()) + buffers_offset_ + parity * opts_.buffer_bytes;
}

void ShmGroup::acquire_buffer(int parity, const std::string& what) { wait_all(buffer_free_step_[parity], what); }

void ShmGroup::release_buffer(int parity) { buffer_free_step_[parity] = step_; }

char* ShmGroup::mailbox(int sender, int receiver) const {
  return static_cast<char*>(segments_[sender].data()) + mailboxes_offset_ + receiver * opts_.p2p_bytes;
}

std::atomic<uint64_t>& ShmGroup::p2p_written(int sender, int receiver) const {
  auto* c =
      reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(segments_[sender].data()) + p2p_counters_offset_);
  return c[receiver];
}

std::atomic<uint64_t>& ShmGroup::p2p_read(int receiver, int sender) const {
  auto* c =
      reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(segments_[receiver].data()) + p2p_counters_offset_);
  return c[opts_.size + sender];
}

void ShmGroup::mark_failed(int culprit, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (!failure_.empty()) return;
    failure_ = reason;
  }
  if (segments_.empty() || segments_[opts_.rank].data() == nullptr) return;
  Header& h = header(opts_.rank);
  h.failed_rank = culprit;
  std::strncpy(h.reason, reason.c_str(), sizeof(h.reason) - 1);
  h.state.store(static_cast<uint32_t>(PeerState::kFailed), std::memory_order_release);
  ring_doorbell();
}

bool ShmGroup::failed() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return !failure_.empty();
}

std::string ShmGroup::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

int ShmGroup::dead_peer() const {
  for (int r = 0; r < opts_.size; ++r) {
    if (r == opts_.rank || segments_.empty()) continue;
    const auto state = static_cast<PeerState>(header(r).state.load(std::memory_order_acquire));
    // A peer that failed first (kFailed) or left (kClosed) exits as a consequence.
    if (state == PeerState::kRunning && !process_alive(pids_[r])) return r;
  }
  return -1;
}

void ShmGroup::close() {
  if (segments_.empty() || segments_[opts_.rank].data() == nullptr) return;
  Header& h = header(opts_.rank);
  uint32_t running = static_cast<uint32_t>(PeerState::kRunning);
  h.state.compare_exchange_strong(running, static_cast<uint32_t>(PeerState::kClosed));
  ring_doorbell();
  segments_.clear();
}

}  // namespace torch_tpu::dist
