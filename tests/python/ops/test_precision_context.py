"""torch.tpu.precision / Precision: a thread-local override of the float32 matmul precision,
checked against hand-rounded oracles (ops/test_numerics.py checks the global setting)."""

import threading

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from helpers.mxu import bf16 as _bf16
from helpers.mxu import three_pass as _three_pass

P = torch.tpu.Precision


def _override():
    return torch_tpu._C._matmul_precision_override()


@pytest.fixture
def global_precision():
    """Sets torch's global precision for a test; checks that nothing else changed it."""
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)
    assert _override() is None


@pytest.fixture
def operands():
    g = torch.Generator().manual_seed(14)
    return torch.randn(40, 256, generator=g), torch.randn(256, 30, generator=g)


def test_enum_values_are_torch_precision_names():
    assert [m.name for m in P] == ["DEFAULT", "HIGH", "HIGHEST"]
    assert {m.name: m.value for m in P} == {"DEFAULT": "medium", "HIGH": "high", "HIGHEST": "highest"}


def test_default_is_one_bf16_pass(global_precision, operands):
    global_precision("highest")
    a, b = operands
    with torch.tpu.precision(P.DEFAULT):
        assert torch.get_float32_matmul_precision() == "highest"  # no global change
        got = (a.tpu() @ b.tpu()).cpu()
    torch.testing.assert_close(got, _bf16(a) @ _bf16(b), atol=1e-4, rtol=1e-5)
    assert (got - a @ b).abs().max() > 1e-3  # bf16-sized errors: the oracle can tell the modes apart
    torch.testing.assert_close((a.tpu() @ b.tpu()).cpu(), a @ b)  # after the block: the global again


def test_high_is_three_bf16_passes(global_precision, operands):
    global_precision("medium")
    a, b = operands
    exact = a.double() @ b.double()
    with torch.tpu.precision(P.HIGH):
        got = (a.tpu() @ b.tpu()).cpu().double()
    torch.testing.assert_close(got, _three_pass(a, b), atol=1e-4, rtol=1e-5)
    one_pass = (a.tpu() @ b.tpu()).cpu().double()  # the global "medium" again
    assert (got - exact).abs().max() * 20 < (one_pass - exact).abs().max()


def _exact(fn, *args):
    """float32 result of ``fn`` computed in float64 (ATen's CPU matmul under a global "medium"
    itself rounds to bf16 on CPUs with bf16 units, so the oracle avoids float32 kernels)."""
    return fn(*(x.double() for x in args)).float()


@pytest.mark.parametrize("op", ["mm", "addmm", "addmm_", "addmm.out", "baddbmm", "linear"])
def test_highest_is_exact_under_a_lower_global(global_precision, op):
    global_precision("medium")
    g = torch.Generator().manual_seed(5)
    a, b, bias = torch.randn(2, 40, 256, generator=g), torch.randn(2, 256, 30, generator=g), torch.randn(40, 30)

    def addmm_out(c, x, y):
        out = torch.empty(0, dtype=x.dtype, device=x.device)
        return torch.addmm(c, x, y, out=out)

    fns = {
        "mm": lambda c, x, y: x[0] @ y[0],
        "addmm": lambda c, x, y: torch.addmm(c, x[0], y[0]),
        "addmm_": lambda c, x, y: c.clone().addmm_(x[0], y[0]),
        "addmm.out": lambda c, x, y: addmm_out(c, x[0], y[0]),
        "baddbmm": lambda c, x, y: torch.baddbmm(c, x, y),
        "linear": lambda c, x, y: F.linear(x[0], y[0].t(), c[0]),
    }
    fn = fns[op]
    with torch.tpu.precision(P.HIGHEST):
        got = fn(bias.tpu(), a.tpu(), b.tpu()).cpu()
    torch.testing.assert_close(got, _exact(fn, bias, a, b))
    assert (fn(bias.tpu(), a.tpu(), b.tpu()).cpu() - got).abs().max() > 1e-3  # outside: the global "medium"


def test_convolution_follows_the_context(global_precision):
    global_precision("highest")
    g = torch.Generator().manual_seed(2)
    x, w, bias = torch.randn(2, 3, 10, 10, generator=g), torch.randn(4, 3, 3, 3, generator=g), torch.randn(4)
    with torch.tpu.precision(P.DEFAULT):
        got = F.conv2d(x.tpu(), w.tpu(), bias.tpu(), padding=1).cpu()
    torch.testing.assert_close(got, F.conv2d(_bf16(x), _bf16(w), bias, padding=1), atol=1e-4, rtol=1e-5)
    assert (got - F.conv2d(x, w, bias, padding=1)).abs().max() > 1e-3


def test_nested_contexts_restore_each_level(global_precision, operands):
    global_precision("high")
    a, b = operands
    ta, tb = a.tpu(), b.tpu()
    assert torch_tpu._C._effective_matmul_precision() == "high"
    with torch.tpu.precision(P.HIGHEST):
        with torch.tpu.precision(P.DEFAULT):
            inner = (ta @ tb).cpu()
            assert torch_tpu._C._effective_matmul_precision() == "medium"
        middle = (ta @ tb).cpu()
        assert torch_tpu._C._effective_matmul_precision() == "highest"
    outer = (ta @ tb).cpu().double()
    assert _override() is None and torch.get_float32_matmul_precision() == "high"
    torch.testing.assert_close(inner, _bf16(a) @ _bf16(b), atol=1e-4, rtol=1e-5)
    # HIGHEST under a global "high": the product in float64, rounded once (matmul_precision.cc).
    torch.testing.assert_close(middle, (a.double() @ b.double()).float())
    torch.testing.assert_close(outer, _three_pass(a, b), atol=1e-4, rtol=1e-5)


