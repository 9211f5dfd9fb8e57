"""Helion's Pallas backend (Helion 1.5.x, a fixed config, no autotuning) on tpu tensors:
its launcher reaches torch_tpu._internal.pallas (JaxCallable, then call_custom_kernel), the
kernel runs in Pallas's TPU interpret mode, and results equal Helion's reference mode."""

import pytest
import torch

pytest.importorskip("jax")
helion = pytest.importorskip("helion")
hl = pytest.importorskip("helion.language")


def _kernels(**settings):
    @helion.kernel(config=helion.Config(block_sizes=[8, 128]), static_shapes=True, **settings)
    def scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(out.size()):
            out[tile] = x[tile] * 2.0 + y[tile]
        return out

    @helion.kernel(config=helion.Config(block_sizes=[8]), static_shapes=True, **settings)
    def row_sum(x: torch.Tensor) -> torch.Tensor:
        m, _ = x.size()
        out = torch.empty([m], dtype=x.dtype, device=x.device)
        for tile in hl.tile(m):
            out[tile] = x[tile, :].sum(-1)
        return out

    return scaled_add, row_sum


def test_helion_pallas_backend_on_tpu_equals_reference_mode():
    from torch_tpu._internal.pallas import tpu_torch_pallas

    on_tpu = _kernels(backend="pallas")
    reference = _kernels(ref_mode=helion.RefMode.EAGER)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 256, generator=g), torch.randn(16, 256, generator=g)
    for _ in range(2):  # the second call takes Helion's direct call_custom_kernel path
        out = on_tpu[0](x.to("tpu"), y.to("tpu"))
        assert out.device.type == "tpu"
        torch.testing.assert_close(out.cpu(), reference[0](x, y), rtol=0, atol=0)
    assert any("scaled_add" in name for name, _ in tpu_torch_pallas._kernels)
    out = on_tpu[1](x.to("tpu"))
    torch.testing.assert_close(out.cpu(), reference[1](x), rtol=1e-5, atol=1e-5)
