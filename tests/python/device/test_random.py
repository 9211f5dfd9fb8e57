"""Random number generation: one generator per chip, seeding, state round trips.

Each chip has a counter-based (Philox) generator, as CUDA: its numbers differ from CPU
PyTorch's, so the oracles here are reproducibility (the same seed or state draws the same
values), independence per chip and generator, and the support of each distribution.
tests/python/device/test_random_philox.py checks the stream itself (state layout,
offsets, distributions) and the CPU-identical stream of TORCH_TPU_RNG=cpu.
"""

import pytest
import torch

from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


def draw(device="tpu", generator=None):
    return torch.randn(6, device=device, generator=generator).cpu()


def test_manual_seed_reproducible():
    torch.tpu.manual_seed(123)
    a = draw()
    b = draw()
    torch.tpu.manual_seed(123)
    assert torch.equal(draw(), a)
    assert torch.equal(draw(), b)
    assert not torch.equal(a, b)
    assert torch.tpu.initial_seed() == 123


def run_op(op, device):
    if op == "randn":
        return torch.randn(4, 5, device=device)
    if op == "rand":
        return torch.rand(7, device=device)
    if op == "randint":
        return torch.randint(0, 100, (10,), device=device)
    if op == "normal_":
        return torch.empty(8, device=device).normal_(2.0, 3.0)
    if op == "uniform_":
        return torch.empty(3, 3, device=device).uniform_(-1, 1)
    if op == "bernoulli":
        return torch.bernoulli(torch.full((16,), 0.3, device=device))
    if op == "dropout":
        return torch.nn.functional.dropout(torch.ones(20, device=device), p=0.5)
    if op == "randperm":
        return torch.randperm(12, device=device)
    if op == "multinomial":
        return torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device=device), 5, replacement=True)
    raise AssertionError(op)


def in_support(op, x):
    """Whether every value is one the op can draw (dtype and shape as CPU's op gives them)."""
    cpu = run_op(op, "cpu")
    if x.dtype != cpu.dtype or x.shape != cpu.shape:
        return False
    if op == "rand":
        return bool(((x >= 0) & (x < 1)).all())
    if op == "uniform_":
        return bool(((x >= -1) & (x < 1)).all())
    if op == "randint":
        return bool(((x >= 0) & (x < 100)).all())
    if op == "bernoulli":
        return bool(((x == 0) | (x == 1)).all())
    if op == "dropout":
        return bool(((x == 0) | (x == 2)).all())
    if op == "randperm":
        return torch.equal(x.sort().values, torch.arange(12))
    if op == "multinomial":
        return bool(((x >= 0) & (x < 3)).all())
    return bool(torch.isfinite(x).all())


@pytest.mark.parametrize("op", ["randn", "rand", "randint", "normal_", "uniform_", "bernoulli", "dropout",
                                "randperm", "multinomial"])
def test_random_ops_reproducible_with_same_seed(op):
    torch.manual_seed(2024)  # seeds the CPU and every tpu generator
    first = run_op(op, "tpu").cpu()
    torch.manual_seed(2024)
    again = run_op(op, "tpu").cpu()
    assert torch.equal(again, first), (again, first)
    assert in_support(op, first), first
    # Another seed draws other values (all but certain for these sizes).
    others = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        others.append(run_op(op, "tpu").cpu())
    assert any(not torch.equal(o, first) for o in others)


def test_torch_manual_seed_seeds_all_chips():
    torch.manual_seed(99)
    for i in range(torch.tpu.device_count()):
        with torch.tpu.device(i):
            assert torch.tpu.initial_seed() == 99


def test_manual_seed_only_current_chip():
    torch.tpu.manual_seed_all(1)
    with torch.tpu.device(3):
        torch.tpu.manual_seed(5)
        assert torch.tpu.initial_seed() == 5
    assert torch.tpu.initial_seed() == 1
    with torch.tpu.device(2):
        assert torch.tpu.initial_seed() == 1


def test_manual_seed_all():
    # The same seed on every chip gives every chip the same stream (as CUDA).
    torch.tpu.manual_seed_all(77)
    draws = [draw(f"tpu:{i}") for i in (0, 1, 5)]
    torch.tpu.manual_seed(77)
    ref = draw("tpu:0")
    for d in draws:
        assert torch.equal(d, ref)


def test_rng_state_round_trip():
    torch.tpu.manual_seed(3)
    draw()
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = draw()
    b = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(draw(), a)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), b)
    # The state is a value: changing the generator afterwards does not change it.
    assert torch.equal(torch.tpu.get_rng_state(), torch.tpu.get_rng_state())


def test_rng_state_per_device_and_all():
    torch.tpu.manual_seed_all(8)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == 8
    first = [draw(f"tpu:{i}") for i in range(2)]
    draw("tpu:1")
    torch.tpu.set_rng_state_all(states)
    assert [torch.equal(draw(f"tpu:{i}"), first[i]) for i in range(2)] == [True, True]
    s1 = torch.tpu.get_rng_state("tpu:1")
    x = draw("tpu:1")
    draw("tpu:0")
    torch.tpu.set_rng_state(s1, "tpu:1")
    assert torch.equal(draw("tpu:1"), x)


