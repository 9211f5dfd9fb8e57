"""scaled_dot_product_attention in compiled graphs: the flash kernel where strict mode takes it
(backend._route_sdpa_to_flash), the math path otherwise; values and gradients against CPU."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)


def _qkv(dtype=torch.float32, heads=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, heads, 32, 16, generator=g, dtype=dtype, requires_grad=True) for _ in range(3)]


def _check(fn, qkv, rtol=1e-5, atol=1e-5):
    dev = [t.detach().to("tpu").requires_grad_() for t in qkv]
    want = fn(*qkv)
    want.square().sum().backward()
    got = torch.compile(fn, backend="tpu")(*dev)
    got.square().sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=rtol, atol=atol)
    for a, b in zip(qkv, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=rtol * 10, atol=atol * 10)
    return torch_tpu.compile_stats()["library_calls"]


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_takes_the_flash_kernel(causal):
    calls = _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3), _qkv())
    assert calls["aten::_scaled_dot_product_flash_attention_for_cpu.default"] == 1
    assert calls["aten::_scaled_dot_product_flash_attention_for_cpu_backward.default"] == 1
    assert "aten::bmm.default" not in calls and "aten::_softmax.default" not in calls


def test_sdpa_under_autocast_bf16_equals_cpu():
    def f(q, k, v):
        dev = q.device.type
        with torch.autocast(dev, dtype=torch.bfloat16):
            q, k, v = (t * 1.0 for t in (q, k, v))
            return F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True).float()

    calls = _check(f, _qkv(), rtol=2e-2, atol=2e-2)
    assert calls["aten::_scaled_dot_product_flash_attention_for_cpu.default"] == 1


def test_sdpa_with_a_mask_keeps_the_math_path():
    mask = torch.rand(32, 32, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device))

    calls = _check(f, _qkv())
    assert "aten::_scaled_dot_product_flash_attention_for_cpu.default" not in calls
    assert calls["aten::bmm.default"] >= 2


def test_sdpa_float32_under_lower_matmul_precision_keeps_the_math_path():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        calls = _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _qkv(),
                       rtol=2e-2, atol=2e-2)
    finally:
        torch.set_float32_matmul_precision(old)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu.default" not in calls


def test_sdpa_bad_input_raises_at_the_call():
    # mismatched head dims: the compiled call raises naming the attention op; the process keeps working
    f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), backend="tpu")
    q = torch.randn(1, 2, 8, 16, device="tpu")
    with pytest.raises(RuntimeError, match="scaled_dot_product_attention|size|shape"):
        f(q, torch.randn(1, 2, 8, 8, device="tpu"), torch.randn(1, 2, 8, 8, device="tpu"))
    out = f(q, q, q)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu()), rtol=1e-5,
                               atol=1e-5)
