"""The default (philox) chip generator: state layout, the counter property (element i
depends only on (seed, offset + i)), the same values in every eager mode and in compiled
programs, the distributions (moments, ranges, a Kolmogorov-Smirnov bound computed here
against the analytic CDF), bad input, and the TORCH_TPU_RNG switch.
"""

import math

import pytest
import torch

import torch_tpu
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


def state(seed, offset):
    s = torch.empty(16, dtype=torch.uint8)
    s[:8] = torch.tensor([seed], dtype=torch.int64).view(torch.uint8)
    s[8:] = torch.tensor([offset], dtype=torch.int64).view(torch.uint8)
    return s


def seed_offset(s):
    return s[:8].view(torch.uint64).item(), s[8:].view(torch.int64).item()


# ------------------------------------------------------------------ state


def test_state_is_seed_and_offset():
    torch.tpu.manual_seed(1234)
    s = torch.tpu.get_rng_state()
    assert s.dtype == torch.uint8 and s.shape == (16,) and s.device.type == "cpu"
    assert seed_offset(s) == (1234, 0)
    torch.rand(10, device="tpu")  # 10 elements: the offset moves by 12 (multiples of 4, as CUDA)
    assert seed_offset(torch.tpu.get_rng_state()) == (1234, 12)
    torch.randn(3, 4, device="tpu")
    assert seed_offset(torch.tpu.get_rng_state()) == (1234, 24)
    g = torch.tpu.default_generators[0]
    assert g.get_offset() == 24 and g.initial_seed() == 1234


def test_dtensor_philox_state_reads_it():
    from torch.distributed.tensor._random import _PhiloxState

    torch.tpu.manual_seed(77)
    torch.rand(5, device="tpu")
    st = _PhiloxState(torch.tpu.get_rng_state())
    assert st.seed.item() == 77 and st.offset.item() == 8
    st.offset = st.offset + 40
    torch.tpu.set_rng_state(st.state)
    assert torch.tpu.default_generators[0].get_offset() == 48


def test_element_i_depends_only_on_seed_and_offset_plus_i():
    torch.tpu.set_rng_state(state(5, 0))
    whole = torch.rand(64, device="tpu").cpu()
    for start in (4, 20, 60):
        torch.tpu.set_rng_state(state(5, start))
        part = torch.rand(64 - start, device="tpu").cpu()
        assert torch.equal(part, whole[start:])
    torch.tpu.set_rng_state(state(5, 0))
    assert torch.equal(torch.rand(8, 8, device="tpu").cpu().flatten(), whole)
    # Non-contiguous targets: element i counts the result's elements in row-major order.
    torch.tpu.set_rng_state(state(5, 0))
    t = torch.empty(8, 8, device="tpu").t()
    t.uniform_()
    assert torch.equal(t.cpu().flatten(), whole)


def stream_words(seed, offset, n):
    """Words 0 and 1 of the blocks at positions offset .. offset + n - 1, read through random_:
    with a range of 2**32 element i is block i's word 0; random_() on int64 keeps word 1 in its
    low 32 bits."""
    torch.tpu.set_rng_state(state(seed, offset))
    w0 = torch.empty(n, device="tpu", dtype=torch.int64).random_(0, 2**32).cpu()
    torch.tpu.set_rng_state(state(seed, offset))
    w1 = torch.empty(n, device="tpu", dtype=torch.int64).random_().cpu() & 0xFFFFFFFF
    return w0, w1


def test_uniform_is_the_streams_first_word():
    n = 3000  # several 64-lane blocks and a partial one, split across threads
    w0, _ = stream_words(7, 16, n)
    expected = (-1.0 + (w0 >> 8).double() / 2**24 * 4.0).float()  # a + u (b - a), rounded once
    torch.tpu.set_rng_state(state(7, 16))
    assert torch.equal(torch.empty(n, device="tpu").uniform_(-1, 3).cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normal_is_box_muller_of_the_streams_words(dtype):
    # The oracle is float64 math on the stream's words.
    n = 3000  # several 64-lane blocks and a partial one, split across threads
    w0, w1 = stream_words(11, 40, n)
    u1 = 1.0 - (w0 >> 8).double() / 2**24
    u2 = (w1 >> 8).double() / 2**24
    expected = 1.5 + 2.0 * torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2 * math.pi * u2)
    torch.tpu.set_rng_state(state(11, 40))
    got = torch.empty(n, device="tpu", dtype=dtype).normal_(1.5, 2.0).cpu().double()
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    # A slice drawn on its own gets the same values (positions decide, not the threads' split).
    torch.tpu.set_rng_state(state(11, 40 + 1000))
    part = torch.empty(n - 1000, device="tpu", dtype=dtype).normal_(1.5, 2.0).cpu().double()
    assert torch.equal(part, got[1000:])


