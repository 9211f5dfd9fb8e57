"""group_norm forward and backward and layer_norm backward, whose CPU kernels allocate their own
results, write them straight into HBM (runtime/host_result_offer.h): values are CPU eager's, bit
for bit, for each dtype and layout, with and without affine parameters, and results kept across
calls stay as they were."""

import pytest
import torch
import torch.nn.functional as F

GROUP_SHAPES = [(4, 8, 16, 16), (2, 6, 5, 7), (3, 4, 10), (2, 8, 4, 4, 4)]


def _group_norm(device, x, affine, memory_format, groups):
    x = x.detach().to(device).clone(memory_format=memory_format).requires_grad_()
    c = x.shape[1]
    w = torch.linspace(0.5, 1.5, c, dtype=x.dtype).to(device).requires_grad_() if affine else None
    b = torch.linspace(-1, 1, c, dtype=x.dtype).to(device).requires_grad_() if affine else None
    out = F.group_norm(x, groups, w, b, eps=1e-5)
    grad = torch.linspace(-1, 1, out.numel(), dtype=x.dtype).reshape(out.shape).to(device)
    out.backward(grad)
    grads = [x.grad] + ([w.grad, b.grad] if affine else [])
    return [t.detach().cpu() for t in [out] + grads]


@pytest.mark.parametrize("shape", GROUP_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_forward_backward_match_cpu(shape, dtype, affine):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 2 + 0.5).to(dtype)
    groups = 2
    for got, want in zip(
        _group_norm("tpu", x, affine, torch.contiguous_format, groups),
        _group_norm("cpu", x, affine, torch.contiguous_format, groups),
    ):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)


def test_group_norm_channels_last_matches_cpu():
    torch.manual_seed(1)
    x = torch.randn(2, 8, 6, 6)
    fmt = torch.channels_last
    for got, want in zip(_group_norm("tpu", x, True, fmt, 4), _group_norm("cpu", x, True, fmt, 4)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _layer_norm_backward(device, x, shape, affine):
    x = x.detach().to(device).requires_grad_()
    w = torch.linspace(0.5, 1.5, x.shape[-1], dtype=x.dtype).to(device).requires_grad_() if affine else None
    b = torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype).to(device).requires_grad_() if affine else None
    out = F.layer_norm(x, shape, w, b)
    grad = torch.linspace(-1, 1, out.numel(), dtype=x.dtype).reshape(out.shape).to(device)
    out.backward(grad)
    return [t.detach().cpu() for t in [out, x.grad] + ([w.grad, b.grad] if affine else [])]


@pytest.mark.parametrize("shape", [(64, 256), (3, 5, 7), (512, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_matches_cpu(shape, dtype, affine):
    torch.manual_seed(2)
    x = (torch.randn(shape) * 3 - 1).to(dtype)
    normalized = shape[-1:]
    for got, want in zip(
        _layer_norm_backward("tpu", x, normalized, affine), _layer_norm_backward("cpu", x, normalized, affine)
    ):
        assert torch.equal(got, want)


def test_results_kept_across_calls_stay():
    # Each call's results land in their own HBM blocks: earlier ones are not overwritten.
    torch.manual_seed(3)
    xs = [torch.randn(4, 8, 16, 16) for _ in range(4)]
    kept = [F.group_norm(x.to("tpu"), 4) for x in xs]
    for x, y in zip(xs, kept):
        assert torch.equal(y.cpu(), F.group_norm(x, 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_norm_with_float32_parameters_matches_cpu(dtype):
    # Reduced-precision activations, float32 affine parameters: CPU's mean/rstd are float32
    # (the meta kernel's would be the input's dtype), and backward takes them as they are.
    torch.manual_seed(4)
    x, w, b = torch.randn(2, 8, 4, 4).to(dtype), torch.randn(8), torch.randn(8)
    got = torch.native_group_norm(x.to("tpu"), w.to("tpu"), b.to("tpu"), 2, 8, 16, 4, 1e-5)
    want = torch.native_group_norm(x, w, b, 2, 8, 16, 4, 1e-5)
    for g, c in zip(got, want):
        assert g.dtype == c.dtype
        assert torch.equal(g.cpu(), c)
    grads = {}
    for dev in ("cpu", "tpu"):
        xx, ww = x.clone().to(dev).requires_grad_(), w.clone().to(dev).requires_grad_()
        F.group_norm(xx, 4, ww, b.to(dev)).float().pow(2).sum().backward()
        grads[dev] = (xx.grad.cpu(), ww.grad.cpu())
    for g, c in zip(grads["tpu"], grads["cpu"]):
        assert g.dtype == c.dtype
        assert torch.equal(g, c)