def test_exit_by_exception_restores(global_precision):
    with pytest.raises(KeyError):
        with torch.tpu.precision(P.DEFAULT):
            raise KeyError("boom")
    assert _override() is None


def test_the_override_is_thread_local(global_precision, operands):
    global_precision("highest")
    a, b = operands
    ta, tb = a.tpu(), b.tpu()
    entered, done = threading.Event(), threading.Event()
    seen = {}

    def other():
        entered.wait(30)
        seen["override"] = _override()
        seen["product"] = (ta @ tb).cpu()
        with torch.tpu.precision(P.HIGH):  # its own block does not reach the main thread
            done.set()
            seen["high"] = (ta @ tb).cpu().double()

    t = threading.Thread(target=other)
    t.start()
    with torch.tpu.precision(P.DEFAULT):
        entered.set()
        done.wait(30)
        mine = (ta @ tb).cpu()
    t.join(60)
    assert seen["override"] is None
    torch.testing.assert_close(seen["product"], a @ b)  # the global "highest"
    torch.testing.assert_close(seen["high"], _three_pass(a, b), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(mine, _bf16(a) @ _bf16(b), atol=1e-4, rtol=1e-5)


def test_one_context_object_entered_on_two_threads(global_precision):
    """Each thread restores its own previous precision, whatever the order of the exits."""
    ctx = torch.tpu.precision(P.DEFAULT)
    other_in, main_in, other_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def other():
        with torch.tpu.precision(P.HIGH):
            with ctx:
                other_in.set()
                main_in.wait(30)
            seen["other"] = _override()  # its own HIGH block again
        other_out.set()

    t = threading.Thread(target=other)
    t.start()
    other_in.wait(30)
    with ctx:
        main_in.set()
        other_out.wait(30)
        seen["main"] = _override()
    t.join(30)
    assert seen == {"other": "high", "main": "medium"} and _override() is None


def test_backward_inside_the_block_follows_it(global_precision):
    """The autograd engine runs tpu backward ops on its own thread, under the state of the
    thread that called backward(): the override travels with it."""
    global_precision("highest")
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(16, 64, generator=g), torch.randn(64, 8, generator=g)
    gy = torch.randn(16, 8, generator=g)
    xt = x.tpu().requires_grad_()
    with torch.tpu.precision(P.DEFAULT):
        (xt @ w.tpu()).backward(gy.tpu())
    torch.testing.assert_close(xt.grad.cpu(), _bf16(gy) @ _bf16(w).t(), atol=1e-4, rtol=1e-5)
    assert (xt.grad.cpu() - gy @ w.t()).abs().max() > 1e-3
    xt.grad = None
    (xt @ w.tpu()).backward(gy.tpu())  # outside: exact again
    torch.testing.assert_close(xt.grad.cpu(), gy @ w.t())


def test_queued_work_keeps_the_precision_of_its_call(global_precision, operands, gate):
    """The product runs on the chip's worker thread (which has no override) after the block has
    ended (the gate holds the stream until then): the value must be the one read at the call."""
    global_precision("highest")
    a, b = operands
    ta, tb = a.tpu(), b.tpu()
    torch.tpu.synchronize()
    gate(torch.zeros(1, device="tpu"))
    with torch.tpu.precision(P.DEFAULT):
        inside = ta @ tb
    outside = ta @ tb
    gate.open()
    torch.tpu.synchronize()
    assert gate.log == [True]  # both products waited behind the gate
    torch.testing.assert_close(inside.cpu(), _bf16(a) @ _bf16(b), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(outside.cpu(), a @ b)


def test_debug_mode_reads_the_override_too(global_precision, operands):
    global_precision("highest")
    a, b = operands
    with torch_tpu.eager_mode("debug"), torch.tpu.precision(P.DEFAULT):
        got = (a.tpu() @ b.tpu()).cpu()
    torch.testing.assert_close(got, _bf16(a) @ _bf16(b), atol=1e-4, rtol=1e-5)


def test_the_cost_model_prices_the_effective_precision(global_precision):
    global_precision("medium")
    x = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    seconds = {}
    for mode in P:
        torch_tpu.runtime.reset_stats()
        with torch.tpu.precision(mode):
            x @ x
        torch.tpu.synchronize()
        seconds[mode] = torch_tpu.runtime.stats()["mxu_seconds"]
    assert seconds[P.HIGHEST] == pytest.approx(6 * seconds[P.DEFAULT])
    assert seconds[P.HIGH] == pytest.approx(3 * seconds[P.DEFAULT])


@pytest.mark.parametrize("bad", ["fast", "high", "HIGHEST", 2, None, torch.tpu.EagerMode.DEFER_NEVER])
def test_bad_precision_names_the_argument(global_precision, bad):
    with pytest.raises(TypeError, match=r"torch\.tpu\.precision: mode must be a torch\.tpu\.Precision "
                                        r"\(DEFAULT, HIGH, HIGHEST\)"):
        torch.tpu.precision(bad)
    assert _override() is None
    a = torch.randn(8, 8)
    torch.testing.assert_close((a.tpu() @ a.tpu()).cpu(), a @ a)  # the process keeps working


def test_other_dtypes_are_untouched(global_precision):
    global_precision("highest")
    a = torch.randn(32, 32, dtype=torch.float64)
    with torch.tpu.precision(P.DEFAULT):
        got = (a.tpu() @ a.tpu()).cpu()
    torch.testing.assert_close(got, a @ a)
