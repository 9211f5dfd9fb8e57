"""0-dim CPU tensor chains evaluated on the host as Python floats (the ``scalars`` step,
torch_tpu/compile/host_scalars.py): values against CPU eager, bit for bit where IEEE rounding
makes them so, and which ops leave the library calls."""

import copy
import math

import pytest
import torch

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)
from torch_tpu.compile import host_scalars


def _stats():
    st = torch_tpu.compile_stats()
    return st["host_scalar_ops"], st["library_calls"]


def test_bias_correction_chain_equals_cpu_and_leaves_no_library_call():
    def update(p, g, step, lr):
        step.add_(1)
        bc1 = 1 - 0.9 ** step
        bc2 = 1 - 0.95 ** step
        size = lr / bc1
        p.sub_(g * size.reciprocal().reciprocal() / bc2.sqrt() - (-size).neg() * 0.01)

    p, g = torch.randn(32, 48), torch.randn(32, 48)
    step, lr = torch.tensor(0.0), torch.tensor(1e-3)
    cpu = [p.clone(), g.clone(), step.clone(), lr.clone()]
    dev = [p.to("tpu"), g.to("tpu"), step.clone(), lr.clone()]
    f = torch.compile(update, backend="tpu")
    with torch.no_grad():
        for _ in range(3):
            f(*dev)
            update(*cpu)
    assert dev[2].item() == cpu[2].item() == 3.0  # the count written back in place
    torch.testing.assert_close(dev[0].cpu(), cpu[0], atol=1e-6, rtol=1e-6)
    host, calls = _stats()
    assert host["aten::pow.Scalar"] >= 2 and host["aten::copy_.default"] >= 1
    assert not any(k.startswith(("aten::pow", "aten::reciprocal", "aten::sqrt")) for k in calls), calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scalar_ops_bit_equal_cpu(dtype):
    # outputs of the graph: each gets a tensor of its own
    def chain(a, b):
        s = (a + b * 3, a - b, torch.sub(a, b, alpha=2.5), a * b, a / b, -a, b.reciprocal(), torch.rsub(a, 0.3))
        # sqrt: not bit-exact, CPU's AVX512 kernel is 1 ulp off IEEE for float32 1.9931
        return s + (b.sqrt(), b.rsqrt(), a.exp(), b.log(), a ** 3, b ** 0.5, b ** -1, a ** 2.7, 0.9 ** b, a ** b)

    a = torch.tensor(0.7312, dtype=dtype)
    b = torch.tensor(1.9931, dtype=dtype)
    got = torch.compile(chain, backend="tpu")(a, b)
    want = chain(a, b)
    exact = 8  # add, sub, sub alpha, mul, div, neg, reciprocal, rsub
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.dtype == dtype and x.device.type == "cpu" and x.dim() == 0
        if i < exact:
            assert x.item() == y.item(), (i, x.item(), y.item())
        else:
            torch.testing.assert_close(x, y, rtol=2e-7 if dtype == torch.float32 else 1e-15, atol=0)
    host, calls = _stats()
    assert sum(host.values()) == 19 and not calls  # b * 3 is an op of its own


def test_special_values_equal_cpu():
    def chain(z, n, big):
        return (z / z, n / z, (-n) / z, n.sqrt(), z.log(), n.log(), big.exp(), big ** 40.0, (-big) ** 3.0,
                z ** -1.0, n ** 0.5, z.reciprocal(), big * big * big)

    z, n, big = torch.tensor(0.0), torch.tensor(-2.0), torch.tensor(1e13)
    got = torch.compile(chain, backend="tpu")(z, n, big)
    want = chain(z, n, big)
    for x, y in zip(got, want):
        xv, yv = x.item(), y.item()
        assert (math.isnan(xv) and math.isnan(yv)) or xv == yv, (xv, yv)


def test_adamw_compiled_step_equals_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ref = copy.deepcopy(model)
    model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2), betas=(0.9, 0.95), weight_decay=0.1)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(8, 16)
    for _ in range(3):
        for m, dev in ((model, "tpu"), (ref, "cpu")):
            m(x.to(dev)).square().mean().backward()
        step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-6, rtol=1e-5)
    assert all(opt.state[p]["step"].item() == 3.0 for p in model.parameters())
    host, calls = _stats()
    assert host["aten::pow.Scalar"] >= 2 * 4 and "aten::pow.Scalar" not in calls


def test_count_read_elsewhere_keeps_its_copy():
    # the count's old value is also read by a tpu op: its write-back stays a library call
    def f(x, step):
        y = x * step.to("tpu")
        step.add_(1)
        return y * step.to("tpu")

    x = torch.randn(8, device="tpu")
    step = torch.tensor(2.0)
    out = torch.compile(f, backend="tpu")(x, step)
    assert step.item() == 3.0
    torch.testing.assert_close(out.cpu(), x.cpu() * 6.0)
    host, calls = _stats()
    assert host["aten::add.Tensor"] == 1 and calls["aten::copy_.default"] == 1


def test_round32_matches_float32():
    for v in (0.1, 1 / 3, 3.4028235e38, 1e39, -1e39, 1e-46, float("inf")):
        want = torch.tensor(v, dtype=torch.float64).to(torch.float32).item()
        assert host_scalars.round32(v) == want, v


def test_scalars_step_bad_input_raises_at_the_call():
    # an input that is not a 0-dim tensor reaching the step: a clear error, and later calls work
    from torch_tpu.compile.host_scalars import make_runner

    st = {"inputs": [0], "ops": [{"op": "aten::mul.Tensor", "args": {"l": [{"$": 0}, 2]}, "kwargs": {"d": {}},
                                  "outputs": [1], "type": "tensor<f32>"}], "outputs": [1], "fresh": [], "writes": []}
    run = make_runner(st)
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to Scalar"):
        run([torch.ones(2), None])
    env = [torch.tensor(1.25), None]
    run(env)
    assert env[1].item() == 2.5