def test_same_seed_same_stream_on_every_chip():
    # As CUDA: chips seeded alike draw alike; seeds differ to make them differ.
    torch.manual_seed(31)
    draws = [torch.randn(50, device=f"tpu:{i}").cpu() for i in (0, 3, 7)]
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    torch.tpu.manual_seed_all(31)
    with torch.tpu.device(3):
        torch.tpu.manual_seed(32)
    a, b = torch.randn(50, device="tpu:0").cpu(), torch.randn(50, device="tpu:3").cpu()
    assert not torch.equal(a, b)


def test_negative_seed_wraps_as_on_cpu():
    torch.tpu.manual_seed(-1)
    assert torch.tpu.initial_seed() == torch.Generator().manual_seed(-1).initial_seed() == 2**64 - 1
    x = torch.rand(6, device="tpu").cpu()
    torch.tpu.manual_seed(2**64 - 1)
    assert torch.equal(torch.rand(6, device="tpu").cpu(), x)
    torch.manual_seed(-5)
    assert torch.tpu.initial_seed() == 2**64 - 5


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (torch.zeros(5056, dtype=torch.uint8), ValueError, "new_state must have 16 bytes"),
        (torch.zeros(15, dtype=torch.uint8), ValueError, "new_state must have 16 bytes"),
        (torch.zeros(16, dtype=torch.int64), TypeError, "new_state must be a torch.uint8 tensor"),
        (torch.zeros(2, dtype=torch.float64), TypeError, "new_state must be a torch.uint8 tensor"),
        ([0] * 16, TypeError, "new_state must be a torch.uint8 tensor"),
        (state(1, -4), ValueError, "negative offset"),
    ],
)
def test_set_rng_state_bad_input(bad, exc, match):
    torch.tpu.manual_seed(3)
    before = torch.tpu.get_rng_state()
    with pytest.raises(exc, match=match):
        torch.tpu.set_rng_state(bad)
    assert torch.equal(torch.tpu.get_rng_state(), before)  # unchanged
    assert torch.rand(3, device="tpu").cpu().shape == (3,)


def test_generator_set_state_bad_input():
    g = torch.Generator(device="tpu")
    with pytest.raises(ValueError, match="new_state must have 16 bytes"):
        g.set_state(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="new_state must be a torch.uint8"):
        g.set_state(torch.zeros(16, dtype=torch.int8))
    with pytest.raises((ValueError, RuntimeError), match="offset|Overflow"):
        g.set_offset(-4)
    g.set_offset(8)
    assert g.get_offset() == 8


def test_draw_past_the_largest_offset_raises_and_keeps_the_state():
    torch.tpu.manual_seed(5)
    g = torch.tpu.default_generators[0]
    g.set_offset(2**63 - 12)
    torch.empty(8, device="tpu").uniform_()
    state = torch.tpu.get_rng_state()
    x = torch.zeros(16, device="tpu")
    with pytest.raises(RuntimeError, match="past 2\\*\\*63"):
        x.uniform_()
    assert torch.equal(x.cpu(), torch.zeros(16))
    assert torch.equal(torch.tpu.get_rng_state(), state)
    torch.tpu.set_rng_state(state)  # the state still round-trips
    assert g.get_offset() == 2**63 - 4


@pytest.mark.parametrize(
    "bad, exc", [(2**64, ValueError), (-(2**63) - 1, ValueError), ("x", TypeError), (None, TypeError)]
)
def test_manual_seed_bad_input(bad, exc):
    torch.tpu.manual_seed(9)
    with pytest.raises(exc, match="seed"):
        torch.tpu.manual_seed(bad)
    with pytest.raises(exc, match="seed"):
        torch.tpu.manual_seed_all(bad)
    assert torch.tpu.initial_seed() == 9


# ------------------------------------------------------------------ modes


