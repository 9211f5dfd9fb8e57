#include "exec/compile_cache.h"

#include "ir/hash.h"

namespace torch_tpu::exec {

CompileCache::CompileCache(size_t capacity, CompileOptions options)
    : capacity_(capacity == 0 ? 1 : capacity), options_(std::move(options)) {}

std::shared_ptr<const CompiledRegion> CompileCache::get_or_compile(const ir::Graph& g, uint64_t* hash) {
  const uint64_t h = ir::structural_hash(g);
  if (hash) *hash = h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [lo, hi] = index_.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      if (ir::structurally_equal(it->second->graph, g)) {
        lru_.splice(lru_.begin(), lru_, it->second);
        ++stats_.hits;
        return it->second->region;
      }
    }
    ++stats_.misses;
  }
  // Compile outside the lock: other threads keep hitting meanwhile. Two
  // threads missing on the same graph both compile; the first insert wins.
  auto region = std::make_shared<const CompiledRegion>(compile(g, options_));
  std::lock_guard<std::mutex> lock(mu_);
  auto [first, last] = index_.equal_range(h);
  for (auto it = first; it != last; ++it)
    if (ir::structurally_equal(it->second->graph, g)) return it->second->region;  // another thread won
  lru_.push_front(Entry{h, g, region});
  index_.emplace(h, lru_.begin());
  while (lru_.size() > capacity_) {
    auto victim = std::prev(lru_.end());
    auto [lo, hi] = index_.equal_range(victim->hash);
    for (auto it = lo; it != hi; ++it)
      if (it->second == victim) {
        index_.erase(it);
        break;
      }
    lru_.erase(victim);
    ++stats_.evictions;
  }
  stats_.entries = lru_.size();
  return region;
}

CompileCache::Stats CompileCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.entries = lru_.size();
  return s;
}

void CompileCache::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = Stats{};
}

void CompileCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
  stats_.entries = 0;
}

CompileCache& CompileCache::global() {
  static CompileCache cache;
  return cache;
}

}  // namespace torch_tpu::exec
