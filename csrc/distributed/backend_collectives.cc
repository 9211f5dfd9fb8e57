// The collectives of TpuBackend, each written once over the group's transport:
// validate the arguments (on the calling thread), describe the steps (what each
// rank publishes at arrival, the tensor messages name), issue them.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "distributed/arguments.h"
#include "distributed/backend.h"
#include "distributed/chips.h"
#include "distributed/host_view.h"

namespace torch_tpu::dist {
namespace {

using c10d::OpType;
using RedOp = c10d::ReduceOp::RedOpType;

std::vector<at::Tensor> concat(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Bodies shared by the list, tensor and coalesced entry points (run on the collective thread).
// `outputs`: one per rank, or one holding all ranks' blocks.
void run_all_gather(Transport& transport, const Call& call, const TensorRecipe& input,
                    const std::vector<TensorRecipe>& outputs) {
  AliasBuilder b(c10::kCPU);
  HostView in(b, input, /*read=*/true);
  std::vector<HostView> outs;
  outs.reserve(outputs.size());
  for (const auto& r : outputs) outs.emplace_back(b, r, /*read=*/false);
  std::vector<at::Tensor> flats;
  for (auto& o : outs) flats.push_back(o.flat());
  transport.all_gather(call, in.flat(), flats);
  for (auto& o : outs) o.commit();
}

// `inputs`: one per rank, or one holding all ranks' blocks.
void run_reduce_scatter(Transport& transport, const Call& call, const std::vector<TensorRecipe>& inputs,
                        const TensorRecipe& output, int redop, double factor, int n) {
  AliasBuilder b(c10::kCPU);
  HostView out(b, output, /*read=*/false);
  const int64_t count = out.flat().numel();
  at::Tensor in;
  if (inputs.size() == 1) {
    HostView v(b, inputs[0], /*read=*/true);
    in = v.flat();
    if (redop == RedOp::PREMUL_SUM) in = in.mul(factor);
  } else {
    in = at::empty({n * count}, out.flat().options());
    for (int r = 0; r < n; ++r) in.narrow(0, r * count, count).copy_(b.alias(inputs[r]).reshape({-1}));
    if (redop == RedOp::PREMUL_SUM) in.mul_(factor);
  }
  transport.reduce_scatter(call, in, out.flat(), redop == RedOp::PREMUL_SUM ? RedOp::SUM : redop);
  out.commit();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> TpuBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  Collective c = begin("tpu_dist:all_reduce", OpType::ALLREDUCE);
  at::Tensor& t = single(tensors, c.op());
  check_tensor(t, c.op(), "tensor");
  const int redop = opts.reduceOp.op_;
  check_redop(redop, t.scalar_type(), c.op());
  const double factor = premul_factor(opts.reduceOp);
  c.devices = tpu_indices({t});
  c.outputs = {t};
  c.device = tpu_index(t);
  c.steps.push_back({describe(OpKind::kAllReduce, t, redop, t.numel(), -1), describe_tensor(t),
                     [this, r = TensorRecipe::of(t), redop, factor](const Call& call) {
                       AliasBuilder b(c10::kCPU);
                       HostView v(b, r, /*read=*/true);
                       transport_->all_reduce(call, v.flat(), redop, factor);
                       v.commit();
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  Collective c = begin("tpu_dist:all_reduce_coalesced", OpType::ALLREDUCE_COALESCED);
  TORCH_CHECK(!tensors.empty(), "tpu_dist all_reduce_coalesced: no tensors");
  const int redop = opts.reduceOp.op_;
  for (const auto& t : tensors) {
    check_tensor(t, c.op(), "tensor");
    check_same(t, tensors[0], c.op(), "a tensor", "the first tensor");
  }
  check_redop(redop, tensors[0].scalar_type(), c.op());
  const double factor = premul_factor(opts.reduceOp);
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  Descriptor d = describe(OpKind::kAllReduce, tensors[0], redop, total, -1);
  d.ndim = 1;
  d.sizes[0] = total;
  c.devices = tpu_indices(tensors);
  c.outputs = tensors;
  c.device = tpu_index(tensors[0]);
  c.steps.push_back(
      {d, describe_tensor(tensors[0]), [this, rs = recipes(tensors), redop, factor, total](const Call& call) {
         AliasBuilder b(c10::kCPU);
         std::vector<at::Tensor> views;
         for (const auto& r : rs) views.push_back(b.alias(r));
         at::Tensor flat = at::empty({total}, views[0].options());
         int64_t off = 0;
         for (auto& v : views) {
           flat.narrow(0, off, v.numel()).view(v.sizes()).copy_(v);
           off += v.numel();
         }
         transport_->all_reduce(call, flat, redop, factor);
         off = 0;
         for (auto& v : views) {
           v.copy_(flat.narrow(0, off, v.numel()).view(v.sizes()));
           off += v.numel();
         }
       }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  Collective c = begin("tpu_dist:broadcast", OpType::BROADCAST);
  at::Tensor& t = single(tensors, c.op());
  check_tensor(t, c.op(), "tensor");
  check_root(opts.rootRank, getSize(), c.op());
  TORCH_CHECK(opts.rootTensor == 0, "tpu_dist broadcast: root tensor must be 0, got ", opts.rootTensor);
  const int root = static_cast<int>(opts.rootRank);
  c.devices = tpu_indices({t});
  c.outputs = {t};
  c.device = tpu_index(t);
  c.steps.push_back({describe(OpKind::kBroadcast, t, 0, t.numel(), root), describe_tensor(t),
                     [this, r = TensorRecipe::of(t), root](const Call& call) {
                       AliasBuilder b(c10::kCPU);
                       HostView v(b, r, /*read=*/getRank() == root);
                       transport_->broadcast(call, v.flat(), root);
                       if (getRank() != root) v.commit();
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  Collective c = begin("tpu_dist:reduce", OpType::REDUCE);
  at::Tensor& t = single(tensors, c.op());
  check_tensor(t, c.op(), "tensor");
  check_root(opts.rootRank, getSize(), c.op());
  const int redop = opts.reduceOp.op_;
  check_redop(redop, t.scalar_type(), c.op());
  const double factor = premul_factor(opts.reduceOp);
  const int root = static_cast<int>(opts.rootRank);
  c.devices = tpu_indices({t});
  c.outputs = {t};
  c.device = tpu_index(t);
  c.steps.push_back({describe(OpKind::kReduce, t, redop, t.numel(), root), describe_tensor(t),
                     [this, r = TensorRecipe::of(t), redop, factor, root](const Call& call) {
                       AliasBuilder b(c10::kCPU);
                       HostView v(b, r, /*read=*/true);
                       transport_->reduce(call, v.flat(), redop, factor, root);
                       if (getRank() == root) v.commit();
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  Collective c = begin("tpu_dist:all_gather", OpType::ALLGATHER);
  at::Tensor& in = single(inputs, c.op());
  check_tensor(in, c.op(), "input");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "tpu_dist all_gather: ", "expects one list of ", getSize(), " output tensors, got ", outputs.size(),
              " list(s) of ", outputs.empty() ? 0 : outputs[0].size());
  for (const auto& o : outputs[0]) {
    check_tensor(o, c.op(), "output");
    check_same(o, in, c.op(), "an output", "the input");
    TORCH_CHECK(o.numel() == in.numel(), "tpu_dist all_gather: every output must have the input's ", in.numel(),
                " elements; got ", describe_tensor(o), " for input ", describe_tensor(in));
  }
  c.devices = tpu_indices(concat(outputs[0], {in}));
  c.outputs = outputs[0];
  c.device = tpu_index(in);
  c.steps.push_back({describe(OpKind::kAllGather, in, 0, in.numel(), -1), describe_tensor(in),
                     [this, ri = TensorRecipe::of(in), ro = recipes(outputs[0])](const Call& call) {
                       run_all_gather(*transport_, call, ri, ro);
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  Collective c = begin("tpu_dist:all_gather_into_tensor", OpType::_ALLGATHER_BASE);
  check_pair(output, input, c.op(), "the output", "the input");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "tpu_dist all_gather_into_tensor: the output (",
              describe_tensor(output), ") must hold ", getSize(), " x the input's ", input.numel(), " elements (input ",
              describe_tensor(input), ")");
  c.devices = tpu_indices({output, input});
  c.outputs = {output};
  c.device = tpu_index(input);
  c.steps.push_back({describe(OpKind::kAllGather, input, 0, input.numel(), -1), describe_tensor(input),
                     [this, ri = TensorRecipe::of(input), ro = TensorRecipe::of(output)](const Call& call) {
                       run_all_gather(*transport_, call, ri, {ro});
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  Collective c = begin("tpu_dist:all_gather_coalesced", OpType::ALLGATHER_COALESCED);
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist all_gather_coalesced: ", outputs.size(), " output lists for ",
              inputs.size(), " inputs");
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], c.op(), "input");
    TORCH_CHECK(static_cast<int>(outputs[i].size()) == getSize(), "tpu_dist all_gather_coalesced: output list ", i,
                " has ", outputs[i].size(), " tensors, expected ", getSize());
    for (const auto& o : outputs[i]) {
      check_same(o, inputs[i], c.op(), "an output", "its input");
      TORCH_CHECK(o.numel() == inputs[i].numel(), "tpu_dist all_gather_coalesced: output ", describe_tensor(o),
                  " does not match input ", describe_tensor(inputs[i]));
      all.push_back(o);
      c.outputs.push_back(o);
    }
    all.push_back(inputs[i]);
    c.steps.push_back({describe(OpKind::kAllGather, inputs[i], 0, inputs[i].numel(), -1), "",
                       [this, ri = TensorRecipe::of(inputs[i]), ro = recipes(outputs[i])](const Call& call) {
                         run_all_gather(*transport_, call, ri, ro);
                       }});
  }
  c.devices = tpu_indices(all);
  c.device = inputs.empty() ? -1 : tpu_index(inputs[0]);
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  Collective c = begin("tpu_dist:all_gather_into_tensor_coalesced", OpType::COALESCED);
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist all_gather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_pair(outputs[i], inputs[i], c.op(), "an output", "its input");
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(),
                "tpu_dist all_gather_into_tensor_coalesced: ", "output ", describe_tensor(outputs[i]), " must hold ",
                getSize(), " x input ", describe_tensor(inputs[i]));
    c.steps.push_back({describe(OpKind::kAllGather, inputs[i], 0, inputs[i].numel(), -1), "",
                       [this, ri = TensorRecipe::of(inputs[i]), ro = TensorRecipe::of(outputs[i])](const Call& call) {
                         run_all_gather(*transport_, call, ri, {ro});
                       }});
  }
  c.devices = tpu_indices(concat(outputs, inputs));
  c.outputs = outputs;
  c.device = inputs.empty() ? -1 : tpu_index(inputs[0]);
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  Collective c = begin("tpu_dist:gather", OpType::GATHER);
  at::Tensor& in = single(inputs, c.op());
  check_tensor(in, c.op(), "input");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, getSize(), c.op());
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "tpu_dist gather: the root expects one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) {
      check_tensor(o, c.op(), "output");
      check_same(o, in, c.op(), "an output", "the input");
      TORCH_CHECK(o.numel() == in.numel(), "tpu_dist gather: output ", describe_tensor(o), " does not match input ",
                  describe_tensor(in));
    }
    c.outputs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "tpu_dist gather: only the root passes output tensors");
  }
  c.devices = tpu_indices(concat(c.outputs, {in}));
  c.device = tpu_index(in);
  c.steps.push_back({describe(OpKind::kGather, in, 0, in.numel(), root), describe_tensor(in),
                     [this, ri = TensorRecipe::of(in), ro = recipes(c.outputs), root](const Call& call) {
                       AliasBuilder b(c10::kCPU);
                       HostView v(b, ri, /*read=*/true);
                       std::vector<HostView> hs;
                       for (const auto& r : ro) hs.emplace_back(b, r, /*read=*/false);
                       std::vector<at::Tensor> flats;
                       for (auto& h : hs) flats.push_back(h.flat());
                       transport_->gather(call, v.flat(), flats, root);
                       for (auto& h : hs) h.commit();
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  Collective c = begin("tpu_dist:scatter", OpType::SCATTER);
  at::Tensor& out = single(outputs, c.op());
  check_tensor(out, c.op(), "output");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, getSize(), c.op());
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "tpu_dist scatter: the root expects one list of ", getSize(), " input tensors");
    for (const auto& i : inputs[0]) {
      check_tensor(i, c.op(), "input");
      check_same(i, out, c.op(), "an input", "the output");
      TORCH_CHECK(i.numel() == out.numel(), "tpu_dist scatter: input ", describe_tensor(i), " does not match output ",
                  describe_tensor(out));
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "tpu_dist scatter: only the root passes input tensors");
  }
  c.devices = tpu_indices(concat(ins, {out}));
  c.outputs = {out};
  c.device = tpu_index(out);
  c.steps.push_back({describe(OpKind::kScatter, out, 0, out.numel(), root), describe_tensor(out),
                     [this, ro = TensorRecipe::of(out), ri = recipes(ins), root](const Call& call) {
                       AliasBuilder b(c10::kCPU);
                       HostView v(b, ro, /*read=*/false);
                       std::vector<HostView> hs;
                       for (const auto& r : ri) hs.emplace_back(b, r, /*read=*/true);
                       std::vector<at::Tensor> flats;
                       for (auto& h : hs) flats.push_back(h.flat());
                       transport_->scatter(call, flats, v.flat(), root);
                       v.commit();
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  Collective c = begin("tpu_dist:reduce_scatter", OpType::REDUCE_SCATTER);
  at::Tensor& out = single(outputs, c.op());
  check_tensor(out, c.op(), "output");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "tpu_dist reduce_scatter: expects one list of ", getSize(), " input tensors");
  for (const auto& i : inputs[0]) {
    check_tensor(i, c.op(), "input");
    check_same(i, out, c.op(), "an input", "the output");
    TORCH_CHECK(i.numel() == out.numel(), "tpu_dist reduce_scatter: input ", describe_tensor(i),
                " does not match output ", describe_tensor(out));
  }
  const int redop = opts.reduceOp.op_;
  check_redop(redop, out.scalar_type(), c.op());
  const double factor = premul_factor(opts.reduceOp);
  c.devices = tpu_indices(concat(inputs[0], {out}));
  c.outputs = {out};
  c.device = tpu_index(out);
  c.steps.push_back({describe(OpKind::kReduceScatter, out, redop, out.numel(), -1), describe_tensor(out),
                     [this, ri = recipes(inputs[0]), ro = TensorRecipe::of(out), redop, factor](const Call& call) {
                       run_reduce_scatter(*transport_, call, ri, ro, redop, factor, getSize());
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  Collective c = begin("tpu_dist:reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE);
  check_pair(output, input, c.op(), "the output", "the input");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "tpu_dist reduce_scatter_tensor: the input (",
              describe_tensor(input), ") must hold ", getSize(), " x the output's ", output.numel(),
              " elements (output ", describe_tensor(output), ")");
  const int redop = opts.reduceOp.op_;
  check_redop(redop, output.scalar_type(), c.op());
  const double factor = premul_factor(opts.reduceOp);
  c.devices = tpu_indices({output, input});
  c.outputs = {output};
  c.device = tpu_index(output);
  c.steps.push_back(
      {describe(OpKind::kReduceScatter, output, redop, output.numel(), -1), describe_tensor(input),
       [this, ri = TensorRecipe::of(input), ro = TensorRecipe::of(output), redop, factor](const Call& call) {
         run_reduce_scatter(*transport_, call, {ri}, ro, redop, factor, getSize());
       }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  Collective c = begin("tpu_dist:reduce_scatter_tensor_coalesced", OpType::REDUCE_SCATTER_TENSOR_COALESCED);
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  const int redop = opts.reduceOp.op_;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_pair(outputs[i], inputs[i], c.op(), "an output", "its input");
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(),
                "tpu_dist reduce_scatter_tensor_coalesced: ", "input ", describe_tensor(inputs[i]), " must hold ",
                getSize(), " x output ", describe_tensor(outputs[i]));
    check_redop(redop, outputs[i].scalar_type(), c.op());
  }
  const double factor = premul_factor(opts.reduceOp);
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.steps.push_back(
        {describe(OpKind::kReduceScatter, outputs[i], redop, outputs[i].numel(), -1), "",
         [this, ri = TensorRecipe::of(inputs[i]), ro = TensorRecipe::of(outputs[i]), redop, factor](const Call& call) {
           run_reduce_scatter(*transport_, call, {ri}, ro, redop, factor, getSize());
         }});
  }
  c.devices = tpu_indices(concat(outputs, inputs));
  c.outputs = outputs;
  c.device = inputs.empty() ? -1 : tpu_index(inputs[0]);
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const c10d::AllToAllOptions& opts) {
  Collective c = begin("tpu_dist:all_to_all_single", OpType::ALLTOALL_BASE);
  check_pair(output, input, c.op(), "the output", "the input");
  const int n = getSize();
  const int64_t es = input.element_size();
  auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& given, const char* role) {
    std::vector<int64_t> rows(n);
    if (given.empty()) {
      const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
      TORCH_CHECK(dim0 % n == 0, "tpu_dist all_to_all_single: the ", role, " (", describe_tensor(t),
                  ") must split evenly along dim 0 into ", n, " parts when no split sizes are given");
      std::fill(rows.begin(), rows.end(), dim0 / n);
    } else {
      TORCH_CHECK(static_cast<int>(given.size()) == n, "tpu_dist all_to_all_single: ", role, " split sizes need ", n,
                  " entries, got ", given.size());
      int64_t sum = 0;
      for (auto s : given) {
        TORCH_CHECK(s >= 0, "tpu_dist all_to_all_single: negative ", role, " split size ", s);
        sum += s;
      }
      TORCH_CHECK(t.dim() > 0 && sum == t.size(0), "tpu_dist all_to_all_single: ", role, " split sizes sum to ", sum,
                  " but the ", role, " (", describe_tensor(t), ") has ", t.dim() > 0 ? t.size(0) : 0, " rows");
      rows = given;
    }
    const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_bytes = dim0 == 0 ? 0 : t.numel() / dim0 * es;
    std::vector<int64_t> bytes(n);
    for (int q = 0; q < n; ++q) bytes[q] = rows[q] * row_bytes;
    return bytes;
  };
  const std::vector<int64_t> send = splits(input, input_split_sizes, "input");
  const std::vector<int64_t> recv = splits(output, output_split_sizes, "output");
  c.devices = tpu_indices({output, input});
  c.outputs = {output};
  c.device = tpu_index(input);
  c.steps.push_back({describe(OpKind::kAllToAll, input, 0, input.numel(), -1), describe_tensor(input),
                     [this, ri = TensorRecipe::of(input), ro = TensorRecipe::of(output),
                      s = splits_of(send, recv)](const Call& call) {
                       AliasBuilder b(c10::kCPU);
                       HostView in(b, ri, /*read=*/true);
                       HostView out(b, ro, /*read=*/false);
                       transport_->all_to_all(call, in.flat().reshape({-1}).view(at::kByte),
                                              out.flat().reshape({-1}).view(at::kByte), s);
                       out.commit();
                     }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  Collective c = begin("tpu_dist:all_to_all", OpType::ALLTOALL);
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
              "tpu_dist all_to_all: expects ", n, " input and ", n, " output tensors, got ", inputs.size(), " and ",
              outputs.size());
  for (int q = 0; q < n; ++q) {
    check_tensor(inputs[q], c.op(), "input");
    check_tensor(outputs[q], c.op(), "output");
    check_same(inputs[q], inputs[0], c.op(), "an input", "the first input");
    check_same(outputs[q], inputs[0], c.op(), "an output", "the first input");
  }
  const int64_t es = inputs[0].element_size();
  std::vector<int64_t> send(n), recv(n);
  for (int q = 0; q < n; ++q) {
    send[q] = inputs[q].numel() * es;
    recv[q] = outputs[q].numel() * es;
  }
  const Splits s = splits_of(send, recv);
  c.devices = tpu_indices(concat(outputs, inputs));
  c.outputs = outputs;
  c.device = tpu_index(inputs[0]);
  c.steps.push_back(
      {describe(OpKind::kAllToAll, inputs[0], 0, s.send_total / std::max<int64_t>(es, 1), -1),
       describe_tensor(inputs[0]), [this, ri = recipes(inputs), ro = recipes(outputs), s](const Call& call) {
         AliasBuilder b(c10::kCPU);
         const int n = getSize();
         std::vector<at::Tensor> ins, outs;
         for (const auto& r : ri) ins.push_back(b.alias(r));
         for (const auto& r : ro) outs.push_back(b.alias(r));
         const auto opts = ins[0].options();
         at::Tensor in = at::empty({s.send_total}, opts.dtype(at::kByte));
         at::Tensor out = at::empty({s.recv_total}, opts.dtype(at::kByte));
         for (int q = 0; q < n; ++q) {
           if (s.counts[q] > 0) {
             in.narrow(0, s.send_offsets[q], s.counts[q]).view(ins[q].scalar_type()).copy_(ins[q].reshape({-1}));
           }
         }
         transport_->all_to_all(call, in, out, s);
         for (int q = 0; q < n; ++q) {
           if (s.counts[n + q] > 0) {
             outs[q].copy_(
                 out.narrow(0, s.recv_offsets[q], s.counts[n + q]).view(outs[q].scalar_type()).view(outs[q].sizes()));
           }
         }
       }});
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> TpuBackend::barrier(const c10d::BarrierOptions& opts) {
  Collective c = begin("tpu_dist:barrier", OpType::BARRIER);
  // Like a device barrier: wait for the work queued on this rank's current chip first.
  c.device = barrier_tpu(opts.device);
  if (c.device >= 0) c.devices.push_back(c.device);
  Descriptor d = describe(OpKind::kBarrier, at::Tensor(), 0, 0, -1);
  set_chip(d, c.device);
  c.steps.push_back({d, "", [this](const Call& call) { transport_->barrier(call); }});
  return issue(std::move(c));
}

}  // namespace torch_tpu::dist
