"""Values PyTorch's own device tests found wrong on tpu, each against CPU: factories into a
non-contiguous out=, nansum over dim=[], quantization raising at the call, debug mode's out=
and uint8-mask handling."""

import pytest
import torch

import torch_tpu
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

FACTORIES = {
    "arange": lambda out: torch.arange(0, 6, out=out),
    "linspace": lambda out: torch.linspace(0, 5, 6, out=out),
    "logspace": lambda out: torch.logspace(0, 5, 6, out=out),
}


@pytest.mark.parametrize("mode", ["strict", "debug"])
@pytest.mark.parametrize("name", list(FACTORIES))
def test_factory_into_non_contiguous_out(name, mode):
    want = torch.zeros(3, 4)
    FACTORIES[name](want.narrow(1, 1, 2))
    with torch_tpu.eager_mode(mode):
        got = torch.zeros(3, 4, device="tpu")
        view = got.narrow(1, 1, 2)
        FACTORIES[name](view)
        assert view.shape == (3, 2) and view.stride() == (4, 1)
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_nansum_over_no_dims_reduces_everything(mode):
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, 0.0, 0.0]])
    with torch_tpu.eager_mode(mode):
        got = torch.nansum(x.to("tpu"), dim=[])
        torch.testing.assert_close(got.cpu(), torch.nansum(x, dim=[]))


@pytest.mark.parametrize(
    "make",
    [
        lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
        lambda x: torch.quantize_per_channel(x, torch.ones(3), torch.zeros(3, dtype=torch.long), 0, torch.qint8),
    ],
    ids=["per_tensor", "per_channel"],
)
def test_quantize_raises_not_implemented_at_the_call(make):
    x = torch.ones(3, device="tpu")
    with pytest.raises(NotImplementedError, match="quantize_per.*quantized tensors are not supported on tpu"):
        make(x)
    torch.tpu.synchronize()
    torch.testing.assert_close((x + 1).cpu(), torch.full((3,), 2.0))


def test_debug_normal_into_out():
    with torch_tpu.eager_mode("debug"):
        mean = torch.zeros(1000, device="tpu")
        r = torch.empty(1000, device="tpu")
        torch.manual_seed(0)
        torch.normal(mean, 3.0, out=r)
        got = r.cpu()
    torch.manual_seed(0)
    want = torch.normal(torch.zeros(1000), 3.0)
    assert got.shape == (1000,)
    assert abs(got.std().item() - 3.0) < 0.3 and abs(want.std().item() - 3.0) < 0.3


def test_debug_uint8_mask_is_a_mask_not_an_index():
    x = torch.arange(6.0)
    m = torch.tensor([1, 0, 1, 0, 1, 1], dtype=torch.uint8)
    with torch_tpu.eager_mode("debug"):
        with pytest.warns(UserWarning, match="uint8 is now deprecated"):
            got = x.to("tpu")[m.to("tpu")].cpu()
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        want = x[m]
    torch.testing.assert_close(got, want)


def test_quantized_empty_raises_not_implemented_at_the_call():
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported on tpu"):
        torch._empty_affine_quantized([2, 3], scale=0.1, zero_point=0, dtype=torch.quint8, device="tpu")
    torch.testing.assert_close((torch.ones(2, device="tpu") * 3).cpu(), torch.full((2,), 3.0))


def test_torchscript_masked_setitem():
    # TorchScript builds the index list as a Tensor?[] of its own type object (not the one
    # eager mode's lists carry); the fallback must still see the mask as a tpu index.
    def fn(x):
        x[x < 50] = 1.0
        return x

    scripted = torch.jit.script(fn)
    want = fn(torch.arange(100.0))
    torch.testing.assert_close(scripted(torch.arange(100.0, device="tpu")).cpu(), want)
    with torch_tpu.eager_mode("debug"):
        torch.testing.assert_close(scripted(torch.arange(100.0, device="tpu")).cpu(), want)
