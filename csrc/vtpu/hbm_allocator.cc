// Caching allocator for one chip's HBM, in the manner of PyTorch's CUDA
// caching allocator: two pools (small requests share 2 MiB segments, large
// ones get their own segment rounded up to 2 MiB), best-fit blocks split on
// allocation and coalesced on free, cached segments released only when a new
// one would not fit the capacity (or on empty_cache()).
//
// Accounting: every request is rounded up to kAlignment (512 B). A block can
// be larger than its rounded request when the remainder was too small to split
// off; allocated_bytes counts the rounded requests, reserved_bytes the whole
// segments, so such slack shows in reserved but not in allocated.
#include "vtpu/hbm_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <new>
#include <type_traits>
#include <vector>

#include "vtpu/stream.h"
#include "vtpu/trace.h"

namespace vtpu {

constexpr uint64_t kAlignment = 512;
constexpr uint64_t kSmallRequest = 1ull << 20;      // <= 1 MiB: small pool
constexpr uint64_t kSmallSegment = 2ull << 20;      // small pool segment size
constexpr uint64_t kLargeRounding = 2ull << 20;     // large segments: multiple of 2 MiB
constexpr uint64_t kHugePageMinBytes = 8ull << 20;  // segments from 8 MiB get transparent huge pages

struct Segment;

struct Block {
  Segment* segment;
  char* addr;
  uint64_t size;           // bytes the block spans
  uint64_t requested = 0;  // rounded request while allocated
  uint64_t logical = 0;    // logical bytes of the request while allocated
  bool allocated = false;
  Block* prev = nullptr;  // address-ordered neighbours within the segment
  Block* next = nullptr;
};

static_assert(std::is_trivially_destructible_v<Block>, "blocks are recycled without a destructor");

struct Segment {
  char* base;
  uint64_t size;    // bytes reserved against capacity
  uint64_t mapped;  // bytes mapped (size rounded up to the page size)
  bool small;
  Block* head;  // block at offset 0; survives every coalesce
  uint64_t live_blocks = 0;
};

namespace {

struct BySizeThenAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};

// Small fixed-size chunks recycled under the allocator's mutex: the free sets' and the live
// map's nodes and the blocks themselves, so that an allocation and its free cost no
// malloc/free pairs once the pool holds as many chunks as were ever live at once.
class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (void*& head : free_) {
      while (head) {
        void* next = *static_cast<void**>(head);
        ::operator delete(head);
        head = next;
      }
    }
  }
  void* get(size_t bytes) {
    const size_t c = slot(bytes);
    if (c >= kSlots) return ::operator new(bytes);
    if (void* p = free_[c]) {
      free_[c] = *static_cast<void**>(p);
      return p;
    }
    return ::operator new((c + 1) * kGrain);
  }
  void put(void* p, size_t bytes) {
    const size_t c = slot(bytes);
    if (c >= kSlots) return ::operator delete(p);
    *static_cast<void**>(p) = free_[c];
    free_[c] = p;
  }

 private:
  static constexpr size_t kGrain = 16, kSlots = 8;  // chunks of 16..128 bytes
  static size_t slot(size_t bytes) { return (std::max<size_t>(bytes, 1) + kGrain - 1) / kGrain - 1; }
  void* free_[kSlots] = {};
};

