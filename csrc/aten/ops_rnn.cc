// The fused LSTM and GRU cells on tpu.
//
// ATen's recurrent layers (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell) compute each step as two
// matrix products and, on any device but the CPU, one fused cell kernel for the rest:
// `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` forward, and `_thnn_fused_lstm_cell_backward_impl`
// / `_thnn_fused_gru_cell_backward` when autograd runs without create_graph (with it, ATen's
// differentiable composite backward runs instead). Those kernels exist for CUDA only, so the
// fallback has no CPU kernel to run. Here each is the cell's arithmetic in tpu ops, queued on the
// stream (and fused in defer_and_fuse) like any other: the same values as CPU eager's unfused
// cells to float32 rounding. The workspaces keep CUDA's layout, since ATen's backward reads them:
// LSTM [B, 4H] = the activated gates (input, forget, cell, output); GRU [B, 5H] = reset gate,
// update gate, new gate, hx, and the hidden part of the new gate (with its bias).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace torch_tpu {
namespace {

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// CUDA's kernels take float64, float32, float16 and bfloat16, every tensor of one dtype.
void check_dtypes(const char* op, const std::vector<const at::Tensor*>& tensors) {
  const at::ScalarType dtype = tensors.front()->scalar_type();
  TORCH_CHECK(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
              " not implemented for '", dtype, "'");
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->scalar_type() == dtype, op, ": expected every tensor of one dtype, got ", dtype, " and ",
                t->scalar_type());
  }
}

// CUDA's checks (checkSizes in RNN.cu), with the op named: gates [B, gates_per_unit * H], the
// state [B, H], biases [gates_per_unit * H].
void check_cell_arguments(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                          const at::Tensor& state, const std::optional<at::Tensor>& input_bias,
                          const std::optional<at::Tensor>& hidden_bias, int64_t gates_per_unit) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes(), op,
              ": expected input_gates and hidden_gates of the same 2-D shape, got ", input_gates.sizes(), " and ",
              hidden_gates.sizes());
  TORCH_CHECK(input_gates.size(1) % gates_per_unit == 0, op, ": expected gates whose width is a multiple of ",
              gates_per_unit, ", got ", input_gates.sizes());
  const int64_t units = input_gates.size(1) / gates_per_unit;
  TORCH_CHECK(state.dim() == 2 && state.size(0) == input_gates.size(0) && state.size(1) == units, op,
              ": expected the state of shape [", input_gates.size(0), ", ", units, "] for gates of shape ",
              input_gates.sizes(), ", got ", state.sizes());
  TORCH_CHECK(defined(input_bias) == defined(hidden_bias), op, ": expected both biases or neither");
  std::vector<const at::Tensor*> tensors{&input_gates, &hidden_gates, &state};
  for (const std::optional<at::Tensor>* bias : {&input_bias, &hidden_bias}) {
    if (!defined(*bias)) continue;
    TORCH_CHECK((*bias)->dim() == 1 && (*bias)->size(0) == input_gates.size(1), op, ": expected biases of shape [",
                input_gates.size(1), "], got ", (*bias)->sizes());
    tensors.push_back(&**bias);
  }
  check_dtypes(op, tensors);
}

// A backward kernel's inputs: states and gradients of one shape [B, H] (`shaped`, all defined)
// and a workspace of shape [B, parts * H], every tensor of one floating dtype.
void check_backward_arguments(const char* op, const at::Tensor& workspace, int64_t parts,
                              std::vector<const at::Tensor*> shaped) {
  const at::Tensor& first = *shaped.front();
  TORCH_CHECK(first.dim() == 2, op, ": expected 2-D states and gradients, got ", first.sizes());
  for (const at::Tensor* t : shaped) {
    TORCH_CHECK(t->sizes() == first.sizes(), op, ": expected states and gradients of one shape, got ", first.sizes(),
                " and ", t->sizes());
  }
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) == first.size(0) && workspace.size(1) == parts * first.size(1),
              op, ": expected a workspace of shape [", first.size(0), ", ", parts * first.size(1), "], got ",
              workspace.sizes());
  shaped.push_back(&workspace);
  check_dtypes(op, shaped);
}

