#include "exec/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "exec/program.h"
#include "exec/tile_ops.h"
#include "ir/fusion.h"
#include "ir/passes.h"

namespace torch_tpu::exec {

using ir::DimMap;
using ir::ElementType;
using ir::OpKind;
using ir::ValueId;

namespace {

// ---------------------------------------------------------------------------
// Memory access over an iteration space

// A loop nest over the iteration space (outer to inner) with the element
// strides of one buffer; dimensions of size 1 dropped and contiguous ones merged.
struct Nest {
  std::vector<int64_t> size, stride;
};

Nest collapse(const ir::Shape& shape, const std::vector<int64_t>& strides) {
  Nest n;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!n.size.empty() && n.stride.back() == strides[d] * shape[d]) {
      n.size.back() *= shape[d];
      n.stride.back() = strides[d];
    } else {
      n.size.push_back(shape[d]);
      n.stride.push_back(strides[d]);
    }
  }
  if (n.size.empty()) {
    n.size.push_back(1);
    n.stride.push_back(0);
  }
  return n;
}

// Calls f(offset, pos, len, inner_stride) for each run of the flat range
// [start, start + n) along the innermost dimension: element `pos` of the
// range is at `offset` (elements) in the buffer.
template <class F>
void for_each_run(const Nest& nest, int64_t start, int64_t n, F f) {
  const size_t r = nest.size.size();
  int64_t idx[16];
  std::vector<int64_t> big;
  int64_t* pos_idx = idx;
  if (r > 16) {
    big.resize(r);
    pos_idx = big.data();
  }
  int64_t rem = start, offset = 0;
  for (size_t d = r; d-- > 0;) {
    pos_idx[d] = rem % nest.size[d];
    rem /= nest.size[d];
    offset += pos_idx[d] * nest.stride[d];
  }
  const int64_t inner = nest.size[r - 1], inner_stride = nest.stride[r - 1];
  int64_t done = 0;
  while (done < n) {
    int64_t len = std::min(n - done, inner - pos_idx[r - 1]);
    f(offset, done, len, inner_stride);
    done += len;
    pos_idx[r - 1] += len;
    offset += len * inner_stride;
    if (pos_idx[r - 1] == inner && done < n) {
      offset -= inner * inner_stride;
      pos_idx[r - 1] = 0;
      for (size_t d = r - 1; d-- > 0;) {
        ++pos_idx[d];
        offset += nest.stride[d];
        if (pos_idx[d] < nest.size[d]) break;
        offset -= nest.size[d] * nest.stride[d];
        pos_idx[d] = 0;
      }
    }
  }
}

// Element offset of flat index `flat` over the first `dims` dimensions of
// `nest`; *last_pos receives its position along dimension dims - 1.
int64_t nest_offset(const Nest& nest, size_t dims, int64_t flat, int64_t* last_pos) {
  int64_t off = 0;
  for (size_t d = dims; d-- > 0;) {
    const int64_t pos = flat % nest.size[d];
    flat /= nest.size[d];
    off += pos * nest.stride[d];
    if (d == dims - 1) *last_pos = pos;
  }
  return off;
}

// Whether the flat range [start, start + n) lies in one run of the innermost
// dimension; then its first element is at *offset and the run's stride is *stride.
bool single_run(const Nest& nest, int64_t start, int64_t n, int64_t* offset, int64_t* stride) {
  const size_t r = nest.size.size();
  int64_t inner_pos = 0;
  const int64_t off = nest_offset(nest, r, start, &inner_pos);
  if (inner_pos + n > nest.size[r - 1]) return false;
  *offset = off;
  *stride = nest.stride[r - 1];
  return true;
}

