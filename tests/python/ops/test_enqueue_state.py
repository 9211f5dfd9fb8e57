"""A queued op computes with the global and thread-local state of the moment it was issued, not of
the moment the chip's worker thread runs it: default dtype, matmul precision, deterministic
algorithms, denormal flushing, the RNG."""

import pytest
import torch

import torch_tpu
from helpers.backend_flags import settable_backend_flags
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


def _busy(device="tpu"):
    """Queues enough work that what is issued next runs a while later."""
    x = torch.ones(1536, 1536, device=device)
    (x @ x).cpu()  # the matmul's signature is known: the ones below are queued
    for _ in range(4):
        x = (x @ x) / 1536
    return x


@pytest.fixture(autouse=True)
def _strict():
    with torch_tpu.eager_mode("strict"):
        yield
        torch.tpu.synchronize()


def test_true_division_follows_the_default_dtype_of_the_call():
    a = torch.arange(1, 7, device="tpu")
    b = torch.full((6,), 3, device="tpu")
    (a / b).cpu(), torch.sin(a).cpu()  # the signatures are known: the next calls are queued
    _busy()
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        q = a / b
        s = torch.sin(a)
    finally:
        torch.set_default_dtype(saved)
    assert q.dtype == s.dtype == torch.float64
    torch.testing.assert_close(q.cpu(), torch.arange(1, 7, dtype=torch.float64) / 3, rtol=0, atol=0)
    torch.testing.assert_close(s.cpu(), torch.sin(torch.arange(1, 7, dtype=torch.float64)), rtol=0, atol=0)


def test_matmul_precision_of_the_call():
    x = torch.randn(64, 64)
    y = torch.randn(64, 64)
    xt, yt = x.to("tpu"), y.to("tpu")
    (xt @ yt).cpu()
    saved = torch.get_float32_matmul_precision()
    _busy()
    try:
        p = xt @ yt  # issued at "highest"
        torch.set_float32_matmul_precision("medium")
        got = p.cpu()
    finally:
        torch.set_float32_matmul_precision(saved)
    torch.testing.assert_close(got, x @ y, rtol=1e-6, atol=1e-5)


def test_matmul_precision_of_the_call_set_through_the_backend_api():
    x = torch.randn(256, 256)
    y = torch.randn(256, 256)
    xt, yt = x.to("tpu"), y.to("tpu")
    (xt @ yt).cpu()
    saved = torch.backends.mkldnn.matmul.fp32_precision
    _busy()
    with settable_backend_flags():
        try:
            p = xt @ yt  # issued with float32 products exact on CPU too
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
            got = p.cpu()
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = saved
    torch.testing.assert_close(got, x @ y, rtol=1e-6, atol=1e-5)


def test_rng_seeded_after_the_call_does_not_change_it():
    torch.manual_seed(1)
    want = torch.randn(1000, device="tpu").cpu()
    torch.manual_seed(1)
    _busy()
    r = torch.randn(1000, device="tpu")
    torch.manual_seed(2)
    torch.testing.assert_close(r.cpu(), want, rtol=0, atol=0)


def test_deterministic_flag_of_the_call():
    # index_put_ with accumulate=True sorts on CPU only under deterministic algorithms; the
    # observable part: a flag set after the call neither raises nor changes the queued result.
    base = torch.zeros(5)
    idx = torch.tensor([0, 1, 1, 4])
    val = torch.tensor([1.0, 2.0, 3.0, 4.0])
    t = base.to("tpu")
    t.index_put_((idx.to("tpu"),), val.to("tpu"), accumulate=True)
    _busy()
    t.index_put_((idx.to("tpu"),), val.to("tpu"), accumulate=True)
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = t.cpu()
    finally:
        torch.use_deterministic_algorithms(saved)
    torch.testing.assert_close(got, 2 * base.index_put_((idx,), val, accumulate=True))


def test_flush_denormal_of_the_call():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        tiny = torch.tensor([1e-39, 2e-39])
        t = tiny.to("tpu")
        (t * 1.0).cpu()
        want = tiny * 1.0  # flushed on this thread, as CPU computes here
        got = (t * 1.0).cpu()
    finally:
        torch.set_flush_denormal(False)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
