// Compiles an IR region into fused tile kernels and runs them on host memory.
//
//   ir::Graph g = ...;                       // parameters, ops, outputs
//   exec::CompiledRegion r = exec::compile(g);
//   exec::run(r, {Buffer::contiguous(x, f32, {4, 8}), ...}, {Buffer::contiguous(y, ...)});
//
// compile() runs the IR passes (CSE, DCE), plans fusion (ir/fusion.h) and
// turns each fused kernel into a tile program: one tight loop per op over a
// tile of the kernel's iteration space (1024-4096 elements, sized so that the
// tile's live values stay in L1, like a TPU's VMEM), with loads and stores
// only for the values the plan reads and writes. Values that stay inside a
// kernel live in per-thread tile scratch and never reach memory. Contiguous
// f32/f64/s64 inputs are read in place, and the op computing a value for a
// contiguous output of its lane type writes it there directly.
//
// Numerics (TPU VPU semantics): f32, bf16 and f16 values are computed in f32;
// 16-bit values are widened on load and rounded (to nearest even) once on
// store, or by an explicit convert. f64 computes in double, integers in
// int64 wrapped to their width after each op, pred as bytes. Reductions
// accumulate in f32 for f32/bf16/f16 (16 partial sums per run, then combined
// pairwise), in double for f64, in int64 for integers. Transcendentals use
// vectorizable f32 polynomials (exec/vmath.h, within a few ulp); power with a
// general exponent calls std::pow in double. Everything else matches the
// reference interpreter (ir/interpreter.h).
//
// A CompiledRegion is immutable and may run on several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/buffer.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "ir/passes.h"

namespace torch_tpu::exec {

struct CompileOptions {
  ir::FusionOptions fusion;  // fusion.fuse = false: one kernel per op
  // Elements per tile; 0 picks a power of two in [1024, 4096] from the
  // number of values a kernel keeps live (about 24 KiB of f32 in all).
  int64_t tile_elements = 0;
  ir::DumpHook dump;  // called after each IR pass, then with "fusion" (the planned graph)
};

struct KernelProgram;  // a fused kernel's tile program (exec/program.h)

class CompiledRegion {
 public:
  CompiledRegion();
  ~CompiledRegion();
  CompiledRegion(CompiledRegion&&) noexcept;
  CompiledRegion& operator=(CompiledRegion&&) noexcept;

  const ir::Graph& graph() const { return graph_; }  // after the passes
  const ir::FusionPlan& plan() const { return plan_; }
  int64_t num_kernels() const { return static_cast<int64_t>(plan_.kernels.size()); }
  const std::vector<ir::TensorType>& input_types() const { return input_types_; }
  const std::vector<ir::TensorType>& output_types() const { return output_types_; }
  // Bytes of scratch memory for values that go between kernels (not outputs).
  int64_t temp_bytes() const { return temp_bytes_; }
  // Plan and tile programs, one line per instruction.
  std::string describe() const;

 private:
  friend CompiledRegion compile(const ir::Graph&, const CompileOptions&);
  friend void run(const CompiledRegion&, const std::vector<Buffer>&, const std::vector<Buffer>&);
  ir::Graph graph_;
  ir::FusionPlan plan_;
  std::vector<ir::TensorType> input_types_, output_types_;
  std::vector<KernelProgram> programs_;
  std::vector<int64_t> temp_offset_;                            // per value: byte offset in the temp arena, or -1
  std::vector<int32_t> output_home_;                            // per value: output index it is computed into, or -1
  std::vector<std::pair<ir::ValueId, int32_t>> output_copies_;  // (value, output) copied at the end
  int64_t temp_bytes_ = 0;
};

// Throws std::invalid_argument naming the op when the graph is malformed.
CompiledRegion compile(const ir::Graph& g, const CompileOptions& options = {});

// inputs[k] is parameter k, outputs[j] receives output j; types and shapes
// must match (std::invalid_argument otherwise). Runs on the calling thread.
void run(const CompiledRegion& region, const std::vector<Buffer>& inputs, const std::vector<Buffer>& outputs);

// Frees the calling thread's tile scratch and temp arena (kept between runs).
void release_thread_scratch();

}  // namespace torch_tpu::exec
