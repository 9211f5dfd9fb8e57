#include "distributed/shm_transport.h"

#include <ATen/ATen.h>

#include "distributed/chips.h"
#include "distributed/p2p.h"

namespace torch_tpu::dist {
namespace {

using RedOp = c10d::ReduceOp::RedOpType;

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

}  // namespace

Arrival ShmTransport::arrive(const Call& c, double payload_bytes, const int64_t* counts) {
  const Arrival a = engine_.arrive(c.seq, c.desc, c.what, counts);
  if (c.device >= 0) {
    const auto op = static_cast<OpKind>(c.desc.op);
    record_cost(c.device, engine_.cost(a, op, payload_bytes, c.seq), op_name(op));
  }
  return a;
}

void ShmTransport::all_reduce(const Call& c, const at::Tensor& data, int redop, double factor) {
  const Arrival a = arrive(c, nbytes(data));
  int op = redop;
  if (redop == RedOp::PREMUL_SUM) {
    data.mul_(factor);
    op = RedOp::SUM;
  }
  engine_.all_reduce(a, data.data_ptr(), data.numel(), data.scalar_type(), op, c.what);
}

void ShmTransport::broadcast(const Call& c, const at::Tensor& data, int root) {
  const Arrival a = arrive(c, nbytes(data));
  engine_.broadcast(a, data.data_ptr(), nbytes(data), root, c.what);
}

void ShmTransport::reduce(const Call& c, const at::Tensor& data, int redop, double factor, int root) {
  const Arrival a = arrive(c, nbytes(data));
  int op = redop;
  at::Tensor input = data;
  if (redop == RedOp::PREMUL_SUM) {
    input = input.mul(factor);  // a copy: non-roots keep their tensor
    op = RedOp::SUM;
  }
  engine_.reduce(a, input.data_ptr(), data.data_ptr(), input.numel(), input.scalar_type(), op, root, c.what);
}

void ShmTransport::all_gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs) {
  const int n = group_.size();
  const int64_t count = input.numel();
  const size_t es = input.element_size();
  std::vector<void*> ptrs(n);
  for (int r = 0; r < n; ++r) {
    ptrs[r] = outputs.size() == 1 ? static_cast<char*>(outputs[0].data_ptr()) + r * count * es : outputs[r].data_ptr();
  }
  const Arrival a = arrive(c, static_cast<double>(n * count * es));
  engine_.all_gather(a, input.data_ptr(), ptrs, count, es, c.what);
}

void ShmTransport::reduce_scatter(const Call& c, const at::Tensor& input, const at::Tensor& output, int redop) {
  const Arrival a = arrive(c, static_cast<double>(nbytes(input)));
  engine_.reduce_scatter(a, input.data_ptr(), output.data_ptr(), output.numel(), input.scalar_type(), redop, c.what);
}

void ShmTransport::gather(const Call& c, const at::Tensor& input, const std::vector<at::Tensor>& outputs, int root) {
  std::vector<void*> ptrs(group_.size(), nullptr);
  for (size_t i = 0; i < outputs.size(); ++i) ptrs[i] = outputs[i].data_ptr();
  const Arrival a = arrive(c, static_cast<double>(nbytes(input) * group_.size()));
  engine_.gather(a, input.data_ptr(), ptrs, nbytes(input), root, c.what);
}

void ShmTransport::scatter(const Call& c, const std::vector<at::Tensor>& inputs, const at::Tensor& output, int root) {
  std::vector<const void*> ptrs(group_.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) ptrs[i] = inputs[i].data_ptr();
  const Arrival a = arrive(c, static_cast<double>(nbytes(output) * group_.size()));
  engine_.scatter(a, ptrs, output.data_ptr(), nbytes(output), root, c.what);
}

void ShmTransport::all_to_all(const Call& c, const at::Tensor& input, const at::Tensor& output, const Splits& splits) {
  const Arrival a = arrive(c, static_cast<double>(splits.send_total), splits.counts.data());
  engine_.all_to_all(a, c.seq, input.data_ptr(), splits.send_offsets, output.data_ptr(), splits.recv_offsets, c.what);
}

void ShmTransport::barrier(const Call& c) { arrive(c, 0); }

void ShmTransport::send(int dst, int tag, const at::Tensor& data, const std::string& what) {
  p2p_send(group_, dst, tag, static_cast<int32_t>(data.scalar_type()), data.data_ptr(), nbytes(data), what);
}

void ShmTransport::recv(int src, int tag, const at::Tensor& data, const std::string& what) {
  p2p_recv(group_, src, tag, static_cast<int32_t>(data.scalar_type()), data.data_ptr(), nbytes(data), what);
}

}  // namespace torch_tpu::dist
