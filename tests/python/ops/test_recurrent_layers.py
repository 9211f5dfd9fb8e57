"""nn.LSTM, nn.GRU and nn.RNN on tpu run CPU eager's route (csrc/aten/ops_recurrent_layers.cc).

CPU eager runs float32 LSTM layers without projections in oneDNN's `mkldnn_rnn_layer`, and every
other layer as one input projection for the whole sequence followed by each step's cell in
in-place ops. The tpu takes the same route for the same calls, so its values and gradients equal
CPU eager's bit for bit. Packed sequences keep ATen's step-by-step composite with the fused cells
and agree to float32 rounding (test_recurrent_cells.py holds the cells' tests).
"""

import copy
import functools

import pytest
import torch
import torch.nn as nn
from torch.profiler import profile

import torch_tpu  # noqa: F401


def _run(module, x, state, device):
    """Forward and backward of `module` on copies of x and state (a tensor, or LSTM's pair, or
    None) on `device`: outputs and gradients, on the CPU."""
    module = copy.deepcopy(module).to(device)
    x = x.detach().clone().to(device).requires_grad_()
    if isinstance(state, tuple):
        state = tuple(s.detach().clone().to(device).requires_grad_() for s in state)
    elif state is not None:
        state = state.detach().clone().to(device).requires_grad_()
    out, final = module(x, state)
    results = [out, *(final if isinstance(final, tuple) else (final,))]
    torch.manual_seed(1)
    sum((t * torch.randn(t.shape).to(t.dtype).to(device)).sum() for t in results).backward()
    states = state if isinstance(state, tuple) else (state,) if state is not None else ()
    grads = [x.grad] + [s.grad for s in states] + [p.grad for p in module.parameters()]
    return [t.detach().cpu() for t in (*results, *grads)]


def _ran(op, fn):
    with profile() as prof:
        fn()
        torch.tpu.synchronize()
    return any(e.name == op for e in prof.events())


LAYERS = {
    "lstm": (nn.LSTM, dict()),
    "lstm two layers": (nn.LSTM, dict(num_layers=2)),
    "lstm bidirectional batch_first": (nn.LSTM, dict(num_layers=2, bidirectional=True, batch_first=True)),
    "lstm without bias": (nn.LSTM, dict(bias=False)),
    "lstm eval with dropout": (nn.LSTM, dict(num_layers=2, dropout=0.5)),
    "lstm with projections": (nn.LSTM, dict(num_layers=2, proj_size=5)),
    "lstm with projections bidirectional without bias": (nn.LSTM, dict(proj_size=5, bidirectional=True, bias=False)),
    "gru": (nn.GRU, dict()),
    "gru bidirectional batch_first": (nn.GRU, dict(num_layers=2, bidirectional=True, batch_first=True)),
    "gru without bias": (nn.GRU, dict(bias=False)),
    "rnn tanh": (nn.RNN, dict(num_layers=2)),
    "rnn relu bidirectional": (nn.RNN, dict(nonlinearity="relu", bidirectional=True)),
}