// Whether the flat range [start, start + n) is whole rows of the innermost
// dimension (of length *row_len) that are consecutive along the next one;
// then the first row starts at *offset and rows are *row_stride apart.
bool whole_rows(const Nest& nest, int64_t start, int64_t n, int64_t* offset, int64_t* row_len, int64_t* row_stride) {
  const size_t r = nest.size.size();
  const int64_t len = nest.size[r - 1];
  if (r < 2 || start % len != 0 || n % len != 0) return false;
  int64_t row_pos = 0;
  const int64_t off = nest_offset(nest, r - 1, start / len, &row_pos);
  if (row_pos + n / len > nest.size[r - 2]) return false;
  *offset = off;
  *row_len = len;
  *row_stride = nest.stride[r - 2];
  return true;
}

struct Access {
  char* base = nullptr;
  ElementType dtype = ElementType::f32;
  int64_t esize = 4;
  Nest nest;
};

Access make_access(const Buffer& b, const ir::Shape& iteration_shape, const DimMap& map) {
  std::vector<int64_t> bs = b.effective_strides();
  std::vector<int64_t> s(iteration_shape.size(), 0);
  for (size_t d = 0; d < map.size(); ++d)
    if (map[d] >= 0) s[d] = bs[map[d]];
  Access a;
  a.base = static_cast<char*>(b.data);
  a.dtype = b.dtype;
  a.esize = ir::element_size(b.dtype);
  a.nest = collapse(iteration_shape, s);
  return a;
}

void load_tile(const Access& a, int64_t start, int64_t n, char* dst, int64_t lane_size) {
  for_each_run(a.nest, start, n, [&](int64_t off, int64_t pos, int64_t len, int64_t stride) {
    tile::load(a.dtype, a.base + off * a.esize, stride, dst + pos * lane_size, len);
  });
}

void store_tile(const Access& a, int64_t start, int64_t n, const char* src, int64_t lane_size) {
  for_each_run(a.nest, start, n, [&](int64_t off, int64_t pos, int64_t len, int64_t stride) {
    tile::store(a.dtype, a.base + off * a.esize, stride, src + pos * lane_size, len);
  });
}

// ---------------------------------------------------------------------------
// Per-thread memory

class AlignedBuffer {
 public:
  ~AlignedBuffer() { release(); }
  char* get(size_t bytes) {
    if (bytes > bytes_) {
      release();
      bytes_ = (bytes + 63) / 64 * 64;
      p_ = static_cast<char*>(std::aligned_alloc(64, bytes_));
      if (!p_) throw std::bad_alloc();
    }
    return p_;
  }
  void release() {
    std::free(p_);
    p_ = nullptr;
    bytes_ = 0;
  }

 private:
  char* p_ = nullptr;
  size_t bytes_ = 0;
};

thread_local AlignedBuffer t_tile_scratch;
thread_local AlignedBuffer t_temp_arena;

// ---------------------------------------------------------------------------
// Running a kernel

