"""Loss ops run on tpu without warnings that CPU does not print.

The fallback writes a functional op's result straight into HBM through the op's out= overload.
mse_loss.out and smooth_l1_loss.out first resize their out tensor to the unreduced shape and then
back to [], so a 0-d out tensor of the right shape made PyTorch print "An output with one or more
elements was resized" on every call: these losses take the functional path instead.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

LOSSES = [F.mse_loss, F.smooth_l1_loss, F.huber_loss, F.l1_loss]


@pytest.mark.parametrize("loss", LOSSES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_warns_nothing_and_matches_cpu(loss, reduction, capfd):
    torch.manual_seed(0)
    a, b = torch.randn(30, 70, requires_grad=True), torch.randn(30, 70)
    at = a.detach().to("tpu").requires_grad_()
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = loss(at, b.to("tpu"), reduction=reduction)
        out.sum().backward()
        torch.tpu.synchronize()
    err = capfd.readouterr().err
    assert [str(w.message) for w in caught] == []
    assert "resized" not in err, err
    ref = loss(a, b, reduction=reduction)
    ref.sum().backward()
    assert out.shape == ref.shape
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(at.grad.cpu(), a.grad)


def test_loss_shape_mismatch_raises_at_the_call():
    with pytest.warns(UserWarning, match="target size"), pytest.raises(RuntimeError, match="must match the size"):
        F.mse_loss(torch.randn(3, 4, device="tpu"), torch.randn(5, 4, device="tpu"))
    assert F.mse_loss(torch.ones(2, device="tpu"), torch.zeros(2, device="tpu")).item() == 1.0
