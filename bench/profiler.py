"""Cost of torch.profiler on tpu: a loop of small ops unprofiled, under a CPU-only
profiler, and under a CPU + PrivateUse1 (tpu device tracks) profiler.

Each figure is the best of several runs of `--ops` chained 64x64 float32 adds (issued,
then waited for with torch.tpu.synchronize()), per op, including the profiler's start,
stop and PyTorch's post-processing of the events (what a user waits for).

Run: python bench/profiler.py [--ops N] [--repeats K]
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import torch_tpu  # noqa: F401


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    x = torch.randn(64, 64, device="tpu")

    def loop():
        y = x
        for _ in range(args.ops):
            y = y + 1
        torch.tpu.synchronize()

    def under(activities):
        def run():
            with profile(activities=activities):
                loop()
        return run

    def best(fn):
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times) / args.ops * 1e6

    loop()  # warm-up: meta-shape cache, allocator
    rows = [("unprofiled", best(loop)),
            ("CPU profiler", best(under([ProfilerActivity.CPU]))),
            ("CPU + tpu profiler", best(under([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])))]
    for name, us in rows:
        print(f"{name:>20}: {us:7.2f} us/op")


if __name__ == "__main__":
    main()
