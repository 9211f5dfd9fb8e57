"""Strict mode raises argument and dtype errors at the call, as CPU does (the first call of each
(op, dtypes, scalar kinds) signature runs synchronously and is remembered); only data-dependent
failures of later calls stay asynchronous, and then the sticky error names the op that failed."""

import re

import pytest
import torch

import torch_tpu
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


def _cpu_error(fn, *tensors):
    with pytest.raises(Exception) as info:
        fn(*tensors)
    return info.type, str(info.value).splitlines()[0]


CASES = {
    "heaviside_complex": (lambda c: torch.heaviside(c, c), lambda d: (torch.randn(3, dtype=torch.cfloat, device=d),)),
    "maximum_complex": (lambda c: torch.maximum(c, c), lambda d: (torch.randn(3, dtype=torch.cfloat, device=d),)),
    "add_bool_alpha": (lambda x: torch.add(x, x, alpha=True), lambda d: (torch.randn(3, device=d),)),
    "random_from_out_of_range": (lambda x: x.random_(-1, 5), lambda d: (torch.empty(3, dtype=torch.uint8, device=d),)),
    "random_to_out_of_range": (lambda x: x.random_(0, 300), lambda d: (torch.empty(3, dtype=torch.int8, device=d),)),
    "int_pow_negative": (lambda x: torch.pow(x, -2), lambda d: (torch.arange(3, device=d),)),
    "index_fill_complex_value": (
        lambda x, i: x.index_fill_(0, i, 1.5j),
        lambda d: (torch.arange(3, device=d), torch.tensor([0], device=d)),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_error_raised_at_the_call(name):
    fn, make = CASES[name]
    cpu_type, cpu_msg = _cpu_error(fn, *make("cpu"))
    with torch_tpu.eager_mode("strict"):
        args = make("tpu")
        torch.tpu.synchronize()
        for _ in range(2):  # a failing signature is not remembered as valid: it raises each time
            with pytest.raises(cpu_type, match=re.escape(cpu_msg)):
                fn(*args)
        torch.tpu.synchronize()  # nothing was left behind to surface later
        # Same op and dtypes with valid arguments still runs (asynchronously) and is right.
        a = torch.randn(4, 3)
        torch.testing.assert_close(torch.add(a.to("tpu"), 1.0, alpha=2).cpu(), torch.add(a, 1.0, alpha=2))


def test_scalar_kind_is_part_of_the_signature():
    with torch_tpu.eager_mode("strict"):
        x = torch.arange(4, device="tpu")
        torch.testing.assert_close(torch.pow(x, 2).cpu(), torch.arange(4) ** 2)
        with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
            torch.pow(x, -1)
        torch.tpu.synchronize()


def test_data_dependent_error_is_sticky_and_names_the_op():
    with torch_tpu.eager_mode("strict"):
        a = torch.arange(6, device="tpu")
        ok = torch.ones(6, dtype=torch.long, device="tpu")
        torch.testing.assert_close((a // ok).cpu(), torch.arange(6))  # the signature is learned: now queued
        zero = torch.zeros(6, dtype=torch.long, device="tpu")
        a // zero  # integer division by zero: only the data says so
        # A later op's synchronous first call does not raise floor_divide's error as its own.
        c = torch.cos(a.to(torch.float64))
        with pytest.raises(RuntimeError, match=r"error in asynchronously executed op 'aten::floor_divide") as info:
            torch.tpu.synchronize()
        assert "ZeroDivisionError" in str(info.value)
        torch.testing.assert_close(c.cpu(), torch.cos(torch.arange(6.0).double()))
        # Raised once: the next synchronizing call (e.g. manual_seed) does not repeat it.
        torch.manual_seed(0)
        torch.tpu.synchronize()
        torch.testing.assert_close((a + 1).cpu(), torch.arange(1, 7))


def _randperm(n, dtype):
    def run(out):
        torch.randperm(n, out=out)

    return run, lambda d: (torch.empty(0, dtype=dtype, device=d),)


def _cat_pair_out(y, x):
    torch.cat([y, y], out=x)


def _ten(d):
    return (torch.rand(10, device=d),)


# (valid call, call CPU rejects), each as (fn, make(device) -> args). The valid call comes first,
# so its signature is learned and later calls are queued; the failing one differs from it only
# in what a coarse signature would not tell apart: an integer just past a power of two, or how
# an out= argument overlaps itself or an input (metadata no meta kernel checks).
AFTER_VALID = {
    "randperm_uint8_n_257": (_randperm(256, torch.uint8), _randperm(257, torch.uint8)),
    "randperm_int16_n_2_15_plus_1": (_randperm(2**15, torch.int16), _randperm(2**15 + 1, torch.int16)),
    "randperm_half_n_2050": (_randperm(2049, torch.half), _randperm(2050, torch.half)),
    "cat_out_internal_overlap": (
        (_cat_pair_out, lambda d: (torch.rand(3, 3, device=d), torch.rand(6, 3, device=d))),
        (_cat_pair_out, lambda d: (torch.rand(3, 3, device=d), torch.rand(1, 3, device=d).expand(6, 3))),
    ),
    "cat_out_overlaps_input": (
        (lambda w: torch.cat([w[:2], w[2:4]], out=w[6:10]), _ten),  # same storage, disjoint
        (lambda w: torch.cat([w[:2], w[2:4]], out=w[1:5]), _ten),
    ),
    "pow_out_partial_overlap": (
        (lambda a: torch.pow(a[:5], 42, out=a[5:10]), _ten),
        (lambda a: torch.pow(a[1:6], 42, out=a[0:5]), _ten),
    ),
}


@pytest.mark.parametrize("name", list(AFTER_VALID))
def test_error_raised_at_the_call_after_a_valid_call(name):
    (ok_fn, ok_make), (bad_fn, bad_make) = AFTER_VALID[name]
    ok_fn(*ok_make("cpu"))
    cpu_type, cpu_msg = _cpu_error(bad_fn, *bad_make("cpu"))
    with torch_tpu.eager_mode("strict"):
        ok_fn(*ok_make("tpu"))
        torch.tpu.synchronize()
        args = bad_make("tpu")
        with pytest.raises(cpu_type, match=re.escape(cpu_msg)):
            bad_fn(*args)
        torch.tpu.synchronize()  # nothing was left behind to surface later
        torch.testing.assert_close((torch.ones(3, device="tpu") * 2).cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("mode", ["strict", "debug"])
@pytest.mark.parametrize(
    "fn",
    [
        lambda t: torch.nonzero(t, out=torch.empty([], dtype=torch.long)),
        lambda t: torch.add(t, t, out=torch.empty([], dtype=torch.long)),
        lambda t: torch.nonzero(t, out=torch.empty(0, dtype=torch.long)),
    ],
    ids=["nonzero_0d", "add_0d", "nonzero_1d"],
)
def test_host_out_tensor_raises_the_device_error(fn, mode):
    # A 0-d host tensor mixes with tpu tensors as an input (a scalar), never as a result.
    with torch_tpu.eager_mode(mode):
        t = torch.tensor([0, 1, 1, 0, 1], device="tpu")
        with pytest.raises(RuntimeError, match=r"on the same device.*tpu.*cpu.*aten::(nonzero|add)"):
            fn(t)
        torch.tpu.synchronize()
        torch.testing.assert_close(torch.nonzero(t).cpu(), torch.tensor([[1], [2], [4]]))
