"""torch.tpu.ops MoE matmuls (ragged_dot, ragged_dot_weight_grad) and torch._grouped_mm on tpu,
against a CPU loop over groups."""

import pytest
import torch

import torch_tpu.tpu.ops as ops
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

DEV = "tpu"


def loop_ragged_dot(lhs, rhs, sizes):
    out, start = [], 0
    for g, s in enumerate(sizes):
        out.append(lhs[start:start + s] @ rhs[g])
        start += s
    return torch.cat(out)


def loop_weight_grad(lhs, go, sizes):
    out, start = [], 0
    for s in sizes:
        out.append(lhs[start:start + s].t() @ go[start:start + s])
        start += s
    return torch.stack(out)


def data(sizes, k=8, n=6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = sum(sizes)
    return (torch.randn(m, k, generator=g).to(dtype), torch.randn(len(sizes), k, n, generator=g).to(dtype),
            torch.randn(m, n, generator=g).to(dtype))


def tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sizes", [[3, 5, 2], [0, 7, 0, 1], [4]], ids=["three", "empty_groups", "one"])
@pytest.mark.parametrize("sizes_dtype", [torch.int32, torch.int64])
def test_ragged_dot_forward_backward_match_cpu_loop(dtype, sizes, sizes_dtype):
    lhs, rhs, go = data(sizes, dtype=dtype)
    gs = torch.tensor(sizes, dtype=sizes_dtype)
    lc, rc = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    want = loop_ragged_dot(lc, rc, sizes)
    want.backward(go)
    lt, rt = lhs.to(DEV).requires_grad_(), rhs.to(DEV).requires_grad_()
    got = ops.ragged_dot(lt, rt, gs.to(DEV))
    assert got.device.type == "tpu" and got.dtype == dtype and got.shape == want.shape
    got.backward(go.to(DEV))
    torch.testing.assert_close(got.cpu(), want.detach(), **tol(dtype))
    torch.testing.assert_close(lt.grad.cpu(), lc.grad, **tol(dtype))
    torch.testing.assert_close(rt.grad.cpu(), rc.grad, **tol(dtype))


def test_ragged_dot_weight_grad_matches_cpu_loop_and_is_differentiable():
    sizes = [2, 0, 5]
    lhs, _, go = data(sizes)
    gs = torch.tensor(sizes, device=DEV)
    want = loop_weight_grad(lhs, go, sizes)
    got = ops.ragged_dot_weight_grad(lhs.to(DEV), go.to(DEV), gs)
    assert got.shape == (3, 8, 6)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1].cpu(), torch.zeros(8, 6))
    # gradients of the weight gradient: against autograd of the CPU loop
    w = torch.randn(3, 8, 6)
    lc, gc = lhs.clone().requires_grad_(), go.clone().requires_grad_()
    loop_weight_grad(lc, gc, sizes).backward(w)
    lt, gt = lhs.to(DEV).requires_grad_(), go.to(DEV).requires_grad_()
    ops.ragged_dot_weight_grad(lt, gt, gs).backward(w.to(DEV))
    torch.testing.assert_close(lt.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gt.grad.cpu(), gc.grad, rtol=1e-5, atol=1e-5)


def test_ragged_dot_gradcheck_float64_cpu():
    sizes = torch.tensor([2, 1, 3])
    lhs, rhs, go = (t.double().requires_grad_() for t in data([2, 1, 3], k=3, n=2))
    assert torch.autograd.gradcheck(lambda a, b: ops.ragged_dot(a, b, sizes), (lhs, rhs))
    assert torch.autograd.gradgradcheck(lambda a, b: ops.ragged_dot(a, b, sizes), (lhs, rhs))
    assert torch.autograd.gradcheck(lambda a, b: ops.ragged_dot_weight_grad(a, b, sizes), (lhs, go))


def test_ragged_dot_out_and_custom_op_names():
    sizes = [3, 5]
    lhs, rhs, _ = data(sizes)
    out = torch.full((8, 6), 7.0, device=DEV)
    got = ops.ragged_dot(lhs.to(DEV), rhs.to(DEV), torch.tensor(sizes), out=out)
    assert got is out
    torch.testing.assert_close(out.cpu(), loop_ragged_dot(lhs, rhs, sizes), rtol=1e-5, atol=1e-5)
    assert hasattr(torch.ops.tpu, "ragged_dot") and hasattr(torch.ops.tpu, "ragged_dot_weight_grad")
    with pytest.raises(ValueError, match="out must be"):
        ops.ragged_dot(lhs.to(DEV), rhs.to(DEV), torch.tensor(sizes), out=torch.empty(8, 5, device=DEV))


def test_ragged_dot_under_torch_compile_tpu():
    torch._dynamo.reset()
    sizes = [3, 5]
    lhs, rhs, go = data(sizes)
    gs = torch.tensor(sizes, device=DEV)

    def f(a, b):
        return torch.tanh(ops.ragged_dot(a, b, gs)) * 2

    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    lt, rt = lhs.to(DEV).requires_grad_(), rhs.to(DEV).requires_grad_()
    got = compiled(lt, rt)
    got.backward(go.to(DEV))
    lc, rc = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    want = torch.tanh(loop_ragged_dot(lc, rc, sizes)) * 2
    want.backward(go)
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lt.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rt.grad.cpu(), rc.grad, rtol=1e-5, atol=1e-5)


