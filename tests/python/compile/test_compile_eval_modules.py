"""torch.compile(backend="tpu") of modules in eval mode under no_grad (inference
graphs, where PyTorch picks the non-training kernels); CPU eager is the oracle."""

import pytest
import torch
import torch.nn as nn


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("norm", [nn.BatchNorm2d, nn.InstanceNorm2d, nn.GroupNorm])
def test_eval_norm_layers_under_no_grad(norm):
    torch.manual_seed(0)
    layer = norm(2, 8) if norm is nn.GroupNorm else norm(8, affine=True, track_running_stats=True)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), layer, nn.ReLU(), nn.Dropout(0.5)).eval()
    if isinstance(layer, nn.modules.batchnorm._NormBase):  # non-trivial running statistics
        layer.running_mean.uniform_(-1, 1)
        layer.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model.to("tpu"), backend="tpu", dynamic=False)
        got = compiled(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
