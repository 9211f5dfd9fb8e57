// defer_and_fuse's per-chip pending region, shared by the recorder
// (record.cc) and the flush (flush.cc); see defer.h.
//
// A region is an ir::Graph being built plus what ties its values to tensors:
// per storage it touches, whether the region only reads it (a parameter per
// distinct layout), produces it (a lazily allocated result: a StorageImpl
// with a null DataPtr that the flush fills in) or writes it in place (the
// value is computed into a temporary and copied back after the kernels ran,
// since the executor's outputs must not overlap its inputs). At the flush,
// results whose storage only the region still holds are dead: they are
// dropped from the outputs and never get HBM.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "defer/defer.h"
#include "defer/lower.h"
#include "runtime/host_alias.h"
#include "vtpu/layout.h"

namespace torch_tpu::defer {

extern std::atomic<int> g_open_regions;  // chips with a pending region
extern std::atomic<int64_t> g_pending_ops;
extern std::atomic<int> g_rng_regions;  // pending regions that draw random numbers
extern thread_local int tls_in_flush;   // flushes running on this thread

extern std::mutex g_stats_mu;
extern DeferStats g_stats;

template <typename F>
void update_stats(F&& f) {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  f(g_stats);
}

// Why a region was flushed (DeferStats::flush_*).
enum class Reason { kConflict, kSync, kStream, kSizeCap, kView, kRepeat, kOther };

struct Layout {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  static Layout of(const at::Tensor& t) {
    return Layout{t.sizes().vec(), t.strides().vec(), t.storage_offset(), t.scalar_type()};
  }
  bool operator==(const Layout& o) const {
    return dtype == o.dtype && offset == o.offset && sizes == o.sizes && strides == o.strides;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  uint64_t physical() const { return vtpu::physical_bytes(sizes, c10::elementSize(dtype)); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * c10::elementSize(dtype); }
};

struct OpRecord {
  const std::string* label;  // OpInfo's, alive for the process
  std::string source;        // "file.py:12" or ""
};

struct Entry {
  enum class Kind { kRead, kPending, kWritten } kind = Kind::kRead;
  c10::Storage storage;
  Layout layout;                                  // kPending: the result's; kWritten: the written tensor's
  ValueId value = -1;                             // kPending / kWritten: the current value
  int32_t op = -1;                                // the recorded op that produced `value`
  std::vector<std::pair<Layout, ValueId>> reads;  // parameters over this storage
  int32_t replay_refs = 0;                        // kPending: references held by Region::replays
};

// Parameter k of a region: a tensor it reads, or a user scalar that changes
// between steps (see ScalarSink).
// A Bernoulli mask a region draws from a tpu generator when it runs.
struct RngDraw {
  at::Generator gen;
  double p = 0.5;
  ir::Shape shape;
  bool draw = true;  // false: zeros (the op that asked for it ran strictly)
  // TORCH_TPU_RNG=philox: the positions reserved when the op was recorded.
  bool philox = false;
  uint64_t seed = 0, offset = 0;
};

struct Param {
  TensorRecipe recipe;
  bool scalar = false;
  ir::Scalar value;
  std::optional<RngDraw> rng;  // a mask drawn at run time, in recording order
};

// A region whose results (nearly) all reach HBM (one op, or the results held at
// the flush: saved for backward, read by a strict op; see flush.cc) runs ATen's
// kernels op by op: fusion saves little memory traffic there, and ATen's
// kernel for a lone softmax or gelu is faster than the executor's. `op` is the op's out=
// overload, called with the op's result (for _to_copy: copy_(result, self)),
// or for an in-place op the op itself.
struct Replay {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  const c10::StorageImpl* result = nullptr;  // the result's storage; null: the op writes args[0]
  bool result_first = false;                 // the result goes before args (copy_), not after (out=)
};

struct Region {
  explicit Region(c10::Stream s) : stream(s), device(s.device_index()) {}
  c10::Stream stream;
  c10::DeviceIndex device;
  ir::Builder builder;
  std::unordered_map<const c10::StorageImpl*, Entry> storages;
  std::vector<const c10::StorageImpl*> outputs;  // produced or written storages, in order
  std::vector<Param> params;                     // parameter k is params[k]
  std::vector<int32_t> value_op;                 // per value: index in ops, or -1
  std::vector<OpRecord> ops;
  // One per op while every op recorded is in place or has an out= overload, and draws no random numbers.
  std::vector<Replay> replays;
  int rng_params = 0;  // masks drawn when it runs (g_rng_regions)
};

// Detects a repeating op sequence (a training loop) so that regions end at
// the same place in every iteration: a size-cap flush falls wherever the cap
// is reached, at another offset into the loop body each time, which makes
// every region new to the compile cache. The fingerprint of the last kWindow
// recorded ops (label, shapes, dtypes) is remembered at each size-cap flush;
// when the same fingerprint comes back, the region is flushed there again.
struct RepeatDetector {
  static constexpr int kWindow = 32;
  static constexpr uint64_t kBase = 0x100000001b3ULL;
  uint64_t keys[kWindow] = {};
  uint64_t hash = 0, base_pow = 1;  // base_pow = kBase^kWindow once the window is full
  int64_t count = 0;
  std::unordered_set<uint64_t> cut_points;

  // Adds op key k; returns the fingerprint of the window (0 until it is full).
  uint64_t push(uint64_t k) {
    const int slot = static_cast<int>(count % kWindow);
    const uint64_t oldest = count >= kWindow ? keys[slot] : 0;
    hash = hash * kBase + k - oldest * base_pow;
    if (count < kWindow) base_pow *= kBase;
    keys[slot] = k;
    ++count;
    return count >= kWindow ? (hash | 1) : 0;
  }
  void remember(uint64_t fp) {
    if (!fp) return;
    if (cut_points.size() >= 4096) cut_points.clear();
    cut_points.insert(fp);
  }
  bool seen(uint64_t fp) const { return fp && cut_points.count(fp) != 0; }
};

struct ChipState {
  std::recursive_mutex mu;
  std::unique_ptr<Region> region;
  RepeatDetector repeat;
};

// One per chip, created on first use and never destroyed (pending regions
// hold storages whose deleters need the chip at exit); nullptr past the last chip.
ChipState* find_state(c10::DeviceIndex d);

// Compiles and queues the chip's region; results nobody holds are dropped.
// Caller holds cs.mu. On an allocation failure the region stays pending (the
// caller may free memory and retry) and torch.OutOfMemoryError names the op.
void flush_locked(ChipState& cs, Reason why);

}  // namespace torch_tpu::defer
