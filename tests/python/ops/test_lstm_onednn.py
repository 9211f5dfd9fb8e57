"""nn.LSTM on tpu through oneDNN's whole-layer kernel, as on the CPU (csrc/aten/ops_lstm_layer.cc).

CPU eager runs float32 LSTM layers without projections in oneDNN's `mkldnn_rnn_layer`; the tpu
takes the same route for the same calls, so its values and gradients equal CPU eager's bit for
bit. Other calls (float64, projections, oneDNN turned off, packed sequences) keep ATen's
step-by-step composite and agree to float32 rounding (test_recurrent_cells.py).
"""

import copy

import pytest
import torch
import torch.nn as nn
from torch.profiler import profile

import torch_tpu  # noqa: F401


def _run(module, x, state, device):
    """Forward and backward of `module` on copies of x and state on `device`: outputs and grads."""
    module = copy.deepcopy(module).to(device)
    x = x.detach().clone().to(device).requires_grad_()
    state = tuple(s.detach().clone().to(device).requires_grad_() for s in state) if state else None
    out, (h, c) = module(x, state)
    torch.manual_seed(1)
    weights = [torch.randn(t.shape).to(device) for t in (out, h, c)]
    sum((t * w).sum() for t, w in zip((out, h, c), weights)).backward()
    grads = [x.grad] + ([s.grad for s in state] if state else []) + [p.grad for p in module.parameters()]
    return [t.detach().cpu() for t in (out, h, c, *grads)]


def _ran_onednn(fn):
    with profile() as prof:
        fn()
        torch.tpu.synchronize()
    return any(e.name == "aten::mkldnn_rnn_layer" for e in prof.events())


LAYERS = {
    "one layer": dict(),
    "two layers": dict(num_layers=2),
    "bidirectional batch_first": dict(num_layers=2, bidirectional=True, batch_first=True),
    "without bias": dict(bias=False),
    "eval with dropout": dict(num_layers=2, dropout=0.5),
}


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("name", list(LAYERS))
def test_float32_layers_equal_cpu_eager_bit_for_bit(name, with_state):
    kwargs = LAYERS[name]
    torch.manual_seed(0)
    module = nn.LSTM(6, 8, **kwargs)
    if "dropout" in kwargs:
        module.eval()
    shape = (3, 5, 6) if kwargs.get("batch_first") else (5, 3, 6)
    x = torch.randn(shape)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    state = (torch.randn(layers, 3, 8), torch.randn(layers, 3, 8)) if with_state else None
    want = _run(module, x, state, "cpu")
    got = _run(module, x, state, "tpu")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_layer_runs_in_onednn_and_other_calls_do_not():
    torch.manual_seed(0)
    x = torch.randn(4, 2, 3, device="tpu")
    assert _ran_onednn(lambda: nn.LSTM(3, 5).to("tpu")(x))
    assert not _ran_onednn(lambda: nn.LSTM(3, 5, proj_size=2).to("tpu")(x))
    assert not _ran_onednn(lambda: nn.LSTM(3, 5).double().to("tpu")(x.double()))
    with torch.backends.mkldnn.flags(enabled=False):
        assert not _ran_onednn(lambda: nn.LSTM(3, 5).to("tpu")(x))


def test_with_onednn_turned_off_values_still_match_cpu():
    torch.manual_seed(0)
    module, x = nn.LSTM(6, 8, num_layers=2), torch.randn(5, 3, 6)
    with torch.backends.mkldnn.flags(enabled=False):
        want, got = _run(module, x, None, "cpu"), _run(module, x, None, "tpu")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)


def test_dropout_between_layers_in_training():
    # p=1 drops the whole first layer's output, so both devices feed zeros to the second layer.
    torch.manual_seed(0)
    module, x = nn.LSTM(4, 6, num_layers=2, dropout=1.0), torch.randn(5, 2, 4)
    for g, w in zip(_run(module, x, None, "tpu"), _run(module, x, None, "cpu")):
        assert torch.equal(g, w)


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
def test_without_autograd(grad_mode):
    torch.manual_seed(0)
    module, x = nn.LSTM(4, 6, num_layers=2), torch.randn(5, 2, 4)
    context = torch.no_grad if grad_mode == "no_grad" else torch.inference_mode
    with context():
        want = module(x)[0]
        got = copy.deepcopy(module).to("tpu")(x.to("tpu"))[0]
    assert torch.equal(got.cpu(), want)


def test_double_backward():
    torch.manual_seed(0)
    module, x = nn.LSTM(4, 6, num_layers=2), torch.randn(5, 2, 4)
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