void run_kernel(const KernelProgram& p, const std::vector<Buffer>& load_bufs, const std::vector<Buffer>& store_bufs,
                const std::vector<Buffer>& reduce_bufs) {
  const int64_t T = p.tile;
  const int64_t slot_bytes = T * 8;
  char* scratch = t_tile_scratch.get(static_cast<size_t>(p.num_slots * slot_bytes));
  // Where each slot's values are for the current tile: its scratch, or the
  // memory of a contiguous input (aliasing load) or output (direct store).
  std::vector<char*> where(static_cast<size_t>(p.num_slots));
  for (int32_t s = 0; s < p.num_slots; ++s) where[s] = scratch + s * slot_bytes;
  std::vector<char*> own = where;
  // A slot loaded from one broadcast element for the whole tile holds a
  // scalar: binary ops, compares and selects take it as an immediate, other
  // readers get it filled in (materialize).
  std::vector<char> uniform(static_cast<size_t>(p.num_slots), 0);
  std::vector<Imm> uniform_value(static_cast<size_t>(p.num_slots));
  std::vector<Lane> uniform_lane(static_cast<size_t>(p.num_slots), Lane::kF32);
  int64_t n = 0;  // elements in the current tile
  auto materialize = [&](int32_t s) {
    if (!uniform[s]) return;
    tile::fill(uniform_lane[s], uniform_value[s], own[s], n);
    where[s] = own[s];
    uniform[s] = 0;
  };
  auto slot = [&](int32_t s) {
    materialize(s);
    return where[s];
  };
  auto ptr = [&](const Operand& o) -> const void* { return o.is_imm() || uniform[o.reg] ? nullptr : where[o.reg]; };
  auto imm = [&](const Operand& o) { return !o.is_imm() && uniform[o.reg] ? uniform_value[o.reg] : o.imm; };

  std::vector<Access> loads, stores;
  loads.reserve(p.loads.size());
  for (size_t i = 0; i < p.loads.size(); ++i)
    loads.push_back(make_access(load_bufs[i], p.iteration_shape, p.loads[i].map));
  const DimMap id = ir::identity_map(static_cast<int64_t>(p.iteration_shape.size()));
  for (size_t i = 0; i < p.stores.size(); ++i) stores.push_back(make_access(store_bufs[i], p.iteration_shape, id));
  // Memory that holds exactly the lane values, densely over the whole iteration space.
  auto dense_lane = [&](const Access& a, bool for_load) {
    bool same = a.dtype == ElementType::f32 || a.dtype == ElementType::f64 || a.dtype == ElementType::s64 ||
                (!for_load && a.dtype == ElementType::pred);
    return same && a.nest.size.size() == 1 && (a.nest.stride[0] == 1 || p.numel == 1);
  };
  std::vector<char> alias_load(loads.size()), direct(stores.size());
  for (size_t i = 0; i < loads.size(); ++i) alias_load[i] = dense_lane(loads[i], true);
  for (size_t i = 0; i < stores.size(); ++i) direct[i] = p.stores[i].def >= 0 && dense_lane(stores[i], false);

  // Reductions: one accumulator per output element, walked with the
  // output's strides (0 along reduced dimensions).
  std::vector<std::unique_ptr<char[]>> acc(p.reduces.size());
  Nest reduce_nest;
  int64_t out_numel = 1;
  if (!p.reduces.empty()) {
    ir::Shape out_shape;
    std::vector<bool> reduced(p.iteration_shape.size(), false);
    for (int64_t d : p.reduce_dims) reduced[d] = true;
    for (size_t d = 0; d < p.iteration_shape.size(); ++d)
      if (!reduced[d]) out_shape.push_back(p.iteration_shape[d]);
    std::vector<int64_t> out_strides = ir::contiguous_strides(out_shape);
    std::vector<int64_t> s(p.iteration_shape.size(), 0);
    for (size_t d = 0, j = 0; d < p.iteration_shape.size(); ++d)
      if (!reduced[d]) s[d] = out_strides[j++];
    reduce_nest = collapse(p.iteration_shape, s);
    out_numel = ir::numel(out_shape);
    for (size_t i = 0; i < p.reduces.size(); ++i) {
      const ReduceDesc& r = p.reduces[i];
      int64_t lb = lane_bytes(r.lane);
      acc[i].reset(new char[static_cast<size_t>(std::max<int64_t>(out_numel, 1) * lb)]);
      tile::fill(r.lane, r.init, acc[i].get(), out_numel);
    }
  }

  for (int64_t start = 0; start < p.numel; start += T) {
    n = std::min(T, p.numel - start);
    for (const Instr& in : p.instrs) {
      if (in.dst >= 0 && in.code != Code::kWrap && in.code != Code::kStore && in.code != Code::kReduce) {
        where[in.dst] = in.direct_store >= 0 && direct[in.direct_store]
                            ? stores[in.direct_store].base + start * stores[in.direct_store].esize
                            : own[in.dst];
        uniform[in.dst] = 0;
      }
      switch (in.code) {
        case Code::kLoad: {
          const Access& a = loads[in.io];
          int64_t offset = 0, stride = 0;
          if (alias_load[in.io]) {
            where[in.dst] = a.base + start * a.esize;
          } else if (!single_run(a.nest, start, n, &offset, &stride)) {
            int64_t row_len = 0, row_stride = 0;
            if (a.nest.stride.back() == 0 && whole_rows(a.nest, start, n, &offset, &row_len, &row_stride))
              tile::expand_rows(a.dtype, a.base + offset * a.esize, row_stride, n / row_len, row_len, slot(in.dst));
            else
              load_tile(a, start, n, slot(in.dst), lane_bytes(in.lane));
          } else if (stride == 0 && in.lane != Lane::kPred) {
            // One element for the whole tile (a per-row statistic, a bias
            // along rows): a scalar, not a filled tile.
            alignas(8) char value[8];
            tile::load(a.dtype, a.base + offset * a.esize, 0, value, 1);
            Imm& v = uniform_value[in.dst];
            if (in.lane == Lane::kF32)
              v.f = *reinterpret_cast<float*>(value);
            else if (in.lane == Lane::kF64)
              v.f = *reinterpret_cast<double*>(value);
            else
              v.i = *reinterpret_cast<int64_t*>(value);
            uniform[in.dst] = 1;
            uniform_lane[in.dst] = in.lane;
          } else if (stride == 1 && lane_bytes(in.lane) == a.esize &&
                     (a.dtype == ElementType::f32 || a.dtype == ElementType::f64 || a.dtype == ElementType::s64)) {
            where[in.dst] = a.base + offset * a.esize;  // lane values in memory, read in place
          } else {
            tile::load(a.dtype, a.base + offset * a.esize, stride, slot(in.dst), n);
          }
          break;
        }
        case Code::kFill:
          tile::fill(in.lane, in.a.imm, slot(in.dst), n);
          break;
        case Code::kUnary:
          tile::unary(in.op, in.lane, slot(in.dst), slot(in.a.reg), n);
          break;
        case Code::kBinary:
          tile::binary(in.op, in.lane, slot(in.dst), ptr(in.a), imm(in.a), ptr(in.b), imm(in.b), n);
          break;
        case Code::kBinaryPair:
          tile::binary_pair(in.op, in.op2, static_cast<float*>(static_cast<void*>(slot(in.dst))),
                            static_cast<const float*>(ptr(in.a)), static_cast<float>(imm(in.a).f),
                            static_cast<const float*>(ptr(in.b)), static_cast<float>(imm(in.b).f),
                            static_cast<const float*>(ptr(in.c)), static_cast<float>(imm(in.c).f), n);
          break;
        case Code::kCompare:
          tile::compare(in.dir, in.lane, reinterpret_cast<uint8_t*>(slot(in.dst)), ptr(in.a), imm(in.a), ptr(in.b),
                        imm(in.b), n);
          break;
        case Code::kSelect:
          tile::select(in.lane, slot(in.dst), reinterpret_cast<const uint8_t*>(slot(in.a.reg)), ptr(in.b), imm(in.b),
                       ptr(in.c), imm(in.c), n);
          break;
        case Code::kConvert:
          tile::convert(in.src_lane, in.src_dtype, in.lane, in.dtype, slot(in.dst), slot(in.a.reg), n);
          break;
        case Code::kWrap:
          tile::wrap(in.dtype, reinterpret_cast<int64_t*>(slot(in.dst)), n);
          break;
        case Code::kPowConst:
          tile::power_const(in.lane, in.exponent, slot(in.dst), slot(in.a.reg), n);
          break;
        case Code::kStore:
          if (!direct[in.io]) store_tile(stores[in.io], start, n, slot(in.a.reg), lane_bytes(in.lane));
          break;
        case Code::kReduce: {
          const ReduceDesc& r = p.reduces[in.io];
          const int64_t lb = lane_bytes(r.lane);
          const char* src = slot(in.a.reg);
          char* a = acc[in.io].get();
          int64_t off = 0, row_len = 0, row_stride = 0;
          if (reduce_nest.stride.back() == 0 && whole_rows(reduce_nest, start, n, &off, &row_len, &row_stride)) {
            tile::reduce_rows(r.kind, r.lane, src, n / row_len, row_len, a + off * lb, row_stride);
            break;
          }
          for_each_run(reduce_nest, start, n, [&](int64_t off, int64_t pos, int64_t len, int64_t stride) {
            if (stride == 0)
              tile::reduce_run(r.kind, r.lane, src + pos * lb, len, a + off * lb);
            else
              tile::reduce_cols(r.kind, r.lane, src + pos * lb, a + off * lb, len);
          });
          break;
        }
      }
    }
  }

  for (size_t i = 0; i < p.reduces.size(); ++i) {
    const Buffer& out = reduce_bufs[i];
    Access a = make_access(out, out.shape, ir::identity_map(static_cast<int64_t>(out.shape.size())));
    store_tile(a, 0, out_numel, acc[i].get(), lane_bytes(p.reduces[i].lane));
  }
}