template <typename T>
struct PoolAllocator {
  using value_type = T;
  NodePool* pool;
  explicit PoolAllocator(NodePool* p) : pool(p) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) : pool(other.pool) {}  // NOLINT: rebinding
  T* allocate(size_t n) { return static_cast<T*>(pool->get(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { pool->put(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const PoolAllocator<U>& other) const {
    return pool == other.pool;
  }
  template <typename U>
  bool operator!=(const PoolAllocator<U>& other) const {
    return pool != other.pool;
  }
};

using FreeSet = std::set<Block*, BySizeThenAddress, PoolAllocator<Block*>>;
using LiveMap =
    std::map<const char*, Block*, std::less<const char*>, PoolAllocator<std::pair<const char* const, Block*>>>;

uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// A block freed in stream order whose uses have not all run yet: still marked allocated (its
// neighbours do not coalesce into it) and counted in its segment's live blocks.
struct DeferredFree {
  Block* block;
  std::array<StreamUse, HbmAllocator::kMaxStreamUses> uses;
  size_t count;
  // Whether every use has run, or all that have not are on `stream` (null: none may be pending).
  bool clear_except(const Stream* stream) const {
    for (size_t i = 0; i < count; ++i) {
      if (uses[i].stream != stream && uses[i].stream->completed_count() < uses[i].enqueued) return false;
    }
    return true;
  }
};

// How many of the most recent stream-ordered frees reuse_on_stream() looks at.
constexpr size_t kReuseWindow = 32;

void wait_idle(Stream& stream) { stream.wait_idle(); }
std::atomic<HbmAllocator::StreamWaiter> stream_waiter{&wait_idle};

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1ull << 20));
  } else if (bytes >= (1ull << 10)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / (1ull << 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

}  // namespace

struct HbmAllocator::Impl {
  int chip;
  uint64_t capacity;
  mutable std::mutex mu;
  NodePool nodes;  // before the containers: destroyed after them
  FreeSet small_free{BySizeThenAddress{}, PoolAllocator<Block*>(&nodes)};
  FreeSet large_free{BySizeThenAddress{}, PoolAllocator<Block*>(&nodes)};
  std::set<Segment*> segments;
  LiveMap live{std::less<const char*>{}, LiveMap::allocator_type(&nodes)};  // allocated blocks by address
  MemoryStats stats;                  // counters; derived fields filled in stats()
  std::deque<DeferredFree> deferred;  // stream-ordered frees, oldest first

  Block* new_block(Segment* segment, char* addr, uint64_t size) {
    return new (nodes.get(sizeof(Block))) Block{segment, addr, size};
  }
  void delete_block(Block* b) { nodes.put(b, sizeof(Block)); }  // Block is trivially destructible

  FreeSet& pool(bool small) { return small ? small_free : large_free; }

  void note_peaks() {
    stats.allocated_bytes_peak = std::max(stats.allocated_bytes_peak, stats.allocated_bytes);
    stats.logical_bytes_peak = std::max(stats.logical_bytes_peak, stats.logical_bytes);
    stats.reserved_bytes_peak = std::max(stats.reserved_bytes_peak, stats.reserved_bytes);
  }

  // Largest request allocate() could serve right now without failing: a cached
  // free block, or a new segment in the capacity left once fully free cached
  // segments are released (allocate() releases them before giving up).
  uint64_t largest_free_block() const {
    uint64_t largest = 0;
    if (!small_free.empty()) largest = (*small_free.rbegin())->size;
    if (!large_free.empty()) largest = std::max(largest, (*large_free.rbegin())->size);
    uint64_t releasable = 0;
    for (const Segment* s : segments) {
      if (s->live_blocks == 0) releasable += s->size;
    }
    const uint64_t held = stats.reserved_bytes - releasable;
    const uint64_t unreserved = capacity > held ? capacity - held : 0;
    return std::max(largest, unreserved / kAlignment * kAlignment);
  }

  Block* take_best_fit(uint64_t size, bool small) {
    FreeSet& free_set = pool(small);
    Block key{nullptr, nullptr, size};
    auto it = free_set.lower_bound(&key);
    if (it == free_set.end()) return nullptr;
    Block* block = *it;
    free_set.erase(it);
    return block;
  }

  // Keeps `size` bytes in `block`, returning the rest to the pool when it is
  // worth a block of its own (large pool: only remainders above 1 MiB, which a
  // large request could use; as in the CUDA allocator).
  void split(Block* block, uint64_t size) {
    const uint64_t rest = block->size - size;
    const bool small = block->segment->small;
    if (small ? rest < kAlignment : rest <= kSmallRequest) return;
    Block* tail = new_block(block->segment, block->addr + size, rest);
    tail->prev = block;
    tail->next = block->next;
    if (block->next) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    pool(small).insert(tail);
  }

  Segment* map_segment(uint64_t size, bool small) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t mapped = round_up(size, page);
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      ++stats.num_ooms;
      throw OutOfMemoryError("tpu:" + std::to_string(chip) + " could not map " + format_bytes(mapped) +
                             " of host memory to back HBM: " + std::strerror(errno));
    }
    // Transparent huge pages where the host offers them ("madvise" mode): the
    // executor streams through large tensors, and 4 KiB pages cost a TLB miss
    // every 1024 floats. Untouched pages still take no memory.
    if (mapped >= kHugePageMinBytes) madvise(base, mapped, MADV_HUGEPAGE);
    auto* segment = new Segment{static_cast<char*>(base), size, mapped, small, nullptr};
    segment->head = new_block(segment, segment->base, size);
    segments.insert(segment);
    stats.reserved_bytes += size;
    ++stats.segments;
    note_peaks();
    return segment;
  }

  void unmap_segment(Segment* segment) {
    pool(segment->small).erase(segment->head);
    delete_block(segment->head);
    munmap(segment->base, segment->mapped);
    stats.reserved_bytes -= segment->size;
    --stats.segments;
    segments.erase(segment);
    delete segment;
  }

  // Returns a block whose last use is over to its pool, coalescing with free neighbours.
  void release_block(Block* block) {
    --block->segment->live_blocks;
    block->allocated = false;
    block->requested = 0;
    block->logical = 0;
    FreeSet& free_set = pool(block->segment->small);
    if (block->prev != nullptr && !block->prev->allocated) {
      Block* prev = block->prev;
      free_set.erase(prev);
      prev->size += block->size;
      prev->next = block->next;
      if (block->next) block->next->prev = prev;
      delete_block(block);
      block = prev;
    }
    if (block->next != nullptr && !block->next->allocated) {
      Block* next = block->next;
      free_set.erase(next);
      block->size += next->size;
      block->next = next->next;
      if (next->next) next->next->prev = block;
      delete_block(next);
    }
    free_set.insert(block);
  }

  // Releases the stream-ordered frees whose uses have all run. Oldest first, stopping at the
  // first still pending: each stream's tags only grow, so the rest are mostly pending too.
  void reap_deferred() {
    while (!deferred.empty() && deferred.front().clear_except(nullptr)) {
      release_block(deferred.front().block);
      deferred.pop_front();
    }
  }

  // A stream-ordered free that work next queued on `stream` may overwrite, of `size` rounded bytes.
  Block* take_deferred(uint64_t size, const Stream& stream) {
    const size_t window = std::min(deferred.size(), kReuseWindow);
    for (size_t k = 0; k < window; ++k) {
      auto it = deferred.end() - 1 - static_cast<std::ptrdiff_t>(k);
      if (it->block->requested != size || !it->clear_except(&stream)) continue;
      Block* block = it->block;
      deferred.erase(it);
      return block;
    }
    return nullptr;
  }

  // Marks `block` handed out for a request of `size` rounded (`logical`) bytes.
  void note_allocated(Block* block, uint64_t size, uint64_t logical) {
    block->requested = size;
    block->logical = logical;
    live.emplace(block->addr, block);
    stats.allocated_bytes += size;
    stats.logical_bytes += logical;
    ++stats.num_allocs;
    ++stats.active_blocks;
    note_peaks();
    if (const trace::Hooks* h = trace::hooks()) h->hbm(chip, stats.allocated_bytes);
  }

  // Takes `block` out of the live blocks and the allocated bytes (it may stay marked allocated).
  void note_freed(Block* block) {
    auto it = live.find(block->addr);
    if (it == live.end() || it->second != block) {
      throw std::invalid_argument("tpu:" + std::to_string(chip) +
                                  " free of a block that is not live in this allocator "
                                  "(freed twice, or from another chip)");
    }
    live.erase(it);
    stats.allocated_bytes -= block->requested;
    stats.logical_bytes -= block->logical;
    ++stats.num_frees;
    --stats.active_blocks;
    if (const trace::Hooks* h = trace::hooks()) h->hbm(chip, stats.allocated_bytes);
  }

  // Frees coalesce completely, so a segment without live blocks is one free block.
  void release_free_segments() {
    std::vector<Segment*> idle;
    for (Segment* s : segments) {
      if (s->live_blocks == 0) idle.push_back(s);
    }
    for (Segment* s : idle) unmap_segment(s);
  }

  [[noreturn]] void out_of_memory(uint64_t physical, uint64_t logical) {
    ++stats.num_ooms;
    throw OutOfMemoryError("tpu:" + std::to_string(chip) + " out of HBM memory: tried to allocate " +
                           format_bytes(physical) + " (physical, tiled layout; " + format_bytes(logical) +
                           " logical); capacity " + format_bytes(capacity) + ", " +
                           format_bytes(stats.allocated_bytes) + " allocated, " + format_bytes(stats.reserved_bytes) +
                           " reserved, largest free block " + format_bytes(largest_free_block()));
  }

  // A new segment for a `size`-byte request; releases cached segments when the
  // capacity is reached, and as a last resort reserves just the request. Null
  // instead of OutOfMemoryError when `may_wait` and stream-ordered frees pend.
  Segment* new_segment(uint64_t size, bool small, uint64_t physical, uint64_t logical, bool may_wait) {
    const uint64_t preferred = small ? kSmallSegment : round_up(size, kLargeRounding);
    auto fits = [&](uint64_t bytes) { return bytes <= capacity - std::min(capacity, stats.reserved_bytes); };
    if (fits(preferred)) return map_segment(preferred, small);
    ++stats.num_alloc_retries;
    release_free_segments();
    if (fits(preferred)) return map_segment(preferred, small);
    if (fits(size)) return map_segment(size, small);
    if (may_wait && !deferred.empty()) return nullptr;
    out_of_memory(physical, logical);
  }
};

