"""torch.tpu.ops.splash_sdpa with implementation "pallas": JAX's splash kernel (Pallas TPU interpret
mode, the pallas extra) against CPU SDPA; what it cannot do raises at the call."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("jax", reason="needs the pallas extra (pip install -e .[pallas])")

from torch_tpu.tpu import ops  # noqa: E402
from torch_tpu.tpu.ops import _attention  # noqa: E402


@pytest.mark.parametrize("causal", [False, True])
def test_pallas_splash_sdpa_matches_cpu_sdpa(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=g) for _ in range(3))
    with _attention.implementation("pallas"):
        got = ops.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=causal, block_q=128)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)


def test_pallas_splash_sdpa_grouped_query_heads():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 128, 64, generator=g)
    k, v = (torch.randn(1, 2, 128, 64, generator=g) for _ in range(2))
    with _attention.implementation("pallas"):
        got = ops.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), enable_gqa=True, block_q=128)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)


def test_pallas_splash_sdpa_unsupported_raises_at_the_call():
    q = torch.randn(1, 1, 128, 64, device="tpu")
    with _attention.implementation("pallas"):
        with pytest.raises(NotImplementedError, match="local window"):
            ops.splash_sdpa(q, q, q, local_window_size=16)
        with pytest.raises(NotImplementedError, match="no backward"):
            ops.splash_sdpa(q.requires_grad_(), q, q)
    out = ops.splash_sdpa(q.detach(), q.detach(), q.detach())  # the default kernel still works
    assert out.shape == (1, 1, 128, 64)