// Element-by-element copy between buffers of the same type and shape.
void copy_buffer(const Buffer& src, const Buffer& dst) {
  const DimMap id = ir::identity_map(static_cast<int64_t>(src.shape.size()));
  Access s = make_access(src, src.shape, id);
  Access d = make_access(dst, dst.shape, id);
  const int64_t n = src.numel();
  const Lane lane = lane_of(src.dtype);
  const int64_t lb = lane_bytes(lane);
  const int64_t T = 4096;
  char* tmp = t_tile_scratch.get(static_cast<size_t>(T * 8));
  for (int64_t start = 0; start < n; start += T) {
    int64_t len = std::min(T, n - start);
    load_tile(s, start, len, tmp, lb);
    store_tile(d, start, len, tmp, lb);
  }
}

const char* code_name(Code c) {
  switch (c) {
    case Code::kLoad:
      return "load";
    case Code::kFill:
      return "fill";
    case Code::kUnary:
      return "unary";
    case Code::kBinary:
      return "binary";
    case Code::kBinaryPair:
      return "binary_pair";
    case Code::kCompare:
      return "compare";
    case Code::kSelect:
      return "select";
    case Code::kConvert:
      return "convert";
    case Code::kWrap:
      return "wrap";
    case Code::kPowConst:
      return "power_const";
    case Code::kStore:
      return "store";
    case Code::kReduce:
      return "reduce";
  }
  return "?";
}

