"""Blocks freed in stream order: a result dropped while queued work still uses it goes back
to the allocator at once, and only later work on the same stream may reuse it, as with
CUDA's caching allocator. The `gate` fixture (conftest.py) blocks a stream, so the work that
uses the dropped block is certainly still queued."""

import pytest
import torch

from helpers.devices import needs_v6e_8

pytestmark = [needs_v6e_8, pytest.mark.usefixtures("strict_mode")]

N = 256 * 1024  # 1 MiB of float32: one block per result


def _kept(*ops):
    """Runs each op once so that its signature is kept (the fast path that reuses blocks)."""
    for op in ops:
        op()
    torch.tpu.synchronize()


def _kept_with_closed_gate(gate, x, *ops):
    """_kept(ops) and the gate's own signature on `x`; the gate is closed again afterwards."""
    _kept(*ops)
    gate(x)
    torch.tpu.synchronize()
    gate.event.clear()


def test_dropped_result_is_reused_on_its_stream_behind_queued_reads(gate):
    host = torch.randn(N)
    x = host.to("tpu")
    _kept_with_closed_gate(gate, x, lambda: x + 1, lambda: x * 2.0, lambda: x * 3.0)

    y = x + 1
    blocked = gate(x)  # the stream waits here: nothing after it has run
    z = y * 2.0  # reads y after the gate
    y_ptr = y.data_ptr()
    del y
    allocated = torch.tpu.memory_allocated()
    w = x * 3.0  # reuses y's block: it writes after z has read it, in stream order
    assert w.data_ptr() == y_ptr
    assert torch.tpu.memory_allocated() == allocated + 4 * N
    gate.open()
    assert torch.equal(z.cpu(), (host + 1) * 2.0)
    assert torch.equal(w.cpu(), host * 3.0)
    assert torch.equal(blocked.cpu(), host + 1)


def test_another_stream_does_not_reuse_a_block_its_stream_still_reads(gate):
    host = torch.randn(N)
    x = host.to("tpu")
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    s1.wait_stream(torch.tpu.current_stream())
    s2.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(s1):
        _kept(lambda: x + 1, lambda: x * 2.0)
        gate(x)
    with torch.tpu.stream(s2):
        _kept(lambda: x * 0.0)
    torch.tpu.synchronize()
    gate.event.clear()

    with torch.tpu.stream(s1):
        y = x + 1
        gate(x)
        z = y * 2.0
        y_ptr = y.data_ptr()
        del y
    with torch.tpu.stream(s2):
        zeros = x * 0.0  # runs at once on s2, while s1 is blocked before reading y
        assert zeros.data_ptr() != y_ptr
        s2.synchronize()
    gate.open()
    s1.synchronize()
    assert torch.equal(zeros.cpu(), torch.zeros(N))
    assert torch.equal(z.cpu(), (host + 1) * 2.0)


def test_many_queued_results_keep_two_blocks(gate):
    # Behind a blocked stream, 20 results dropped one after another take two blocks, as on
    # CPU, instead of one per queued op.
    host = torch.randn(N)
    x = host.to("tpu")
    _kept_with_closed_gate(gate, x, lambda: x * 2.0)
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    gate(x)
    for k in range(20):
        out = x * float(k)
    assert torch.tpu.max_memory_allocated() <= base + 3 * 4 * N  # the gate's result and two
    gate.open()
    assert torch.equal(out.cpu(), host * 19.0)


def test_record_stream_holds_the_block_for_that_streams_work(gate):
    host = torch.randn(N)
    x = host.to("tpu")
    _kept_with_closed_gate(gate, x, lambda: x * 2.0)
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        blocked = gate(x)  # s waits at the gate
    y = x * 2.0
    torch.tpu.current_stream().synchronize()  # the default stream is done with y
    y.record_stream(s)  # as CUDA code does for work it queues on s by other means
    y_ptr = y.data_ptr()
    del y
    w = x * 2.0
    assert w.data_ptr() != y_ptr  # held until s's work queued by then has run
    gate.open()
    s.synchronize()
    assert torch.equal(w.cpu(), host * 2.0) and torch.equal(blocked.cpu(), host + 1)


def test_record_stream_of_another_device_raises():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two chips")
    x = torch.ones(4, device="tpu:0")
    with pytest.raises(RuntimeError, match="record_stream: expected a stream of tpu:0"):
        x.record_stream(torch.tpu.Stream(device="tpu:1"))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(N, device="tpu"),
        lambda: torch.full((N,), 2.5, device="tpu"),
        lambda: torch.empty(N, device="tpu").fill_(-1.0),
    ],
    ids=["zeros", "full", "fill_"],
)
def test_dropped_fill_results_reuse_their_block(gate, make):
    # A fill queued behind other work does not keep its tensor's block: a loop of dropped
    # zeros holds one block, as a loop of dropped `x + 1` does, not one per queued fill.
    host = torch.randn(N)
    x = host.to("tpu")
    _kept_with_closed_gate(gate, x, make)
    blocked = gate(x)
    allocated = torch.tpu.memory_allocated()
    for _ in range(50):
        make()
    assert torch.tpu.memory_allocated() <= allocated + 4 * N
    kept = make()
    gate.open()
    assert torch.equal(kept.cpu(), make().cpu())
    assert torch.equal(blocked.cpu(), host + 1)