def _inputs(cls, kwargs, with_state, dtype=torch.float32):
    shape = (3, 5, 6) if kwargs.get("batch_first") else (5, 3, 6)
    x = torch.randn(shape, dtype=dtype)
    if not with_state:
        return x, None
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    h = torch.randn(layers, 3, kwargs.get("proj_size") or 8, dtype=dtype)
    return x, ((h, torch.randn(layers, 3, 8, dtype=dtype)) if cls is nn.LSTM else h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_equal_cpu_eager_bit_for_bit(name, with_state, dtype):
    cls, kwargs = LAYERS[name]
    torch.manual_seed(0)
    module = cls(6, 8, **kwargs).to(dtype)
    if "dropout" in kwargs:
        module.eval()
    x, state = _inputs(cls, kwargs, with_state, dtype)
    want = _run(module, x, state, "cpu")
    got = _run(module, x, state, "tpu")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_routes():
    torch.manual_seed(0)
    x = torch.randn(4, 2, 3, device="tpu")
    onednn, lstm_cell, gru_cell = "aten::mkldnn_rnn_layer", "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_gru_cell"
    assert _ran(onednn, lambda: nn.LSTM(3, 5).to("tpu")(x))
    for module in (nn.LSTM(3, 5, proj_size=2).to("tpu"), nn.LSTM(3, 5).double().to("tpu")):
        call = functools.partial(module, x.to(next(module.parameters()).dtype))
        assert not _ran(onednn, call)
        assert not _ran(lstm_cell, call)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not _ran(onednn, lambda: nn.LSTM(3, 5).to("tpu")(x))
    assert not _ran(gru_cell, lambda: nn.GRU(3, 5).to("tpu")(x))
    # packed sequences keep ATen's composite, with the fused cells
    packed = nn.utils.rnn.pack_padded_sequence(x, [4, 3])
    assert _ran(gru_cell, lambda: nn.GRU(3, 5).to("tpu")(packed))


def test_with_onednn_turned_off_values_still_equal_cpu():
    torch.manual_seed(0)
    module, x = nn.LSTM(6, 8, num_layers=2), torch.randn(5, 3, 6)
    with torch.backends.mkldnn.flags(enabled=False):
        want, got = _run(module, x, None, "cpu"), _run(module, x, None, "tpu")
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_dropout_between_layers_in_training():
    # p=1 drops the whole first layer's output, so both devices feed zeros to the second layer.
    torch.manual_seed(0)
    module, x = nn.LSTM(4, 6, num_layers=2, dropout=1.0), torch.randn(5, 2, 4)
    for g, w in zip(_run(module, x, None, "tpu"), _run(module, x, None, "cpu")):
        assert torch.equal(g, w)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
def test_without_autograd(grad_mode, cls):
    torch.manual_seed(0)
    module, x = cls(4, 6, num_layers=2), torch.randn(5, 2, 4)
    context = torch.no_grad if grad_mode == "no_grad" else torch.inference_mode
    with context():
        want = module(x)[0]
        got = copy.deepcopy(module).to("tpu")(x.to("tpu"))[0]
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_double_backward(cls):
    torch.manual_seed(0)
    module, x = cls(4, 6, num_layers=2), torch.randn(5, 2, 4)
    results = []
    for device in ("cpu", "tpu"):
        m, xi = copy.deepcopy(module).to(device), x.clone().to(device).requires_grad_()
        (g,) = torch.autograd.grad(m(xi)[0].square().sum(), xi, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), xi)
        results.append((g.detach().cpu(), gg.cpu()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_packed_sequence_matches_cpu():
    torch.manual_seed(0)
    module = nn.LSTM(4, 6)
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 4), [5, 4, 2])
    want = module(packed)[0].data
    got = copy.deepcopy(module).to("tpu")(packed.to("tpu"))[0].data
    torch.testing.assert_close(got.cpu(), want, rtol=2e-5, atol=2e-5)


def _raw_lstm(x, h, params, num_layers=2):
    return torch.lstm(x, h, params, True, num_layers, 0.0, True, False, False)


@pytest.mark.parametrize(
    "case,match",
    [
        # CPU eager's oneDNN route reads these out of bounds and returns values; tpu raises.
        ("hidden state of another batch", "hidden states of shape"),
        ("input of another width", "weights of layer 0"),
        ("too few parameters", "8 parameter tensors"),
    ],
)
def test_bad_arguments_raise_at_the_call(case, match):
    torch.manual_seed(0)
    params = [p.to("tpu") for p in nn.LSTM(4, 6, num_layers=2)._flat_weights]
    x = torch.randn(5, 2, 4, device="tpu")
    h = (torch.zeros(2, 2, 6, device="tpu"), torch.zeros(2, 2, 6, device="tpu"))
    if case == "hidden state of another batch":
        h = (torch.zeros(2, 3, 6, device="tpu"),) * 2
    elif case == "input of another width":
        x = x[:, :, :3]
    else:
        params = params[:5]
    with pytest.raises(RuntimeError, match=match):
        _raw_lstm(x, h, params)
    torch.tpu.synchronize()


