"""torch.tpu.optimizers (torch_tpu.tpu.optimizers): step by step against torch.optim on the CPU, and bad input."""

import pytest
import torch
import torch.nn as nn

from torch_tpu.tpu import optimizers as O


def small_model(bias=True):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7, bias=bias), nn.Tanh(), nn.Linear(7, 3, bias=bias))


def grads_of(model, step):
    """Gradients of a fixed loss on the CPU model (its own .grad), keyed like named_parameters."""
    gen = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(4, 5, generator=gen), torch.randn(4, 3, generator=gen)
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def run_against(ref_cls, ref_kw, ours, *, bias=True, steps=5, atol=1e-6, rtol=1e-6, state_map=None,
                round_ref_state=None):
    """ours on tpu and ref_cls on the CPU see the same gradients for `steps` steps; compared after each."""
    ref = small_model(bias)
    ref_opt = ref_cls(ref.parameters(), **ref_kw)
    params = {k: p.detach().clone().to("tpu") for k, p in ref.named_parameters()}
    state = ours.init(params)
    state_history = []
    for step in range(steps):
        grads = grads_of(ref, step)
        state_history.append(grads)
        ref_opt.step()
        if round_ref_state:
            for st in ref_opt.state.values():
                for name in round_ref_state:
                    st[name].copy_(st[name].bfloat16().float())
        ours.step(params, {k: g.to("tpu") for k, g in grads.items()}, state)
        assert state["step"].item() == step + 1
        for k, p in ref.named_parameters():
            torch.testing.assert_close(params[k].cpu(), p.detach(), atol=atol, rtol=rtol, msg=f"step {step} {k}")
            for mine, theirs in (state_map or {}).items():
                torch.testing.assert_close(state["slots"][k][mine].float().cpu(), ref_opt.state[p][theirs],
                                           atol=atol, rtol=rtol, msg=f"step {step} {k} {mine}")
    run_against.grads = state_history  # the gradients fed, for a second run on the CPU
    return params, state


ADAM_STATE = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}


@pytest.mark.parametrize("kw", [
    {"lr": 0.01},
    {"lr": 0.01, "weight_decay": 0.0},
    {"lr": 0.02, "weight_decay": 0.3, "eps": 1e-6},
    {"lr": 0.01, "amsgrad": True},
    {"lr": 0.01, "maximize": True},
    {"lr": 0.01, "betas": (0.8, 0.99), "amsgrad": True, "maximize": True},
])
def test_adamw_float32_moments_matches_torch_optim(kw):
    ours_kw = dict(kw)
    if "betas" in ours_kw:
        ours_kw["beta1"], ours_kw["beta2"] = ours_kw.pop("betas")
    state_map = dict(ADAM_STATE, **({"max_exp_avg_sq": "max_exp_avg_sq"} if kw.get("amsgrad") else {}))
    params, state = run_against(torch.optim.AdamW, kw, O.AdamW(use_bfloat16_moments=False, **ours_kw),
                                state_map=state_map)
    assert state["slots"]["0.weight"]["exp_avg"].dtype == torch.float32
    assert state["step"].device.type == "tpu"


def test_adamw_bfloat16_moments():
    ours = O.AdamW(lr=0.01, weight_decay=0.1)  # use_bfloat16_moments=True is the default
    # Within bfloat16's precision of torch.optim.AdamW's float32 moments...
    params, state = run_against(torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}, ours, atol=2e-3, rtol=1e-2)
    assert {v.dtype for s in state["slots"].values() for v in s.values()} == {torch.bfloat16}
    # ...and tight against torch.optim.AdamW whose moments are rounded to bfloat16 after each step.
    params, state = run_against(torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}, ours, state_map=ADAM_STATE,
                                round_ref_state=("exp_avg", "exp_avg_sq"))
    # Exact: the same functional update on the CPU, fed the same gradients.
    ref = small_model()
    cpu = {k: p.detach().clone() for k, p in ref.named_parameters()}
    cpu_state = ours.init(cpu)
    for grads in run_against.grads:
        ours.step(cpu, grads, cpu_state)
    for k in cpu:
        torch.testing.assert_close(params[k].cpu(), cpu[k], atol=0, rtol=0)
        for name in ADAM_STATE:
            torch.testing.assert_close(state["slots"][k][name].cpu(), cpu_state["slots"][k][name], atol=0, rtol=0)


