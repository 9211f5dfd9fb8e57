"""Region outputs written in place into graph inputs (builder._write_in_place): values
against CPU, where the rule applies and where it must not."""

import pytest
import torch

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)


def compiled_update(fn, *tensors):
    """fn(*tensors) compiled for tpu on copies of `tensors` and run eagerly on CPU copies:
    (tpu tensors after the call, CPU tensors after the call, the tpu program's steps)."""
    cpu = [t.clone() for t in tensors]
    dev = [t.to("tpu") for t in tensors]
    compiled = torch.compile(fn, backend="tpu")
    with torch.no_grad():
        compiled(*dev)
        fn(*cpu)
    return dev, cpu


def copies_run():
    calls = torch_tpu.compile_stats()["library_calls"]
    return calls.get("aten::copy_.default", 0)


def test_optimizer_like_update_writes_into_its_inputs():
    def sgd_momentum(p, buf, g):
        buf.mul_(0.9).add_(g)
        p.add_(buf * -0.1).mul_(0.99)

    p, buf, g = torch.randn(64, 96), torch.randn(64, 96), torch.randn(64, 96)
    cpu = [t.clone() for t in (p, buf, g)]
    dev = [t.to("tpu") for t in (p, buf, g)]
    storage = [t.data_ptr() for t in dev]
    step = torch.compile(sgd_momentum, backend="tpu")
    with torch.no_grad():
        for _ in range(3):
            step(*dev)
            sgd_momentum(*cpu)
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
    assert [t.data_ptr() for t in dev] == storage
    assert copies_run() == 0  # both updates written by the region, no copy back


def test_mutation_read_across_elements_keeps_its_copy():
    # x - x.mean(0) reads every row of x for each element: writing into x while reading would be wrong
    def center(x):
        x.sub_(x.mean(dim=0)).mul_(2)

    dev, cpu = compiled_update(center, torch.randn(32, 48))
    torch.testing.assert_close(dev[0].cpu(), cpu[0], atol=1e-5, rtol=1e-5)
    assert copies_run() == 1


def test_mutation_from_a_transpose_keeps_its_copy():
    def flip_add(x):
        x.copy_(x.t() * 2 + 1)

    dev, cpu = compiled_update(flip_add, torch.randn(40, 40))
    torch.testing.assert_close(dev[0].cpu(), cpu[0], atol=1e-5, rtol=1e-5)


def test_input_read_after_the_region_keeps_its_copy():
    def update_then_read(p, g, out):
        new = p * 0.5 + g
        out.copy_(p.sum(dim=1, keepdim=True) + g)  # reads the old p after new is computed
        p.copy_(new)

    dev, cpu = compiled_update(update_then_read, torch.randn(16, 32), torch.randn(16, 32), torch.zeros(16, 32))
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)


def test_region_into_a_tensor_that_does_not_fit_raises():
    from torch_tpu.compile import graph_compiler

    aten = torch.ops.aten
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(8, 16).to("tpu")
    gm = make_fx(lambda x: aten.add.Tensor(aten.mul.Tensor(x, 3), 1), tracing_mode="fake")(x)
    region = graph_compiler.compile_fx_graph(gm, [x], "inference").program.regions[0]
    with pytest.raises(ValueError, match=r"output 0 cannot be written into a Float tensor of shape \[4, 16\]"):
        region.run([x], 0, "probe", [], [torch.empty(4, 16, device="tpu")])
    with pytest.raises(ValueError, match="5 tensors to write into, the region has 1 outputs"):
        region.run([x], 0, "probe", [], [None] * 5)
    # still usable: a fitting tensor receives the result
    out = torch.empty(8, 16, device="tpu")
    region.run([x], 0, "probe", [], [out])
    torch.testing.assert_close(out.cpu(), x.cpu() * 3 + 1)


def test_one_op_region_joins_the_region_of_its_users():
    # AdamW's weight decay p * (1 - lr * wd) alone would be a one-op region (run as a library
    # call); its only user, the update, is in a larger region, which it joins
    ps = [torch.randn(32, 48), torch.randn(48)]
    grads = [torch.randn_like(p) for p in ps]
    cpu = [p.clone().requires_grad_() for p in ps]
    dev = [p.to("tpu").requires_grad_() for p in ps]
    opt_cpu = torch.optim.AdamW(cpu, lr=0.01, weight_decay=0.1, foreach=True)
    opt_dev = torch.optim.AdamW(dev, lr=0.01, weight_decay=0.1, foreach=True)
    step = torch.compile(opt_dev.step, backend="tpu")
    for _ in range(2):
        for a, b, g in zip(cpu, dev, grads):
            a.grad, b.grad = g.clone(), g.to("tpu")
        step()
        opt_cpu.step()
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(opt_dev.state[a]["exp_avg_sq"].cpu(), opt_cpu.state[b]["exp_avg_sq"])
    assert "aten::mul.Tensor" not in torch_tpu.compile_stats()["library_calls"]