// input_gates + hidden_gates (+ input_bias + hidden_bias), in CUDA's order; a new tensor.
at::Tensor gate_sums(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                     const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = input_gates + hidden_gates;
  if (defined(input_bias)) gates.add_(*input_bias).add_(*hidden_bias);
  return gates;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  check_cell_arguments("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  // Activated in place: the gates tensor becomes the workspace.
  at::Tensor workspace = gate_sums(input_gates, hidden_gates, input_bias, hidden_bias);
  auto gates = workspace.chunk(4, 1);
  const at::Tensor& in = gates[0].sigmoid_();
  const at::Tensor& forget = gates[1].sigmoid_();
  const at::Tensor& cell = gates[2].tanh_();
  const at::Tensor& out = gates[3].sigmoid_();
  at::Tensor cy = forget * cx;
  cy.add_(in * cell);  // CPU's cell's order (addcmul may round once)
  at::Tensor hy = out * cy.tanh();
  return {std::move(hy), std::move(cy), std::move(workspace)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                        const std::optional<at::Tensor>& grad_cy,
                                                                        const at::Tensor& cx, const at::Tensor& cy,
                                                                        const at::Tensor& workspace, bool has_bias) {
  if (!defined(grad_hy) && !defined(grad_cy)) return {};  // as CUDA: nothing flows back
  std::vector<const at::Tensor*> shaped{&cx, &cy};
  for (const std::optional<at::Tensor>* grad : {&grad_hy, &grad_cy}) {
    if (defined(*grad)) shaped.push_back(&**grad);
  }
  check_backward_arguments("_thnn_fused_lstm_cell_backward_impl", workspace, 4, std::move(shaped));
  auto gates = workspace.chunk(4, 1);
  const at::Tensor &in = gates[0], &forget = gates[1], &cell = gates[2], &out = gates[3];
  const at::Tensor tanh_cy = cy.tanh();
  at::Tensor grad_c;  // d loss / d cy, through hy and directly
  at::Tensor grad_out;
  if (defined(grad_hy)) {
    grad_c = *grad_hy * out * (1 - tanh_cy * tanh_cy);
    grad_out = *grad_hy * tanh_cy * out * (1 - out);
    if (defined(grad_cy)) grad_c.add_(*grad_cy);
  } else {
    grad_c = grad_cy->clone();
    grad_out = at::zeros_like(out);
  }
  at::Tensor grad_in = grad_c * cell * in * (1 - in);
  at::Tensor grad_forget = grad_c * cx * forget * (1 - forget);
  at::Tensor grad_cell = grad_c * in * (1 - cell * cell);
  at::Tensor grad_gates = at::cat({grad_in, grad_forget, grad_cell, grad_out}, 1);
  at::Tensor grad_cx = grad_c * forget;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {std::move(grad_gates), std::move(grad_cx), std::move(grad_bias)};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  check_cell_arguments("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  const at::Tensor input_part = defined(input_bias) ? input_gates + *input_bias : input_gates;
  const at::Tensor hidden_part = defined(hidden_bias) ? hidden_gates + *hidden_bias : hidden_gates;
  auto in = input_part.chunk(3, 1);
  auto hidden = hidden_part.chunk(3, 1);
  at::Tensor reset = (in[0] + hidden[0]).sigmoid_();
  at::Tensor update = (in[1] + hidden[1]).sigmoid_();
  at::Tensor new_gate = (in[2] + reset * hidden[2]).tanh_();
  at::Tensor hy = new_gate + update * (hx - new_gate);
  at::Tensor workspace = at::cat({reset, update, new_gate, hx, hidden[2]}, 1);
  return {std::move(hy), std::move(workspace)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  check_backward_arguments("_thnn_fused_gru_cell_backward", workspace, 5, {&grad_hy});
  auto parts = workspace.chunk(5, 1);
  const at::Tensor &reset = parts[0], &update = parts[1], &new_gate = parts[2], &hx = parts[3], &hidden_new = parts[4];
  at::Tensor grad_hx = grad_hy * update;
  at::Tensor grad_new = grad_hy * (1 - update) * (1 - new_gate * new_gate);
  at::Tensor grad_update = grad_hy * (hx - new_gate) * update * (1 - update);
  at::Tensor grad_reset = grad_new * hidden_new * reset * (1 - reset);
  at::Tensor grad_input_gates = at::cat({grad_reset, grad_update, grad_new}, 1);
  at::Tensor grad_hidden_gates = at::cat({grad_reset, grad_update, grad_new * reset}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {std::move(grad_input_gates), std::move(grad_hidden_gates), std::move(grad_hx), std::move(grad_input_bias),
          std::move(grad_hidden_bias)};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace
}  // namespace torch_tpu
