// A fused kernel's tile program: per tile of the kernel's iteration space,
// loads into register slots, one vectorized loop per op (exec/tile_ops.h),
// stores and reduction updates. Built by build_program (program_builder.cc),
// run by the executor's kernel runner (executor.cc). Executor-internal.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/tile_ops.h"
#include "ir/fusion.h"
#include "ir/graph.h"

namespace torch_tpu::exec {

struct Operand {
  int32_t reg = -1;  // register before allocation, slot after; -1: immediate
  Imm imm;
  bool is_imm() const { return reg < 0; }
};

enum class Code : uint8_t {
  kLoad,
  kFill,
  kUnary,
  kBinary,
  kBinaryPair,
  kCompare,
  kSelect,
  kConvert,
  kWrap,
  kPowConst,
  kStore,
  kReduce
};

struct Instr {
  explicit Instr(Code what) : code(what) {}
  Code code;
  ir::OpKind op = ir::OpKind::kAdd;
  ir::OpKind op2 = ir::OpKind::kAdd;  // kBinaryPair: dst = (a op b) op2 c
  ir::CompareDirection dir = ir::CompareDirection::EQ;
  Lane lane = Lane::kF32;      // of the result (compare: of the operands)
  Lane src_lane = Lane::kF32;  // convert
  ir::ElementType dtype = ir::ElementType::f32;
  ir::ElementType src_dtype = ir::ElementType::f32;
  int32_t dst = -1;
  Operand a, b, c;
  int32_t io = -1;            // load / store / reduce index
  double exponent = 0.0;      // kPowConst
  int32_t direct_store = -1;  // compute op: the store it may write straight into
  ir::ValueId value = -1;     // the IR value computed (for describe())
};

struct LoadDesc {
  ir::ValueId value;
  ir::DimMap map;
};
struct StoreDesc {
  ir::ValueId value;
  int32_t def = -1;  // instruction that may write the output memory directly, or -1
};
struct ReduceDesc {
  ir::ValueId value;
  ir::ReduceKind kind;
  Imm init;
  Lane lane;
  ir::ElementType dtype;
};

// The tile program of one fused kernel.
struct KernelProgram {
  ir::Shape iteration_shape;
  int64_t numel = 0;
  std::vector<int64_t> reduce_dims;
  std::vector<Instr> instrs;
  std::vector<LoadDesc> loads;
  std::vector<StoreDesc> stores;
  std::vector<ReduceDesc> reduces;
  int32_t num_slots = 0;
  int64_t tile = 0;
};

// The tile program of kernel `k` of `g` (a graph after the IR passes).
// tile_elements: elements per tile, 0 to pick them from the live values.
KernelProgram build_program(const ir::Graph& g, const ir::FusedKernel& k, int64_t tile_elements);

}  // namespace torch_tpu::exec
