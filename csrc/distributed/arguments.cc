#include "distributed/arguments.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "distributed/chips.h"

namespace torch_tpu::dist {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

}  // namespace

std::string describe_tensor(const at::Tensor& t) {
  std::ostringstream os;
  os << dtype_name(static_cast<int32_t>(t.scalar_type())) << t.sizes() << " on " << t.device();
  return os.str();
}

std::string what_of(const char* op, uint64_t seq, const std::string& tensor) {
  std::ostringstream os;
  os << op << " (collective #" << seq;
  if (!tensor.empty()) os << ", " << tensor;
  os << ")";
  return os.str();
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist ", op, ": expects one tensor per process (one chip per rank), got ",
              tensors.size());
  return tensors[0];
}

void check_tensor(const at::Tensor& t, const char* op, const char* role) {
  TORCH_CHECK(t.defined(), "tpu_dist ", op, ": ", role, " is undefined");
  TORCH_CHECK(t.layout() == at::kStrided, "tpu_dist ", op, ": ", role, " must be a dense (strided) tensor, got ",
              t.layout(), " ", describe_tensor(t));
  TORCH_CHECK(is_tpu(t.device()) || t.device().is_cpu(), "tpu_dist ", op, ": ", role, " must be on tpu or cpu, got ",
              describe_tensor(t));
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what_a, const char* what_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "tpu_dist ", op, ": ", what_a, " (", describe_tensor(a), ") and ",
              what_b, " (", describe_tensor(b), ") must have the same dtype");
  TORCH_CHECK(a.device() == b.device(), "tpu_dist ", op, ": ", what_a, " (", describe_tensor(a), ") and ", what_b, " (",
              describe_tensor(b), ") must be on the same device");
}

void check_pair(const at::Tensor& output, const at::Tensor& input, const char* op, const char* what_output,
                const char* what_input) {
  check_tensor(input, op, "input");
  check_tensor(output, op, "output");
  check_same(output, input, op, what_output, what_input);
}

void check_redop(int redop, at::ScalarType dtype, const char* op) {
  const bool integral = at::isIntegralType(dtype, /*includeBool=*/true);
  switch (static_cast<RedOp>(redop)) {
    case RedOp::SUM:
    case RedOp::PRODUCT:
      return;
    case RedOp::MIN:
    case RedOp::MAX:
      TORCH_CHECK(!at::isComplexType(dtype), "tpu_dist ", op, ": ", redop_name(redop), " is not defined for ", dtype);
      return;
    case RedOp::AVG:
      TORCH_CHECK(dtype != at::kBool, "tpu_dist ", op, ": AVG is not defined for bool tensors");
      return;
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      TORCH_CHECK(integral, "tpu_dist ", op, ": ", redop_name(redop), " needs an integer or bool tensor, got ", dtype);
      return;
    case RedOp::PREMUL_SUM:
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "tpu_dist ", op,
                  ": PREMUL_SUM needs a floating-point tensor, got ", dtype);
      return;
    default:
      TORCH_CHECK(false, "tpu_dist ", op, ": unsupported reduce op ", redop);
  }
}

void check_root(int64_t root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "tpu_dist ", op, ": root rank ", root, " is out of range for a group of ",
              size);
}

double premul_factor(const c10d::ReduceOp& op) {
  if (op.op_ != RedOp::PREMUL_SUM) return 1.0;
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "tpu_dist: PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) return s->tensor_factor.item<double>();  // synchronizes a tpu factor
  return s->double_factor;
}

namespace {
thread_local bool t_spmd_check = false;
}  // namespace

bool set_spmd_check(bool enabled) {
  const bool previous = t_spmd_check;
  t_spmd_check = enabled;
  return previous;
}

bool spmd_check() { return t_spmd_check; }

Descriptor describe(OpKind op, const at::Tensor& t, int redop, int64_t numel, int64_t root) {
  Descriptor d;
  d.spmd = t_spmd_check ? 1 : 0;
  d.op = static_cast<int32_t>(op);
  d.redop = redop;
  d.numel = numel;
  d.root = root;
  if (t.defined()) {
    d.dtype = static_cast<int32_t>(t.scalar_type());
    d.ndim = static_cast<int32_t>(std::min<int64_t>(t.dim(), kMaxDims));
    for (int i = 0; i < d.ndim; ++i) d.sizes[i] = t.size(i);
    set_chip(d, tpu_index(t));
  }
  return d;
}

Splits splits_of(const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& recv_bytes) {
  const size_t n = send_bytes.size();
  Splits s;
  s.counts.resize(2 * n);
  s.send_offsets.resize(n);
  s.recv_offsets.resize(n);
  for (size_t q = 0; q < n; ++q) {
    s.counts[q] = send_bytes[q];
    s.counts[n + q] = recv_bytes[q];
    s.send_offsets[q] = s.send_total;
    s.recv_offsets[q] = s.recv_total;
    s.send_total += send_bytes[q];
    s.recv_total += recv_bytes[q];
  }
  return s;
}

}  // namespace torch_tpu::dist
