#include "ir/interpreter.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace torch_tpu::ir {

Literal Literal::zeros(const TensorType& t) {
  Literal l;
  l.type = t;
  if (is_float(t.dtype))
    l.f.assign(static_cast<size_t>(t.numel()), 0.0);
  else
    l.i.assign(static_cast<size_t>(t.numel()), 0);
  return l;
}

Literal Literal::from_bytes(const TensorType& t, const void* data) {
  Literal l = zeros(t);
  const int64_t n = t.numel();
  for (int64_t k = 0; k < n; ++k) {
    switch (t.dtype) {
      case ElementType::f32:
        l.f[k] = static_cast<const float*>(data)[k];
        break;
      case ElementType::bf16:
        l.f[k] = bf16_to_f32(static_cast<const uint16_t*>(data)[k]);
        break;
      case ElementType::f16:
        l.f[k] = f16_to_f32(static_cast<const uint16_t*>(data)[k]);
        break;
      case ElementType::f64:
        l.f[k] = static_cast<const double*>(data)[k];
        break;
      case ElementType::s64:
        l.i[k] = static_cast<const int64_t*>(data)[k];
        break;
      case ElementType::s32:
        l.i[k] = static_cast<const int32_t*>(data)[k];
        break;
      case ElementType::s8:
        l.i[k] = static_cast<const int8_t*>(data)[k];
        break;
      case ElementType::u8:
        l.i[k] = static_cast<const uint8_t*>(data)[k];
        break;
      case ElementType::pred:
        l.i[k] = static_cast<const uint8_t*>(data)[k] != 0;
        break;
    }
  }
  return l;
}

void Literal::to_bytes(void* data) const {
  const int64_t n = numel();
  for (int64_t k = 0; k < n; ++k) {
    switch (type.dtype) {
      case ElementType::f32:
        static_cast<float*>(data)[k] = static_cast<float>(f[k]);
        break;
      case ElementType::bf16:
        static_cast<uint16_t*>(data)[k] = f32_to_bf16(static_cast<float>(f[k]));
        break;
      case ElementType::f16:
        static_cast<uint16_t*>(data)[k] = f32_to_f16(static_cast<float>(f[k]));
        break;
      case ElementType::f64:
        static_cast<double*>(data)[k] = f[k];
        break;
      case ElementType::s64:
        static_cast<int64_t*>(data)[k] = i[k];
        break;
      case ElementType::s32:
        static_cast<int32_t*>(data)[k] = static_cast<int32_t>(i[k]);
        break;
      case ElementType::s8:
        static_cast<int8_t*>(data)[k] = static_cast<int8_t>(i[k]);
        break;
      case ElementType::u8:
        static_cast<uint8_t*>(data)[k] = static_cast<uint8_t>(i[k]);
        break;
      case ElementType::pred:
        static_cast<uint8_t*>(data)[k] = i[k] != 0;
        break;
    }
  }
}

