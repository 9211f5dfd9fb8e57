#include "distributed/ring_engine.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

namespace torch_tpu::dist {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

bool uses_redop(OpKind op) { return op == OpKind::kAllReduce || op == OpKind::kReduceScatter || op == OpKind::kReduce; }
bool uses_root(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kGather || op == OpKind::kScatter || op == OpKind::kReduce;
}
bool uses_numel(OpKind op) { return op != OpKind::kAllToAll && op != OpKind::kBarrier; }

}  // namespace

std::string summary(const Descriptor& d) {
  std::ostringstream os;
  const auto op = static_cast<OpKind>(d.op);
  os << op_name(op) << "(";
  if (op != OpKind::kBarrier) {
    if (uses_redop(op)) os << redop_name(d.redop) << ", ";
    os << dtype_name(d.dtype) << "[";
    for (int i = 0; i < d.ndim && i < kMaxDims; ++i) os << (i ? ", " : "") << d.sizes[i];
    os << "]";
    if (uses_numel(op)) os << " numel " << d.numel;
    if (uses_root(op)) os << ", root " << d.root;
  }
  os << ") #" << d.seq;
  if (d.spmd) os << " [spmd_safe]";
  return os.str();
}

bool descriptors_agree(const Descriptor& a, const Descriptor& b, uint64_t seq, bool shapes) {
  const auto op = static_cast<OpKind>(a.op);
  bool agree = a.seq == seq && b.seq == seq && a.op == b.op && (op == OpKind::kBarrier || a.dtype == b.dtype) &&
               (!uses_redop(op) || a.redop == b.redop) && (!uses_numel(op) || a.numel == b.numel) &&
               (!uses_root(op) || a.root == b.root);
  if (agree && shapes && uses_numel(op)) {
    agree = a.ndim == b.ndim && std::equal(a.sizes, a.sizes + std::min(a.ndim, kMaxDims), b.sizes);
  }
  return agree;
}

std::string disagreement(const std::vector<Descriptor>& descs, uint64_t seq,
                         const std::function<std::string(int)>& rank_name) {
  const bool shapes = std::any_of(descs.begin(), descs.end(), [](const Descriptor& d) { return d.spmd != 0; });
  bool agree = true;
  for (size_t r = 1; r < descs.size() && agree; ++r) agree = descriptors_agree(descs[r], descs[0], seq, shapes);
  if (agree) return {};
  std::ostringstream os;
  os << (shapes ? "ranks called different collectives or disagree on reduce op, dtype, shape, element count or root "
                  "(spmd_safe compares shapes too):"
                : "ranks called different collectives or disagree on reduce op, dtype, element count or root:");
  for (size_t r = 0; r < descs.size(); ++r) os << "\n  " << rank_name(static_cast<int>(r)) << ": " << summary(descs[r]);
  return os.str();
}

namespace {

// Chunk starts aligned to 64 bytes so vectorised kernels see aligned blocks.
std::vector<int64_t> split_starts(int64_t numel, int n, size_t element_size) {
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(element_size));
  std::vector<int64_t> starts(n + 1);
  for (int c = 0; c <= n; ++c) {
    int64_t s = numel * c / n;
    if (c < n) s = std::min(numel, (s + align - 1) / align * align);
    starts[c] = s;
  }
  for (int c = 1; c <= n; ++c) starts[c] = std::max(starts[c], starts[c - 1]);
  return starts;
}

// The n chunks of split_starts as (start, length) pairs, and the longest.
struct Chunks {
  std::vector<int64_t> starts, lens;
  int64_t longest = 0;
};
Chunks split_chunks(int64_t numel, int n, size_t element_size) {
  const auto bounds = split_starts(numel, n, element_size);
  Chunks out;
  out.starts.assign(bounds.begin(), bounds.end() - 1);
  for (int c = 0; c < n; ++c) {
    out.lens.push_back(bounds[c + 1] - bounds[c]);
    out.longest = std::max(out.longest, out.lens.back());
  }
  return out;
}

