// Recurrent layers (nn.LSTM, nn.GRU, nn.RNN) on tpu, run the way CPU eager runs them.
//
// ATen's `lstm`, `gru`, `rnn_tanh` and `rnn_relu` are composites that pick their route by
// device. On the CPU: float32 LSTM layers without projections go to oneDNN's whole-layer kernel
// (`mkldnn_rnn_layer`, with its own backward); other layers project the whole sequence's input
// in one product up front, then run each step's cell as a handful of in-place ops. On every
// other device: two small products per step and a fused cell kernel (CUDA's design). The vTPU's
// HBM is host memory, so the CPU's route is open to it and is the faster one here (one large
// product instead of one per step; oneDNN's fused LSTM). These kernels take it for tpu tensors:
// the same ops as CPU eager, so the same values bit for bit. `mkldnn_rnn_layer` runs as a CPU
// kernel on the chip's worker (op_info.cc lists it among the ops whose meta kernel disagrees
// with the CPU's: its workspace is empty there). Calls on fake or functional tensors (tracing)
// and symbolic shapes take ATen's composite, as before.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/gru_native.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mkldnn_rnn_layer.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/rnn_relu_native.h>
#include <ATen/ops/rnn_tanh_native.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <algorithm>
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
                                            c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper});
  return t.defined() && t.key_set().has(c10::DispatchKey::PrivateUse1) && !t.key_set().has_any(wrapped) &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

bool all_plain_tpu(const at::Tensor& input, at::TensorList states, at::TensorList params) {
  return plain_tpu(input) && std::all_of(states.begin(), states.end(), plain_tpu) &&
         std::all_of(params.begin(), params.end(), plain_tpu);
}

// ATen's own answer (torch.ops.mkldnn._is_mkldnn_bf16_supported / _fp16_supported): whether this
// CPU's oneDNN runs a half-precision dtype natively, which CPU eager's choice of route depends on.
bool onednn_runs_natively(at::ScalarType dtype) {
  auto query = [](const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<bool()>().call();
  };
  static const bool bf16 = query("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = query("mkldnn::_is_mkldnn_fp16_supported");
  return dtype == at::kBFloat16 ? bf16 : fp16;
}

// CPU eager's condition for an LSTM on oneDNN (use_mkldnn and has_projections in ATen's RNN.cpp).
// Under torch.autocast("tpu") the composite route instead: its products autocast as on every other
// path (mkldnn_rnn_layer is on none of the tpu's autocast lists, which are CUDA's).
bool takes_onednn(const at::Tensor& input, at::TensorList hx) {
  if (!at::globalContext().userEnabledMkldnn() || input.numel() == 0) return false;
  if (at::autocast::is_autocast_enabled(c10::DeviceType::PrivateUse1)) return false;
  if (hx[0].size(2) != hx[1].size(2)) return false;
  switch (input.scalar_type()) {
    case at::kFloat:
      return true;
    case at::kBFloat16:
      return onednn_runs_natively(at::kBFloat16);
    case at::kHalf:
      return !c10::GradMode::is_enabled() && onednn_runs_natively(at::kHalf);
    default:
      return false;
  }
}

void check_parameter_count(const char* op, at::TensorList params, int64_t per_layer, int64_t num_layers,
                           int64_t directions) {
  TORCH_CHECK(num_layers >= 1, op, ": expected num_layers of at least 1, got ", num_layers);
  TORCH_CHECK(static_cast<int64_t>(params.size()) == per_layer * num_layers * directions, op, ": expected ",
              per_layer * num_layers * directions, " parameter tensors for ", num_layers, " layers, got ",
              params.size());
}

std::string shapes_of(const at::Tensor* tensors, int64_t count) {
  std::string shapes;
  for (int64_t i = 0; i < count; ++i) {
    shapes += (i ? (i + 1 == count ? " and " : ", ") : "") + c10::str(tensors[i].sizes());
  }
  return shapes;
}

// A recurrent state: h, and c for an LSTM.
struct State {
  at::Tensor h, c;
};

// The layers over `input_` ([T, B, I], or [B, T, I] batch_first), as ATen stacks them for both
// routes: each layer's directions (`run(layer_input [T, B, I'], index, reverse)`, giving that
// direction's outputs [T, B, H'] and last state) concatenated, dropout between layers in
// training. Returns the output and the final states stacked in index order (c undefined
// without cell states).
template <typename RunDirection>
std::tuple<at::Tensor, at::Tensor, at::Tensor> stack_layers(const at::Tensor& input_, int64_t num_layers,
                                                            int64_t directions, double dropout, bool train,
                                                            bool batch_first, const RunDirection& run) {
  at::Tensor layer_input = batch_first ? input_.transpose(0, 1) : input_;
  std::vector<at::Tensor> final_h, final_c, outputs(directions);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (int64_t direction = 0; direction < directions; ++direction) {
      auto [output, state] = run(layer_input, layer * directions + direction, direction == 1);
      outputs[direction] = std::move(output);
      final_h.push_back(std::move(state.h));
      if (state.c.defined()) final_c.push_back(std::move(state.c));
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout != 0 && train && layer < num_layers - 1) layer_input = at::dropout(layer_input, dropout, true);
  }
  at::Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
  return {std::move(output), at::stack(final_h, 0), final_c.empty() ? at::Tensor() : at::stack(final_c, 0)};
}

