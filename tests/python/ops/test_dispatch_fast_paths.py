"""Strict mode's cheaper per-op paths keep CPU's results, errors and the cost counters:
cat and gather through the fallback, host scalars snapshotted by memcpy, cached estimates."""

import pytest
import torch

import torch_tpu.runtime as rt

DEV = "tpu"


def raises_as_cpu(fn, *cpu_args):
    """fn on the CPU arguments, then on their tpu copies: the same exception type and message."""
    with pytest.raises(Exception) as cpu:
        fn(*cpu_args)
    with pytest.raises(type(cpu.value)) as tpu:
        fn(*[x.to(DEV) for x in cpu_args])
    assert str(tpu.value) == str(cpu.value)


def test_cat_values_promotion_and_errors():
    a = torch.randn(3, 4)
    b = torch.randn(2, 4, dtype=torch.float64)
    got = torch.cat([a.to(DEV), b.to(DEV)])
    want = torch.cat([a, b])
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)
    assert torch.equal(torch.cat([a.to(DEV), a.to(DEV)], dim=1).cpu(), torch.cat([a, a], dim=1))
    raises_as_cpu(lambda x, y: torch.cat([x, y]), a, torch.randn(2, 5))  # sizes must match
    raises_as_cpu(lambda x: torch.cat([x, x], dim=3), a)  # dimension out of range
    assert torch.equal(torch.cat([a.to(DEV)]).cpu(), a)  # the process keeps working


def test_gather_values_and_errors():
    a = torch.randn(4, 6)
    i = torch.randint(0, 6, (4, 3))
    assert torch.equal(a.to(DEV).gather(1, i.to(DEV)).cpu(), a.gather(1, i))
    raises_as_cpu(lambda x, j: x.gather(1, j), a, torch.randint(0, 6, (4, 3, 2)))  # index rank differs
    raises_as_cpu(lambda x, j: x.gather(1, j), a, i.float())  # index must be int64
    assert torch.equal(a.to(DEV).gather(0, i[:1].to(DEV) % 4).cpu(), a.gather(0, i[:1] % 4))


def test_host_scalar_tensor_is_a_snapshot():
    a = torch.randn(8, 8)
    s = torch.tensor(2.0)
    r = a.to(DEV) * s  # a 0-d host tensor argument
    s.fill_(5.0)  # changed before the queued op may have run
    assert torch.equal(r.cpu(), a * 2.0)
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    got = x.to(DEV) * 2.5  # wrapped Python scalar: type promotion as on CPU
    assert got.dtype == torch.float32 and torch.equal(got.cpu(), x * 2.5)
    h = torch.tensor(3, dtype=torch.int64)
    got = x.to(DEV) + h  # a 0-d int64 host tensor does not promote int32
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), x + h)


def test_repeated_op_counts_the_same_estimate():
    a = torch.randn(16, 16, device=DEV)
    a + a  # first call of the signature: priced and estimated
    torch.tpu.synchronize()
    before = rt.stats()
    for _ in range(3):
        a + a
    torch.tpu.synchronize()
    mid = rt.stats()
    a + a
    torch.tpu.synchronize()
    after = rt.stats()
    assert mid["ops"] - before["ops"] == 3 and after["ops"] - mid["ops"] == 1
    one = after["device_seconds"] - mid["device_seconds"]
    assert one > 0
    assert mid["device_seconds"] - before["device_seconds"] == pytest.approx(3 * one, rel=1e-9)
    b, m, f = (s["device_seconds_by_generation"] for s in (before, mid, after))
    assert len(b) == 5
    for gen in b:
        assert m[gen] - b[gen] == pytest.approx(3 * (f[gen] - m[gen]), rel=1e-9) and f[gen] > m[gen]
