"""nn.LSTMCell, nn.GRUCell and the fused cell kernels on tpu (csrc/aten/ops_rnn.cc).

ATen's cells take the fused cell kernels (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell` and
their backward) for any device but the CPU; those have CUDA kernels only, so on tpu every cell
raised NotImplementedError. The layers (nn.LSTM, nn.GRU) take CPU eager's route on tpu
(test_recurrent_layers.py) except for packed sequences and while tracing, which use these cells.
CPU eager (ATen's unfused cells) is the oracle: values and gradients agree to float32 rounding
(the gates' sums run in another order).
"""

import pytest
import torch
import torch.nn as nn

import torch_tpu

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def _pair(make, dtype=torch.float32):
    torch.manual_seed(0)
    cpu = make().to(dtype)
    tpu = make().to(dtype)
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


def _run(module, args):
    """Forward on `args`, backward of a weighted sum of the outputs; returns outputs and grads."""
    args = [
        a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args
    ]
    out = module(*args)
    flat = []
    for o in out if isinstance(out, tuple) else (out,):
        flat.extend(o if isinstance(o, tuple) else (o,))
    torch.manual_seed(1)
    loss = sum((o * torch.randn(o.shape, dtype=o.dtype).to(o.device)).sum() for o in flat)
    loss.backward()
    grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads += [p.grad for p in module.parameters()]
    return [o.detach().cpu() for o in flat], [g.cpu() for g in grads]


