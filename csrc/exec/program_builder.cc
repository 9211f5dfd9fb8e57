// Turns a planned fused kernel (ir/fusion.h) into its tile program
// (exec/program.h): instructions in operand order, immediates for constants,
// paired binary ops, direct stores, register slots by linear scan, tile size.
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "exec/program.h"

namespace torch_tpu::exec {
namespace {

using ir::DimMap;
using ir::ElementType;
using ir::OpKind;
using ir::ValueId;

bool narrow_int(ElementType t) { return t == ElementType::s32 || t == ElementType::s8 || t == ElementType::u8; }

Imm imm_of(const ir::Scalar& s, ElementType t) {
  Imm v;
  if (ir::is_float(t))
    v.f = ir::round_to_type(s.f, t);
  else
    v.i = ir::wrap_to_type(s.i, t);
  return v;
}

// Tiles that do not straddle rows of the innermost dimension (size `row`):
// then a per-row value broadcast along the row (a mean, a scale) is one
// scalar for the whole tile and a vector broadcast across rows (a bias) is
// read in place. Rows from 1024 elements up to `tile` are one tile each;
// shorter rows are packed whole into a tile (reduced and expanded row by row
// in one call); longer rows are cut into equal tiles of at least tile / 2.
int64_t row_aligned_tile(int64_t tile, int64_t row) {
  if (row <= 0) return tile;  // an empty iteration space
  if (row >= 1024 && row <= tile) return row;
  if (row <= tile) return row * (tile / row);  // whole short rows: reduced and broadcast a row at a time
  const int64_t fewest = (row + tile - 1) / tile;
  for (int64_t k = fewest; k <= 2 * fewest; ++k)
    if (row % k == 0) return row / k >= tile / 2 ? row / k : tile;
  return tile;
}

class ProgramBuilder {
 public:
  ProgramBuilder(const ir::Graph& g, const ir::FusedKernel& k) : g_(g), k_(k), computed_(k.ops.begin(), k.ops.end()) {}

  KernelProgram build(int64_t tile_elements) {
    p_.iteration_shape = k_.iteration_shape;
    p_.numel = ir::numel(k_.iteration_shape);
    p_.reduce_dims = k_.reduce_dimensions;
    const DimMap id = ir::identity_map(static_cast<int64_t>(k_.iteration_shape.size()));
    for (ValueId v : k_.writes) {
      if (g_.op(v).kind == OpKind::kReduce) continue;
      Operand o = materialize(emit(v, id), v);
      Instr s{Code::kStore};
      s.a = o;
      s.io = static_cast<int32_t>(p_.stores.size());
      s.value = v;
      s.dtype = g_.type(v).dtype;
      s.lane = lane_of(s.dtype);
      p_.stores.push_back({v});
      p_.instrs.push_back(s);
    }
    for (ValueId r : k_.reduces) {
      const ir::Op& op = g_.op(r);
      Operand o = materialize(emit(op.operands[0], id), op.operands[0]);
      Instr s{Code::kReduce};
      s.a = o;
      s.io = static_cast<int32_t>(p_.reduces.size());
      s.value = r;
      s.dtype = op.type.dtype;
      s.lane = lane_of(op.type.dtype);
      p_.reduces.push_back({r, op.attrs.reduce_kind, imm_of(op.attrs.init, op.type.dtype), s.lane, op.type.dtype});
      p_.instrs.push_back(s);
    }
    pair_binary_ops();
    link_direct_stores();
    allocate_slots();
    if (tile_elements > 0) {
      p_.tile = tile_elements;
    } else {
      // Keep the tile's live values (f32) within ~24 KiB, i.e. in L1: each op
      // is a pass over its operands, and L1 bandwidth bounds the cheap ones.
      // (GELU, 1M f32 on the dev machine: 1.9 ms at 1024, 2.4 ms at 4096.)
      p_.tile = 4096;
      while (p_.tile > 1024 && p_.num_slots * p_.tile * 4 > 24 * 1024) p_.tile /= 2;
      p_.tile = row_aligned_tile(p_.tile, p_.iteration_shape.empty() ? 1 : p_.iteration_shape.back());
    }
    return std::move(p_);
  }

