"""torch.tpu.optimizers.SingleTraceTrainer: one compiled program per step, equal to the eager loop."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)
from torch_tpu.tpu import optimizers as O


class Classifier(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(6, 16, bias=bias)
        self.norm = nn.LayerNorm(16, elementwise_affine=bias)
        self.fc2 = nn.Linear(16, 4, bias=bias)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class WithLoss(nn.Module):
    """Returns its own loss (the default compute_loss_fn path)."""

    def __init__(self):
        super().__init__()
        self.net = Classifier()

    def forward(self, x, target):
        return F.cross_entropy(self.net(x), target)


def batches(n=5):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 6, generator=gen), torch.randint(0, 4, (8,), generator=gen)) for _ in range(n)]


@pytest.mark.parametrize("ours, ref_cls, ref_kw, bias", [
    (O.AdamW(lr=0.01, use_bfloat16_moments=False), torch.optim.AdamW, {"lr": 0.01}, True),
    (O.Sgd(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01), torch.optim.SGD,
     {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, True),
    (O.Muon(lr=0.02), torch.optim.Muon, {"lr": 0.02}, False),
])
def test_compiled_step_is_one_program_equal_to_the_eager_loop(ours, ref_cls, ref_kw, bias):
    torch.manual_seed(0)
    ref = Classifier(bias)
    compiled_model, eager_model = copy.deepcopy(ref).to("tpu"), copy.deepcopy(ref).to("tpu")
    compiled = O.SingleTraceTrainer(compiled_model, ours, compute_loss_fn=F.cross_entropy)
    eager = O.SingleTraceTrainer(eager_model, copy.deepcopy(ours), compile_fn=lambda f: f,
                                 compute_loss_fn=F.cross_entropy)
    ref_opt = ref_cls(ref.parameters(), **ref_kw)
    data = batches()
    for x, t in data:
        loss = compiled.step(x.to("tpu"), t.to("tpu"))
        loss_eager = eager.step(x.to("tpu"), t.to("tpu"))
        loss_ref = F.cross_entropy(ref(x), t)  # the classic eager loop on the CPU
        loss_ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.cpu(), loss_ref.detach(), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(loss.cpu(), loss_eager.cpu(), atol=1e-6, rtol=1e-6)
    for (k, p), q, r in zip(compiled_model.named_parameters(), eager_model.parameters(), ref.parameters()):
        assert p.grad is None  # gradients are values inside the program, not .grad
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), atol=2e-6, rtol=1e-5, msg=k)
        torch.testing.assert_close(p.detach().cpu(), r.detach(), atol=2e-6, rtol=1e-5, msg=k)
    assert compiled.state["step"].item() == len(data)
    stats = torch_tpu.compile_stats()
    # forward, loss, backward and the update: one graph, one program, run once per step
    assert stats["graphs"] == 1 and stats["compilations"] == 1
    assert stats["graph_breaks"] == 0 and stats["recompile_reasons"] == []
    assert stats["programs_run"] == len(data)
    assert stats["library_calls"].get("aten::copy_.default", 0) >= 1  # the write-back of params and state


def test_default_optimizer_and_loss_from_the_model():
    torch.manual_seed(0)
    model = WithLoss().to("tpu")
    trainer = O.SingleTraceTrainer(model)
    assert isinstance(trainer.optimizer, O.AdamW) and trainer.optimizer.use_bfloat16_moments
    losses = [trainer.step((x.to("tpu"), t.to("tpu"))).item() for x, t in batches(8) * 3]
    assert losses[-1] < losses[0]
    assert torch_tpu.compile_stats()["compilations"] == 1
    assert trainer.state["slots"]["net.fc1.weight"]["exp_avg"].dtype == torch.bfloat16


def test_dict_inputs_and_frozen_parameters():
    torch.manual_seed(0)
    model = Classifier().to("tpu")
    model.fc1.weight.requires_grad_(False)
    before = model.fc1.weight.detach().cpu().clone()
    trainer = O.SingleTraceTrainer(model, O.Sgd(lr=0.1), compute_loss_fn=F.cross_entropy)
    assert "fc1.weight" not in trainer.params
    x, t = batches(1)[0]
    trainer.step({"x": x.to("tpu")}, t.to("tpu"))
    assert torch.equal(model.fc1.weight.detach().cpu(), before)
    assert not torch.equal(model.fc2.weight.detach().cpu(), Classifier().fc2.weight.detach())


def test_bad_input_raises_naming_the_argument():
    model = Classifier().to("tpu")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        O.SingleTraceTrainer(lambda x: x)
    with pytest.raises(TypeError, match="optimizer must be a torch.tpu.optimizers.Optimizer"):
        O.SingleTraceTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="compile_fn must be callable"):
        O.SingleTraceTrainer(model, compile_fn="tpu")
    with pytest.raises(TypeError, match="compute_loss_fn must be callable"):
        O.SingleTraceTrainer(model, compute_loss_fn=1)
    with pytest.raises(ValueError, match=r"params\['fc1.bias'\]: Muon only supports 2D parameters"):
        O.SingleTraceTrainer(model, O.Muon())
    x, t = batches(1)[0]
    eager = O.SingleTraceTrainer(model, O.Sgd(lr=0.1), compile_fn=lambda f: f)
    with pytest.raises(TypeError, match="targets were given but compute_loss_fn is None"):
        eager.step(x.to("tpu"), t.to("tpu"))
    with pytest.raises(ValueError, match="the loss must be a 0-dim Tensor"):
        eager.step(x.to("tpu"))  # the model returns logits, not a loss
    # the process keeps working
    trainer = O.SingleTraceTrainer(model, O.Sgd(lr=0.1), compute_loss_fn=F.cross_entropy)
    assert torch.isfinite(trainer.step(x.to("tpu"), t.to("tpu"))).item()
