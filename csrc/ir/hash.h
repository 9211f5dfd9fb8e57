// Structural hashing and equality of graphs, the key of the compile cache.
//
// Two graphs are structurally equal when they have the same ops (kind,
// attributes, result type), wired the same way, with the same parameters
// (by signature position) and outputs (in order). Value ids and the order in
// which independent ops were appended do not matter: both functions walk the
// ops in a canonical order (post-order DFS from the outputs, then from the
// parameters, then from any dead ops).
//
// Constants' values are part of the structure: a splat of 0.5 and one of
// 0.25 give different keys, since the compiled kernels bake them in. A
// recorder that sees a scalar change on every call (a learning rate that
// follows a schedule) should pass it as a rank-0 parameter instead.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace torch_tpu::ir {

// Mixes `v` into the running hash `h`: boost's hash_combine step, then the
// splitmix64 finalizer. The one mixing step of csrc's hashes (structural
// hashes, CSE keys, the meta cache's and the defer repeat detector's keys).
inline uint64_t hash_mix(uint64_t h, uint64_t v) {
  uint64_t x = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// Op ids of `g` in canonical order (every op exactly once, operands first).
std::vector<ValueId> canonical_order(const Graph& g);
uint64_t structural_hash(const Graph& g);
bool structurally_equal(const Graph& a, const Graph& b);

}  // namespace torch_tpu::ir