namespace {

using u64 = uint64_t;

double float_unary(OpKind k, double x) {
  switch (k) {
    case OpKind::kNegate:
      return -x;
    case OpKind::kAbs:
      return std::fabs(x);
    case OpKind::kExponential:
      return std::exp(x);
    case OpKind::kLog:
      return std::log(x);
    case OpKind::kLogPlusOne:
      return std::log1p(x);
    case OpKind::kExponentialMinusOne:
      return std::expm1(x);
    case OpKind::kTanh:
      return std::tanh(x);
    case OpKind::kLogistic:
      return 1.0 / (1.0 + std::exp(-x));
    case OpKind::kSqrt:
      return std::sqrt(x);
    case OpKind::kRsqrt:
      return 1.0 / std::sqrt(x);
    case OpKind::kSine:
      return std::sin(x);
    case OpKind::kCosine:
      return std::cos(x);
    case OpKind::kErf:
      return std::erf(x);
    case OpKind::kFloor:
      return std::floor(x);
    case OpKind::kCeil:
      return std::ceil(x);
    case OpKind::kSign:
      return x > 0 ? 1.0 : x < 0 ? -1.0 : x;
    default:
      throw std::invalid_argument(std::string("[") + op_name(k) + "] not a float unary op");
  }
}

int64_t int_unary(OpKind k, int64_t x, ElementType t) {
  switch (k) {
    case OpKind::kNegate:
      return static_cast<int64_t>(u64{0} - static_cast<u64>(x));
    case OpKind::kAbs:
      return x < 0 ? static_cast<int64_t>(u64{0} - static_cast<u64>(x)) : x;
    case OpKind::kSign:
      return x > 0 ? 1 : x < 0 ? -1 : 0;
    case OpKind::kNot:
      return is_pred(t) ? !x : ~x;
    default:
      throw std::invalid_argument(std::string("[") + op_name(k) + "] not an integer unary op");
  }
}

double float_binary(OpKind k, double a, double b) {
  switch (k) {
    case OpKind::kAdd:
      return a + b;
    case OpKind::kSubtract:
      return a - b;
    case OpKind::kMultiply:
      return a * b;
    case OpKind::kDivide:
      return a / b;
    case OpKind::kMaximum:
      return (a > b || a != a) ? a : b;
    case OpKind::kMinimum:
      return (a < b || a != a) ? a : b;
    case OpKind::kPower:
      return std::pow(a, b);
    default:
      throw std::invalid_argument(std::string("[") + op_name(k) + "] not a float binary op");
  }
}

int64_t int_binary(OpKind k, int64_t a, int64_t b) {
  switch (k) {
    case OpKind::kAdd:
      return static_cast<int64_t>(static_cast<u64>(a) + static_cast<u64>(b));
    case OpKind::kSubtract:
      return static_cast<int64_t>(static_cast<u64>(a) - static_cast<u64>(b));
    case OpKind::kMultiply:
      return static_cast<int64_t>(static_cast<u64>(a) * static_cast<u64>(b));
    case OpKind::kDivide:
      return int_divide(a, b);
    case OpKind::kMaximum:
      return a > b ? a : b;
    case OpKind::kMinimum:
      return a < b ? a : b;
    case OpKind::kPower:
      return int_power(a, b);
    case OpKind::kAnd:
      return a & b;
    case OpKind::kOr:
      return a | b;
    default:
      throw std::invalid_argument(std::string("[") + op_name(k) + "] not an integer binary op");
  }
}

template <typename T>
bool compare(CompareDirection d, T a, T b) {
  switch (d) {
    case CompareDirection::EQ:
      return a == b;
    case CompareDirection::NE:
      return a != b;
    case CompareDirection::LT:
      return a < b;
    case CompareDirection::LE:
      return a <= b;
    case CompareDirection::GT:
      return a > b;
    case CompareDirection::GE:
      return a >= b;
  }
  return false;
}

int64_t float_to_int(double v, ElementType t) {
  if (v != v) return 0;
  double lo, hi;
  switch (t) {
    case ElementType::s64:
      lo = -9223372036854775808.0;
      hi = 9223372036854775807.0;
      break;
    case ElementType::s32:
      lo = -2147483648.0;
      hi = 2147483647.0;
      break;
    case ElementType::s8:
      lo = -128.0;
      hi = 127.0;
      break;
    case ElementType::u8:
      lo = 0.0;
      hi = 255.0;
      break;
    default:
      return v != 0.0;  // pred
  }
  if (t == ElementType::s64) {
    // 2^63 is not an int64: saturate before converting.
    if (v >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
    if (v <= lo) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(v);
  }
  v = v < lo ? lo : v > hi ? hi : v;
  return static_cast<int64_t>(v);
}

// Element offsets of the operand of broadcast_in_dim for each result element.
std::vector<int64_t> broadcast_index(const Shape& in, const Shape& out, const std::vector<int64_t>& dims) {
  std::vector<int64_t> in_strides = contiguous_strides(in);
  std::vector<int64_t> stride_of_out(out.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (in[i] == out[dims[i]]) stride_of_out[dims[i]] = in_strides[i];
  const int64_t n = numel(out);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::vector<int64_t> pos(out.size(), 0);
  int64_t offset = 0;
  for (int64_t k = 0; k < n; ++k) {
    idx[k] = offset;
    for (size_t d = out.size(); d-- > 0;) {
      ++pos[d];
      offset += stride_of_out[d];
      if (pos[d] < out[d]) break;
      offset -= stride_of_out[d] * pos[d];
      pos[d] = 0;
    }
  }
  return idx;
}

Literal reduce(const Op& op, const Literal& in) {
  const Shape& shape = in.type.shape;
  std::vector<int64_t> out_strides_full(shape.size(), 0);
  {
    std::vector<int64_t> out_strides = contiguous_strides(op.type.shape);
    size_t j = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      bool reduced = false;
      for (int64_t r : op.attrs.dimensions) reduced |= (r == static_cast<int64_t>(d));
      if (!reduced) out_strides_full[d] = out_strides[j++];
    }
  }
  Literal out = Literal::zeros(op.type);
  const ElementType t = op.type.dtype;
  const ReduceKind kind = op.attrs.reduce_kind;
  const bool fl = is_float(t);
  const int64_t m = out.numel();
  std::vector<double> accf(fl ? m : 0, op.attrs.init.f);
  std::vector<int64_t> acci(fl ? 0 : m, op.attrs.init.i);
  std::vector<int64_t> pos(shape.size(), 0);
  int64_t o = 0;
  const int64_t n = in.numel();
  for (int64_t k = 0; k < n; ++k) {
    if (fl) {
      double& a = accf[o];
      double x = in.f[k];
      switch (kind) {
        case ReduceKind::kSum:
          a += x;
          break;
        case ReduceKind::kProd:
          a *= x;
          break;
        case ReduceKind::kMax:
          a = (x > a || x != x) ? x : a;
          break;
        case ReduceKind::kMin:
          a = (x < a || x != x) ? x : a;
          break;
      }
    } else {
      int64_t& a = acci[o];
      int64_t x = in.i[k];
      switch (kind) {
        case ReduceKind::kSum:
          a = static_cast<int64_t>(static_cast<u64>(a) + static_cast<u64>(x));
          break;
        case ReduceKind::kProd:
          a = static_cast<int64_t>(static_cast<u64>(a) * static_cast<u64>(x));
          break;
        case ReduceKind::kMax:
          a = x > a ? x : a;
          break;
        case ReduceKind::kMin:
          a = x < a ? x : a;
          break;
      }
    }
    for (size_t d = shape.size(); d-- > 0;) {
      ++pos[d];
      o += out_strides_full[d];
      if (pos[d] < shape[d]) break;
      o -= out_strides_full[d] * pos[d];
      pos[d] = 0;
    }
  }
  for (int64_t k = 0; k < m; ++k) {
    if (fl)
      out.f[k] = round_to_type(accf[k], t);
    else
      out.i[k] = wrap_to_type(acci[k], t);
  }
  return out;
}

Literal convert(const Literal& in, const TensorType& to) {
  Literal out = Literal::zeros(to);
  const ElementType from = in.type.dtype, t = to.dtype;
  const int64_t n = in.numel();
  for (int64_t k = 0; k < n; ++k) {
    if (is_float(from) && is_float(t))
      out.f[k] = round_to_type(in.f[k], t);
    else if (is_float(from))
      out.i[k] = is_pred(t) ? (in.f[k] != 0.0) : float_to_int(in.f[k], t);
    else if (is_float(t))
      out.f[k] = round_to_type(static_cast<double>(in.i[k]), t);
    else
      out.i[k] = wrap_to_type(in.i[k], t);
  }
  return out;
}

}  // namespace

std::vector<Literal> interpret(const Graph& g, const std::vector<Literal>& inputs, const InterpretOptions& options) {
  if (inputs.size() != g.parameters().size())
    throw std::invalid_argument("[interpret] expected " + std::to_string(g.parameters().size()) + " inputs, got " +
                                std::to_string(inputs.size()));
  std::vector<Literal> vals(static_cast<size_t>(g.num_ops()));
  for (ValueId v = 0; v < g.num_ops(); ++v) {
    const Op& op = g.op(v);
    const ElementType t = op.type.dtype;
    const bool fl = is_float(t);
    const bool keep = !options.round_16bit_each_op && (t == ElementType::bf16 || t == ElementType::f16);
    // Rounding of an arithmetic result (not of convert or reduce).
    auto rnd = [&](double x) { return keep ? x : round_to_type(x, t); };
    auto in = [&](int i) -> const Literal& { return vals[op.operands[i]]; };
    Literal out;
    if (op.kind == OpKind::kParameter) {
      const Literal& x = inputs[op.attrs.parameter_index];
      if (x.type != op.type)
        throw std::invalid_argument("[interpret] parameter " + std::to_string(op.attrs.parameter_index) + " is " +
                                    op.type.str() + ", got " + x.type.str());
      out = x;
    } else if (op.kind == OpKind::kConstant) {
      out = Literal::zeros(op.type);
      if (fl)
        out.f.assign(out.f.size(), round_to_type(op.attrs.value.f, t));
      else
        out.i.assign(out.i.size(), wrap_to_type(op.attrs.value.i, t));
    } else if (op.kind == OpKind::kConvert) {
      out = convert(in(0), op.type);
    } else if (is_unary_elementwise(op.kind)) {
      out = Literal::zeros(op.type);
      const Literal& a = in(0);
      for (int64_t k = 0; k < out.numel(); ++k) {
        if (fl)
          out.f[k] = rnd(float_unary(op.kind, a.f[k]));
        else
          out.i[k] = wrap_to_type(int_unary(op.kind, a.i[k], t), t);
      }
    } else if (op.kind == OpKind::kCompare) {
      out = Literal::zeros(op.type);
      const Literal& a = in(0);
      const Literal& b = in(1);
      const bool afl = is_float(a.type.dtype);
      for (int64_t k = 0; k < out.numel(); ++k)
        out.i[k] = afl ? compare(op.attrs.direction, a.f[k], b.f[k]) : compare(op.attrs.direction, a.i[k], b.i[k]);
    } else if (is_binary_elementwise(op.kind)) {
      out = Literal::zeros(op.type);
      const Literal& a = in(0);
      const Literal& b = in(1);
      for (int64_t k = 0; k < out.numel(); ++k) {
        if (fl)
          out.f[k] = rnd(float_binary(op.kind, a.f[k], b.f[k]));
        else
          out.i[k] = wrap_to_type(int_binary(op.kind, a.i[k], b.i[k]), t);
      }
    } else if (op.kind == OpKind::kSelect) {
      out = Literal::zeros(op.type);
      const Literal& p = in(0);
      const Literal& a = in(1);
      const Literal& b = in(2);
      for (int64_t k = 0; k < out.numel(); ++k) {
        if (fl)
          out.f[k] = p.i[k] ? a.f[k] : b.f[k];
        else
          out.i[k] = p.i[k] ? a.i[k] : b.i[k];
      }
    } else if (op.kind == OpKind::kBroadcastInDim) {
      out = Literal::zeros(op.type);
      const Literal& a = in(0);
      std::vector<int64_t> idx = broadcast_index(a.type.shape, op.type.shape, op.attrs.dimensions);
      for (int64_t k = 0; k < out.numel(); ++k) {
        if (fl)
          out.f[k] = a.f[idx[k]];
        else
          out.i[k] = a.i[idx[k]];
      }
    } else if (op.kind == OpKind::kReshape) {
      out = in(0);
      out.type = op.type;
    } else if (op.kind == OpKind::kReduce) {
      out = reduce(op, in(0));
    } else {
      throw std::invalid_argument(std::string("[") + op_name(op.kind) + "] not supported by the interpreter");
    }
    vals[v] = std::move(out);
  }
  std::vector<Literal> results;
  for (ValueId v : g.outputs()) {
    results.push_back(vals[v]);
    Literal& r = results.back();
    if (is_float(r.type.dtype))
      for (double& x : r.f) x = round_to_type(x, r.type.dtype);
  }
  return results;
}

}  // namespace torch_tpu::ir
