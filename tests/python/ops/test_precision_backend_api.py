"""PyTorch's per-backend float32 precision API (torch.backends.{mkldnn,cuda}.matmul.fp32_precision,
torch.backends.fp32_precision): settings torch.get_float32_matmul_precision() refuses to read
("mix of the legacy and new APIs") still give tpu matmuls, at the precision docs/design.md
"Numerics" names, checked against hand-rounded oracles."""

import pytest
import torch

import torch_tpu  # noqa: F401
from helpers.backend_flags import settable_backend_flags
from helpers.mxu import bf16 as _bf16
from helpers.mxu import three_pass as _three_pass

_SETTINGS = (torch.backends, torch.backends.mkldnn, torch.backends.mkldnn.matmul, torch.backends.cuda.matmul)


@pytest.fixture
def backends():
    """Lets a test set the per-backend settings; restores them (and the legacy one) after it."""
    legacy = torch.get_float32_matmul_precision()
    old = [s.fp32_precision for s in _SETTINGS]
    with settable_backend_flags():
        yield torch.backends
        torch.set_float32_matmul_precision(legacy)
        for setting, value in zip(_SETTINGS, old):
            setting.fp32_precision = value
    assert torch.get_float32_matmul_precision() == legacy


@pytest.fixture
def operands():
    g = torch.Generator().manual_seed(22)
    return torch.randn(40, 256, generator=g), torch.randn(256, 30, generator=g)


def _tpu_product(a, b):
    return (a.tpu() @ b.tpu()).cpu()


def test_mkldnn_bf16_alone_is_one_bf16_pass(backends, operands):
    backends.mkldnn.matmul.fp32_precision = "bf16"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()  # what the tpu ops must not depend on
    a, b = operands
    assert torch.randn(3, device="tpu").shape == (3,)
    got = _tpu_product(a, b)
    torch.testing.assert_close(got.double(), _bf16(a).double() @ _bf16(b).double(), atol=1e-4, rtol=1e-5)
    assert (got.double() - a.double() @ b.double()).abs().max() > 1e-3  # bf16-sized: the test can fail
    assert torch_tpu._C._effective_matmul_precision() == "medium"


def test_cuda_tf32_alone_is_three_bf16_passes(backends, operands):
    backends.cuda.matmul.fp32_precision = "tf32"
    a, b = operands
    torch.testing.assert_close(_tpu_product(a, b).double(), _three_pass(a, b), atol=1e-4, rtol=1e-5)
    assert torch_tpu._C._effective_matmul_precision() == "high"


def test_generic_bf16_reaches_the_matmul_through_mkldnn(backends, operands):
    backends.mkldnn.fp32_precision = backends.mkldnn.matmul.fp32_precision = "none"  # inherit...
    backends.fp32_precision = "bf16"  # ... this
    a, b = operands
    torch.testing.assert_close(_tpu_product(a, b).double(), _bf16(a).double() @ _bf16(b).double(),
                               atol=1e-4, rtol=1e-5)


def test_ieee_everywhere_is_exact(backends, operands):
    backends.mkldnn.matmul.fp32_precision = "ieee"
    backends.cuda.matmul.fp32_precision = "ieee"
    a, b = operands
    torch.testing.assert_close(_tpu_product(a, b), a @ b)
    assert torch_tpu._C._effective_matmul_precision() == "highest"


def test_highest_override_is_exact_where_the_host_kernel_would_round(backends, operands):
    # CPU's own kernel follows mkldnn's bf16 (on hosts with bf16 units); the TPU's HIGHEST does not.
    backends.mkldnn.matmul.fp32_precision = "bf16"
    a, b = operands
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        got = _tpu_product(a, b)
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
        w = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(2))
        conv = torch.nn.functional.conv2d(x.tpu(), w.tpu()).cpu()
    torch.testing.assert_close(got.double(), a.double() @ b.double(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(conv.double(), torch.nn.functional.conv2d(x.double(), w.double()),
                               atol=1e-5, rtol=1e-6)


def test_sdpa_under_mkldnn_bf16_follows_the_precision(backends):
    backends.mkldnn.matmul.fp32_precision = "bf16"
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 16, 32, generator=g) for _ in range(3))
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        got = torch.nn.functional.scaled_dot_product_attention(q.tpu(), k.tpu(), v.tpu()).cpu()
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["defer_and_fuse", "compile"])
def test_deferred_and_compiled_products_under_mkldnn_bf16(backends, operands, path):
    backends.mkldnn.matmul.fp32_precision = "bf16"
    a, b = operands

    def fn(x, y):
        return torch.relu(x @ y)

    if path == "compile":
        got = torch.compile(fn, backend="tpu")(a.tpu(), b.tpu()).cpu()
    else:
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            got = fn(a.tpu(), b.tpu()).cpu()
    torch.testing.assert_close(got.double(), fn(_bf16(a).double(), _bf16(b).double()), atol=1e-4, rtol=1e-5)