 private:
  int32_t new_reg() { return next_reg_++; }

  Instr& push(Code code, ValueId v) {
    Instr in{code};
    in.value = v;
    if (v >= 0) {
      in.dtype = g_.type(v).dtype;
      in.lane = lane_of(in.dtype);
    }
    p_.instrs.push_back(in);
    return p_.instrs.back();
  }

  // An immediate becomes a filled register where an op needs an array.
  Operand materialize(Operand o, ValueId v) {
    if (!o.is_imm()) return o;
    Instr& in = push(Code::kFill, v);
    in.a = o;
    in.dst = new_reg();
    return Operand{in.dst, {}};
  }

  // Emits the instructions computing v (indexed by map) after those of its
  // operands. Post-order with an explicit stack, so that long chains do not
  // recurse deeply: emit_uncached() then finds its operands in the memo.
  Operand emit(ValueId v, const DimMap& map) {
    using Key = std::pair<ValueId, DimMap>;
    Key root{v, map};
    auto it = memo_.find(root);
    if (it != memo_.end()) return it->second;
    std::vector<std::pair<Key, bool>> stack{{root, false}};
    while (!stack.empty()) {
      if (memo_.count(stack.back().first)) {
        stack.pop_back();
        continue;
      }
      if (stack.back().second) {
        Key k = std::move(stack.back().first);
        stack.pop_back();
        Operand r = emit_uncached(k.first, k.second);
        memo_.emplace(std::move(k), r);
        continue;
      }
      stack.back().second = true;
      const Key k = stack.back().first;  // copy: the stack grows below
      const ir::Op& op = g_.op(k.first);
      if (!computed_.count(k.first) || op.kind == OpKind::kConstant) continue;
      if (op.kind == OpKind::kBroadcastInDim) {
        ValueId u = op.operands[0];
        stack.push_back({{u, ir::compose_broadcast(k.second, op, g_.type(u).shape)}, false});
      } else {
        for (size_t i = op.operands.size(); i-- > 0;) stack.push_back({{op.operands[i], k.second}, false});
      }
    }
    return memo_.at(root);
  }

