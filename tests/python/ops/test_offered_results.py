"""relu, flip and roll, whose CPU kernels allocate their own results, write them straight into
HBM (runtime/host_result_offer.h): values are CPU eager's, bit for bit, for every dtype, dim and
layout, with results kept across calls and inputs the offer skips (non-contiguous)."""

import pytest
import torch

from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

OPS = [
    ("relu", torch.relu),
    ("flip(0)", lambda t: t.flip(0)),
    ("flip(-1, 0)", lambda t: t.flip(-1, 0)),
    ("roll(3, 1)", lambda t: t.roll(3, 1)),
    ("roll((1, -2), (0, 1))", lambda t: t.roll((1, -2), (0, 1))),
    ("roll(5)", lambda t: t.roll(5)),  # flattened
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int8]


def _input(shape, dtype):
    g = torch.Generator().manual_seed(7)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("name, op", OPS, ids=[n for n, _ in OPS])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (64, 256), (1024, 33)])
def test_matches_cpu_and_results_stay(name, op, dtype, shape):
    x = _input(shape, dtype)
    xt = x.to("tpu")
    first = op(xt)
    second = op(xt * 2 if dtype != torch.int8 else xt)  # another call: must not overwrite `first`
    assert torch.equal(first.cpu(), op(x))
    assert torch.equal(second.cpu(), op(x * 2 if dtype != torch.int8 else x))
    assert first.shape == op(x).shape and first.stride() == op(x).stride()


@pytest.mark.parametrize("name, op", OPS, ids=[n for n, _ in OPS])
@pytest.mark.parametrize(
    "view",
    [
        lambda t: t.transpose(1, 3),
        lambda t: t[:, :, ::2],
        lambda t: t.contiguous(memory_format=torch.channels_last),
    ],
    ids=["transposed", "strided", "channels_last"],
)
def test_non_contiguous_inputs_match_cpu(name, op, view):
    x = _input((4, 6, 10, 12), torch.float32)
    got = op(view(x.to("tpu")))
    expected = op(view(x))
    assert torch.equal(got.cpu(), expected)
    assert got.shape == expected.shape  # (roll of channels_last: tpu contiguous, docs/limits.md)


def test_in_a_loop_the_dropped_results_reuse_their_block():
    x = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    for _ in range(200):
        torch.relu(x)
        x.flip(1)
        x.roll(7, 0)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before
    assert torch.equal(torch.relu(x).cpu(), torch.relu(x.cpu()))


def test_bad_arguments_raise_at_the_call_as_on_cpu():
    x = torch.randn(3, 4, device="tpu")
    with pytest.raises(IndexError, match="out of range"):
        x.flip(2)
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        x.roll((1, 2), (0,))
