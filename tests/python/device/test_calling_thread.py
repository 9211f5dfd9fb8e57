"""Copies between host and chip, and ops that run at once, start no OpenMP
team on the calling thread.

A parallel region on the calling thread would start a second team beside the stream worker's,
and with more OpenMP threads than CPUs libgomp stops spinning, so every parallel kernel on
either thread pays a futex wake-up (csrc/runtime/calling_thread.h). Threads are counted in a
fresh process: an OpenMP team of two adds one thread the first time its master runs a region.
"""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, torch, torch_tpu
    torch.set_num_threads(2)
    threads = lambda: len(os.listdir("/proc/self/task"))
    big = torch.randn(1024, 1024)  # 4 MiB: copied by the worker, waited for
    small = torch.randn(256, 256)  # 256 KiB: snapshot on the calling thread, queued
    t_big, t_small = big.to("tpu"), small.to("tpu")
    out = (t_big.exp() + 1).cpu()  # device -> host
    small_t = t_small.t().contiguous().cpu()
    back = torch.empty(1024, 1024)
    back.copy_(t_big)
    normed = torch.nn.functional.batch_norm(t_big, None, None, training=True).cpu()  # runs at once, on the worker
    before = threads()
    oracle = big.exp() + 1  # the user's own parallel CPU kernel: now the calling thread starts its team
    after = threads()
    torch.testing.assert_close(out, oracle)
    torch.testing.assert_close(small_t, small.t().contiguous())
    torch.testing.assert_close(back, big)
    torch.testing.assert_close(normed, torch.nn.functional.batch_norm(big, None, None, training=True))
    print(before, after)
    """
)


def test_copies_start_no_team_on_the_calling_thread():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert after == before + 1, f"threads before the user's CPU kernel {before}, after {after}"