int64_t slot_elements(size_t buffer_bytes, int parts, size_t element_size) {
  int64_t per = static_cast<int64_t>(buffer_bytes / parts / element_size);
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(element_size));
  if (per > align) per = per / align * align;
  return std::max<int64_t>(per, 1);
}

inline int64_t clamp_len(int64_t len, int64_t offset, int64_t slot) {
  return std::max<int64_t>(0, std::min(slot, len - offset));
}

}  // namespace

Arrival Engine::arrive(uint64_t seq, const Descriptor& d, const std::string& what, const int64_t* counts) {
  const int n = g_.size();
  Descriptor& mine = g_.my_descriptor(seq);
  mine = d;
  mine.seq = seq;
  if (counts != nullptr) std::memcpy(g_.my_counts(seq), counts, 2 * n * sizeof(int64_t));
  g_.set_current(seq);
  g_.publish();
  g_.wait_all(g_.step(), what);

  Arrival a;
  a.descs.resize(n);
  for (int r = 0; r < n; ++r) a.descs[r] = r == g_.rank() ? mine : g_.descriptor(r, seq);
  const auto op = static_cast<OpKind>(mine.op);
  const std::string disagree = disagreement(a.descs, seq, [this](int r) { return g_.describe_rank(r); });
  TORCH_CHECK(disagree.empty(), "tpu_dist ", what, " in group '", g_.options().group_name, "': ", disagree);
  if (op == OpKind::kAllToAll) {
    for (int r = 0; r < n; ++r) {
      const int64_t* cr = r == g_.rank() ? g_.my_counts(seq) : g_.counts(r, seq);
      for (int q = 0; q < n; ++q) {
        const int64_t* cq = q == g_.rank() ? g_.my_counts(seq) : g_.counts(q, seq);
        TORCH_CHECK(cr[q] == cq[n + r], "tpu_dist ", what, " in group '", g_.options().group_name,
                    "': ", g_.describe_rank(r), " sends ", cr[q], " bytes to ", g_.describe_rank(q), ", which expects ",
                    cq[n + r], " bytes from it (split sizes disagree)");
      }
    }
  }
  std::vector<int> chips(n);
  for (int r = 0; r < n; ++r) chips[r] = a.descs[r].chip;
  a.order = ring_order(chips, topology_);
  a.position.assign(n, 0);
  for (int p = 0; p < n; ++p) a.position[a.order[p]] = p;
  return a;
}

void Engine::ring_reduce_window(const Arrival& a, const char* input, const std::vector<int64_t>& starts,
                                const std::vector<int64_t>& lens, int64_t offset, int64_t slot, int parity,
                                at::ScalarType dtype, int redop, const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const size_t es = c10::elementSize(dtype);
  const int p = a.position[me];
  const int pred = a.order[(p - 1 + n) % n];
  char* mine = g_.buffer(me, parity);
  const char* theirs = g_.buffer(pred, parity);
  g_.acquire_buffer(parity, what);
  const uint64_t base = g_.step();
  for (int k = 0; k < n; ++k) {
    const int c = ((p - 1 - k) % n + n) % n;
    const int64_t l = clamp_len(lens[c], offset, slot);
    char* dst = mine + c * slot * es;
    const char* src = input + (starts[c] + offset) * es;
    if (k == 0) {
      if (l > 0) std::memcpy(dst, src, l * es);
    } else {
      g_.wait_rank(pred, base + k, what);
      combine(dst, theirs + c * slot * es, src, l, dtype, redop);
      if (k == n - 1 && redop == RedOp::AVG) divide(dst, l, dtype, n);
    }
    g_.publish();
  }
}

