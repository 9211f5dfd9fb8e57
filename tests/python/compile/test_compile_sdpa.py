"""scaled_dot_product_attention in compiled graphs: one custom op each way (torch.ops.tpu.attention,
torch_tpu/compile/attention.py) without mask or dropout, the composite's math path otherwise;
values and gradients against CPU eager."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)

ROUTED = ("tpu::attention.default", "tpu::attention_backward.default")


def _qkv(dtype=torch.float32, heads=(4, 4, 4), t=32, s=32, d=16, dv=16):
    g = torch.Generator().manual_seed(0)
    shapes = [(2, heads[0], t, d), (2, heads[1], s, d), (2, heads[2], s, dv)]
    return [torch.randn(sh, generator=g, dtype=dtype).requires_grad_() for sh in shapes]


def _check(fn, qkv, rtol=1e-5, atol=1e-5):
    dev = [t.detach().to("tpu").requires_grad_() for t in qkv]
    want = fn(*qkv)
    want.square().sum().backward()
    got = torch.compile(fn, backend="tpu")(*dev)
    got.square().sum().backward()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=rtol, atol=atol)
    for a, b in zip(qkv, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=rtol * 10, atol=atol * 10)
    return torch_tpu.compile_stats()["library_calls"]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_is_one_op_each_way(causal, dtype):
    # T != S and a value head dim of its own: the causal mask is top-left aligned, as SDPA's
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3)  # noqa: E731
    calls = _check(fn, _qkv(dtype, t=24, s=40, dv=8))
    assert all(calls[name] == 1 for name in ROUTED), calls
    assert not {"aten::_softmax.default", "aten::any.dim", "aten::bmm.default"} & set(calls), calls


def test_sdpa_under_autocast_bf16_equals_cpu():
    def f(q, k, v):
        with torch.autocast(q.device.type, dtype=torch.bfloat16):
            q, k, v = (torch.nn.functional.linear(t, torch.eye(16, device=t.device)) for t in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).float()

    calls = _check(f, _qkv(), rtol=2e-2, atol=2e-2)
    assert calls["tpu::attention.default"] == 1


def test_float32_inputs_under_autocast_keep_the_composite():
    # autocast casts SDPA's float32 inputs to bf16; the custom op has no autocast rule: not routed
    def f(q, k, v):
        with torch.autocast(q.device.type, dtype=torch.bfloat16):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    calls = _check(f, _qkv(), rtol=2e-2, atol=2e-2)
    assert "tpu::attention.default" not in calls


def test_mask_dropout_and_grouped_heads_keep_the_composite():
    mask = torch.rand(32, 32, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    calls = _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)), _qkv())
    assert "tpu::attention.default" not in calls and calls["aten::bmm.default"] >= 2
    torch._dynamo.reset()
    torch_tpu.reset_compile_stats()
    gqa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    calls = _check(gqa, _qkv(heads=(4, 2, 2)))
    assert "tpu::attention.default" not in calls
    q = torch.randn(1, 2, 8, 4, device="tpu")
    torch._dynamo.reset()
    torch_tpu.reset_compile_stats()
    torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), backend="tpu")(q)
    assert "tpu::attention.default" not in torch_tpu.compile_stats()["library_calls"]


def test_inference_and_dynamic_shapes():
    f = torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), backend="tpu", dynamic=True)
    for t in (5, 9):
        q = torch.randn(1, 2, t, 4)
        with torch.no_grad():
            torch.testing.assert_close(
                f(q.to("tpu")).cpu(), F.scaled_dot_product_attention(q, q, q, is_causal=True), rtol=1e-5, atol=1e-5
            )


def test_bad_input_raises_at_the_call():
    # mismatched head dims: the compiled call raises naming the sizes; the process keeps working
    f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), backend="tpu")
    q = torch.randn(1, 2, 8, 16, device="tpu")
    with pytest.raises(RuntimeError, match="size|shape"):
        f(q, torch.randn(1, 2, 8, 8, device="tpu"), torch.randn(1, 2, 8, 8, device="tpu"))
    torch.testing.assert_close(
        f(q, q, q).cpu(), F.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu()), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ValueError, match="tpu.attention: q .* differ"):
        torch.ops.tpu.attention(q, q[..., :8], q, True, 0.25)
