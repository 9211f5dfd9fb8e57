// nn.LSTM on tpu through oneDNN's whole-layer LSTM kernel, as CPU eager runs it.
//
// ATen's `lstm` is a composite: on the CPU it hands float32 layers without projections to
// oneDNN (`mkldnn_rnn_layer`, one fused kernel per layer and direction, with its own backward),
// and on every other device it loops over time steps, two matrix products and a fused cell per
// step. The vTPU's HBM is host memory, so the CPU's route is open to it: this autograd kernel
// takes it for the calls CPU eager would send to oneDNN, and `mkldnn_rnn_layer` and its backward
// then run as CPU kernels on the chip's worker (op_info.cc lists the forward among the ops whose
// meta kernel disagrees with the CPU's: its workspace is empty there). Same kernels, same
// values as CPU eager; every other call (other dtypes, projections, symbolic shapes, fake or
// functional tensors while tracing) takes ATen's composite, as before.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/mkldnn_rnn_layer.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace torch_tpu {
namespace {

// oneDNN's rnn_kind for LSTM (ideep::rnn_kind::LSTM), the `mode` argument of mkldnn_rnn_layer.
constexpr int64_t kOneDnnLstm = 2;

// A plain tpu tensor: no tracing, functionalization or vmap layer above it.
bool plain_tpu(const at::Tensor& t) {
  static const c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                            c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  return t.defined() && t.key_set().has(c10::DispatchKey::PrivateUse1) && !t.key_set().has_any(wrapped) &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

// CPU eager's condition for oneDNN (use_mkldnn and has_projections in ATen's RNN.cpp), for
// float32: the only dtype whose oneDNN route does not depend on the host's ISA.
bool takes_onednn(const at::Tensor& input, at::TensorList hx, at::TensorList params) {
  if (!at::globalContext().userEnabledMkldnn() || input.numel() == 0 || hx.size() != 2) return false;
  if (hx[0].dim() != 3 || hx[1].dim() != 3 || hx[0].size(2) != hx[1].size(2)) return false;
  auto float32_tpu = [](const at::Tensor& t) { return plain_tpu(t) && t.scalar_type() == at::kFloat; };
  if (!float32_tpu(input) || !float32_tpu(hx[0]) || !float32_tpu(hx[1])) return false;
  for (const at::Tensor& p : params) {
    if (!float32_tpu(p)) return false;
  }
  return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers_onednn(const at::Tensor& input_, at::TensorList hx,
                                                                  at::TensorList params, bool has_biases,
                                                                  int64_t num_layers, double dropout, bool train,
                                                                  bool bidirectional, bool batch_first) {
  const int64_t directions = bidirectional ? 2 : 1;
  const size_t per_layer = has_biases ? 4 : 2;
  TORCH_CHECK(params.size() == per_layer * num_layers * directions, "lstm: expected ",
              per_layer * num_layers * directions, " parameter tensors for ", num_layers, " layers, got ",
              params.size());
  TORCH_CHECK(input_.dim() == 3, "lstm: expected a 3-D input, got ", input_.sizes());
  const int64_t hidden_size = hx[0].size(2), batch = input_.size(batch_first ? 0 : 1);
  // oneDNN reads these shapes from its descriptors without checking the tensors: check here.
  for (const at::Tensor& state : hx) {
    TORCH_CHECK(state.sizes() == at::IntArrayRef({num_layers * directions, batch, hidden_size}),
                "lstm: expected hidden states of shape [", num_layers * directions, ", ", batch, ", ", hidden_size,
                "], got ", state.sizes());
  }
  for (int64_t index = 0; index < num_layers * directions; ++index) {
    const int64_t layer_input_size = index < directions ? input_.size(2) : hidden_size * directions;
    const at::Tensor* w = &params[index * per_layer];
    TORCH_CHECK(w[0].sizes() == at::IntArrayRef({4 * hidden_size, layer_input_size}) &&
                    w[1].sizes() == at::IntArrayRef({4 * hidden_size, hidden_size}) &&
                    (!has_biases || (w[2].sizes() == at::IntArrayRef({4 * hidden_size}) &&
                                     w[3].sizes() == at::IntArrayRef({4 * hidden_size}))),
                "lstm: expected the weights of layer ", index / directions, " of shapes [", 4 * hidden_size, ", ",
                layer_input_size, "] and [", 4 * hidden_size, ", ", hidden_size, "]",
                has_biases ? " and biases of shape [" + std::to_string(4 * hidden_size) + "]" : std::string(),
                ", got ", w[0].sizes(), " and ", w[1].sizes());
  }
  at::Tensor layer_input = (batch_first ? input_.transpose(0, 1) : input_).contiguous();
  const at::Tensor h0 = hx[0].contiguous(), c0 = hx[1].contiguous();
  std::vector<at::Tensor> hy, cy, outputs(directions);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      const at::Tensor* w = &params[index * per_layer];
      // Without biases oneDNN still reads a bias argument; ATen passes zeros it never uses.
      at::Tensor no_bias = has_biases ? at::Tensor() : at::zeros({w[0].size(0)}, w[0].options());
      auto [output, h, c, workspace] =
          at::mkldnn_rnn_layer(layer_input, w[0], w[1], has_biases ? w[2] : no_bias, has_biases ? w[3] : no_bias,
                               h0[index], c0[index], /*reverse=*/direction == 1, /*batch_sizes=*/{}, kOneDnnLstm,
                               hidden_size, num_layers, has_biases, bidirectional, batch_first, train);
      outputs[direction] = std::move(output);
      hy.push_back(std::move(h));
      cy.push_back(std::move(c));
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout != 0 && train && layer < num_layers - 1) layer_input = at::dropout(layer_input, dropout, true);
  }
  at::Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
  return {std::move(output), at::stack(hy, 0), at::stack(cy, 0)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm(const at::Tensor& input, at::TensorList hx, at::TensorList params,
                                                    bool has_biases, int64_t num_layers, double dropout, bool train,
                                                    bool bidirectional, bool batch_first) {
  if (takes_onednn(input, hx, params)) {
    return lstm_layers_onednn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
}

// The autograd key for calls that record a graph; the backend key for those under
// torch.inference_mode, which skip autograd keys.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("lstm.input", TORCH_FN(lstm)); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("lstm.input", TORCH_FN(lstm)); }

}  // namespace
}  // namespace torch_tpu