void Engine::all_reduce(const Arrival& a, void* data, int64_t numel, at::ScalarType dtype, int redop,
                        const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const size_t es = c10::elementSize(dtype);
  const int64_t bytes = numel * static_cast<int64_t>(es);
  char* d = static_cast<char*>(data);
  if (n == 1 || numel == 0) return;
  if (static_cast<size_t>(bytes) <= small_bytes_ && static_cast<size_t>(bytes) <= g_.buffer_bytes()) {
    // One shot: everyone publishes its data, everyone reduces all of it in rank order.
    const int parity = next_parity();
    g_.acquire_buffer(parity, what);
    std::memcpy(g_.buffer(me, parity), d, bytes);
    g_.publish();
    g_.wait_all(g_.step(), what);
    std::memcpy(d, g_.buffer(0, parity), bytes);
    for (int r = 1; r < n; ++r) combine(d, d, g_.buffer(r, parity), numel, dtype, redop);
    if (redop == RedOp::AVG) divide(d, numel, dtype, n);
    g_.publish();
    g_.release_buffer(parity);
    return;
  }
  const Chunks chunks = split_chunks(numel, n, es);
  const std::vector<int64_t>& starts = chunks.starts;
  const std::vector<int64_t>& lens = chunks.lens;
  const int64_t longest = chunks.longest;
  const int64_t slot = slot_elements(g_.buffer_bytes(), n, es);
  const int p = a.position[me];
  for (int64_t o = 0; o < longest; o += slot) {
    const int parity = next_parity();
    ring_reduce_window(a, d, starts, lens, o, slot, parity, dtype, redop, what);
    // All-gather: each position's reduced block window sits in its owner's buffer.
    const uint64_t reduced = g_.step();
    for (int k = 0; k < n; ++k) {
      const int c = (p - k + n) % n;
      const int r = a.order[c];
      const int64_t l = clamp_len(lens[c], o, slot);
      if (l <= 0) continue;
      g_.wait_rank(r, reduced, what);
      std::memcpy(d + (starts[c] + o) * es, g_.buffer(r, parity) + c * slot * es, l * es);
    }
    g_.publish();
    g_.release_buffer(parity);
  }
}

void Engine::reduce_scatter(const Arrival& a, const void* input, void* output, int64_t count, at::ScalarType dtype,
                            int redop, const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const size_t es = c10::elementSize(dtype);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (count == 0) return;
  if (n == 1) {
    if (out != in) std::memmove(out, in, count * es);
    return;
  }
  std::vector<int64_t> starts(n), lens(n, count);
  for (int c = 0; c < n; ++c) starts[c] = a.order[c] * count;  // position c reduces rank order[c]'s block
  const int64_t slot = slot_elements(g_.buffer_bytes(), n, es);
  const int p = a.position[me];
  for (int64_t o = 0; o < count; o += slot) {
    const int parity = next_parity();
    ring_reduce_window(a, in, starts, lens, o, slot, parity, dtype, redop, what);
    const int64_t l = clamp_len(count, o, slot);
    std::memcpy(out + o * es, g_.buffer(me, parity) + p * slot * es, l * es);
    g_.publish();
    g_.release_buffer(parity);
  }
}

void Engine::reduce(const Arrival& a, const void* input, void* output, int64_t numel, at::ScalarType dtype, int redop,
                    int root, const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const size_t es = c10::elementSize(dtype);
  if (numel == 0) return;
  if (n == 1) {
    if (output != input) std::memmove(output, input, numel * es);
    return;
  }
  const Chunks chunks = split_chunks(numel, n, es);
  const std::vector<int64_t>& starts = chunks.starts;
  const std::vector<int64_t>& lens = chunks.lens;
  const int64_t longest = chunks.longest;
  const int64_t slot = slot_elements(g_.buffer_bytes(), n, es);
  char* out = static_cast<char*>(output);
  for (int64_t o = 0; o < longest; o += slot) {
    const int parity = next_parity();
    ring_reduce_window(a, static_cast<const char*>(input), starts, lens, o, slot, parity, dtype, redop, what);
    if (me == root) {
      const uint64_t reduced = g_.step();
      for (int c = 0; c < n; ++c) {
        const int r = a.order[c];
        const int64_t l = clamp_len(lens[c], o, slot);
        if (l <= 0) continue;
        g_.wait_rank(r, reduced, what);
        std::memcpy(out + (starts[c] + o) * es, g_.buffer(r, parity) + c * slot * es, l * es);
      }
    }
    g_.publish();
    g_.release_buffer(parity);
  }
}

