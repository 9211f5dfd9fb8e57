"""Partitioning into regions (builder): an op whose inputs are all outside regions joins its first
reader's region; split regions with column-reduction outputs (a bias gradient's sum next to the
activation gradient) run in row chunks whose partial results are combined. Values against CPU."""

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)
from torch_tpu.compile import program


@pytest.fixture
def programs(monkeypatch):
    """The Program objects built while the test runs."""
    built = []
    init = program.Program.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        built.append(self)

    monkeypatch.setattr(program.Program, "__init__", record)
    return built


def test_gelu_tanh_backward_and_bias_sum_are_one_split_region(programs):
    lin_cpu = torch.nn.Linear(256, 1024)
    lin_tpu = copy.deepcopy(lin_cpu).to("tpu")
    x_cpu = torch.randn(512, 256, generator=torch.Generator().manual_seed(0)).requires_grad_()
    x_tpu = x_cpu.detach().to("tpu").requires_grad_()

    def block(lin, t):
        return F.gelu(lin(t), approximate="tanh")

    block(lin_cpu, x_cpu).square().sum().backward()
    torch.compile(block, backend="tpu")(lin_tpu, x_tpu).square().sum().backward()
    grads = [[t.grad.cpu() for t in (x, lin.weight, lin.bias)] for x, lin in ((x_cpu, lin_cpu), (x_tpu, lin_tpu))]
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    backward = [p for p in programs if p.desc["kind"] == "backward"]
    assert len(backward) == 1
    (region,) = [st for st in backward[0].desc["steps"] if st["kind"] == "region"]
    assert "aten::tanh.default" in region["ops"] and "aten::sum.dim_IntList" in region["ops"]
    assert len(region["ops"]) >= 18  # the whole decomposed gelu backward, times the incoming gradient
    (r,) = backward[0].regions
    assert r.chunks > 1 and len(r.partial_outputs) == 1  # [512, 1024] in row chunks, the bias sum per chunk


@pytest.mark.parametrize("kind", ["sum", "amax", "amin"])
def test_column_reduction_next_to_a_large_result_is_split_and_combined(programs, kind):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1024, 384, generator=g), torch.randn(1024, 384, generator=g)
    a[700, 5] = float("nan")  # NaN reaches the column's max/min/sum from one chunk

    def f(a, b):
        y = a * b + 1.0
        r = {"sum": lambda t: t.sum(0, keepdim=True), "amax": lambda t: t.amax(0), "amin": lambda t: t.amin(0)}[kind]
        return y, r(y)

    want = f(a, b)
    got = torch.compile(f, backend="tpu")(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True)
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-5, atol=1e-4, equal_nan=True)
    assert got[1].cpu()[..., 5].isnan().all()
    (p,) = programs
    (r,) = p.regions
    assert r.chunks > 1 and r.partial_outputs == [1]


def test_root_read_first_by_a_library_call_keeps_its_own_region():
    def f(x, w):
        h = x * 0.5 + 1.0  # root `x * 0.5` read by a fusible op: one region
        s = x.exp()  # root read by a library call (mm) first
        return h, s @ w, s + 1.0

    x, w = torch.randn(64, 32), torch.randn(32, 16)
    want = f(x, w)
    got = torch.compile(f, backend="tpu")(x.to("tpu"), w.to("tpu"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    assert torch_tpu.compile_stats()["library_calls"].get("aten::mm.default") == 1


def test_whole_sum_of_a_split_vector_is_a_rank0_partial(programs):
    a = torch.randn(3 << 18, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def f(a):
        y = a * 2 + 1
        return y, y.sum()

    got = torch.compile(f, backend="tpu")(a.to("tpu"))
    want = f(a)
    torch.testing.assert_close(got[0].cpu(), want[0])
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-12, atol=1e-9)
    (r,) = programs[0].regions
    assert r.chunks > 1 and r.partial_outputs == [1]