BAD = [
    ("sum", dict(gs=[3, 4]), ValueError, r"group_sizes must sum to lhs.shape\[0\] = 8, got sum 7"),
    ("negative", dict(gs=[9, -1]), ValueError, r"group_sizes must be non-negative.*group_sizes\[1\] = -1"),
    ("float_sizes", dict(gs_dtype=torch.float32), TypeError, "group_sizes must have an integer dtype"),
    ("groups", dict(gs=[8]), ValueError, r"group_sizes has 1 groups, rhs.shape\[0\] is 2"),
    ("k", dict(k_rhs=7), ValueError, r"contraction sizes differ: lhs.shape\[1\] = 8, rhs.shape\[1\] = 7"),
    ("dtype", dict(rhs_dtype=torch.bfloat16), TypeError, "rhs dtype torch.bfloat16 differs from lhs"),
    ("int_lhs", dict(lhs_dtype=torch.int64, rhs_dtype=torch.int64), TypeError, "lhs must have a floating dtype"),
    ("rank", dict(rhs_2d=True), ValueError, r"rhs must be 3-D \[G, K, N\]"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_ragged_dot_bad_input_raises_at_the_call(case):
    _, kw, exc, msg = case
    lhs = torch.randn(8, 8, device=DEV).to(kw.get("lhs_dtype", torch.float32))
    rhs = torch.randn(2, kw.get("k_rhs", 8), 6, device=DEV).to(kw.get("rhs_dtype", torch.float32))
    if kw.get("rhs_2d"):
        rhs = rhs[0]
    gs = torch.tensor(kw.get("gs", [3, 5])).to(kw.get("gs_dtype", torch.int64))
    with pytest.raises(exc, match=msg):
        ops.ragged_dot(lhs, rhs, gs)
    # the process keeps working
    good = ops.ragged_dot(torch.ones(8, 8, device=DEV), torch.ones(2, 8, 6, device=DEV), torch.tensor([3, 5]))
    assert torch.equal(good.cpu(), torch.full((8, 6), 8.0))


def test_ragged_dot_weight_grad_bad_input():
    lhs, go = torch.randn(8, 4, device=DEV), torch.randn(8, 3, device=DEV)
    with pytest.raises(ValueError, match="group_sizes must sum"):
        ops.ragged_dot_weight_grad(lhs, go, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"grad_output must be 2-D \[M, N\] with M = lhs.shape\[0\] = 8"):
        ops.ragged_dot_weight_grad(lhs, go[:5], torch.tensor([3, 5]))


# ----------------------------------------------------------------- torch._grouped_mm on tpu
# torch 2.13 has no CPU kernel of its own for _grouped_mm: it is CompositeExplicitAutograd
# (ATen's loop over groups), so on tpu it runs as tpu matmuls. It requires 16-byte aligned
# strides (sizes multiple of 4 for float32, 8 for bfloat16), on CPU and tpu alike.

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_2d_3d_matches_cpu_loop_with_backward(dtype):
    sizes = [3, 0, 5]
    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    a, b, go = data(sizes, k=8, n=16, dtype=dtype, seed=3)
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = loop_ragged_dot(ac, bc, sizes)
    want.backward(go)
    at, bt = a.to(DEV).requires_grad_(), b.to(DEV).requires_grad_()
    got = torch._grouped_mm(at, bt, offs=offs.to(DEV))
    assert got.device.type == "tpu"
    got.backward(go.to(DEV))
    torch.testing.assert_close(got.cpu(), want.detach(), **tol(dtype))
    torch.testing.assert_close(at.grad.cpu(), ac.grad, **tol(dtype))
    torch.testing.assert_close(bt.grad.cpu(), bc.grad, **tol(dtype))


def test_grouped_mm_3d_3d_and_2d_2d_match_cpu():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(3, 4, 8, generator=g), torch.randn(3, 8, 8, generator=g)
    torch.testing.assert_close(torch._grouped_mm(a.to(DEV), b.to(DEV)).cpu(), torch.bmm(a, b), rtol=1e-5, atol=1e-5)
    # 2-D x 2-D: offs split the contraction dim into groups, one [M, N] product per group
    x, y = torch.randn(4, 12, generator=g), torch.randn(12, 8, generator=g)
    offs = torch.tensor([4, 12], dtype=torch.int32)
    want = torch.stack([x[:, :4] @ y[:4], x[:, 4:] @ y[4:]])
    xt = x.to(DEV).t().contiguous().t()  # column-major lhs, as the kernel asks for
    got = torch._grouped_mm(xt, y.to(DEV), offs=offs.to(DEV))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["defer_and_fuse", "debug"])
def test_ragged_dot_and_grouped_mm_in_other_eager_modes(mode):
    import torch_tpu

    sizes = [3, 0, 5]
    lhs, rhs, go = data(sizes, k=8, n=8)
    lc, rc = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    want = loop_ragged_dot(lc.sin(), rc, sizes)
    want.backward(go)
    with torch_tpu.eager_mode(mode):
        lt, rt = lhs.to(DEV).requires_grad_(), rhs.to(DEV).requires_grad_()
        got = ops.ragged_dot(lt.sin(), rt, torch.tensor(sizes, device=DEV))
        got.backward(go.to(DEV))
        gmm = torch._grouped_mm(lhs.to(DEV).sin(), rhs.to(DEV), offs=torch.tensor([3, 3, 8], dtype=torch.int32,
                                                                                 device=DEV))
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gmm.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lt.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rt.grad.cpu(), rc.grad, rtol=1e-5, atol=1e-5)