def _compare(cpu_module, tpu_module, args, dtype=torch.float32):
    cpu_out, cpu_grads = _run(cpu_module, args)
    tpu_out, tpu_grads = _run(tpu_module, [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
    assert len(tpu_out) == len(cpu_out) and len(tpu_grads) == len(cpu_grads)
    for got, want in zip(tpu_out + tpu_grads, cpu_out + cpu_grads):
        torch.testing.assert_close(got, want, **TOL[dtype])


class _StateAsArguments(nn.Module):
    """`module(x, (h, c))` (LSTM) or `module(x, h)` (GRU) with the state as separate arguments, so
    that _run gives each its own gradient."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x, h, c=None):
        return self.module(x, h if c is None else (h, c))


CELLS = {
    "lstm cell": (lambda: nn.LSTMCell(5, 9), True),
    "lstm cell without bias": (lambda: nn.LSTMCell(5, 9, bias=False), True),
    "gru cell": (lambda: nn.GRUCell(5, 9), False),
    "gru cell without bias": (lambda: nn.GRUCell(5, 9, bias=False), False),
}


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("with_state", [False, True])
def test_cell_values_and_gradients_match_cpu(name, with_state):
    make, lstm = CELLS[name]
    cpu, tpu = _pair(make)
    torch.manual_seed(4)
    args = [torch.randn(3, 5)]
    if with_state:
        h = torch.randn(3, 9)
        args.append((h, torch.randn(3, 9)) if lstm else h)
    if with_state and lstm:
        _compare(_StateAsArguments(cpu), _StateAsArguments(tpu), [args[0], *args[1]])
    else:
        _compare(cpu, tpu, args)


def test_unbatched_cell_and_layer():
    cpu, tpu = _pair(lambda: nn.LSTMCell(4, 6))
    torch.manual_seed(5)
    _compare(cpu, tpu, [torch.randn(4)])
    cpu, tpu = _pair(lambda: nn.GRU(4, 6))
    _compare(cpu, tpu, [torch.randn(7, 4)])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_only_the_final_state_needs_a_gradient(kind):
    # LSTM: the backward gets grad_hy undefined for steps whose output is unused (only cy's).
    cpu, tpu = _pair(lambda: (nn.LSTM if kind == "lstm" else nn.GRU)(3, 4))
    torch.manual_seed(6)
    x = torch.randn(4, 2, 3)
    results = []
    for module, dev in ((cpu, "cpu"), (tpu, "tpu")):
        xi = x.detach().to(dev).requires_grad_()
        _, state = module(xi)
        last = state[1] if kind == "lstm" else state  # the cell state alone for LSTM
        last.sum().backward()
        results.append([xi.grad.cpu()] + [p.grad.cpu() for p in module.parameters()])
    for got, want in zip(*reversed(results)):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_double_backward(kind):
    # create_graph=True takes ATen's differentiable cell backward (tpu ops) instead of the fused one.
    cell = (lambda: nn.LSTMCell(3, 4)) if kind == "lstm" else (lambda: nn.GRUCell(3, 4))
    cpu, tpu = _pair(cell, torch.float64)
    torch.manual_seed(7)
    x = torch.randn(2, 3, dtype=torch.float64)
    results = []
    for module, dev in ((cpu, "cpu"), (tpu, "tpu")):
        xi = x.detach().to(dev).requires_grad_()
        out = module(xi)
        y = (out[0] if kind == "lstm" else out).square().sum()
        (g,) = torch.autograd.grad(y, xi, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), xi)
        results.append((g.detach().cpu(), gg.cpu()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, **TOL[torch.float64])


@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_fused_cell_rejects_mismatched_shapes_at_the_call(op):
    ig = torch.randn(3, 12, device="tpu")
    bad_hidden = torch.randn(3, 8, device="tpu")
    state = torch.randn(3, 3 if op == "lstm" else 4, device="tpu")
    fused = torch.ops.aten._thnn_fused_lstm_cell if op == "lstm" else torch.ops.aten._thnn_fused_gru_cell
    with pytest.raises(RuntimeError, match=f"_thnn_fused_{op}_cell"):
        fused(ig, bad_hidden, state)
    with pytest.raises(RuntimeError, match=f"_thnn_fused_{op}_cell"):
        fused(ig, ig, torch.randn(3, 5, device="tpu"))  # state of the wrong width
    with pytest.raises(RuntimeError, match=f"_thnn_fused_{op}_cell"):
        fused(ig, ig, state, torch.randn(5, device="tpu"))  # bias of the wrong length


def test_fused_lstm_cell_workspace_holds_the_activated_gates():
    torch.manual_seed(9)
    ig, hg, cx, bi, bh = torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 2), torch.randn(8), torch.randn(8)
    hy, cy, workspace = torch.ops.aten._thnn_fused_lstm_cell(*(t.to("tpu") for t in (ig, hg, cx, bi, bh)))
    gates = (ig + hg + bi + bh).chunk(4, 1)
    i, f, g, o = gates[0].sigmoid(), gates[1].sigmoid(), gates[2].tanh(), gates[3].sigmoid()
    want_cy = f * cx + i * g
    torch.testing.assert_close(cy.cpu(), want_cy)
    torch.testing.assert_close(hy.cpu(), o * want_cy.tanh())
    torch.testing.assert_close(workspace.cpu(), torch.cat([i, f, g, o], 1))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_packed_layers(kind):
    cpu, tpu = _pair(lambda: (nn.LSTM if kind == "lstm" else nn.GRU)(6, 8, num_layers=2, bidirectional=True))
    torch.manual_seed(12)
    x = torch.randn(5, 3, 6)
    packed = nn.utils.rnn.pack_padded_sequence(x, [5, 4, 2])
    want = cpu(packed)[0].data
    got = tpu(packed.to("tpu"))[0].data
    torch.testing.assert_close(got.cpu(), want, **TOL[torch.float32])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_layer_in_defer_and_fuse(kind):
    cpu, tpu = _pair(lambda: (nn.LSTM if kind == "lstm" else nn.GRU)(6, 8, num_layers=2))
    torch.manual_seed(10)
    x = torch.randn(5, 3, 6)
    with torch_tpu.eager_mode("defer_and_fuse"):
        _compare(cpu, tpu, [x])


@pytest.mark.parametrize("allow_rnn", [False, True])
def test_layer_under_torch_compile(allow_rnn, monkeypatch):
    # Dynamo runs RNN modules eagerly between graphs unless allow_rnn; with it, the fused cells are
    # traced into the programs (library calls through these kernels).
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", allow_rnn)
    torch._dynamo.reset()
    cpu, tpu = _pair(lambda: nn.LSTM(6, 8, num_layers=2))
    torch.manual_seed(11)
    x = torch.randn(5, 3, 6)
    want, _ = cpu(x)
    want.sum().backward()
    got, _ = torch.compile(tpu, backend="tpu")(x.to("tpu"))
    got.sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL[torch.float32])
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL[torch.float32])
    torch._dynamo.reset()


# Found by a break-it pass (direct calls of the fused ops): each raises at the call, naming the op.
A = torch.ops.aten


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="tpu").to(dtype)


@pytest.mark.parametrize(
    "call,match",
    [
        # a workspace narrower than 4H crashed the process (chunk gave fewer than 4 gates)
        (
            lambda: A._thnn_fused_lstm_cell_backward_impl(_t(3, 1), None, _t(3, 1), _t(3, 1), _t(3, 3), True),
            "workspace of shape",
        ),
        (
            lambda: A._thnn_fused_lstm_cell_backward_impl(_t(3, 4), _t(3, 4), _t(3, 4), _t(3, 4), _t(1, 3, 16), True),
            "workspace of shape",
        ),
        # broadcastable but wrong shapes were accepted
        (
            lambda: A._thnn_fused_lstm_cell_backward_impl(_t(3, 4), _t(3, 4), _t(1, 4), _t(3, 4), _t(3, 16), True),
            "one shape",
        ),
        (
            lambda: A._thnn_fused_lstm_cell_backward_impl(_t(3, 1), None, _t(3, 4), _t(3, 4), _t(3, 16), True),
            "one shape",
        ),
        (
            lambda: A._thnn_fused_lstm_cell_backward_impl(
                _t(3, 4), None, _t(3, 4), _t(3, 4), _t(3, 16, dtype=torch.int32), True
            ),
            "one dtype",
        ),
        (lambda: A._thnn_fused_gru_cell_backward(_t(3, 1), _t(3, 20), True), "workspace of shape"),
        (lambda: A._thnn_fused_gru_cell_backward(_t(3, 4, dtype=torch.float64), _t(3, 20), True), "one dtype"),
        # biases of another dtype: the GRU gave float64 results, the LSTM float32
        (
            lambda: A._thnn_fused_gru_cell(
                _t(3, 12), _t(3, 12), _t(3, 4), _t(12, dtype=torch.float64), _t(12, dtype=torch.float64)
            ),
            "one dtype",
        ),
        (
            lambda: A._thnn_fused_lstm_cell(
                _t(3, 16), _t(3, 16), _t(3, 4), _t(16, dtype=torch.int64), _t(16, dtype=torch.int64)
            ),
            "one dtype",
        ),
        # integer and complex gates
        (
            lambda: A._thnn_fused_lstm_cell(
                _t(3, 16, dtype=torch.int32), _t(3, 16, dtype=torch.int32), _t(3, 4, dtype=torch.int32)
            ),
            "not implemented for 'Int'",
        ),
        (
            lambda: A._thnn_fused_gru_cell(
                _t(3, 12, dtype=torch.complex64), _t(3, 12, dtype=torch.complex64), _t(3, 4, dtype=torch.complex64)
            ),
            "not implemented for 'ComplexFloat'",
        ),
        # a gate width that is no multiple of the gate count
        (lambda: A._thnn_fused_lstm_cell(_t(3, 15), _t(3, 15), _t(3, 3)), "multiple of 4"),
    ],
)
def test_fused_ops_reject_bad_arguments_at_the_call(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()
    torch.tpu.synchronize()