HbmAllocator::HbmAllocator(int chip, uint64_t capacity_bytes)
    : impl_(new Impl), chip_(chip), capacity_(capacity_bytes) {
  impl_->chip = chip;
  impl_->capacity = capacity_bytes;
}

HbmAllocator::~HbmAllocator() {
  // Blocks still live at teardown are reclaimed with their segments.
  for (Segment* segment : impl_->segments) {
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      impl_->delete_block(b);
      b = next;
    }
    munmap(segment->base, segment->mapped);
    delete segment;
  }
  delete impl_;
}

Block* HbmAllocator::reuse_on_stream(uint64_t logical, uint64_t physical, Stream& stream) {
  if (physical < logical || physical == 0 || physical > UINT64_MAX - kAlignment) return nullptr;
  const uint64_t size = round_up(physical, kAlignment);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->reap_deferred();
  Block* block = impl_->take_deferred(size, stream);
  if (block) impl_->note_allocated(block, size, logical);
  return block;
}

Block* HbmAllocator::allocate(uint64_t logical, uint64_t physical) {
  if (physical < logical) {
    throw std::invalid_argument("tpu:" + std::to_string(chip_) + " allocation of " + std::to_string(logical) +
                                " logical bytes asks for only " + std::to_string(physical) + " physical bytes");
  }
  if (physical == 0) return nullptr;
  if (physical > UINT64_MAX - kAlignment) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->out_of_memory(physical, logical);
  }
  const uint64_t size = round_up(physical, kAlignment);
  const bool small = size <= kSmallRequest;

  for (bool may_wait = true;; may_wait = false) {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->reap_deferred();
    Block* block = impl_->take_best_fit(size, small);
    if (block == nullptr) {
      Segment* segment = impl_->new_segment(size, small, physical, logical, may_wait);
      if (segment == nullptr) {
        // Freed blocks wait on streams' queued work: wait for it (unlocked: the work may free
        // blocks too), then try once more.
        std::vector<Stream*> streams;
        for (const DeferredFree& d : impl_->deferred) {
          for (size_t i = 0; i < d.count; ++i) {
            if (std::find(streams.begin(), streams.end(), d.uses[i].stream) == streams.end()) {
              streams.push_back(d.uses[i].stream);
            }
          }
        }
        lock.unlock();
        // Not from a stream's worker: the streams waited for may be waiting on its stream.
        if (!Stream::on_any_worker_thread()) {
          const StreamWaiter waiter = stream_waiter.load();
          for (Stream* s : streams) waiter(*s);
        }
        continue;
      }
      block = segment->head;
    }
    impl_->split(block, size);
    block->allocated = true;
    ++block->segment->live_blocks;
    impl_->note_allocated(block, size, logical);
    return block;
  }
}