def draws():
    """Random ops of every kind, the last ones through composite ops."""
    out = [
        torch.rand(33, device="tpu"),
        torch.randn(5, 7, device="tpu"),
        torch.randint(-3, 90, (20,), device="tpu"),
        torch.empty(9, device="tpu").uniform_(-2, 3),
        torch.empty(10, device="tpu", dtype=torch.bfloat16).normal_(1, 2),
        torch.bernoulli(torch.full((40,), 0.3, device="tpu")),
        torch.empty(12, device="tpu").exponential_(2.0),
        torch.nn.functional.dropout(torch.ones(64, device="tpu"), p=0.25),
        torch.randperm(10, device="tpu"),
        torch.multinomial(torch.tensor([0.2, 0.3, 0.5], device="tpu"), 6, True),
    ]
    x = torch.ones(48, device="tpu")
    out.append(torch.nn.functional.dropout(x * 2, p=0.5) + 1)  # fused in defer_and_fuse
    return [t.cpu() for t in out]


@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_every_eager_mode_draws_what_strict_draws(mode):
    torch.manual_seed(11)
    with torch_tpu.eager_mode("strict"):
        want = draws()
    end = torch.tpu.get_rng_state()
    torch.manual_seed(11)
    with torch_tpu.eager_mode(mode):
        got = draws()
    assert torch.equal(torch.tpu.get_rng_state(), end)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_compiled_program_draws_what_eager_draws():
    def f(x):
        a = torch.rand(16, device=x.device)
        b = torch.randn_like(x)
        c = torch.empty_like(x).uniform_(-1, 1)
        m = torch.bernoulli(torch.full_like(x, 0.5))
        return a, b + 0.0, c, m, x + 1  # draws, one consumed by a fused op

    x = torch.arange(32.0, device="tpu")
    torch.manual_seed(4)
    want = [t.cpu() for t in f(x)]
    end = torch.tpu.get_rng_state()
    compiled = torch.compile(f, backend="tpu")
    for _ in range(2):  # the first call compiles
        torch.manual_seed(4)
        got = [t.cpu() for t in compiled(x)]
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert torch.equal(torch.tpu.get_rng_state(), end)


# ------------------------------------------------------------------ distributions


def ks_statistic(sample, cdf):
    """sup |F_n(x) - F(x)| of a 1-D float64 sample against a continuous CDF."""
    x, _ = torch.sort(sample.double())
    n = x.numel()
    f = cdf(x)
    hi = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    lo = f - torch.arange(0, n, dtype=torch.float64) / n
    return max(hi.max().item(), lo.max().item())


def ks_bound(n, alpha=1e-6):
    # Dvoretzky-Kiefer-Wolfowitz (Massart's constant): P(D_n > e) <= 2 exp(-2 n e^2).
    return math.sqrt(math.log(2 / alpha) / (2 * n))


N = 20000


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "name, draw, cdf, mean, var",
    [
        ("uniform", lambda t: t.uniform_(-1, 3), lambda x: ((x + 1) / 4).clamp(0, 1), 1.0, 16 / 12),
        (
            "normal",
            lambda t: t.normal_(2, 0.5),
            lambda x: 0.5 * (1 + torch.erf((x - 2) / (0.5 * math.sqrt(2)))),
            2.0,
            0.25,
        ),
        ("exponential", lambda t: t.exponential_(4.0), lambda x: 1 - torch.exp(-4 * x.clamp(min=0)), 0.25, 1 / 16),
        ("cauchy", lambda t: t.cauchy_(1, 2), lambda x: 0.5 + torch.atan((x - 1) / 2) / math.pi, None, None),
        (
            "log_normal",
            lambda t: t.log_normal_(0, 0.25),
            lambda x: 0.5 * (1 + torch.erf(torch.log(x.clamp(min=1e-300)) / (0.25 * math.sqrt(2)))),
            math.exp(0.25**2 / 2),
            (math.exp(0.25**2) - 1) * math.exp(0.25**2),
        ),
    ],
)
def test_continuous_distributions(name, draw, cdf, mean, var, dtype):
    torch.manual_seed(2026)
    x = draw(torch.empty(N, device="tpu", dtype=dtype)).cpu().double()
    assert torch.isfinite(x).all()
    assert ks_statistic(x, cdf) < ks_bound(N)
    if mean is not None:  # within 6 standard errors
        assert abs(x.mean().item() - mean) < 6 * math.sqrt(var / N)
        assert abs(x.var().item() - var) < 0.1 * var
    if name == "uniform":
        assert x.min().item() >= -1 and x.max().item() < 3
    if name == "exponential":
        assert x.min().item() >= 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_uniform_narrow_dtypes_stay_in_range(dtype):
    torch.manual_seed(1)
    x = torch.empty(N, device="tpu", dtype=dtype).uniform_(0, 1).cpu()
    assert x.min().item() >= 0 and x.max().item() < 1
    assert abs(x.double().mean().item() - 0.5) < 0.02


