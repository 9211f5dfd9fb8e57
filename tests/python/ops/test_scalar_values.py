"""Pointwise ops whose double arguments change from call to call (csrc/aten/meta_cache.cc).

Non-capturable Adam and AdamW pass new step sizes every step (`addcdiv_(..., value=-step_size)`,
`lerp_`, `addcmul_`). Their meta results were cached by the doubles' exact bits, so every call
ran the op's Python meta kernel (100-140 us against 7 for the op). A pointwise op's output
metadata never depends on a double's value, so those are keyed by the value's class (sign, whole
or not, range) and the order of consecutive doubles: the checks that look at values (softshrink's
lambda >= 0, a min above a max) still raise at the call.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

CALLS = {
    "addcdiv_": lambda p, a, b, v: p.addcdiv_(a, b, value=v),
    "addcmul_": lambda p, a, b, v: p.addcmul_(a, b, value=v),
    "lerp_": lambda p, a, b, v: p.lerp_(a, v),
    "add_ alpha": lambda p, a, b, v: p.add_(a, alpha=v),
    "addcdiv": lambda p, a, b, v: torch.addcdiv(p, a, b, value=v),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_new_values_reuse_the_meta_result_and_compute_with_each_value(name):
    call = CALLS[name]
    torch.manual_seed(0)
    p, a, b = torch.randn(16, 16), torch.randn(16, 16), torch.rand(16, 16) + 1
    tp, ta, tb = p.to("tpu"), a.to("tpu"), b.to("tpu")
    values = [-1e-3 * (1 + i / 7) for i in range(40)]
    call(tp, ta, tb, values[0])
    call(p, a, b, values[0])
    before = torch_tpu._C._meta_kernel_calls()
    for v in values[1:]:
        got = call(tp, ta, tb, v)
        want = call(p, a, b, v)
    assert torch_tpu._C._meta_kernel_calls() - before == 0
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(tp.cpu(), p, rtol=0, atol=0)


def test_a_new_class_of_value_runs_the_meta_kernel():
    x = torch.randn(8, device="tpu")
    x.add_(x, alpha=0.5)
    before = torch_tpu._C._meta_kernel_calls()
    x.add_(x, alpha=0.25)  # same class: cached
    assert torch_tpu._C._meta_kernel_calls() == before
    x.add_(x, alpha=-0.25)  # negative: a new class
    x.add_(x, alpha=float("inf"))
    assert torch_tpu._C._meta_kernel_calls() == before + 2


def test_value_checks_still_raise_at_the_call():
    x = torch.randn(8, device="tpu")
    F.softshrink(x, 0.5)
    F.softshrink(x, 0.25)
    with pytest.raises(RuntimeError, match="lambda must be in range"):
        F.softshrink(x, -0.5)  # a negative value: another class, so its meta kernel runs and checks
    with pytest.raises(RuntimeError, match="lambda must be in range"):
        F.softshrink(x, -0.75)
    torch.tpu.synchronize()  # nothing sticky was left behind


def test_order_of_two_doubles_is_part_of_the_key():
    x = torch.randn(8, device="tpu")
    torch.ops.aten.hardtanh(x, -3.5, -2.5)
    before = torch_tpu._C._meta_kernel_calls()
    torch.ops.aten.hardtanh(x, -5.5, -4.5)  # same classes, same order: cached
    assert torch_tpu._C._meta_kernel_calls() == before
    torch.ops.aten.hardtanh(x, -2.5, -3.5)  # same classes, min above max: its meta kernel runs
    assert torch_tpu._C._meta_kernel_calls() == before + 1


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (-0.5, 0.25), (-3.0, 2.5)])
def test_hardtanh_and_clamp_values_follow_each_call(lo, hi):
    x = torch.linspace(-4, 4, 33)
    torch.testing.assert_close(F.hardtanh(x.to("tpu"), lo, hi).cpu(), F.hardtanh(x, lo, hi), rtol=0, atol=0)
    torch.testing.assert_close(x.to("tpu").clamp(lo, hi).cpu(), x.clamp(lo, hi), rtol=0, atol=0)


def test_adamw_matches_cpu_over_steps():
    torch.manual_seed(1)
    model = torch.nn.Linear(8, 4)
    cpu_params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    tpu_params = [p.detach().clone().to("tpu").requires_grad_() for p in model.parameters()]
    opts = [torch.optim.AdamW(ps, lr=1e-2, foreach=False) for ps in (cpu_params, tpu_params)]
    for step in range(6):
        torch.manual_seed(10 + step)
        grads = [torch.randn(p.shape) for p in cpu_params]
        for ps, opt in zip((cpu_params, tpu_params), opts):
            for p, g in zip(ps, grads):
                p.grad = g.to(p.device)
            opt.step()
    for got, want in zip(tpu_params, cpu_params):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "dtype,ok,overflows,call",
    [
        (torch.bfloat16, 1e38, 3.395e38, lambda x, v: torch.ops.aten.clamp_min(x, v)),  # past bf16's max only
        (torch.bfloat16, 1e38, 3.395e38, lambda x, v: torch.add(x, x, alpha=v)),
        (torch.int8, 100.0, 200.0, lambda x, v: x.masked_fill(x > 1, v)),  # whole, past int8's range
        (torch.uint8, 2.0, 300.0, lambda x, v: x.masked_fill(x > 1, v)),
        (torch.int8, -100.0, -129.0, lambda x, v: x.masked_fill(x > 1, v)),
    ],
)
def test_a_value_past_the_dtypes_range_raises_at_the_call(dtype, ok, overflows, call):
    # Found by a break-it pass: bf16's maximum and the integer ranges were no class boundaries, so
    # the overflowing value was queued under the valid one's validated signature and raised at
    # the next synchronize.
    x = torch.arange(6).to(dtype)
    for device in ("cpu", "tpu"):
        xd = x.to(device)
        call(xd, ok)
        with pytest.raises(RuntimeError, match="without overflow"):
            call(xd, overflows)
    torch.tpu.synchronize()  # nothing sticky left behind


def test_int8_range_edges_are_told_apart():
    x = torch.arange(6, dtype=torch.int8, device="tpu")
    for v in (127.0, -128.0, 100.0, -100.0):
        torch.testing.assert_close(x.masked_fill(x > 1, v).cpu(), x.cpu().masked_fill(x.cpu() > 1, v))
    for v in (128.0, -129.0):
        with pytest.raises(RuntimeError, match="without overflow"):
            x.masked_fill(x > 1, v)
    torch.tpu.synchronize()
