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


def kept(fn, *args):
    """fn(*args) three times: its result, and how many of the last two calls took the kept path."""
    fn(*args)
    n0 = torch_tpu._C._fast_kept_calls()
    fn(*args)
    r = fn(*args)
    return r, torch_tpu._C._fast_kept_calls() - n0


# The generic kernels (fast_ops.cc TORCH_TPU_FAST_FUNCTIONAL): (name, fn of x [6, 5], y [6, 5], i int64 [6, 5]).
GENERIC = [
    ("mm", lambda x, y, i: x @ y.t()),
    ("bmm", lambda x, y, i: torch.bmm(x[None], y.t()[None])),
    ("addmm", lambda x, y, i: torch.addmm(x[:, :1], x, y.t(), beta=0.5, alpha=2)),
    ("linear", lambda x, y, i: F.linear(x, y, y[:, 0])),
    ("cat", lambda x, y, i: torch.cat([x, y, x[:2]], 0)),
    ("cat dim 1", lambda x, y, i: torch.cat([x, y.t().t()], -1)),
    ("pow", lambda x, y, i: x.pow(2)),
    ("pow int", lambda x, y, i: i.pow(3)),
    ("rsqrt", lambda x, y, i: (x.abs() + 1).rsqrt()),
    ("sqrt", lambda x, y, i: x.abs().sqrt()),
    ("neg", lambda x, y, i: -x),
    ("exp", lambda x, y, i: x.exp()),
    ("tanh", lambda x, y, i: x.tanh()),
    ("sigmoid", lambda x, y, i: x.sigmoid()),
    ("silu", lambda x, y, i: F.silu(x)),
    ("sin cos", lambda x, y, i: x.sin() + x.cos()),
    ("bitwise_not", lambda x, y, i: ~i),
    ("logical_not", lambda x, y, i: torch.logical_not(i)),
    ("where", lambda x, y, i: torch.where(x > y, x, y)),
    ("where scalar", lambda x, y, i: torch.where(x > 0, x, 0.0)),
    ("comparisons", lambda x, y, i: (x == y) | (x != 0.5) & (x <= y) | (x < 0) | (x >= 1) | (x > y) | (i == 2)),
    ("maximum minimum", lambda x, y, i: torch.maximum(x, y) - torch.minimum(x, y)),
    ("argmax", lambda x, y, i: x.argmax(-1)),
    ("argmax all", lambda x, y, i: x.argmax()),
    ("any", lambda x, y, i: (x > 1).any(1)),
    ("isin", lambda x, y, i: torch.isin(i, i[0])),
    ("softmax", lambda x, y, i: x.softmax(-1)),
    ("cumsum", lambda x, y, i: i.cumsum(1)),
    ("cumsum dtype", lambda x, y, i: x.cumsum(0, dtype=torch.float64)),
]


@pytest.mark.parametrize("name,fn", GENERIC, ids=[c[0] for c in GENERIC])
def test_generic_kernels_values_and_kept_path(name, fn):
    for make in (
        lambda: torch.randn(6, 5),
        lambda: torch.randn(5, 6).t(),  # non-contiguous
        lambda: torch.randn(7, 5)[1:],  # a storage offset
    ):
        x, y, i = make(), make(), torch.randint(0, 4, (6, 5))
        tx, ty, ti = x.to(DEV), y.to(DEV), i.to(DEV)
        # CPU's kernel on the layout the device holds: a BLAS may round differently for a
        # misaligned pointer (x's offset of 5 floats), and .to() gives a fresh, aligned copy.
        want = fn(tx.cpu(), ty.cpu(), ti.cpu())
        got, n = kept(fn, tx, ty, ti)
        same(got, want)
        assert n >= 2, f"{name}: the repeated calls did not take the kept path"


def test_generic_kernels_bf16():
    x, y = torch.randn(6, 5).bfloat16(), torch.randn(6, 5).bfloat16()
    tx, ty = x.to(DEV), y.to(DEV)
    for fn in (lambda a, b: a @ b.t(), lambda a, b: torch.cat([a, b]), lambda a, b: F.silu(a) * (a.abs() + 1).rsqrt()):
        got, n = kept(fn, tx, ty)
        same(got, fn(x, y))
        assert n >= 2


def test_generic_kernels_raise_as_cpu_after_kept_signatures():
    x, y = torch.randn(4, 5), torch.randn(5, 3)
    tx, ty = x.to(DEV), y.to(DEV)
    for _ in range(3):  # kept: mm, cat, pow, argmax, where
        tx @ ty, torch.cat([tx, tx]), tx.pow(2), tx.argmax(1), torch.where(tx > 0, tx, tx)
    raises_as_cpu(lambda a, b: a @ b, x, torch.randn(4, 3))  # inner sizes differ
    raises_as_cpu(lambda a, b: torch.cat([a, b], 1), x, torch.randn(3, 3))  # sizes differ outside dim 1
    raises_as_cpu(lambda a: torch.cat([a, a], 2), x)  # dim out of range
    raises_as_cpu(lambda a: a.pow(-1), torch.arange(4))  # integers to negative powers: CPU's kernel check
    raises_as_cpu(lambda a: a.argmax(2), x)
    raises_as_cpu(lambda c, a: torch.where(c, a, a), torch.ones(4, 5), x)  # a float condition
    raises_as_cpu(lambda a, b: a @ b, torch.arange(4.0).reshape(2, 2), torch.arange(4).reshape(2, 2))  # dtypes
    raises_as_cpu(lambda a: torch.isin(a, a, assume_unique=True, invert=True).cumsum(5), torch.arange(4))
    for _ in range(2):  # the kept signatures still give CPU's values
        same(tx @ ty, x @ y)
        same(torch.cat([tx, tx]), torch.cat([x, x]))


