"""Eager modes: selection, debug mode's synchronous checks, strict mode's sticky errors."""

import os
import subprocess
import sys
import threading

import pytest
import torch

import torch_tpu


def _run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


def test_default_is_strict_and_setters_round_trip():
    assert torch_tpu.get_eager_mode() == "strict"
    torch_tpu.set_eager_mode("debug")
    try:
        assert torch_tpu.get_eager_mode() == "debug"
    finally:
        torch_tpu.set_eager_mode("strict")
    assert torch_tpu.get_eager_mode() == "strict"


def test_context_manager_is_thread_local_and_wins():
    seen = {}
    with torch_tpu.eager_mode("debug"):
        t = threading.Thread(target=lambda: seen.setdefault("other", torch_tpu.get_eager_mode()))
        t.start()
        t.join()
        assert torch_tpu.get_eager_mode() == "debug"
        torch_tpu.set_eager_mode("strict")  # the thread-local block still wins
        assert torch_tpu.get_eager_mode() == "debug"
    assert seen["other"] == "strict"
    assert torch_tpu.get_eager_mode() == "strict"


def test_bad_mode_names():
    with pytest.raises(ValueError, match="valid modes: strict, debug, defer_and_fuse"):
        torch_tpu.set_eager_mode("fast")
    with pytest.raises(ValueError):
        with torch_tpu.eager_mode("nope"):
            pass


def test_launch_blocking_env_selects_debug():
    r = _run("import torch, torch_tpu; print(torch_tpu.get_eager_mode())", TORCH_TPU_LAUNCH_BLOCKING="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "debug"


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_modes_give_cpu_results_for_a_training_step(mode):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    dev.load_state_dict(cpu.state_dict())
    dev = dev.tpu()
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with torch_tpu.eager_mode(mode):
        loss = torch.nn.functional.cross_entropy(dev(x.tpu()), y.tpu())
        loss.backward()
    ref = torch.nn.functional.cross_entropy(cpu(x), y)
    ref.backward()
    torch.testing.assert_close(loss.cpu(), ref)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)


INDEX_CASES = {
    "index_select": lambda x, i: x.index_select(0, i),
    "gather": lambda x, i: x.gather(0, i.view(-1, 1).expand(-1, 3)),
    "scatter": lambda x, i: x.scatter(0, i.view(-1, 1).expand(-1, 3), 1.0),
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x),
    "index": lambda x, i: x[i],
    "index_put_": lambda x, i: x.index_put_((i,), torch.ones(3, device=x.device)),
    "take": lambda x, i: x.take(i * 3),
}


@pytest.mark.parametrize("name", sorted(INDEX_CASES))
def test_debug_mode_checks_index_bounds(name):
    x = torch.randn(5, 3, device="tpu")
    bad = torch.tensor([1, 9], device="tpu")
    with torch_tpu.eager_mode("debug"):
        with pytest.raises(IndexError) as info:
            INDEX_CASES[name](x, bad)
        # valid indices still work and equal CPU
        ok = torch.tensor([1, 4], device="tpu")
        torch.testing.assert_close(INDEX_CASES[name](x.clone(), ok).cpu(),
                                   INDEX_CASES[name](x.cpu(), ok.cpu()))
    msg = str(info.value)
    assert ("9" in msg or "27" in msg) and ("size" in msg), msg
    assert "test_eager_modes.py" in msg, msg  # the Python source line of the op


def test_debug_mode_check_finite_names_the_op():
    x = torch.tensor([1.0, -1.0], device="tpu")
    with torch_tpu.eager_mode("debug"):
        torch_tpu.eager.set_check_finite(True)
        try:
            with pytest.raises(RuntimeError, match="sqrt.*NaN or Inf"):
                torch.sqrt(x)
            torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(x.cpu()))
        finally:
            torch_tpu.eager.set_check_finite(False)
    assert torch.isnan(torch.sqrt(x).cpu()).any()  # off again: no error


def test_debug_mode_shape_errors_are_cpu_types_with_context():
    a, b = torch.randn(2, 3, device="tpu"), torch.randn(4, 5, device="tpu")
    with torch_tpu.eager_mode("debug"):
        with pytest.raises(RuntimeError) as info:
            a @ b
    assert "2x3" in str(info.value) or "[2, 3]" in str(info.value)


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_dtype_changing_views_keep_their_dtype(mode):
    """view_as_complex / view_as_real / view(dtype) return views with the new dtype in
    every mode (debug mode's synchronous path once gave view_as_complex a float32 view
    and view_as_real a ComplexFloat[..., 2] one, out of its storage's bounds: stft)."""
    x = torch.randn(5, 2)
    c = torch.view_as_complex(x)
    t = x.to("tpu")
    with torch_tpu.eager_mode(mode):
        tc = torch.view_as_complex(t)
        assert tc.dtype == torch.complex64 and tc.shape == (5,) and tc.stride() == (1,)
        assert tc.data_ptr() == t.data_ptr()
        tr = torch.view_as_real(tc)
        assert tr.dtype == torch.float32 and tr.shape == (5, 2) and tr.stride() == (2, 1)
        ti = t.view(torch.int32)
        assert ti.dtype == torch.int32 and ti.shape == (5, 2)
        spec = torch.stft(torch.arange(100.0).to("tpu"), 10, return_complex=False)
    torch.testing.assert_close(tc.cpu(), c)
    torch.testing.assert_close(tr.cpu(), x)
    assert torch.equal(ti.cpu(), x.view(torch.int32))
    torch.testing.assert_close(spec.cpu(), torch.stft(torch.arange(100.0), 10, return_complex=False))


def test_strict_mode_error_is_sticky_then_cleared():
    x = torch.randn(5, 3, device="tpu")
    x.index_select(0, torch.tensor([0, 1], device="tpu"))  # the signature's first call (synchronous)
    y = x.index_select(0, torch.tensor([0, 99], device="tpu"))  # queued: no error yet
    with pytest.raises(RuntimeError, match="index_select"):
        torch.tpu.synchronize()
    z = x * 2  # later work on the chip is correct once the error is handled
    torch.testing.assert_close(z.cpu(), x.cpu() * 2)
    del y


def test_defer_and_fuse_is_selectable():
    torch_tpu.set_eager_mode("defer_and_fuse")
    try:
        assert torch_tpu.get_eager_mode() == "defer_and_fuse"
    finally:
        torch_tpu.set_eager_mode("strict")
    r = _run("import torch, torch_tpu; print(torch_tpu.get_eager_mode())", TORCH_TPU_DEFER_AND_FUSE="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "defer_and_fuse"