GRU_BAD_ARGUMENTS = {
    "hidden state of another batch": lambda x, h, ps: (x, h[:, :1], ps),
    "too few parameters": lambda x, h, ps: (x, h, ps[:5]),
    "input of another width": lambda x, h, ps: (x[:, :, :3], h, ps),
    "empty sequence": lambda x, h, ps: (x[:0], h, ps),
}


@pytest.mark.parametrize("case", list(GRU_BAD_ARGUMENTS))
def test_gru_bad_arguments_raise_at_the_call_as_on_cpu(case):
    torch.manual_seed(0)
    params = list(nn.GRU(4, 6, num_layers=2)._flat_weights)
    x, h = torch.randn(5, 2, 4), torch.zeros(2, 2, 6)
    errors = []
    for device in ("cpu", "tpu"):
        args = GRU_BAD_ARGUMENTS[case](x.to(device), h.to(device), [p.to(device) for p in params])
        with pytest.raises(RuntimeError) as error:
            torch.gru(*args, True, 2, 0.0, True, False, False)
        errors.append(str(error.value))
    assert errors[1] == errors[0]
    torch.tpu.synchronize()


# Found by a break-it pass.


@pytest.mark.parametrize("cell_state_shape", [(1,), (1, 6), ()])
def test_lstm_cell_state_of_too_few_dims_raises_as_on_cpu(cell_state_shape):
    # A 1-D or 2-D cell state broadcast through the cells and returned a made-up shape.
    torch.manual_seed(0)
    params = list(nn.LSTM(4, 6)._flat_weights)
    x, h, c = torch.randn(5, 2, 4), torch.zeros(1, 2, 6), torch.zeros(cell_state_shape)
    errors = []
    for device in ("cpu", "tpu"):
        with pytest.raises((RuntimeError, IndexError)) as error:
            torch.lstm(
                x.to(device),
                [h.to(device), c.to(device)],
                [p.to(device) for p in params],
                True,
                1,
                0.0,
                False,
                False,
                False,
            )
        errors.append(error.type)
    assert errors[1] is errors[0]
    torch.tpu.synchronize()


def test_lstm_under_autocast_equals_cpu_autocast():
    # The float32 oneDNN route ignored autocast (mkldnn_rnn_layer is on no tpu autocast list);
    # under autocast the layer takes the composite route, whose products autocast to bf16. The
    # oracle: CPU autocast on the same route (oneDNN off; the CPU's oneDNN LSTM needs bf16 units).
    torch.manual_seed(0)
    module, x = nn.LSTM(6, 8, num_layers=2), torch.randn(5, 3, 6)
    with torch.backends.mkldnn.flags(enabled=False), torch.autocast("cpu", dtype=torch.bfloat16):
        want = module(x)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = copy.deepcopy(module).to("tpu")(x.to("tpu"))
    plain = module(x)[0]
    assert not torch.allclose(want[0], plain, rtol=1e-4, atol=1e-4)  # the products did run in bf16
    for g, w in zip((got[0], *got[1]), (want[0], *want[1])):
        assert g.dtype == w.dtype
        assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("num_layers", [0, -1])
@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_num_layers_below_one_raises_at_the_call(op, num_layers):
    params = [p.to("tpu") for p in (nn.LSTM if op == "lstm" else nn.GRU)(4, 6)._flat_weights]
    x, h = torch.randn(5, 2, 4, device="tpu"), torch.zeros(1, 2, 6, device="tpu")
    state = [h, h] if op == "lstm" else h
    with pytest.raises(RuntimeError, match="num_layers"):
        getattr(torch, op)(x, state, params, True, num_layers, 0.0, True, False, False)
    torch.tpu.synchronize()


def test_wrong_bias_shape_is_named():
    params = [p.to("tpu") for p in nn.LSTM(4, 6)._flat_weights]
    params[2] = torch.zeros(7, device="tpu")
    h = torch.zeros(1, 2, 6, device="tpu")
    with pytest.raises(RuntimeError, match=r"biases of shape \[24\], got .*\[7\]"):
        torch.lstm(torch.randn(5, 2, 4, device="tpu"), [h, h], params, True, 1, 0.0, True, False, False)
    torch.tpu.synchronize()