std::string operand_str(const Operand& o, Lane lane) {
  if (!o.is_imm()) return "s" + std::to_string(o.reg);
  std::ostringstream s;
  if (lane == Lane::kF32 || lane == Lane::kF64)
    s << o.imm.f;
  else
    s << o.imm.i;
  return s.str();
}

}  // namespace

// ---------------------------------------------------------------------------
// CompiledRegion

CompiledRegion::CompiledRegion() = default;
CompiledRegion::~CompiledRegion() = default;
CompiledRegion::CompiledRegion(CompiledRegion&&) noexcept = default;
CompiledRegion& CompiledRegion::operator=(CompiledRegion&&) noexcept = default;

std::string CompiledRegion::describe() const {
  std::ostringstream out;
  out << plan_.to_string(graph_);
  for (size_t k = 0; k < programs_.size(); ++k) {
    const KernelProgram& p = programs_[k];
    out << "program " << k << ": tile " << p.tile << ", " << p.num_slots << " slots\n";
    for (const Instr& in : p.instrs) {
      out << "  " << code_name(in.code);
      if (in.code == Code::kUnary || in.code == Code::kBinary || in.code == Code::kBinaryPair ||
          in.code == Code::kCompare)
        out << " " << ir::op_name(in.op);
      if (in.code == Code::kBinaryPair) out << " " << ir::op_name(in.op2);
      if (in.code == Code::kCompare) out << " " << ir::direction_name(in.dir);
      if (in.code == Code::kPowConst) out << " ^" << in.exponent;
      out << " " << lane_name(in.lane);
      if (in.code == Code::kLoad) {
        out << " %" << p.loads[in.io].value << " map "
            << ir::shape_str(std::vector<int64_t>(p.loads[in.io].map.begin(), p.loads[in.io].map.end()));
      } else if (in.code == Code::kFill) {
        out << " " << operand_str(in.a, in.lane);
      } else {
        Lane ol = in.code == Code::kConvert ? in.src_lane : in.lane;
        if (in.code == Code::kSelect) {
          out << " s" << in.a.reg << ", " << operand_str(in.b, in.lane) << ", " << operand_str(in.c, in.lane);
        } else if (in.code != Code::kWrap) {
          out << " " << operand_str(in.a, ol);
          if (in.code == Code::kBinary || in.code == Code::kBinaryPair || in.code == Code::kCompare)
            out << ", " << operand_str(in.b, ol);
          if (in.code == Code::kBinaryPair) out << ", " << operand_str(in.c, ol);
        }
      }
      if (in.code == Code::kStore || in.code == Code::kReduce)
        out << " -> %" << in.value;
      else
        out << " -> s" << in.dst << " (%" << in.value << ")";
      out << "\n";
    }
  }
  return out.str();
}

