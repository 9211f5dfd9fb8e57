"""MXU numerics (float32 matmul precision), autocast, SDPA, portability report."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers.mxu import bf16 as _bf16
from helpers.mxu import three_pass as _three_pass


@pytest.fixture
def precision():
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)


def test_highest_is_exact_fp32(precision):
    precision("highest")
    a, b = torch.randn(33, 70), torch.randn(70, 17)
    torch.testing.assert_close((a.tpu() @ b.tpu()).cpu(), a @ b)


@pytest.mark.parametrize(
    "rows,cols,weight_layout",
    [(4, 8192, "linear"), (2, 8192, "linear"), (7, 8192, "linear"), (8, 8200, "linear"), (1, 8192, "linear"),
     (9, 8192, "linear"), (4, 8191, "linear"), (4, 8192, "contiguous")],
)
def test_a_few_rows_against_a_large_weight_are_as_accurate_as_cpu(precision, rows, cols, weight_layout):
    # 2-8 rows by a transposed [N >= 8192, K] weight (a decode step's vocabulary projection) run in
    # another order than ATen's (csrc/aten/host_matmul.h); the shapes around the bounds do not.
    precision("highest")
    torch.manual_seed(2)
    x = torch.randn(rows, 512)
    w = torch.randn(cols, 512) if weight_layout == "linear" else torch.randn(512, cols)
    b = w.t() if weight_layout == "linear" else w
    exact = x.double() @ b.double()

    def forms(x, w, b):  # the same product called as a user would: each form is its own CPU oracle
        out = torch.full((cols, rows), float("nan"), device=x.device).t()  # out= in another layout
        torch.mm(x, b, out=out)
        linear = F.linear(x.unsqueeze(1), w).squeeze(1) if weight_layout == "linear" else x @ b
        return [x @ b, x @ b, x @ b, out, linear]  # the first call is validated, the later ones kept

    got = [t.cpu() for t in forms(x.tpu(), w.tpu(), b.tpu())]
    for g, cpu in zip(got, forms(x, w, b)):  # sums of 512 products in another order: rounding apart
        torch.testing.assert_close(g, cpu, atol=1e-4, rtol=1e-5)
        assert (g.double() - exact).abs().mean() <= 1.25 * (cpu.double() - exact).abs().mean()
    for g in got[1:3]:
        torch.testing.assert_close(g, got[0], atol=0, rtol=0)  # the kept calls compute as the first


def test_a_few_rows_into_an_out_that_overlaps_an_operand_give_cpus_result(precision):
    # The reordered product (csrc/aten/host_matmul.h) steps aside: ATen's kernel, as on CPU.
    precision("highest")
    torch.manual_seed(3)
    b = torch.randn(8192, 512).t()
    results = []
    for dev in ("cpu", "tpu"):
        buf = torch.randn(4, 8192, generator=torch.Generator().manual_seed(1)).to(dev)
        for _ in range(2):  # the validated first call, then the kept one
            torch.mm(buf[:, :512], b.to(dev), out=buf)
        results.append(buf.cpu())
    # equal_nan: on an Intel CPU, MKL's product into its own operand is all NaN.
    torch.testing.assert_close(results[1], results[0], atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "baddbmm", "linear"])
def test_medium_rounds_inputs_to_bf16(precision, op):
    precision("medium")
    torch.manual_seed(0)
    a, b = torch.randn(4, 16, 64), torch.randn(4, 64, 24)
    bias = torch.randn(24)
    fns = {
        "mm": lambda a, b, c: a[0] @ b[0],
        "addmm": lambda a, b, c: torch.addmm(c, a[0], b[0]),
        "bmm": lambda a, b, c: torch.bmm(a, b),
        "baddbmm": lambda a, b, c: torch.baddbmm(c, a, b),
        "linear": lambda a, b, c: F.linear(a, b[0].t(), c),
    }
    fn = fns[op]
    got = fn(a.tpu(), b.tpu(), bias.tpu()).cpu()
    precision("highest")
    expected = fn(_bf16(a), _bf16(b), bias)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)
    # ... and differs from exact fp32 by bf16-sized errors, so the test can fail.
    assert (got - fn(a, b, bias)).abs().max() > 1e-3


def test_high_is_three_bf16_passes(precision):
    torch.manual_seed(1)
    a, b = torch.randn(40, 256), torch.randn(256, 30)
    exact = a.double() @ b.double()
    precision("high")
    got = (a.tpu() @ b.tpu()).cpu().double()
    torch.testing.assert_close(got, _three_pass(a, b), atol=1e-4, rtol=1e-5)
    precision("medium")
    medium = (a.tpu() @ b.tpu()).cpu().double()
    # three passes are far more accurate than one, and close to exact
    assert (got - exact).abs().max() * 20 < (medium - exact).abs().max()


def test_conv2d_follows_precision(precision):
    torch.manual_seed(2)
    x, w, bias = torch.randn(2, 3, 10, 10), torch.randn(4, 3, 3, 3), torch.randn(4)
    precision("medium")
    got = F.conv2d(x.tpu(), w.tpu(), bias.tpu(), padding=1).cpu()
    precision("highest")
    torch.testing.assert_close(got, F.conv2d(_bf16(x), _bf16(w), bias, padding=1), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(F.conv2d(x.tpu(), w.tpu(), bias.tpu(), padding=1).cpu(),
                               F.conv2d(x, w, bias, padding=1))


def test_bf16_elementwise_rounds_once():
    x = torch.randn(1000).to(torch.bfloat16)
    y = torch.randn(1000).to(torch.bfloat16)
    expected = (x.float() * y.float() + x.float()).to(torch.bfloat16)
    got = torch.addcmul(x.tpu(), x.tpu(), y.tpu()).cpu()
    assert torch.equal(got, expected)


def test_autocast_bf16_policy():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = a.tpu() @ b.tpu()
        s = torch.softmax(y, -1)  # fp32 policy op
        lin = F.linear(a.tpu(), b.t().tpu())
    assert y.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
    assert s.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_cpu = a @ b
    torch.testing.assert_close(y.cpu(), y_cpu)


def test_autocast_float16_and_backward():
    w = torch.randn(16, 4, requires_grad=True)
    wt = w.detach().tpu().requires_grad_()
    x = torch.randn(8, 16)
    with torch.autocast("tpu", dtype=torch.float16):
        out = (x.tpu() @ wt).float().sum()
    out.backward()
    with torch.autocast("cpu", dtype=torch.float16):
        (x @ w).float().sum().backward()
    assert wt.grad.dtype == torch.float32
    torch.testing.assert_close(wt.grad.cpu(), w.grad, atol=1e-2, rtol=1e-2)


def test_sdpa_matches_cpu_and_has_gradients():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    qt, kt, vt = (t.detach().tpu().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out_t = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    torch.testing.assert_close(out_t.cpu(), out, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    out_t.backward(g.tpu())
    for a, b in ((q, qt), (k, kt), (v, vt)):
        torch.testing.assert_close(b.grad.cpu(), a.grad, atol=1e-5, rtol=1e-5)


def test_unsupported_dtypes_are_reported():
    torch_tpu.runtime.reset_unsupported_on_tpu()
    x = torch.arange(4, dtype=torch.float64, device="tpu")
    y = (x * 2).sum()
    assert y.item() == 12.0
    report = torch_tpu.runtime.unsupported_on_tpu()
    assert any("mul" in op for op in report), report
    assert all(set(v) <= {"Double", "ComplexFloat", "ComplexDouble", "ComplexHalf"} for v in report.values())
    torch_tpu.runtime.reset_unsupported_on_tpu()
    (torch.ones(3, device="tpu") * 2).sum().item()
    assert torch_tpu.runtime.unsupported_on_tpu() == {}


def test_complex_works_for_correctness():
    z = torch.randn(5, dtype=torch.complex64)
    torch.testing.assert_close((z.tpu() * z.tpu()).cpu(), z * z)


def test_sparse_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="sparse"):
        torch.ones(3, device="tpu").to_sparse()
    with pytest.raises(NotImplementedError, match="sparse"):
        torch.empty(3, device="tpu", layout=torch.sparse_coo)
