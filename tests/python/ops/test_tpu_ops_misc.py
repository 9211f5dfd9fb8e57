"""torch.tpu.ops: optimization_barrier, max_pool{1,2,3}d(_backward) without indices, jagged
NestedTensor alignment, and the list of TorchTPU members; values against CPU PyTorch."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.tpu.ops as ops
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

DEV = "tpu"

# (n, input shape, kernel_size, stride, padding, dilation, ceil_mode)
POOLS = [
    (1, (2, 3, 11), [3], [2], [1], [1], False),
    (1, (3, 10), [2], [], [0], [2], True),
    (2, (2, 3, 9, 8), [3, 2], [2, 1], [1, 0], [1, 2], True),
    (2, (3, 7, 7), [2], [2], [0], [1], False),
    (3, (1, 2, 6, 7, 5), [2, 3, 2], [2, 2, 1], [1, 1, 0], [1, 1, 2], False),
    (3, (2, 5, 6, 5), [3], [2], [1], [1], True),
]
FWD = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


@pytest.mark.parametrize("case", POOLS, ids=[f"{c[0]}d-{i}" for i, c in enumerate(POOLS)])
def test_max_pool_and_backward_match_cpu(case):
    n, shape, k, s, p, d, ceil = case
    g = torch.Generator().manual_seed(n)
    x = torch.randn(*shape, generator=g)
    x[..., 0] = x[..., 1]  # ties: the first maximum wins, as in ATen
    xc = x.clone().requires_grad_()
    want = FWD[n](xc, k, s or None, p, d, ceil_mode=ceil)
    go = torch.randn(want.shape, generator=g)
    want.backward(go)
    pool, backward = getattr(ops, f"max_pool{n}d"), getattr(ops, f"max_pool{n}d_backward")
    xt = x.to(DEV).requires_grad_()
    got = pool(xt, k, s, p, d, ceil)
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=0, atol=0)
    got.backward(go.to(DEV))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=0, atol=0)
    direct = backward(go.to(DEV), x.to(DEV), k, s, p, d, ceil)
    torch.testing.assert_close(direct.cpu(), xc.grad, rtol=0, atol=0)


def test_max_pool2d_under_torch_compile_and_int_arguments():
    torch._dynamo.reset()
    x = torch.randn(2, 3, 8, 8)

    def f(t):
        return ops.max_pool2d(t.relu(), [2, 2], [2, 2], [0, 0], [1, 1], False) * 3

    got = torch.compile(f, backend="tpu", fullgraph=True)(x.to(DEV))
    torch.testing.assert_close(got.cpu(), F.max_pool2d(x.relu(), 2) * 3, rtol=0, atol=0)
    torch.testing.assert_close(ops.max_pool2d(x.to(DEV), 2, 2, 0, 1, False).cpu(), F.max_pool2d(x, 2))


def test_max_pool_bad_input():
    x = torch.randn(2, 3, 8, 8, device=DEV)
    with pytest.raises(ValueError, match=r"max_pool2d: kernel_size must have 1 or 2 elements, got 3"):
        ops.max_pool2d(x, [2, 2, 2], [1], [0], [1], False)
    with pytest.raises(ValueError, match=r"max_pool3d: input must be 4-D or 5-D"):
        ops.max_pool3d(x[0, 0], [2], [1], [0], [1], False)
    with pytest.raises(TypeError, match=r"max_pool1d: stride must be an int or a sequence"):
        ops.max_pool1d(x[0], [2], "x", [0], [1], False)
    with pytest.raises(RuntimeError, match="pad should be"):
        ops.max_pool2d(x, [2], [1], [3], [1], False)
    with pytest.raises(ValueError, match=r"max_pool2d_backward: grad_output must have the pooled shape \(2, 3, 4, 4\)"):
        ops.max_pool2d_backward(torch.ones(2, 3, 5, 5, device=DEV), x, [2], [2], [0], [1], False)
    assert ops.max_pool2d(x, [2], [2], [0], [1], False).shape == (2, 3, 4, 4)


def test_optimization_barrier_eager_identity_and_autograd():
    a = torch.randn(4, device=DEV, requires_grad=True)
    b = torch.arange(3, device=DEV)
    out = ops.optimization_barrier([a, b])
    assert isinstance(out, list) and out[0] is a and out[1] is b
    assert ops.optimization_barrier(()) == []
    with pytest.raises(TypeError, match=r"inputs\[1\] must be a Tensor, got int"):
        ops.optimization_barrier([a, 3])
    with pytest.raises(TypeError, match="got a Tensor"):
        ops.optimization_barrier(a)


def test_optimization_barrier_under_torch_compile_is_a_separate_call():
    torch._dynamo.reset()
    x = torch.randn(6, 5)
    y = torch.randn(6, 5)
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(a, b):
        s, t = ops.optimization_barrier([a.sin(), b * 2])
        return (s + t).exp()

    torch_tpu.reset_compile_stats()
    got = torch.compile(f, backend="tpu", fullgraph=True)(x.to(DEV), y.to(DEV))
    torch.testing.assert_close(got.cpu(), (x.sin() + y * 2).exp(), rtol=1e-5, atol=1e-5)
    stats = torch_tpu.compile_stats()
    # the barrier stays a library call between the fused regions before and after it
    assert stats["library_calls"]["tpu::optimization_barrier.default"] == 1, stats["library_calls"]
    torch.compile(f, backend=recording_backend, fullgraph=True)(x, y)
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("optimization_barrier" in t for t in targets), targets
    # gradients flow through the barrier under compile
    torch._dynamo.reset()
    xt = x.to(DEV).requires_grad_()
    torch.compile(f, backend="tpu")(xt, y.to(DEV)).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), (x.sin() + y * 2).exp() * x.cos(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- jagged NestedTensors

def jagged(lengths, dim=4, device=DEV, requires_grad=False):
    g = torch.Generator().manual_seed(sum(lengths))
    parts = [torch.randn(n, dim, generator=g) for n in lengths]
    return torch.nested.nested_tensor(parts, layout=torch.jagged, device=device, requires_grad=requires_grad), parts


@pytest.mark.parametrize("lengths,multiple,pad", [([3, 5], 16, 8), ([4, 4], 8, 0), ([1, 2, 3], 4, 2)])
def test_align_and_strip_jagged(lengths, multiple, pad):
    nt, parts = jagged(lengths)
    aligned = ops.align_jagged_to_multiple(nt, multiple, padding_value=-1.5)
    assert aligned.is_nested and aligned.layout == torch.jagged and aligned.device.type == "tpu"
    total = sum(lengths)
    assert aligned.values().shape == (total + pad, 4) and (total + pad) % multiple == 0
    assert aligned.offsets().cpu().tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist(), total + pad]
    seqs = aligned.unbind()
    assert len(seqs) == len(lengths) + 1
    for got, want in zip(seqs, parts):
        assert torch.equal(got.cpu(), want)
    assert torch.equal(seqs[-1].cpu(), torch.full((pad, 4), -1.5))
    for stripped in (ops.strip_jagged_padding(aligned), ops.strip_jagged_padding(aligned, valid_tokens=total)):
        assert stripped.offsets().cpu().tolist() == nt.offsets().cpu().tolist()
        for got, want in zip(stripped.unbind(), parts):
            assert torch.equal(got.cpu(), want)


def test_align_jagged_default_multiple_and_autograd():
    nt, parts = jagged([3, 5], requires_grad=True)
    aligned = ops.align_jagged_to_multiple(nt)
    assert aligned.values().shape[0] == 128
    ops.strip_jagged_padding(aligned).values().pow(2).sum().backward()
    want = torch.cat(parts) * 2
    torch.testing.assert_close(nt.grad.values().cpu(), want)


def test_jagged_bad_input():
    nt, _ = jagged([3, 5])
    with pytest.raises(TypeError, match="nt must be a NestedTensor with layout=torch.jagged, got a dense Tensor"):
        ops.align_jagged_to_multiple(torch.randn(2, 3, device=DEV))
    strided = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], device=DEV)
    with pytest.raises(TypeError, match="nt must have layout=torch.jagged"):
        ops.align_jagged_to_multiple(strided)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="multiple must be a positive int"):
            ops.align_jagged_to_multiple(nt, bad)
    with pytest.raises(ValueError, match=r"valid_tokens must be an int in \[0, 8\]"):
        ops.strip_jagged_padding(nt, valid_tokens=9)
    one, _ = jagged([4])
    with pytest.raises(ValueError, match="nt has 1 sequence"):
        ops.strip_jagged_padding(one)
    holes = torch.nested.narrow(torch.randn(2, 6, 4, device=DEV), 1, torch.tensor([0, 1], device=DEV),
                                torch.tensor([3, 4], device=DEV), layout=torch.jagged)
    with pytest.raises(NotImplementedError, match="holes"):
        ops.align_jagged_to_multiple(holes)
    assert ops.align_jagged_to_multiple(nt, 8).values().shape == (8, 4)


# ----------------------------------------------------------------- the whole list

def test_every_member_is_built_and_unknown_names_raise_attribute_error():
    assert ops.NOT_YET == {}
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        ops.nonexistent  # noqa: B018


def test_public_names_match_torchtpu_signatures():
    import inspect

    assert set(ops.__all__) | set(ops.NOT_YET) == {
        "align_jagged_to_multiple", "all_gather_dim", "max_pool1d", "max_pool1d_backward", "max_pool2d",
        "max_pool2d_backward", "max_pool3d", "max_pool3d_backward", "optimization_barrier", "ragged_all_to_all",
        "ragged_dot", "ragged_dot_weight_grad", "recv", "reduce_scatter_dim", "send", "sparse_dense_matmul",
        "sparse_dense_matmul_activation_unstack", "sparse_dense_matmul_grad_with_adagrad",
        "sparse_dense_matmul_grad_with_adam", "sparse_dense_matmul_grad_with_sgd",
        "sparse_dense_matmul_gradient_stack", "sparse_gather", "sparse_gather_backward", "sparse_iota",
        "sparse_map_row", "splash_sdpa", "strip_jagged_padding"}
    params = {name: list(inspect.signature(getattr(ops, name)).parameters) for name in ops.__all__}
    assert params["ragged_all_to_all"] == ["operand", "output", "input_offsets", "send_sizes", "output_offsets",
                                           "recv_sizes", "process_group_name", "out"]
    assert params["max_pool3d_backward"] == ["grad_output", "input", "kernel_size", "stride", "padding",
                                             "dilation", "ceil_mode"]
    assert params["reduce_scatter_dim"] == ["input", "dim", "group", "reduce_op"]
    assert inspect.signature(ops.align_jagged_to_multiple).parameters["multiple"].default == 128
