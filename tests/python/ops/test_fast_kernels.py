"""Strict mode's unboxed kernels (csrc/aten/fast_ops.cc: add/sub/mul/div and their in-place
forms, sum, mean, amax, index_select, gather): a signature's first call goes through the
fallback (validated at the call), later ones take the kept layout. Values, dtypes and
strides equal CPU's on every call; bad input raises CPU's exception at the call, also for an
op whose other signatures are kept; the counters price a kept call as its first one."""

import threading

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.runtime as rt

DEV = "tpu"


def same(got, want):
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got.cpu(), want)


def raises_as_cpu(fn, *cpu_args):
    """fn on the CPU arguments, then on their tpu copies: the same exception type and message."""
    with pytest.raises(Exception) as cpu:
        fn(*cpu_args)
    with pytest.raises(type(cpu.value)) as tpu:
        fn(*[x.to(DEV) if isinstance(x, torch.Tensor) else x for x in cpu_args])
    assert str(tpu.value) == str(cpu.value)


CASES = [
    ("add", lambda a, b: a + b),
    ("add alpha", lambda a, b: torch.add(a, b, alpha=-0.5)),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b),
    ("mul wrapped float", lambda a, b: a * 2.5),
    ("add wrapped int", lambda a, b: a + 3),
    ("sum", lambda a, b: a.sum()),
    ("sum dim", lambda a, b: a.sum(1)),
    ("sum dims keepdim", lambda a, b: a.sum((0, 1), keepdim=True)),
    ("sum dtype", lambda a, b: a.sum(dtype=torch.float64)),
    ("mean", lambda a, b: a.mean()),
    ("mean dim", lambda a, b: a.mean(0, keepdim=True)),
    ("amax", lambda a, b: a.amax(0)),
    ("amax dims", lambda a, b: a.amax((0, 1))),
]


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_values_on_first_and_kept_calls(name, fn):
    for make in (
        lambda: torch.randn(6, 5),
        lambda: torch.randn(5, 6).t(),  # non-contiguous: the result's strides follow CPU's
        lambda: torch.randn(7, 5)[1:],  # a storage offset
        lambda: torch.randn(6, 5).to(torch.bfloat16),
    ):
        a, b = make(), make() + 3
        ta, tb = a.to(DEV), b.to(DEV)
        for _ in range(3):  # first call, then kept ones
            same(fn(ta, tb), fn(a, b))


def test_integer_promotion_and_broadcast():
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    y = torch.arange(4, dtype=torch.int64)
    for _ in range(3):
        same(x.to(DEV) + y.to(DEV), x + y)  # int32 + int64 -> int64, broadcast
        same(x.to(DEV) * 2.5, x * 2.5)  # a float scalar promotes to float32
        same(x.to(DEV) / 2, x / 2)  # true division
        same(x.to(DEV).sum(), x.sum())  # int32 sums to int64
        same(x.to(DEV) + torch.tensor(7), x + torch.tensor(7))  # a 0-d host tensor


def test_in_place_values():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ta, tb = a.to(DEV), b.to(DEV)
    for _ in range(3):
        ta.add_(tb, alpha=2)
        a.add_(b, alpha=2)
        ta.mul_(tb)
        a.mul_(b)
        ta.sub_(0.25)
        a.sub_(0.25)
        ta.div_(tb)
        a.div_(b)
    assert torch.equal(ta.cpu(), a)
    r = ta.add_(tb)
    assert r is ta  # in place returns self


def test_index_ops_values():
    w = torch.randn(10, 6)
    i = torch.randint(0, 10, (7,))
    g = torch.randint(0, 6, (10, 3))
    tw, ti, tg = w.to(DEV), i.to(DEV), g.to(DEV)
    for _ in range(3):
        same(tw.index_select(0, ti), w.index_select(0, i))
        same(tw.index_select(1, tg[0]), w.index_select(1, g[0]))
        same(F.embedding(ti, tw), F.embedding(i, w))
        same(tw.gather(1, tg), w.gather(1, g))