CompiledRegion compile(const ir::Graph& g, const CompileOptions& options) {
  g.verify();
  CompiledRegion r;
  r.graph_ = ir::run_passes(g, ir::default_passes(), options.dump);
  r.plan_ = ir::plan_fusion(r.graph_, options.fusion);
  const ir::Graph& graph = r.graph_;
  for (ValueId p : graph.parameters()) r.input_types_.push_back(graph.type(p));
  for (ValueId v : graph.outputs()) r.output_types_.push_back(graph.type(v));
  for (const ir::FusedKernel& k : r.plan_.kernels)
    r.programs_.push_back(build_program(graph, k, options.tile_elements));

  // Where each written value lives: the first output that is it, else a
  // temp in the arena. Other outputs are copied at the end.
  const int64_t n = graph.num_ops();
  r.output_home_.assign(n, -1);
  r.temp_offset_.assign(n, -1);
  for (size_t j = 0; j < graph.outputs().size(); ++j) {
    ValueId v = graph.outputs()[j];
    if (r.plan_.writer[v] >= 0 && r.output_home_[v] < 0)
      r.output_home_[v] = static_cast<int32_t>(j);
    else
      r.output_copies_.push_back({v, static_cast<int32_t>(j)});
  }
  auto base_of = [&](ValueId v) {
    while (graph.op(v).kind == OpKind::kReshape) v = graph.op(v).operands[0];
    return v;
  };
  const int nk = static_cast<int>(r.plan_.kernels.size());
  std::vector<int> last_use(n, -1);
  for (int k = 0; k < nk; ++k)
    for (ValueId x : r.plan_.kernels[k].reads) last_use[base_of(x)] = std::max(last_use[base_of(x)], k);
  for (const auto& c : r.output_copies_) last_use[base_of(c.first)] = nk;
  // First fit over kernel-index lifetimes.
  struct Placed {
    int64_t offset, bytes;
    int begin, end;
  };
  std::vector<Placed> placed;
  for (int k = 0; k < nk; ++k) {
    for (ValueId v : r.plan_.kernels[k].writes) {
      if (r.output_home_[v] >= 0) continue;
      const int64_t bytes = (graph.type(v).numel() * ir::element_size(graph.type(v).dtype) + 63) / 64 * 64;
      const int begin = k, end = std::max(k, last_use[v]);
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (const Placed& p : placed)
        if (p.begin <= end && begin <= p.end) busy.push_back({p.offset, p.offset + p.bytes});
      std::sort(busy.begin(), busy.end());
      int64_t offset = 0;
      for (const auto& b : busy) {
        if (offset + bytes <= b.first) break;
        offset = std::max(offset, b.second);
      }
      placed.push_back({offset, bytes, begin, end});
      r.temp_offset_[v] = offset;
      r.temp_bytes_ = std::max(r.temp_bytes_, offset + bytes);
    }
  }
  return r;
}

// ---------------------------------------------------------------------------
// run