  Operand emit_uncached(ValueId v, const DimMap& map) {
    const ir::Op& op = g_.op(v);
    const ElementType t = op.type.dtype;
    if (!computed_.count(v)) {
      Instr& in = push(Code::kLoad, v);
      in.io = static_cast<int32_t>(p_.loads.size());
      in.dst = new_reg();
      p_.loads.push_back({v, map});
      return Operand{in.dst, {}};
    }
    if (op.kind == OpKind::kConstant) return Operand{-1, imm_of(op.attrs.value, t)};
    if (op.kind == OpKind::kBroadcastInDim) {
      ValueId u = op.operands[0];
      return emit(u, ir::compose_broadcast(map, op, g_.type(u).shape));
    }
    if (op.kind == OpKind::kConvert) {
      ValueId u = op.operands[0];
      Operand a = materialize(emit(u, map), u);
      Instr& in = push(Code::kConvert, v);
      in.src_dtype = g_.type(u).dtype;
      in.src_lane = lane_of(in.src_dtype);
      in.a = a;
      in.dst = new_reg();
      return Operand{in.dst, {}};
    }
    if (ir::is_unary_elementwise(op.kind)) {
      ValueId u = op.operands[0];
      Operand a = materialize(emit(u, map), u);
      Instr& in = push(Code::kUnary, v);
      in.op = op.kind;
      in.a = a;
      in.dst = new_reg();
      int32_t dst = in.dst;
      if (narrow_int(t)) wrap(dst, v);
      return Operand{dst, {}};
    }
    if (op.kind == OpKind::kSelect) {
      Operand p = emit(op.operands[0], map);
      if (p.is_imm()) return emit(op.operands[p.imm.i ? 1 : 2], map);
      Operand a = emit(op.operands[1], map);
      Operand b = emit(op.operands[2], map);
      Instr& in = push(Code::kSelect, v);
      in.a = p;
      in.b = a;
      in.c = b;
      in.dst = new_reg();
      return Operand{in.dst, {}};
    }
    if (ir::is_binary_elementwise(op.kind)) {
      Operand a = emit(op.operands[0], map);
      Operand b = emit(op.operands[1], map);
      if (a.is_imm() && b.is_imm()) a = materialize(a, op.operands[0]);
      const Lane operand_lane = lane_of(g_.type(op.operands[0]).dtype);
      if (op.kind == OpKind::kPower && b.is_imm() && !a.is_imm() &&
          (operand_lane == Lane::kF32 || operand_lane == Lane::kF64) && tile::has_fast_power(b.imm.f)) {
        Instr& in = push(Code::kPowConst, v);
        in.a = a;
        in.exponent = b.imm.f;
        in.dst = new_reg();
        return Operand{in.dst, {}};
      }
      Instr& in = push(op.kind == OpKind::kCompare ? Code::kCompare : Code::kBinary, v);
      in.op = op.kind;
      in.dir = op.attrs.direction;
      if (op.kind == OpKind::kCompare) in.lane = operand_lane;
      in.a = a;
      in.b = b;
      in.dst = new_reg();
      int32_t dst = in.dst;
      bool arith = op.kind == OpKind::kAdd || op.kind == OpKind::kSubtract || op.kind == OpKind::kMultiply ||
                   op.kind == OpKind::kDivide || op.kind == OpKind::kPower;
      if (arith && narrow_int(t)) wrap(dst, v);
      return Operand{dst, {}};
    }
    throw std::logic_error(std::string("[") + ir::op_name(op.kind) + "] cannot be evaluated in a fused kernel");
  }

  void wrap(int32_t reg, ValueId v) {
    Instr& in = push(Code::kWrap, v);
    in.dst = reg;
  }

  // x = a op b; y = x op2 c, with x read nowhere else, is one pass over the
  // tile (x stays in registers) instead of two: float add/sub/mul, the cheap
  // ops whose passes cost more in L1 traffic than in arithmetic. Each op
  // still rounds to float, so results are those of the two passes.
  void pair_binary_ops() {
    auto pairable = [](const Instr& in) {
      return in.code == Code::kBinary && in.lane == Lane::kF32 &&
             (in.op == OpKind::kAdd || in.op == OpKind::kSubtract || in.op == OpKind::kMultiply);
    };
    std::vector<int> readers(static_cast<size_t>(next_reg_), 0);
    for (const Instr& in : p_.instrs) {
      for (const Operand* o : {&in.a, &in.b, &in.c})
        if (!o->is_imm()) ++readers[o->reg];
      if (in.code == Code::kWrap) ++readers[in.dst];
    }
    std::vector<int32_t> def(static_cast<size_t>(next_reg_), -1);
    std::vector<char> dead(p_.instrs.size(), 0);
    for (size_t j = 0; j < p_.instrs.size(); ++j) {
      Instr& in = p_.instrs[j];
      if (pairable(in)) {
        for (int side = 0; side < 2; ++side) {
          const Operand& x = side == 0 ? in.a : in.b;
          if (x.is_imm() || readers[x.reg] != 1 || def[x.reg] < 0) continue;
          const Instr& first = p_.instrs[def[x.reg]];
          if (!pairable(first)) continue;
          if (side == 1 && in.op == OpKind::kSubtract) continue;  // c - x: not this form
          const Operand c = side == 0 ? in.b : in.a;
          dead[def[x.reg]] = 1;
          in.code = Code::kBinaryPair;
          in.op2 = in.op;
          in.op = first.op;
          in.a = first.a;
          in.b = first.b;
          in.c = c;
          break;
        }
      }
      if (in.dst >= 0 && in.code != Code::kStore && in.code != Code::kReduce && in.code != Code::kWrap)
        def[in.dst] = static_cast<int32_t>(j);
    }
    size_t k = 0;
    for (size_t j = 0; j < p_.instrs.size(); ++j)
      if (!dead[j]) p_.instrs[k++] = p_.instrs[j];
    p_.instrs.erase(p_.instrs.begin() + static_cast<std::ptrdiff_t>(k), p_.instrs.end());
  }