void Engine::all_gather(const Arrival& a, const void* input, const std::vector<void*>& outputs, int64_t count,
                        size_t es, const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const char* in = static_cast<const char*>(input);
  if (count == 0) return;
  const int64_t window = slot_elements(g_.buffer_bytes(), 1, es);
  const int p = a.position[me];
  for (int64_t o = 0; o < count; o += window) {
    const int64_t l = std::min(window, count - o);
    const int parity = next_parity();
    if (n > 1) {
      g_.acquire_buffer(parity, what);
      std::memcpy(g_.buffer(me, parity), in + o * es, l * es);
      g_.publish();
    }
    const uint64_t written = g_.step();
    char* own = static_cast<char*>(outputs[me]) + o * es;
    if (own != in + o * es) std::memmove(own, in + o * es, l * es);
    for (int k = 1; k < n; ++k) {  // ring order, starting from our predecessor
      const int r = a.order[(p - k + n) % n];
      g_.wait_rank(r, written, what);
      std::memcpy(static_cast<char*>(outputs[r]) + o * es, g_.buffer(r, parity), l * es);
    }
    if (n > 1) {
      g_.publish();
      g_.release_buffer(parity);
    }
  }
}

void Engine::broadcast(const Arrival& a, void* data, int64_t bytes, int root, const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  char* d = static_cast<char*>(data);
  if (n == 1) return;
  const int64_t window = static_cast<int64_t>(g_.buffer_bytes());
  for (int64_t o = 0; o < bytes; o += window) {
    const int64_t l = std::min(window, bytes - o);
    const int parity = next_parity();
    if (me == root) {
      g_.acquire_buffer(parity, what);
      std::memcpy(g_.buffer(me, parity), d + o, l);
      g_.publish();
    } else {
      g_.publish();
      g_.wait_rank(root, g_.step(), what);
      std::memcpy(d + o, g_.buffer(root, parity), l);
    }
    g_.publish();
    g_.release_buffer(parity);
  }
}

void Engine::gather(const Arrival& a, const void* input, const std::vector<void*>& outputs, int64_t bytes, int root,
                    const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const char* in = static_cast<const char*>(input);
  const int64_t window = static_cast<int64_t>(g_.buffer_bytes());
  if (me == root && bytes > 0 && outputs[me] != input) std::memmove(outputs[me], in, bytes);
  if (n == 1) return;
  for (int64_t o = 0; o < bytes; o += window) {
    const int64_t l = std::min(window, bytes - o);
    const int parity = next_parity();
    if (me != root) {
      g_.acquire_buffer(parity, what);
      std::memcpy(g_.buffer(me, parity), in + o, l);
    }
    g_.publish();
    if (me == root) {
      const uint64_t written = g_.step();
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        g_.wait_rank(r, written, what);
        std::memcpy(static_cast<char*>(outputs[r]) + o, g_.buffer(r, parity), l);
      }
    }
    g_.publish();
    g_.release_buffer(parity);
  }
}

