"""Device micro-benchmarks: tpu (vTPU) against the same operation on CPU tensors.

Measures in one process, side by side:
  * ``empty`` latency (a 4 KiB float32 tensor),
  * host -> device ``copy_`` at 4 KiB, 4 MiB and 64 MiB (pageable and pinned),
  * device -> host ``copy_`` at the same sizes,
and prints each time (microseconds, median of repeats) with the ratio tpu / cpu.
The CPU peer of a copy is ``dst.copy_(src)`` between two CPU tensors.

Run: python bench/device.py [--repeats N]
"""

import argparse
import statistics
import time

import torch

import torch_tpu  # noqa: F401


def timeit(fn, repeats: int, sync=None) -> float:
    """Median wall seconds of fn() (each followed by sync(), if given)."""
    fn()
    if sync:
        sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    sync = torch.tpu.synchronize
    rows = []

    n = 1024  # 4 KiB of float32
    cpu = timeit(lambda: torch.empty(n), args.repeats * 10)
    tpu = timeit(lambda: torch.empty(n, device="tpu"), args.repeats * 10)
    rows.append(("empty 4 KiB", tpu, cpu))

    for label, nbytes in [("4 KiB", 4 << 10), ("4 MiB", 4 << 20), ("64 MiB", 64 << 20)]:
        reps = max(5, args.repeats // (1 if nbytes < (1 << 20) else 5))
        src = torch.randn(nbytes // 4)
        pinned = src.pin_memory()
        host_dst = torch.empty_like(src)
        dev = torch.empty(nbytes // 4, device="tpu")
        cpu = timeit(lambda: host_dst.copy_(src), reps)  # noqa: B023  (timed before the loop moves on)
        h2d = timeit(lambda: dev.copy_(src), reps, sync)  # noqa: B023
        h2d_pinned = timeit(lambda: dev.copy_(pinned, non_blocking=True), reps, sync)  # noqa: B023
        d2h = timeit(lambda: host_dst.copy_(dev), reps)  # noqa: B023
        rows.append((f"host->device copy_ {label}", h2d, cpu))
        rows.append((f"host->device copy_ {label} pinned, non_blocking", h2d_pinned, cpu))
        rows.append((f"device->host copy_ {label}", d2h, cpu))
        assert torch.equal(dev.cpu(), src), "copy produced wrong data"

    print(f"{'operation':48} {'tpu us':>10} {'cpu us':>10} {'tpu/cpu':>8}")
    for name, t, c in rows:
        print(f"{name:48} {t * 1e6:10.1f} {c * 1e6:10.1f} {t / c:8.2f}")


if __name__ == "__main__":
    main()