// ---- CPU eager's route for an LSTM: oneDNN's whole-layer kernel per layer and direction.

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers_onednn(const at::Tensor& input_, at::TensorList hx,
                                                                  at::TensorList params, bool has_biases,
                                                                  int64_t num_layers, double dropout, bool train,
                                                                  bool bidirectional, bool batch_first) {
  const int64_t directions = bidirectional ? 2 : 1;
  const int64_t per_layer = has_biases ? 4 : 2;
  check_parameter_count("lstm", params, per_layer, num_layers, directions);
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
                has_biases ? " and biases of shape [" + std::to_string(4 * hidden_size) + "]" : std::string(), ", got ",
                shapes_of(w, per_layer));
  }
  const at::Tensor h0 = hx[0].contiguous(), c0 = hx[1].contiguous();
  auto run = [&](const at::Tensor& layer_input, int64_t index, bool reverse) {
    const at::Tensor* w = &params[index * per_layer];
    // Without biases oneDNN still reads a bias argument; ATen passes zeros it never uses.
    at::Tensor no_bias = has_biases ? at::Tensor() : at::zeros({w[0].size(0)}, w[0].options());
    auto [output, h, c, workspace] =
        at::mkldnn_rnn_layer(layer_input.contiguous(), w[0], w[1], has_biases ? w[2] : no_bias,
                             has_biases ? w[3] : no_bias, h0[index], c0[index], reverse, /*batch_sizes=*/{},
                             kOneDnnLstm, hidden_size, num_layers, has_biases, bidirectional, batch_first, train);
    return std::make_pair(std::move(output), State{std::move(h), std::move(c)});
  };
  return stack_layers(input_, num_layers, directions, dropout, train, batch_first, run);
}

// ---- CPU eager's route for every other layer: the whole sequence's input projection up front,
// then each step's cell as in-place ops (ATen's FullLayer and cells for CPU tensors).

enum class Cell { kLstm, kGru, kTanh, kRelu };

struct Weights {
  at::Tensor w_ih, w_hh, b_ih, b_hh, w_hr;  // biases and w_hr (LSTM projections) may be undefined
};

