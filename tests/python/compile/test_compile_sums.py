"""graph_compiler._low_precision_sums: a bf16 sum with dtype=float32 that is only cast back to bf16
(autocast's bias gradients) is summed in bf16; one whose float32 value is used stays."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)
from torch_tpu.compile.graph_compiler import _low_precision_sums

aten = torch.ops.aten


def _sums(gm):
    return [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]


def test_sum_cast_back_is_summed_in_bf16_and_equals_the_float32_sum_rounded():
    x = torch.randn(512, 96, generator=torch.Generator().manual_seed(0)).bfloat16()

    def cast_back(x):
        return aten.sum.dim_IntList(x, [0], True, dtype=torch.float32).view(96).to(torch.bfloat16)

    def used_in_float32(x):
        s = aten.sum.dim_IntList(x, [0], True, dtype=torch.float32)
        return s.to(torch.bfloat16), s * 2

    gm = make_fx(cast_back, tracing_mode="fake")(x)
    assert _low_precision_sums(gm) == 1
    (s,) = _sums(gm)
    assert "dtype" not in s.kwargs and s.meta["val"].dtype == torch.bfloat16
    gm.recompile()
    assert torch.equal(gm(x), cast_back(x))  # float32 accumulation, one rounding: the same bits
    kept = make_fx(used_in_float32, tracing_mode="fake")(x)
    assert _low_precision_sums(kept) == 0 and _sums(kept)[0].kwargs["dtype"] == torch.float32


def test_autocast_linear_bias_gradient_equals_cpu(monkeypatch):
    from torch_tpu.compile import graph_compiler

    rewrites = []
    monkeypatch.setattr(graph_compiler, "_low_precision_sums", lambda gm: rewrites.append(_low_precision_sums(gm)))
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(256, 64, generator=g)
    want = []
    for dev in ("cpu", "tpu"):
        m = torch.nn.Linear(64, 48).to(dev)
        m.load_state_dict(lin.state_dict())
        f = m if dev == "cpu" else torch.compile(m, backend="tpu")
        with torch.autocast(dev, dtype=torch.bfloat16):
            f(x.to(dev)).float().square().sum().backward()
        want.append((m.weight.grad.cpu(), m.bias.grad.cpu()))
    (w_cpu, b_cpu), (w_tpu, b_tpu) = want
    torch.testing.assert_close(b_tpu, b_cpu, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(w_tpu, w_cpu, rtol=1e-2, atol=1e-2)
    assert torch_tpu.compile_stats()["graphs"] == 2 and sum(rewrites) == 1  # the backward's bias sum