  // A stored value computed by an arithmetic instruction can be written by it
  // straight into the output when the output is contiguous and holds the
  // lane type (decided per run); the store is then skipped.
  void link_direct_stores() {
    std::vector<int32_t> def(static_cast<size_t>(next_reg_), -1);
    for (size_t i = 0; i < p_.instrs.size(); ++i) {
      Instr& in = p_.instrs[i];
      if (in.code == Code::kStore) {
        int32_t d = def[in.a.reg];
        if (d < 0) continue;
        Instr& di = p_.instrs[d];
        bool computes = di.code == Code::kUnary || di.code == Code::kBinary || di.code == Code::kBinaryPair ||
                        di.code == Code::kCompare || di.code == Code::kSelect || di.code == Code::kConvert ||
                        di.code == Code::kPowConst;
        if (computes && di.direct_store < 0) {
          di.direct_store = in.io;
          p_.stores[in.io].def = d;
        }
      } else if (in.code != Code::kReduce && in.code != Code::kWrap) {
        def[in.dst] = static_cast<int32_t>(i);
      }
    }
  }

  // Linear scan: a register's slot is free after its last reader. A result
  // never shares a slot with its operands (the loops use __restrict__).
  void allocate_slots() {
    const size_t ni = p_.instrs.size();
    auto reads = [](const Instr& in, auto f) {
      for (const Operand* o : {&in.a, &in.b, &in.c})
        if (!o->is_imm()) f(o->reg);
      if (in.code == Code::kWrap) f(in.dst);
    };
    std::vector<int> last(static_cast<size_t>(next_reg_), -1);
    for (size_t i = 0; i < ni; ++i) reads(p_.instrs[i], [&](int32_t r) { last[r] = static_cast<int>(i); });
    std::vector<std::vector<int32_t>> dies(ni);
    for (int32_t r = 0; r < next_reg_; ++r)
      if (last[r] >= 0) dies[last[r]].push_back(r);
    std::vector<int32_t> slot(static_cast<size_t>(next_reg_), -1);
    std::vector<int32_t> free_slots;
    int32_t used = 0;
    for (size_t i = 0; i < ni; ++i) {
      Instr& in = p_.instrs[i];
      for (Operand* o : {&in.a, &in.b, &in.c})
        if (!o->is_imm()) o->reg = slot[o->reg];
      const bool defines = in.code != Code::kStore && in.code != Code::kReduce && in.code != Code::kWrap;
      const int32_t reg = in.dst;
      if (defines) {
        int32_t s = used;
        if (!free_slots.empty()) {
          s = free_slots.back();
          free_slots.pop_back();
        } else {
          ++used;
        }
        slot[reg] = s;
        in.dst = s;
        if (last[reg] < 0) free_slots.push_back(s);  // nobody reads it
      } else if (in.code == Code::kWrap) {
        in.dst = slot[reg];
      }
      for (int32_t r : dies[i]) free_slots.push_back(slot[r]);
    }
    p_.num_slots = std::max<int32_t>(used, 1);
  }

  const ir::Graph& g_;
  const ir::FusedKernel& k_;
  std::set<ValueId> computed_;
  std::map<std::pair<ValueId, DimMap>, Operand> memo_;
  KernelProgram p_;
  int32_t next_reg_ = 0;
};

}  // namespace

KernelProgram build_program(const ir::Graph& g, const ir::FusedKernel& k, int64_t tile_elements) {
  return ProgramBuilder(g, k).build(tile_elements);
}

}  // namespace torch_tpu::exec