void Engine::scatter(const Arrival& a, const std::vector<const void*>& inputs, void* output, int64_t bytes, int root,
                     const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  char* out = static_cast<char*>(output);
  if (me == root && bytes > 0 && inputs[me] != output) std::memmove(out, inputs[me], bytes);
  if (n == 1) return;
  const int64_t slot = slot_elements(g_.buffer_bytes(), n, 1);
  for (int64_t o = 0; o < bytes; o += slot) {
    const int64_t l = std::min(slot, bytes - o);
    const int parity = next_parity();
    if (me == root) {
      g_.acquire_buffer(parity, what);
      for (int r = 0; r < n; ++r) {
        if (r != me) std::memcpy(g_.buffer(me, parity) + r * slot, static_cast<const char*>(inputs[r]) + o, l);
      }
      g_.publish();
    } else {
      g_.publish();
      g_.wait_rank(root, g_.step(), what);
      std::memcpy(out + o, g_.buffer(root, parity) + me * slot, l);
    }
    g_.publish();
    g_.release_buffer(parity);
  }
}

void Engine::all_to_all(const Arrival& a, uint64_t seq, const void* input, const std::vector<int64_t>& send_offsets,
                        void* output, const std::vector<int64_t>& recv_offsets, const std::string& what) {
  const int n = g_.size();
  const int me = g_.rank();
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  std::vector<const int64_t*> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r == me ? g_.my_counts(seq) : g_.counts(r, seq);
  const int64_t own = counts[me][me];
  if (own > 0 && out + recv_offsets[me] != in + send_offsets[me]) {
    std::memmove(out + recv_offsets[me], in + send_offsets[me], own);
  }
  if (n == 1) return;
  const int64_t slot = slot_elements(g_.buffer_bytes(), n, 1);
  int64_t rounds = 0;
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (q != r) rounds = std::max(rounds, (counts[r][q] + slot - 1) / slot);
    }
  }
  const int p = a.position[me];
  for (int64_t t = 0; t < rounds; ++t) {
    const int64_t o = t * slot;
    const int parity = next_parity();
    g_.acquire_buffer(parity, what);
    for (int q = 0; q < n; ++q) {
      const int64_t l = q == me ? 0 : clamp_len(counts[me][q], o, slot);
      if (l > 0) std::memcpy(g_.buffer(me, parity) + q * slot, in + send_offsets[q] + o, l);
    }
    g_.publish();
    const uint64_t written = g_.step();
    for (int k = 1; k < n; ++k) {
      const int q = a.order[(p - k + n) % n];
      const int64_t l = clamp_len(counts[q][me], o, slot);
      if (l <= 0) continue;
      g_.wait_rank(q, written, what);
      std::memcpy(out + recv_offsets[q] + o, g_.buffer(q, parity) + me * slot, l);
    }
    g_.publish();
    g_.release_buffer(parity);
  }
}

vtpu::CollectiveCost Engine::cost(const Arrival& a, OpKind op, double payload, uint64_t seq) {
  vtpu::CollectiveCost c;
  const int n = g_.size();
  const int me = g_.rank();
  if (a.descs[me].chip < 0) return c;  // host tensors: no ICI
  c.payload_bytes = payload;
  if (n <= 1) return c;
  std::vector<int> chips(n);
  for (int r = 0; r < n; ++r) chips[r] = a.descs[r].chip;
  const double f = static_cast<double>(n - 1) / n;
  switch (op) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kBroadcast:
    case OpKind::kBarrier:
      c = ring_cost(op, n, payload);
      break;
    case OpKind::kGather:
    case OpKind::kScatter:
      c.ici_bytes = me == a.descs[me].root ? f * payload : payload / n;
      c.ici_steps = 1;
      break;
    case OpKind::kAllToAll: {
      // Each byte crosses as many links as the chips are hops apart.
      const int64_t* sent = g_.my_counts(seq);
      double hop_bytes = 0;
      for (int q = 0; q < n; ++q) {
        if (q == me || chips[q] < 0) continue;
        hop_bytes += static_cast<double>(sent[q]) * std::max(1, topology_.hops(chips[me], chips[q]));
      }
      c.ici_bytes = hop_bytes;
      c.ici_steps = 1;
      break;
    }
  }
  c.ici_links = ring_links(chips, topology_);
  return c;
}

}  // namespace torch_tpu::dist