def test_adamw_capturable_false_keeps_the_step_on_cpu():
    _, state = run_against(torch.optim.AdamW, {"lr": 0.01}, O.AdamW(lr=0.01, use_bfloat16_moments=False,
                                                                   capturable=False), state_map=ADAM_STATE)
    assert state["step"].device.type == "cpu"


@pytest.mark.parametrize("kw", [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.1, "momentum": 0.9, "dampening": 0.5},
    {"lr": 0.1, "momentum": 0.9, "nesterov": True},
    {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.2, "maximize": True},
    {"lr": 0.05, "weight_decay": 0.2, "nesterov": True, "momentum": 0.5, "maximize": True},
])
def test_sgd_matches_torch_optim(kw):
    state_map = {"momentum_buffer": "momentum_buffer"} if kw.get("momentum") else {}
    run_against(torch.optim.SGD, kw, O.Sgd(**kw), atol=0, rtol=0, state_map=state_map)


@pytest.mark.parametrize("kw", [
    {"lr": 0.02},
    {"lr": 0.02, "nesterov": False, "weight_decay": 0.0},
    {"lr": 0.02, "momentum": 0.9, "adjust_lr_fn": "match_rms_adamw"},
    {"lr": 0.02, "ns_steps": 3, "ns_coefficients": (3.0, -3.0, 1.5), "adjust_lr_fn": "original"},
])
def test_muon_matches_torch_optim(kw):
    run_against(torch.optim.Muon, kw, O.Muon(**kw), bias=False, state_map={"momentum_buffer": "momentum_buffer"})


def test_muon_defaults_are_torch_optims():
    from torch.optim import _muon
    assert (O.DEFAULT_A, O.DEFAULT_B, O.DEFAULT_C, O.EPS, O.DEFAULT_NS_STEPS) == (
        _muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C, _muon.EPS, _muon.DEFAULT_NS_STEPS)
    m = O.Muon()
    assert m.ns_coefficients == (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C) and m.ns_steps == 5


def test_muon_bfloat16_momentum():
    _, state = run_against(torch.optim.Muon, {"lr": 0.02}, O.Muon(lr=0.02, use_bfloat16_moments=True), bias=False,
                           state_map={"momentum_buffer": "momentum_buffer"}, round_ref_state=("momentum_buffer",),
                           atol=1e-5, rtol=1e-5)
    assert state["slots"]["0.weight"]["momentum_buffer"].dtype == torch.bfloat16


def test_update_is_pure_and_takes_lists():
    opt = O.Sgd(lr=0.5, momentum=0.9)
    p = [torch.ones(2, 3, device="tpu"), torch.zeros(3, device="tpu")]
    g = [torch.full((2, 3), 2.0, device="tpu"), torch.ones(3, device="tpu")]
    state = opt.init(p)
    new_p, new_state = opt.update(p, g, state)
    assert isinstance(new_p, list) and torch.equal(p[0].cpu(), torch.ones(2, 3))  # nothing mutated
    assert state["step"].item() == 0 and new_state["step"].item() == 1
    torch.testing.assert_close(new_p[0].cpu(), torch.zeros(2, 3))
    torch.testing.assert_close(new_state["slots"][1]["momentum_buffer"].cpu(), torch.ones(3))