void HbmAllocator::free(Block* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->note_freed(block);
  impl_->release_block(block);
}

void HbmAllocator::free_after(Block* block, const StreamUse* uses, size_t count) {
  if (block == nullptr) return;
  if (count > kMaxStreamUses) throw std::invalid_argument("free_after: more stream uses than kMaxStreamUses");
  DeferredFree d{block, {}, count};
  std::copy(uses, uses + count, d.uses.begin());
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->note_freed(block);
  if (d.clear_except(nullptr)) {
    impl_->release_block(block);
  } else {
    impl_->deferred.push_back(d);
  }
}

void HbmAllocator::set_stream_waiter(StreamWaiter waiter) { stream_waiter.store(waiter ? waiter : &wait_idle); }

void* HbmAllocator::data(const Block* block) { return block ? block->addr : nullptr; }

uint64_t HbmAllocator::size(const Block* block) { return block ? block->size : 0; }

void HbmAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->reap_deferred();
  impl_->release_free_segments();
}

MemoryStats HbmAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  MemoryStats s = impl_->stats;
  s.capacity_bytes = capacity_;
  s.largest_free_block = impl_->largest_free_block();
  return s;
}

void HbmAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  MemoryStats& s = impl_->stats;
  s.allocated_bytes_peak = s.allocated_bytes;
  s.logical_bytes_peak = s.logical_bytes;
  s.reserved_bytes_peak = s.reserved_bytes;
}

bool HbmAllocator::owns(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->live.upper_bound(p);
  if (it == impl_->live.begin()) return false;
  --it;
  const Block* b = it->second;
  return p >= b->addr && p < b->addr + b->size;
}

}  // namespace vtpu
