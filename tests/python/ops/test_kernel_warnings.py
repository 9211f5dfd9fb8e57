"""Warnings of the CPU kernels that run tpu ops reach Python's warnings module once, on the
thread that issued the op: at the call when the op runs synchronously (the first call of a
signature, host-side checks), else at the next synchronization."""

import warnings

import pytest
import torch

import torch_tpu
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

NONCONTIG = "input value tensor is non-contiguous"


def _record(fn, sync=True):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
        if sync:
            torch.tpu.synchronize()
    return [str(w.message) for w in got]


@pytest.fixture(autouse=True)
def _strict():
    saved = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # TORCH_WARN_ONCE warns each time: a test can see every warning
    try:
        with torch_tpu.eager_mode("strict"):
            yield
    finally:
        torch.set_warn_always(saved)


def _searchsorted_args(device):
    return torch.arange(10.0, device=device), torch.rand(4, 2).t().to(device)


def test_kernel_warning_reaches_python_at_the_first_call():
    torch.manual_seed(0)
    cpu = _record(lambda: torch.searchsorted(*_searchsorted_args("cpu")), sync=False)
    assert sum(NONCONTIG in m for m in cpu) == 1
    s, v = _searchsorted_args("tpu")
    sorted_dtype = torch.float64  # a signature no other test used: its first call runs now
    s, v = s.to(sorted_dtype), v.to(sorted_dtype)
    got = _record(lambda: torch.searchsorted(s, v), sync=False)  # no synchronization: at the call
    assert sum(NONCONTIG in m for m in got) == 1, got
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -W error: the first call of a signature raises at the call
        s16, v16 = s.to(torch.int32), (v * 10).to(torch.int32)
        with pytest.raises(UserWarning, match=NONCONTIG):
            torch.searchsorted(s16, v16)
        with pytest.raises(UserWarning, match=NONCONTIG):  # a queued call: at the next synchronization
            torch.searchsorted(s16, v16)
            torch.tpu.synchronize()
    torch.tpu.synchronize()


def test_queued_kernel_warning_arrives_once_by_the_next_synchronization():
    s, v = _searchsorted_args("tpu")
    torch.searchsorted(s, v)
    torch.tpu.synchronize()
    got = _record(lambda: torch.searchsorted(s, v))
    assert sum(NONCONTIG in m for m in got) == 1, got
    assert _record(lambda: torch.tpu.synchronize()) == []  # delivered once


def test_uint8_mask_deprecation_warned_once_as_on_cpu():
    m = torch.tensor([1, 0, 1, 0, 1, 0], dtype=torch.uint8)
    cpu = _record(lambda: torch.arange(6.0)[m], sync=False)
    x = torch.arange(6.0, device="tpu")
    got = _record(lambda: x[m.to("tpu")])
    assert len(cpu) == 1 and got == cpu, (got, cpu)