def test_discrete_distributions():
    torch.manual_seed(8)
    r = torch.randint(3, 10, (N,), device="tpu").cpu()
    assert r.min().item() == 3 and r.max().item() == 9
    counts = torch.bincount(r - 3, minlength=7).double() / N
    assert (counts - 1 / 7).abs().max().item() < 0.02
    b = torch.empty(N, device="tpu").bernoulli_(0.3).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 6 * math.sqrt(0.21 / N)
    p = torch.linspace(0, 1, N)
    bt = torch.bernoulli(p.to("tpu")).cpu()
    assert bt[0].item() == 0 and bt[-1].item() == 1
    assert abs(bt.mean().item() - 0.5) < 0.02
    g = torch.empty(N, device="tpu").geometric_(0.25).cpu()
    assert g.min().item() >= 1 and abs(g.mean().item() - 4.0) < 6 * math.sqrt(0.75 / 0.0625 / N)
    for dtype, hi in [(torch.uint8, 255), (torch.int8, 127), (torch.bool, 1)]:
        v = torch.empty(4000, device="tpu", dtype=dtype).random_().cpu().long()
        assert v.min().item() == 0 and v.max().item() == hi
    f = torch.empty(4000, device="tpu").random_(-5, 5).cpu()
    assert f.min().item() == -5 and f.max().item() == 4 and torch.equal(f, f.round())
    big = torch.empty(4000, device="tpu", dtype=torch.int64).random_(-(2**63), None).cpu()
    assert (big < 0).any() and (big > 2**62).any()
    d = torch.nn.functional.dropout(torch.ones(N, device="tpu"), p=0.2).cpu()
    assert set(d.unique().tolist()) == {0.0, 1.25}
    assert abs((d == 0).double().mean().item() - 0.2) < 6 * math.sqrt(0.16 / N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.uint8, torch.bool])