void run(const CompiledRegion& region, const std::vector<Buffer>& inputs, const std::vector<Buffer>& outputs) {
  const ir::Graph& g = region.graph_;
  auto check = [](const char* what, size_t k, const Buffer& b, const ir::TensorType& t) {
    if (b.dtype != t.dtype || b.shape != t.shape)
      throw std::invalid_argument(std::string("[run] ") + what + " " + std::to_string(k) + " must be " + t.str() +
                                  ", got " + b.str());
    if (!b.strides.empty() && b.strides.size() != b.shape.size())
      throw std::invalid_argument(std::string("[run] ") + what + " " + std::to_string(k) + ": strides " +
                                  ir::shape_str(b.strides) + " do not match shape " + ir::shape_str(b.shape));
    if (!b.data && b.numel() > 0)
      throw std::invalid_argument(std::string("[run] ") + what + " " + std::to_string(k) + " has no data");
  };
  if (inputs.size() != region.input_types_.size())
    throw std::invalid_argument("[run] expected " + std::to_string(region.input_types_.size()) + " inputs, got " +
                                std::to_string(inputs.size()));
  if (outputs.size() != region.output_types_.size())
    throw std::invalid_argument("[run] expected " + std::to_string(region.output_types_.size()) + " outputs, got " +
                                std::to_string(outputs.size()));
  for (size_t k = 0; k < inputs.size(); ++k) check("input", k, inputs[k], region.input_types_[k]);
  for (size_t k = 0; k < outputs.size(); ++k) check("output", k, outputs[k], region.output_types_[k]);

  const int64_t n = g.num_ops();
  std::vector<Buffer> buf(static_cast<size_t>(n));
  std::vector<char> have(static_cast<size_t>(n), 0);
  char* arena = region.temp_bytes_ > 0 ? t_temp_arena.get(static_cast<size_t>(region.temp_bytes_)) : nullptr;
  for (size_t k = 0; k < inputs.size(); ++k) {
    ValueId p = g.parameters()[k];
    buf[p] = inputs[k];
    have[p] = 1;
  }
  for (ValueId v = 0; v < n; ++v) {
    if (region.output_home_[v] >= 0) {
      buf[v] = outputs[region.output_home_[v]];
      have[v] = 1;
    } else if (region.temp_offset_[v] >= 0) {
      buf[v] = Buffer::contiguous(arena + region.temp_offset_[v], g.type(v).dtype, g.type(v).shape);
      have[v] = 1;
    }
  }
  std::vector<std::unique_ptr<char[]>> view_copies;
  // A reshape aliases its operand's memory when that is contiguous; a strided
  // operand is first copied.
  auto get = [&](ValueId v, auto& self) -> const Buffer& {
    if (have[v]) return buf[v];
    const ir::Op& op = g.op(v);
    if (op.kind != OpKind::kReshape) throw std::logic_error("[run] value %" + std::to_string(v) + " has no memory");
    const Buffer& base = self(op.operands[0], self);
    void* data = base.data;
    if (!base.is_contiguous()) {
      const int64_t bytes = base.numel() * ir::element_size(base.dtype);
      view_copies.emplace_back(new char[static_cast<size_t>(std::max<int64_t>(bytes, 1))]);
      data = view_copies.back().get();
      copy_buffer(base, Buffer::contiguous(data, base.dtype, base.shape));
    }
    buf[v] = Buffer::contiguous(data, op.type.dtype, op.type.shape);
    have[v] = 1;
    return buf[v];
  };

  for (size_t k = 0; k < region.programs_.size(); ++k) {
    const KernelProgram& p = region.programs_[k];
    std::vector<Buffer> lb, sb, rb;
    for (const LoadDesc& l : p.loads) lb.push_back(get(l.value, get));
    for (const StoreDesc& s : p.stores) sb.push_back(get(s.value, get));
    for (const ReduceDesc& r : p.reduces) rb.push_back(get(r.value, get));
    run_kernel(p, lb, sb, rb);
  }
  for (const auto& [v, j] : region.output_copies_) copy_buffer(get(v, get), outputs[j]);
}

void release_thread_scratch() {
  t_tile_scratch.release();
  t_temp_arena.release();
}

}  // namespace torch_tpu::exec