def test_grad_scale_and_found_inf():
    ref = small_model()
    params = {k: p.detach().clone().to("tpu") for k, p in ref.named_parameters()}
    grads = {k: g.to("tpu") for k, g in grads_of(ref, 0).items()}
    plain = O.AdamW(lr=0.01, use_bfloat16_moments=False)
    want, _ = plain.update(params, grads, plain.init(params))
    scaled = O.AdamW(lr=0.01, use_bfloat16_moments=False, grad_scale=torch.tensor(4.0, device="tpu"))
    got, _ = scaled.update(params, {k: 4 * g for k, g in grads.items()}, scaled.init(params))
    for k in params:
        torch.testing.assert_close(got[k].cpu(), want[k].cpu())
    skip = O.Sgd(lr=0.1, momentum=0.9, found_inf=torch.tensor(1.0, device="tpu"))
    state = skip.init(params)
    got, new_state = skip.update(params, grads, state)
    assert new_state["step"].item() == 0
    for k in params:
        torch.testing.assert_close(got[k].cpu(), params[k].cpu(), atol=0, rtol=0)


@pytest.mark.parametrize("make, exc, words", [
    (lambda: O.AdamW(lr=-0.1), ValueError, "lr"),
    (lambda: O.Sgd(lr=-1.0), ValueError, "lr"),
    (lambda: O.Muon(lr=-1e-3), ValueError, "lr"),
    (lambda: O.Optimizer(lr="fast"), TypeError, "lr"),
    (lambda: O.AdamW(beta1=1.0), ValueError, "beta1"),
    (lambda: O.AdamW(beta2=-0.1), ValueError, "beta2"),
    (lambda: O.AdamW(eps=-1e-8), ValueError, "eps"),
    (lambda: O.AdamW(weight_decay=-0.01), ValueError, "weight_decay"),
    (lambda: O.AdamW(amsgrad=1), TypeError, "amsgrad"),
    (lambda: O.AdamW(grad_scale=2.0), TypeError, "grad_scale"),
    (lambda: O.Sgd(momentum=-0.9), ValueError, "momentum"),
    (lambda: O.Sgd(nesterov=True), ValueError, "nesterov"),
    (lambda: O.Sgd(momentum=0.9, dampening=0.1, nesterov=True), ValueError, "nesterov"),
    (lambda: O.Sgd(has_sparse_grad=True), NotImplementedError, "has_sparse_grad"),
    (lambda: O.Muon(ns_steps=100), ValueError, "ns_steps"),
    (lambda: O.Muon(ns_coefficients=(1.0, 2.0)), ValueError, "ns_coefficients"),
    (lambda: O.Muon(adjust_lr_fn="sqrt"), ValueError, "adjust_lr_fn"),
    (lambda: O.Muon(has_complex=True), ValueError, "has_complex"),
])
def test_bad_hyperparameters_raise_naming_the_argument(make, exc, words):
    with pytest.raises(exc, match=words):
        make()


def test_bad_params_and_grads_raise_naming_them():
    opt = O.AdamW()
    with pytest.raises(TypeError, match=r"params\['w'\] must be a Tensor"):
        opt.init({"w": 3.0})
    with pytest.raises(TypeError, match=r"params\[0\] must be a floating-point Tensor"):
        opt.init([torch.ones(2, dtype=torch.int64, device="tpu")])
    with pytest.raises(TypeError, match="params must be a mapping"):
        opt.init(torch.ones(2, device="tpu"))
    p = {"w": torch.ones(2, 2, device="tpu")}
    state = opt.init(p)
    with pytest.raises(ValueError, match=r"grads\['w'\] has shape \[3\]"):
        opt.update(p, {"w": torch.ones(3, device="tpu")}, state)
    with pytest.raises(ValueError, match="grads must have the keys of params"):
        opt.update(p, {"v": torch.ones(2, 2, device="tpu")}, state)
    with pytest.raises(TypeError, match="state must be the dict returned by init"):
        opt.update(p, {"w": torch.ones(2, 2, device="tpu")}, {})
    with pytest.raises(NotImplementedError, match="_update_param"):
        O.Optimizer().update(p, {"w": torch.ones(2, 2, device="tpu")}, O.Optimizer().init(p))
    # torch.optim.Muon rejects a 1-D parameter with a ValueError ("Muon only supports 2D parameters"); so do we,
    # naming the parameter, when the params are given (init / update).
    with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
        torch.optim.Muon([torch.ones(4, requires_grad=True)])
    with pytest.raises(ValueError, match=r"params\['bias'\]: Muon only supports 2D parameters"):
        O.Muon().init({"weight": torch.ones(3, 4, device="tpu"), "bias": torch.ones(4, device="tpu")})
    # The process keeps working.
    opt.step(p, {"w": torch.ones(2, 2, device="tpu")}, state)
    assert state["step"].item() == 1 and p["w"].cpu().lt(1).all()


