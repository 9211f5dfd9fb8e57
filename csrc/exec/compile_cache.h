// Compiled regions cached by structure: a region recorded again with the same
// ops, shapes, types and wiring (ir/hash.h) reuses its compiled kernels.
// Thread-safe; least recently used entries are evicted beyond `capacity`.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "exec/executor.h"

namespace torch_tpu::exec {

class CompileCache {
 public:
  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;  // compilations
    uint64_t evictions = 0;
    uint64_t entries = 0;
  };

  explicit CompileCache(size_t capacity = 4096, CompileOptions options = {});

  // The compiled form of `g`, compiled on a miss. Equal hashes are confirmed
  // with structurally_equal(), so a hash collision only costs a compile.
  // `hash`, when given, receives ir::structural_hash(g) (computed here anyway).
  std::shared_ptr<const CompiledRegion> get_or_compile(const ir::Graph& g, uint64_t* hash = nullptr);
  Stats stats() const;
  void reset_stats();  // counters only
  void clear();        // entries too
  size_t capacity() const { return capacity_; }

  // The process-wide cache defer_and_fuse uses.
  static CompileCache& global();

 private:
  struct Entry {
    uint64_t hash;
    ir::Graph graph;  // as recorded (before passes), to confirm equality
    std::shared_ptr<const CompiledRegion> region;
  };
  using List = std::list<Entry>;  // most recently used first

  size_t capacity_;
  CompileOptions options_;
  mutable std::mutex mu_;
  List lru_;
  std::unordered_multimap<uint64_t, List::iterator> index_;
  Stats stats_;
};

}  // namespace torch_tpu::exec