def test_chips_are_independent():
    torch.tpu.manual_seed_all(7)
    ref = [draw("tpu:0"), draw("tpu:0")]
    torch.tpu.manual_seed_all(7)
    draw("tpu:1")
    torch.randn(1000, device="tpu:1")
    with torch.tpu.device(1):
        torch.tpu.manual_seed(11)
    assert torch.equal(draw("tpu:0"), ref[0])
    assert torch.equal(draw("tpu:0"), ref[1])


def test_seed_then_reproduce():
    torch.tpu.seed()
    s = torch.tpu.initial_seed()
    a = draw()
    torch.tpu.manual_seed(s)
    assert torch.equal(draw(), a)
    torch.tpu.seed()
    assert torch.tpu.initial_seed() != s  # 64-bit random seeds: a repeat is practically impossible


@pytest.mark.parametrize("how", ["tpu.manual_seed", "torch.manual_seed", "tpu.manual_seed_all",
                                 "tpu.set_rng_state"])
def test_seed_applies_to_ops_queued_after_it(gate, how):
    # Seeding applies between the ops issued before and after it, however far the chip lags:
    # the generator reserves an op's numbers when the op is issued, so seeding and reading
    # the state need not wait for the chip (the gate stays closed throughout).
    torch.tpu.manual_seed(2)
    expected_after = draw()
    torch.tpu.manual_seed(1)
    expected_before = draw()
    torch.tpu.manual_seed(1)
    y = gate(torch.zeros(2, device="tpu"))
    before = torch.randn(6, device="tpu")
    if how == "tpu.manual_seed":
        torch.tpu.manual_seed(2)
    elif how == "torch.manual_seed":
        torch.manual_seed(2)
    elif how == "tpu.manual_seed_all":
        torch.tpu.manual_seed_all(2)
    else:
        torch.tpu.set_rng_state(torch.Generator(device="tpu").manual_seed(2).get_state())
    after = torch.randn(6, device="tpu")
    torch.tpu.get_rng_state()
    assert gate.log == []  # nothing waited for the queued work
    gate.open()
    assert torch.equal(before.cpu(), expected_before)
    assert torch.equal(after.cpu(), expected_after)
    del y


def test_generator_seed_with_python_kernel_queued_does_not_deadlock(run_python):
    import subprocess
    code = """
        import time, torch
        lib = torch.library.Library("tpu_test_sub", "DEF")
        lib.define("slow(Tensor x) -> Tensor")
        def slow(x):
            time.sleep(0.3)  # releases the GIL; the kernel needs it back to finish
            return x + 1
        lib.impl("slow", slow, "CPU")
        lib.impl("slow", lambda x: torch.empty_like(x), "Meta")
        g = torch.Generator(device="tpu")
        y = torch.ops.tpu_test_sub.slow(torch.zeros(2, device="tpu"))
        time.sleep(0.1)  # let the stream's worker enter the kernel
        g.manual_seed(3)
        print(y.cpu().tolist())
    """
    try:
        out = run_python(code, timeout=60)  # a deadlock never ends; import torch alone takes ~9 s under load
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: Generator.manual_seed waited for the chip with the GIL held")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[1.0, 1.0]"


def test_generator_object():
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", 0)
    g.manual_seed(5)
    torch.tpu.manual_seed(1000)
    default_state = torch.tpu.get_rng_state()
    a = draw(generator=g)
    b = draw(generator=g)
    # Drawing from g leaves the default generator alone.
    assert torch.equal(torch.tpu.get_rng_state(), default_state)
    # Another generator with the same seed draws the same stream; the default one, seeded alike, too.
    other = torch.Generator(device="tpu").manual_seed(5)
    assert torch.equal(a, draw(generator=other))
    assert torch.equal(b, draw(generator=other))
    assert not torch.equal(a, b)
    g.manual_seed(5)
    state = g.get_state()
    assert torch.equal(draw(generator=g), a)
    g.set_state(state)
    assert torch.equal(draw(generator=g), a)
    assert g.initial_seed() == 5


def test_generator_on_other_chip():
    g = torch.Generator(device="tpu:2").manual_seed(9)
    assert g.device == torch.device("tpu", 2)
    x = torch.rand(5, device="tpu:2", generator=g).cpu()
    assert torch.equal(x, torch.rand(5, device="tpu:0", generator=torch.Generator(device="tpu").manual_seed(9)).cpu())
    g.manual_seed(9)
    y = torch.empty(5, device="tpu:2").uniform_(generator=g).cpu()
    assert torch.equal(x, y)


def test_cpu_generator_rejected_for_tpu_op():
    with pytest.raises(RuntimeError, match="generator"):
        torch.randn(3, device="tpu", generator=torch.Generator()).cpu()
    assert torch.ones(2, device="tpu").sum().item() == 2.0


def test_fork_rng_restores_tpu_state():
    torch.tpu.manual_seed(42)
    expected = draw()
    torch.tpu.manual_seed(42)
    with torch.random.fork_rng(devices=[0], device_type="tpu"):
        torch.tpu.manual_seed(0)
        draw()
    assert torch.equal(draw(), expected)
