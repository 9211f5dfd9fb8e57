"""bf16 and fp16 matrix products: on a host without AVX-512, with
TORCH_TPU_WIDEN_HALF_PRODUCTS=1, the worker widens the operands to float32 (matmul_precision.h),
so the result must be the float32 product rounded once, as the MXU's bf16 x bf16 -> f32
accumulation gives, through every path (the fallback's first call, the fast path's repeated
calls, out=, autograd). Oracle: CPU's float32 product of the same operands."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

HALF = [torch.bfloat16, torch.float16]


def _rounded_f32(fn, *tensors, dtype):
    return fn(*(t.float() for t in tensors)).to(dtype)


def _assert_rounded_product(got, want, dtype):
    # Same float32 products summed in another order: at most one ulp of the half type apart.
    assert got.dtype == dtype and got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), want, rtol=torch.finfo(dtype).eps, atol=torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", HALF)
def test_mm_bmm_addmm_repeated(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 72, generator=g, dtype=dtype), torch.randn(72, 56, generator=g, dtype=dtype)
    x, y = torch.randn(3, 40, 72, generator=g, dtype=dtype), torch.randn(3, 72, 24, generator=g, dtype=dtype)
    bias = torch.randn(56, generator=g, dtype=dtype)
    for _ in range(3):  # first call through the fallback, then the fast path
        _assert_rounded_product(a.to("tpu") @ b.to("tpu"), _rounded_f32(torch.mm, a, b, dtype=dtype), dtype)
        _assert_rounded_product(torch.bmm(x.to("tpu"), y.to("tpu")), _rounded_f32(torch.bmm, x, y, dtype=dtype), dtype)
        got = torch.addmm(bias.to("tpu"), a.to("tpu"), b.to("tpu"), beta=0.5, alpha=2.0)
        want = torch.addmm(bias.float(), a.float(), b.float(), beta=0.5, alpha=2.0).to(dtype)
        _assert_rounded_product(got, want, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_out_and_linear_backward(dtype):
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(16, 32, generator=g, dtype=dtype), torch.randn(24, 32, generator=g, dtype=dtype)
    out = torch.full((16, 24), 7.0, dtype=dtype, device="tpu")
    torch.mm(a.to("tpu"), w.t().to("tpu"), out=out)
    _assert_rounded_product(out, _rounded_f32(torch.mm, a, w.t(), dtype=dtype), dtype)

    at = a.to("tpu").requires_grad_()
    wt = w.to("tpu").requires_grad_()
    F.linear(at, wt).sum().backward()
    ones = torch.ones(16, 24, dtype=dtype)
    _assert_rounded_product(at.grad, _rounded_f32(torch.mm, ones, w, dtype=dtype), dtype)
    _assert_rounded_product(wt.grad, _rounded_f32(torch.mm, ones.t(), a, dtype=dtype), dtype)


def test_mixed_dtypes_still_raise_at_the_call():
    a = torch.randn(4, 4, dtype=torch.bfloat16, device="tpu")
    b = torch.randn(4, 4, device="tpu")
    with pytest.raises(RuntimeError, match="dtype"):
        torch.mm(a, b)