def test_index_copy_in_place_values_and_overlap():
    cache, src = torch.zeros(2, 4, 6, 3), torch.randn(2, 4, 1, 3)
    tcache, tsrc = cache.to(DEV), src.to(DEV)
    for pos in range(4):  # a static cache's update, one position per step
        idx = torch.tensor([pos])
        r = tcache.index_copy_(2, idx.to(DEV), tsrc + pos)
        cache.index_copy_(2, idx, src + pos)
        assert r is tcache
    assert torch.equal(tcache.cpu(), cache)
    n0 = torch_tpu._C._fast_kept_calls()
    tcache.index_copy_(2, torch.tensor([5], device=DEV), tsrc)
    assert torch_tpu._C._fast_kept_calls() - n0 == 1
    raises_as_cpu(lambda c, s: c.index_copy_(2, torch.tensor([0, 1], device=c.device), s), cache, src)  # 2 vs 1
    raises_as_cpu(lambda c, s: c.index_copy_(2, torch.tensor([0.0], device=c.device), s), cache, src)  # float index
    # A source that shares self's storage is never kept: CPU's overlap check raises at the call.
    t = torch.arange(12.0).reshape(3, 4)
    tt = t.to(DEV)
    for _ in range(3):
        tt.index_copy_(0, torch.tensor([0], device=DEV), tt[2:3].clone())
        t.index_copy_(0, torch.tensor([0]), t[2:3].clone())
    for _ in range(2):
        raises_as_cpu(lambda c: c.index_copy_(0, torch.tensor([1], device=c.device), c[2:3]), t.clone())
    assert torch.equal(tt.cpu(), t)


def test_kept_products_follow_the_matmul_precision():
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    ta, tb = a.to(DEV), b.to(DEV)
    exact, n = kept(lambda: ta @ tb)
    assert n == 2
    same(exact, a @ b)
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):  # one bf16 pass: not the kept highest-precision kernel
        medium = ta @ tb
    want = a.bfloat16().float() @ b.bfloat16().float()
    torch.testing.assert_close(medium.cpu(), want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(medium.cpu(), exact.cpu())
    same(ta @ tb, a @ b)


def test_generic_kernels_in_other_modes():
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    tx, ty = x.to(DEV), y.to(DEV)
    for _ in range(2):
        F.silu(tx), tx @ ty
    n0 = torch_tpu._C._fast_kept_calls()
    with torch_tpu.eager_mode("defer_and_fuse"):
        before = torch_tpu.debug.region_stats()["ops_recorded"]
        r = F.silu(tx) * ty
        assert torch_tpu.debug.region_stats()["ops_recorded"] == before + 2  # recorded, not queued
        m = tx @ ty
    assert torch_tpu._C._fast_kept_calls() == n0
    torch.testing.assert_close(r.cpu(), F.silu(x) * y)  # a fused region's numerics (docs/eager-modes.md)
    same(m, x @ y)
    with torch_tpu.eager_mode("debug"):
        same(F.silu(tx), F.silu(x))
        same(torch.cat([tx, ty]), torch.cat([x, y]))


def test_a_custom_cost_elsewhere_leaves_the_kept_paths():
    """A custom cost function (what each torch.tpu.pallas kernel registers, also at import)
    turns off the kept path of its own op only: that op is priced by it on every call."""
    x = torch.randn(6, 5)
    tx = x.to(DEV)
    asked = []

    def price(args, results):
        asked.append(1)
        return {"flops": 7.0, "bytes_read": 0.0, "bytes_written": 0.0}

    torch_tpu._C._set_custom_op_cost("test_fast_kernels::elsewhere", price)
    try:
        got, n = kept(lambda a: a.exp(), tx)  # another op's function: exp is kept
        same(got, x.exp())
        assert n == 2
        torch_tpu._C._set_custom_op_cost("aten::sin", price)
        got, n = kept(lambda a: a.sin(), tx)  # its own: priced on each call, never kept
        same(got, x.sin())
        assert n == 0 and len(asked) == 3
    finally:
        torch_tpu._C._set_custom_op_cost("aten::sin", None)
        torch_tpu._C._set_custom_op_cost("test_fast_kernels::elsewhere", None)
    got, n = kept(lambda a: a.sin(), tx)  # unregistered: kept again
    same(got, x.sin())
    assert n == 2 and len(asked) == 3


def test_a_donated_tensor_elsewhere_leaves_the_kept_paths():
    """A tensor without values alive somewhere (donated to a Pallas kernel, written in a dry
    run) sends only the calls that read it to the fallback, which raises at the call."""
    x = torch.randn(6, 5)
    tx, gone = x.to(DEV), torch.randn(6, 5).to(DEV)
    for _ in range(2):  # kept signatures, gone's among them
        tx.exp(), gone.exp()
    torch_tpu._C._mark_donated(gone, "test_op")
    got, n = kept(lambda a: a.exp(), tx)
    same(got, x.exp())
    assert n == 2
    with pytest.raises(RuntimeError, match="was donated to test_op"):
        gone.exp()
    gone.zero_()  # overwritten whole: usable again
    same(gone.exp(), torch.ones(6, 5))