// One step from the biased input projection `x` ([B, gates * H]); the same ops in the same order
// as ATen's CPU cells, so the same bits.
State cell_step(Cell cell, const at::Tensor& x, const State& state, const Weights& w) {
  at::Tensor hidden = at::linear(state.h, w.w_hh, w.b_hh);
  switch (cell) {
    case Cell::kTanh:
      return {at::tanh(hidden.add_(x)), {}};
    case Cell::kRelu:
      return {at::relu(hidden.add_(x)), {}};
    case Cell::kGru: {
      const auto in = x.unsafe_chunk(3, 1);
      auto hid = hidden.unsafe_chunk(3, 1);
      const at::Tensor reset = hid[0].add_(in[0]).sigmoid_();
      const at::Tensor update = hid[1].add_(in[1]).sigmoid_();
      const at::Tensor candidate = in[2].add(hid[2].mul_(reset)).tanh_();
      return {(state.h - candidate).mul_(update).add_(candidate), {}};
    }
    case Cell::kLstm: {
      auto gates = hidden.add_(x).unsafe_chunk(4, 1);
      const at::Tensor input_gate = gates[0].sigmoid_();
      const at::Tensor forget_gate = gates[1].sigmoid_();
      const at::Tensor cell_gate = gates[2].tanh_();
      const at::Tensor output_gate = gates[3].sigmoid_();
      at::Tensor c = (forget_gate * state.c).add_(input_gate * cell_gate);
      at::Tensor h = output_gate * c.tanh();
      if (w.w_hr.defined()) h = at::matmul(h, w.w_hr.t());
      return {std::move(h), std::move(c)};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown cell");
}

// One direction of one layer over `input` [T, B, I]: the outputs [T, B, H'] and the last state.
std::pair<at::Tensor, State> run_direction(Cell cell, const at::Tensor& input, State state, const Weights& w,
                                           bool reverse) {
  std::vector<at::Tensor> steps = at::linear(input, w.w_ih, w.b_ih).unbind(0);
  TORCH_CHECK(!steps.empty(), "Expected sequence length to be larger than 0 in RNN");
  if (reverse) std::reverse(steps.begin(), steps.end());
  std::vector<at::Tensor> outputs;
  outputs.reserve(steps.size());
  for (const at::Tensor& x : steps) {
    state = cell_step(cell, x, state, w);
    outputs.push_back(state.h);
  }
  if (reverse) std::reverse(outputs.begin(), outputs.end());
  return {at::stack(outputs, 0), std::move(state)};
}

// The layers over `input_` from the initial states `h0` (and `c0`, LSTM), each [layers *
// directions, B, H]: the output and the final states stacked as h0 and c0.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layers_cpu_route(Cell cell, const at::Tensor& input_,
                                                                const at::Tensor& h0, const at::Tensor& c0,
                                                                at::TensorList params, bool has_biases,
                                                                int64_t num_layers, double dropout, bool train,
                                                                bool bidirectional, bool batch_first) {
  const int64_t directions = bidirectional ? 2 : 1;
  const bool projections = cell == Cell::kLstm && h0.size(2) != c0.size(2);  // LSTM: both 3-D
  const int64_t per_layer = (has_biases ? 4 : 2) + (projections ? 1 : 0);
  TORCH_CHECK(static_cast<int64_t>(params.size()) % per_layer == 0, "got an incorrect number of RNN parameters");
  check_parameter_count("rnn", params, per_layer, num_layers, directions);
  for (const at::Tensor& state : {h0, c0}) {
    TORCH_CHECK(!state.defined() || (state.dim() >= 1 && state.size(0) == num_layers * directions),
                "rnn: expected states with ", num_layers * directions, " layers and directions in dim 0, got ",
                state.sizes());
  }
  const std::vector<at::Tensor> hs = h0.unbind(0), cs = c0.defined() ? c0.unbind(0) : std::vector<at::Tensor>();
  auto run = [&](const at::Tensor& layer_input, int64_t index, bool reverse) {
    const at::Tensor* p = &params[index * per_layer];
    Weights w{p[0], p[1]};
    if (has_biases) w.b_ih = p[2], w.b_hh = p[3];
    if (projections) w.w_hr = p[per_layer - 1];
    return run_direction(cell, layer_input, State{hs[index], cs.empty() ? at::Tensor() : cs[index]}, w, reverse);
  };
  return stack_layers(input_, num_layers, directions, dropout, train, batch_first, run);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm(const at::Tensor& input, at::TensorList hx, at::TensorList params,
                                                    bool has_biases, int64_t num_layers, double dropout, bool train,
                                                    bool bidirectional, bool batch_first) {
  // Other ranks: ATen's composite, which raises CPU's errors for them.
  if (hx.size() != 2 || input.dim() != 3 || hx[0].dim() != 3 || hx[1].dim() != 3 || !all_plain_tpu(input, hx, params)) {
    return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  if (takes_onednn(input, hx)) {
    return lstm_layers_onednn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  return layers_cpu_route(Cell::kLstm, input, hx[0], hx[1], params, has_biases, num_layers, dropout, train,
                          bidirectional, batch_first);
}

template <Cell cell>
std::tuple<at::Tensor, at::Tensor> recurrent(const at::Tensor& input, const at::Tensor& hx, at::TensorList params,
                                             bool has_biases, int64_t num_layers, double dropout, bool train,
                                             bool bidirectional, bool batch_first) {
  if (all_plain_tpu(input, {hx}, params)) {
    auto [output, h, c] = layers_cpu_route(cell, input, hx, at::Tensor(), params, has_biases, num_layers, dropout,
                                           train, bidirectional, batch_first);
    return {std::move(output), std::move(h)};
  }
  using Layers = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&, at::TensorList, bool,
                                                        int64_t, double, bool, bool, bool);
  const Layers composite = cell == Cell::kGru    ? static_cast<Layers>(&at::native::gru)
                           : cell == Cell::kTanh ? static_cast<Layers>(&at::native::rnn_tanh)
                                                 : static_cast<Layers>(&at::native::rnn_relu);
  return composite(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
}

// The autograd key for calls that record a graph; the backend key for those under
// torch.inference_mode, which skip autograd keys.
#define TPU_RECURRENT_LAYERS(m)                               \
  m.impl("lstm.input", TORCH_FN(lstm));                       \
  m.impl("gru.input", TORCH_FN(recurrent<Cell::kGru>));       \
  m.impl("rnn_tanh.input", TORCH_FN(recurrent<Cell::kTanh>)); \
  m.impl("rnn_relu.input", TORCH_FN(recurrent<Cell::kRelu>))

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { TPU_RECURRENT_LAYERS(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { TPU_RECURRENT_LAYERS(m); }

}  // namespace
}  // namespace torch_tpu
