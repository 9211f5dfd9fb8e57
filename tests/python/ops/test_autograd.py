"""Autograd and optimizers on tpu against the same computation on CPU."""

import copy

import pytest
import torch

from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 3))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)


def test_mlp_gradients_match_cpu():
    cpu = make_mlp()
    tpu = copy.deepcopy(cpu).tpu()
    x, y = batch()
    loss_c = torch.nn.functional.cross_entropy(cpu(x), y)
    loss_c.backward()
    loss_t = torch.nn.functional.cross_entropy(tpu(x.tpu()), y.tpu())
    loss_t.backward()
    assert loss_t.device == torch.device("tpu", 0)
    torch.testing.assert_close(loss_t.cpu(), loss_c)
    for (name, pc), pt in zip(cpu.named_parameters(), tpu.parameters()):
        assert pt.grad is not None and pt.grad.device == torch.device("tpu", 0), name
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, msg=name)


def test_input_gradient_and_grad_accumulation():
    xc = torch.randn(4, 3, requires_grad=True)
    xt = xc.detach().tpu().requires_grad_()
    for x in (xc, xt):
        for _ in range(2):  # gradients accumulate
            (x.sin() * x.exp()).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)


def test_autograd_grad_on_non_leaf_views():
    a = torch.randn(6, 4)
    at = a.tpu().requires_grad_()
    ac = a.clone().requires_grad_()
    outs = []
    for x in (ac, at):
        v = x.t()[1:3] * 2
        outs.append(torch.autograd.grad((v ** 2).sum(), x)[0])
    torch.testing.assert_close(outs[1].cpu(), outs[0])


@pytest.mark.parametrize("opt_name", ["SGD", "SGD_momentum", "Adam", "AdamW", "RMSprop"])
def test_optimizer_steps_match_cpu(opt_name):
    cpu = make_mlp()
    tpu = copy.deepcopy(cpu).tpu()

    def make_opt(params):
        if opt_name == "SGD":
            return torch.optim.SGD(params, lr=0.1)
        if opt_name == "SGD_momentum":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
        if opt_name == "Adam":
            return torch.optim.Adam(params, lr=0.01)
        if opt_name == "AdamW":
            return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
        return torch.optim.RMSprop(params, lr=0.01)

    opt_c, opt_t = make_opt(cpu.parameters()), make_opt(tpu.parameters())
    x, y = batch()
    xt, yt = x.tpu(), y.tpu()
    for _ in range(3):
        for model, opt, xx, yy in ((cpu, opt_c, x, y), (tpu, opt_t, xt, yt)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xx), yy).backward()
            opt.step()
    for (name, pc), pt in zip(cpu.named_parameters(), tpu.parameters()):
        assert pt.device == torch.device("tpu", 0)
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), msg=name)
    # Optimizer state lives on the device too.
    for state in opt_t.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                assert v.device == torch.device("tpu", 0)


def test_training_on_second_chip():
    cpu = make_mlp()
    tpu = copy.deepcopy(cpu).to("tpu:1")
    x, y = batch()
    for model, xx, yy in ((cpu, x, y), (tpu, x.to("tpu:1"), y.to("tpu:1"))):
        torch.nn.functional.cross_entropy(model(xx), yy).backward()
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        assert pt.grad.device == torch.device("tpu", 1)
        torch.testing.assert_close(pt.grad.cpu(), pc.grad)