def test_bad_input_raises_at_the_call_after_kept_signatures():
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    ta, tb = a.to(DEV), b.to(DEV)
    for _ in range(3):
        ta + tb, ta.sum(1), ta.amax(0), ta.index_select(0, torch.tensor([0, 1], device=DEV))
    raises_as_cpu(lambda x, y: x + y, a, torch.randn(3, 5))  # sizes do not broadcast
    raises_as_cpu(lambda x: x.sum(2), a)  # dim out of range
    raises_as_cpu(lambda x: x.amax((0, 0)), a)  # a dim twice
    raises_as_cpu(lambda x: x.mean(), torch.arange(4))  # mean of an integer tensor
    raises_as_cpu(lambda x, i: x.index_select(0, i), a, torch.tensor([0.0, 1.0]))  # float index
    raises_as_cpu(lambda x, i: x.gather(1, i), a, torch.randint(0, 5, (4, 3, 2)))  # index rank differs
    raises_as_cpu(lambda x, y: x.add_(y), torch.arange(4), torch.randn(4))  # float into int64
    raises_as_cpu(lambda x, y: torch.add(x, y, alpha=0.5), torch.arange(4), torch.arange(4))  # float alpha
    with pytest.raises(RuntimeError, match="same device"):
        ta + b  # a host operand that is not 0-d
    for _ in range(2):  # the same signatures kept after failures elsewhere; still CPU's values
        same(ta + tb, a + b)
        same(ta.sum(1), a.sum(1))


def test_in_place_overlap_raises_as_cpu():
    x = torch.randn(10)
    tx = x.to(DEV)
    for _ in range(2):
        tx[:5].add_(tx[5:])  # disjoint halves of one storage: fine
        x[:5].add_(x[5:])
    assert torch.equal(tx.cpu(), x)
    raises_as_cpu(lambda t: t[1:].add_(t[:-1]), torch.randn(10))  # partial overlap
    raises_as_cpu(lambda t: t.expand(3, 10).add_(torch.ones(3, 10, device=t.device)), torch.randn(10))


def test_kept_call_prices_as_the_first():
    a = torch.randn(32, 32, device=DEV)
    torch.tpu.synchronize()
    s0 = rt.stats()
    a.sum(0)  # this test's first call of the signature (maybe not the process's)
    torch.tpu.synchronize()
    s1 = rt.stats()
    for _ in range(4):
        a.sum(0)
    torch.tpu.synchronize()
    s2 = rt.stats()
    assert s1["ops"] - s0["ops"] == 1 and s2["ops"] - s1["ops"] == 4
    one = s1["device_seconds"] - s0["device_seconds"]
    assert one > 0 and s2["device_seconds"] - s1["device_seconds"] == pytest.approx(4 * one, rel=1e-9)


def test_validation_toggle_and_threads():
    a, b = torch.randn(3, 7), torch.randn(3, 7)
    ta, tb = a.to(DEV), b.to(DEV)
    was = torch_tpu._C._validate_first_call()
    try:
        torch_tpu._C._set_validate_first_call(False)
        for _ in range(2):
            same(ta - tb, a - b)  # kept unvalidated
        torch_tpu._C._set_validate_first_call(True)
        same(ta - tb, a - b)  # validated again before it is kept as validated
        raises_as_cpu(lambda x, y: x - y, torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=torch.bool))
    finally:
        torch_tpu._C._set_validate_first_call(was)
    out = {}

    def worker():
        out["r"] = [(ta * tb).cpu() for _ in range(3)]

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert all(torch.equal(r, a * b) for r in out["r"])


def test_wrapped_python_numbers_are_not_float64_use():
    x = torch.randn(4, device=DEV)
    rt.reset_unsupported_on_tpu()
    for _ in range(2):
        (x * 2.0).sum()
    torch.tpu.synchronize()
    assert rt.unsupported_on_tpu() == {}
    y = x.double()
    rt.reset_unsupported_on_tpu()
    for _ in range(3):
        y * 2.0
    assert rt.unsupported_on_tpu()["aten::mul.Tensor"] == {"Double": 3}  # every call counted
    rt.reset_unsupported_on_tpu()


def test_other_modes_and_dry_run_take_the_fallback():
    from torch_tpu.estimate import dry_run

    a, b = torch.randn(16, 16), torch.randn(16, 16)
    ta, tb = a.to(DEV), b.to(DEV)
    for _ in range(2):
        ta + tb  # kept
    with torch_tpu.eager_mode("defer_and_fuse"):
        r = (ta + tb) * tb
        before = torch_tpu.debug.region_stats()["ops_recorded"]
        r2 = ta + tb
        assert torch_tpu.debug.region_stats()["ops_recorded"] == before + 1  # recorded, not queued
    same(r, (a + b) * b)
    same(r2, a + b)
    with torch_tpu.eager_mode("debug"):
        same(ta + tb, a + b)
    with dry_run():
        d = ta + tb  # shaped and priced, not computed
    with pytest.raises(RuntimeError, match="holds no values"):
        d.cpu()
    same(ta + tb, a + b)