@pytest.mark.parametrize("capturable", [True, False])
def test_adamw_params_on_two_chips_match_torch_optim(capturable):
    # A model split over tpu:0 and tpu:1: torch.optim.AdamW(capturable=True) keeps one step per
    # parameter on its device; ours keeps one step, so each update must bring it to its parameter.
    ref = small_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    names = [k for k, _ in ref.named_parameters()]
    params = {k: p.detach().clone().to(f"tpu:{i % 2}") for i, (k, p) in enumerate(ref.named_parameters())}
    ours = O.AdamW(lr=0.01, use_bfloat16_moments=False, capturable=capturable)
    state = ours.init(params)
    for step in range(3):
        grads = grads_of(ref, step)
        ref_opt.step()
        ours.step(params, {k: g.to(params[k].device) for k, g in grads.items()}, state)
        for k, p in ref.named_parameters():
            assert params[k].device == torch.device(f"tpu:{names.index(k) % 2}")
            torch.testing.assert_close(params[k].cpu(), p.detach(), atol=1e-6, rtol=1e-6, msg=f"step {step} {k}")
    assert state["step"].item() == 3


def test_state_of_another_optimizer_or_params_is_refused_before_anything_changes():
    p = {"w": torch.randn(3, 4, device="tpu")}
    g = {"w": torch.randn(3, 4, device="tpu")}
    before = p["w"].clone()
    # slots of another optimizer / configuration: was a bare KeyError('momentum_buffer') from the update
    for opt, state, missing in [(O.Sgd(momentum=0.9), O.AdamW().init(p), "momentum_buffer"),
                                (O.AdamW(amsgrad=True), O.AdamW().init(p), "max_exp_avg_sq"),
                                (O.AdamW(), O.Sgd().init(p), "exp_avg")]:
        match = rf"state\['slots'\]\['w'\] has slots .*{type(opt).__name__} keeps .*{missing}"
        with pytest.raises(ValueError, match=match):
            opt.update(p, g, state)
    # slots made for a parameter of another shape: update() broadcast them silently, step() wrote the
    # parameter and then failed on the slot
    small = O.AdamW().init({"w": torch.randn(4, device="tpu")})
    match = r"state\['slots'\]\['w'\]\['exp_avg'\] has shape \[4\], params\['w'\] \[3, 4\]"
    with pytest.raises(ValueError, match=match):
        O.AdamW().update(p, g, small)
    with pytest.raises(ValueError, match=r"has shape \[4\]"):
        O.AdamW().step(p, g, small)
    assert torch.equal(p["w"], before)  # nothing written
    with pytest.raises(TypeError, match=r"state\['step'\] must be a Tensor"):
        O.AdamW().update(p, g, {"step": 0, "slots": O.AdamW().init(p)["slots"]})
    with pytest.raises(TypeError, match=r"state\['slots'\]\['w'\] must be a dict of slot tensors, got NoneType"):
        O.AdamW().update(p, g, {"step": torch.zeros(()), "slots": {"w": None}})
    state = O.AdamW().init(p)  # the process keeps working
    O.AdamW().step(p, g, state)
    assert state["step"].item() == 1 and not torch.equal(p["w"], before)
