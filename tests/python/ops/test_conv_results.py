"""Convolutions whose CPU kernel allocates its own results write them straight into HBM
(runtime/host_result_offer.h): forward and backward values are CPU eager's, bit for bit, for
every layout and path the kernel takes (oneDNN, the slow im2col kernels, depthwise, transposed,
float64, channels_last, results of equal sizes, tensors kept across calls)."""

import pytest
import torch
import torch.nn.functional as F

from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

CASES = [
    # (input shape, weight shape, kwargs, conv)
    ((2, 8, 64, 64), (8, 8, 3, 3), dict(padding=1), F.conv2d),
    ((1, 3, 17, 19), (5, 3, 3, 3), dict(stride=2), F.conv2d),
    ((2, 8, 16, 16), (8, 1, 3, 3), dict(padding=1, groups=8), F.conv2d),  # depthwise
    ((2, 6, 12, 12), (6, 3, 3, 3), dict(groups=2, dilation=2), F.conv2d),
    ((2, 4, 30), (6, 4, 5), dict(padding=2), F.conv1d),
    ((1, 2, 6, 7, 8), (3, 2, 3, 3, 3), dict(padding=1), F.conv3d),
    ((2, 8, 10, 10), (8, 4, 3, 3), dict(stride=2, padding=1, output_padding=1), F.conv_transpose2d),
    ((2, 4, 9, 9), (4, 4, 1, 1), {}, F.conv2d),  # output the same size as the input
]


def _run(device, x, w, b, kwargs, conv, memory_format=torch.contiguous_format):
    x = x.detach().to(device).clone(memory_format=memory_format).requires_grad_()
    w = w.detach().to(device).clone().requires_grad_()
    b = None if b is None else b.detach().to(device).clone().requires_grad_()
    out = conv(x, w, b, **kwargs)
    grad = torch.linspace(-1, 1, out.numel(), device=device).reshape(out.shape).to(out.dtype)
    out.backward(grad)
    return [t.detach().cpu() for t in (out, x.grad, w.grad) + (() if b is None else (b.grad,))], out


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_forward_backward_match_cpu(case, dtype, bias):
    shape, wshape, kwargs, conv = CASES[case]
    g = torch.Generator().manual_seed(case)
    x = torch.randn(shape, generator=g, dtype=dtype)
    w = torch.randn(wshape, generator=g, dtype=dtype)
    out_channels = wshape[1] * kwargs.get("groups", 1) if conv is F.conv_transpose2d else wshape[0]
    b = torch.randn(out_channels, generator=g, dtype=dtype) if bias else None
    want, _ = _run("cpu", x, w, b, kwargs, conv)
    got, out = _run("tpu", x, w, b, kwargs, conv)
    assert out.device.type == "tpu"
    for gt, wt in zip(got, want):
        assert gt.shape == wt.shape and gt.stride() == wt.stride()
        torch.testing.assert_close(gt, wt, rtol=0, atol=0)


def _channels_last_runs():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 8, 20, 20, generator=g), torch.randn(16, 8, 3, 3, generator=g), torch.randn(16)
    return (_run("cpu", x, w, b, dict(padding=1), F.conv2d, torch.channels_last),
            _run("tpu", x, w, b, dict(padding=1), F.conv2d, torch.channels_last))


def test_channels_last_values():
    (want, _), (got, _) = _channels_last_runs()
    for gt, wt in zip(got, want):
        torch.testing.assert_close(gt.contiguous(), wt.contiguous(), rtol=0, atol=0)


@pytest.mark.xfail(strict=True, reason="results take the meta kernel's contiguous layout (docs/limits.md)")
def test_channels_last_layout():
    (_, cpu_out), (_, out) = _channels_last_runs()
    assert out.stride() == cpu_out.stride()


def test_results_stay_valid_across_many_calls():
    # Each call's result lives in its own HBM block: results kept from earlier calls must not
    # change when later calls reuse the kernel's (offered) allocations.
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 8, 3, 3, generator=g)
    xs = [torch.randn(2, 8, 32, 32, generator=g) for _ in range(6)]
    wt = w.to("tpu")
    kept = [F.conv2d(x.to("tpu"), wt, padding=1) for x in xs]
    again = [F.conv2d(x.to("tpu"), wt, padding=1) for x in reversed(xs)]
    for x, k, a in zip(xs, kept, reversed(again)):
        want = F.conv2d(x, w, padding=1)
        torch.testing.assert_close(k.cpu(), want, rtol=0, atol=0)
        torch.testing.assert_close(a.cpu(), want, rtol=0, atol=0)


def test_conv_errors_at_the_call_as_cpu():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 5, 3, 3)
    with pytest.raises(RuntimeError) as cpu_err:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError) as tpu_err:
        F.conv2d(x.to("tpu"), w.to("tpu"))
    assert str(tpu_err.value) == str(cpu_err.value)


@pytest.mark.parametrize("conv,x_shape,w_shape", [
    (F.conv2d, (1, 2, 5, 5), (0, 2, 3, 3)),            # no output channels
    (F.conv_transpose2d, (1, 0, 5, 5), (0, 4, 3, 3)),  # no input channels
    (F.conv2d, (1, 0, 5, 5), (4, 0, 3, 3)),            # weight without input channels
    (F.conv2d, (0, 2, 5, 5), (4, 2, 3, 3)),            # empty batch
])
def test_empty_weights_and_batches_as_cpu(conv, x_shape, w_shape):
    # Their pricing divided by the weight's first dimension: a SIGFPE, not CPU's error.
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    try:
        want = conv(x, w)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as got:
            conv(x.to("tpu"), w.to("tpu")).cpu()
        assert str(got.value) == str(e)
        return
    got = conv(x.to("tpu"), w.to("tpu"))
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