def test_bernoulli_float_p_draws_what_tensor_p_draws(dtype):
    # bernoulli_(p) (dropout's masks: whole blocks of lanes, an integer compare, split across
    # threads) against the element-by-element kernel of bernoulli(tensor of p) at the same state.
    n = 40000 + 37  # beyond one thread's share, not a multiple of the 64 lanes
    for p in (0.0, 1.0, 0.5, 1 / 3, 0.9, 1e-300, 1 - 2**-53):
        for offset in (0, 12):
            torch.tpu.set_rng_state(state(11, offset))
            got = torch.empty(n, device="tpu", dtype=dtype).bernoulli_(p).cpu()
            torch.tpu.set_rng_state(state(11, offset))
            want = torch.bernoulli(torch.full((n,), p, dtype=torch.float64, device="tpu")).to(dtype).cpu()
            assert torch.equal(got, want), (p, offset)
            assert seed_offset(torch.tpu.get_rng_state()) == (11, offset + (n + 3) // 4 * 4)


def test_in_place_fill_of_overlapping_elements_raises_before_drawing():
    # CPU rejects a self whose elements share memory before its generator moves; so does tpu.
    torch.manual_seed(0)
    before = torch.tpu.get_rng_state()
    for fill in (lambda t: t.bernoulli_(0.5), lambda t: t.uniform_(), lambda t: t.normal_()):
        with pytest.raises(RuntimeError) as cpu_error:
            fill(torch.zeros(1).expand(5))
        with pytest.raises(RuntimeError) as tpu_error:
            fill(torch.zeros(1, device="tpu").expand(5))
        assert str(tpu_error.value) == str(cpu_error.value)
        assert torch.equal(torch.tpu.get_rng_state(), before)


def test_fill_of_a_dtype_the_op_rejects_leaves_the_generator():
    # complex bernoulli: CPU's NotImplementedError at the call, and neither generator moves.
    calls = (lambda d: torch.bernoulli(torch.zeros(10, dtype=torch.complex64, device=d), p=0.5),
             lambda d: torch.zeros(10, dtype=torch.complex64, device=d).bernoulli_(0.5))
    for call in calls:
        with pytest.raises(NotImplementedError) as cpu_error:
            call("cpu")
        torch.manual_seed(0)
        tpu_before, cpu_before = torch.tpu.get_rng_state(), torch.get_rng_state()
        with pytest.raises(NotImplementedError) as tpu_error:
            call("tpu")
        assert str(tpu_error.value) == str(cpu_error.value)
        assert torch.equal(torch.tpu.get_rng_state(), tpu_before)
        assert torch.equal(torch.get_rng_state(), cpu_before)


def test_independent_draws_are_uncorrelated():
    torch.manual_seed(3)
    a, b = torch.rand(N, device="tpu").cpu().double(), torch.rand(N, device="tpu").cpu().double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 6 / math.sqrt(N)
    assert abs(torch.corrcoef(torch.stack([a[:-1], a[1:]]))[0, 1].item()) < 6 / math.sqrt(N)


@pytest.mark.parametrize(
    "op, call, match",
    [
        ("random_", lambda t: t.random_(5, 3), "from"),
        ("uniform_", lambda t: t.uniform_(3, 1), "from"),
        ("normal_", lambda t: t.normal_(0, -1), "std"),
        ("bernoulli_", lambda t: t.bernoulli_(1.5), "p"),
        ("exponential_", lambda t: t.exponential_(-1), "lambda"),
    ],
)
def test_bad_distribution_arguments_raise_at_the_call(op, call, match):
    torch.tpu.manual_seed(0)
    t = torch.empty(4, device="tpu")
    with pytest.raises(RuntimeError, match=match) as cpu_err:
        call(torch.empty(4))
    with pytest.raises(RuntimeError, match=match) as err:
        call(t)
    assert str(err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]
    assert torch.tpu.default_generators[0].get_offset() == 0  # nothing reserved
    assert call.__name__ and torch.rand(2, device="tpu").cpu().shape == (2,)


def test_fill_of_an_unsupported_dtype_raises_at_the_call():
    t = torch.empty(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="not implemented for 'Long'") as err:
        t.uniform_()
    assert "asynchronously" not in str(err.value)
    assert torch.empty(3, dtype=torch.complex64, device="tpu").normal_().cpu().shape == (3,)


# ------------------------------------------------------------------ TORCH_TPU_RNG


def test_cpu_stream_option_matches_cpu(run_python):
    out = run_python(
        """
        import json, torch
        import torch_tpu
        ops = {
            "randn": lambda d: torch.randn(4, 5, device=d),
            "randint": lambda d: torch.randint(0, 100, (10,), device=d),
            "normal_": lambda d: torch.empty(8, device=d).normal_(2.0, 3.0),
            "bernoulli": lambda d: torch.bernoulli(torch.full((16,), 0.3, device=d)),
            "dropout": lambda d: torch.nn.functional.dropout(torch.ones(20, device=d), p=0.5),
            "randperm": lambda d: torch.randperm(12, device=d),
        }
        same = {}
        for name, f in ops.items():
            torch.manual_seed(2024)
            want = f("cpu")
            torch.manual_seed(2024)
            same[name] = torch.equal(f("tpu").cpu(), want)
        print(json.dumps({"same": same, "state": torch.tpu.get_rng_state().numel(),
                          "kind": torch_tpu._C._rng_kind()}))
    """,
        env={"TORCH_TPU_RNG": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = out.json()
    assert r["kind"] == "cpu" and r["state"] == 5056
    assert all(r["same"].values()), r["same"]


def test_bad_rng_variable_names_it(run_python):
    out = run_python(
        """
        import torch, torch_tpu
        try:
            torch.rand(2, device="tpu")
        except ValueError as e:
            print("ValueError:", e)
        try:
            torch.tpu.get_rng_state()
        except ValueError as e:
            print("ValueError:", e)
        print(torch.ones(2, device="tpu").sum().item())
    """,
        env={"TORCH_TPU_RNG": "mt"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and lines[-1] == "2.0", out.stdout
    for line in lines[:2]:
        assert line.startswith("ValueError: TORCH_TPU_RNG must be 'philox'") and "'mt'" in line
