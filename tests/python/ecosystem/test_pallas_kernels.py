"""torch.tpu.pallas.kernels: JAX's own Pallas TPU kernels as ops, against PyTorch on CPU."""

import math

import pytest
import torch

pytest.importorskip("jax")

from torch.tpu.pallas import kernels  # noqa: E402


def _qkv(b, h, t, s, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, d, generator=g), torch.randn(b, h, s, d, generator=g),
            torch.randn(b, h, s, d, generator=g))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention(causal):
    q, k, v = _qkv(1, 2, 128, 128, 128)
    scale = 1 / math.sqrt(128)
    out = kernels.flash_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), causal=causal, sm_scale=scale)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-3, atol=2e-3)


def test_splash_attention_and_splash_sdpa():
    q, k, v = _qkv(1, 2, 128, 128, 128, seed=1)
    out = kernels.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-3, atol=2e-3)


def test_gmm():
    g = torch.Generator().manual_seed(2)
    lhs, rhs = torch.randn(256, 128, generator=g), torch.randn(2, 128, 128, generator=g)
    sizes = torch.tensor([128, 128], dtype=torch.int32)
    out = kernels.gmm(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu"))
    ref = torch.cat([lhs[:128] @ rhs[0], lhs[128:] @ rhs[1]])
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-3)


def test_ragged_paged_attention_does_not_run_in_jax_0_10_interpret_mode():
    """A known limit (docs/pallas.md): the kernel reshapes a VMEM ref, which JAX 0.10.2's TPU
    interpreter cannot do; the error is the op's (raised at the call: strict mode runs a
    signature's first call at once), and the chip stays usable."""
    hq, hkv, d, page = 4, 2, 128, 16
    q = torch.randn(16, hq, d, device="tpu")
    kv_pages = torch.randn(4, page, 2 * hkv, d, device="tpu")
    i32 = dict(dtype=torch.int32, device="tpu")
    args = (torch.tensor([16, 24], **i32), torch.tensor([[0, 1], [2, 3]], **i32), torch.tensor([0, 8, 16], **i32),
            torch.tensor([2], **i32))
    with pytest.raises(RuntimeError, match=r"(?s)tpu_pallas::ragged_paged_attention.*ReshapeTransform"):
        kernels.ragged_paged_attention(q, kv_pages, *args, sm_scale=d**-0.5)
        torch.tpu.synchronize()
    torch.testing.assert_close((q[:1] * 2).cpu(), q[:1].cpu() * 2)


def test_block_that_does_not_divide_names_the_op():
    q, k, v = _qkv(1, 1, 96, 96, 128)
    with pytest.raises(ValueError, match=r"tpu_pallas::flash_attention.*block size 64 does not divide"):
        kernels.flash_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), block_q=64, block_k=64)
