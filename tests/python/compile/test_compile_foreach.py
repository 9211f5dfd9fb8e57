"""``_foreach_*`` ops split per tensor after AOTAutograd's trace (torch_tpu/compile/foreach.py):
values against CPU eager, and no foreach op left as a library call."""

import pytest
import torch

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)
from torch_tpu.compile import foreach


def _lists(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 24), (24,), (8, 8, 4)]
    return [[torch.rand(s, generator=g) + 0.5 for s in shapes] for _ in range(3)]


def _run(fn, lists):
    cpu = [[t.clone() for t in ts] for ts in lists]
    dev = [[t.to("tpu") for t in ts] for ts in lists]
    with torch.no_grad():
        want = fn(*cpu)
        got = torch.compile(fn, backend="tpu")(*dev)
    return got, want, dev, cpu


def _foreach_calls():
    return {k: v for k, v in torch_tpu.compile_stats()["library_calls"].items() if "_foreach" in k}


def test_functional_foreach_ops_equal_cpu():
    def f(a, b, c):
        x = torch._foreach_add(a, b, alpha=0.5)
        x = torch._foreach_mul(x, 1.5)
        x = torch._foreach_sub(x, [0.1, 0.2, 0.3])
        x = torch._foreach_div(x, c)
        y = torch._foreach_addcmul(x, b, c, value=0.25)
        y = torch._foreach_addcdiv(y, a, c, [0.5, 1.0, 2.0])
        z = torch._foreach_pow(torch._foreach_sqrt(y), 2.5)
        z = torch._foreach_maximum(z, a)
        z = torch._foreach_lerp(torch._foreach_lerp(z, b, 0.3), a, 0.8)
        return torch._foreach_clamp_min(torch._foreach_exp(torch._foreach_neg(z)), 0.2)

    got, want, _, _ = _run(f, _lists())
    for x, y in zip(got, want):
        assert x.device.type == "tpu" and x.shape == y.shape
        torch.testing.assert_close(x.cpu(), y, rtol=1e-5, atol=1e-6)
    assert _foreach_calls() == {}
    assert "aten::lerp.Scalar" not in torch_tpu.compile_stats()["library_calls"]  # split as core ATen does


def test_in_place_foreach_updates_inputs():
    def f(a, b, c):
        torch._foreach_mul_(a, 0.9)
        torch._foreach_addcmul_(a, b, c, 0.1)
        torch._foreach_add_(b, a, alpha=-2.0)

    got, want, dev, cpu = _run(f, _lists(1))
    assert got is None and want is None
    for ds, cs in zip(dev, cpu):
        for x, y in zip(ds, cs):
            torch.testing.assert_close(x.cpu(), y, rtol=1e-6, atol=1e-6)
    assert _foreach_calls() == {}


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=True),
    lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True, foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True),
], ids=["sgd_nesterov", "adam_amsgrad", "adamw"])
def test_compiled_optimizers_equal_cpu(make):
    params = _lists(2)[0]
    cpu = [p.clone().requires_grad_() for p in params]
    dev = [p.to("tpu").requires_grad_() for p in params]
    opt_cpu, opt_dev = make(cpu), make(dev)
    step = torch.compile(opt_dev.step, backend="tpu")
    for k in range(3):
        for pc, pd in zip(cpu, dev):
            grad = torch.full_like(pc, 0.1 * (k + 1)) + pc.detach() * 0.01
            pc.grad, pd.grad = grad, grad.to("tpu")
        opt_cpu.step()
        step()
    for pc, pd in zip(cpu, dev):
        torch.testing.assert_close(pd.detach().cpu(), pc.detach(), rtol=1e-5, atol=1e-6)
    assert _foreach_calls() == {}


def test_expand_keeps_a_list_read_whole():
    # a node whose list another op reads whole stays (and later per-tensor nodes read its elements)
    def g(xs):
        ys = torch.ops.aten._foreach_add.Scalar(xs, 1.0)
        return torch.ops.aten._foreach_mul.Scalar(ys, 2.0), ys

    xs = [torch.randn(3), torch.randn(2)]
    gm = torch.fx.experimental.proxy_tensor.make_fx(g)(xs)
    for n in gm.graph.nodes:  # make_fx records the values of its nodes
        assert n.op != "call_function" or "val" in n.meta
    n_before = len([n for n in gm.graph.nodes if "_foreach" in str(n.target)])
    assert foreach.expand(gm) == n_before
    out = gm(xs)
    torch.testing.assert_close(list(out[0]), [(x + 1) * 2 for x in xs])
    torch.testing.assert_close(list(out[1]), [x + 1 for x in xs])


def test_bad_foreach_input_raises_at_the_call():
    # lists of different lengths: the compiled call raises as eager does, naming the op; the process keeps working
    def f(a, b):
        return torch._foreach_add(a, b)

    a = [torch.randn(3, device="tpu"), torch.randn(2, device="tpu")]
    b = [torch.randn(3, device="tpu")]
    g = torch.compile(f, backend="tpu")
    with pytest.raises(RuntimeError, match="_foreach_add"):
        g(a, b)
    out = g(a, [torch.ones(3, device="tpu"), torch.ones(2, device="tpu")])
    torch.testing.assert_close(out[1].cpu(), a[1].cpu() + 1)
