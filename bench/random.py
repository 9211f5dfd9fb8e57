"""Random fills on tpu (philox, the default generator) against CPU PyTorch's, side by side.

    python bench/random.py [--sizes 65536,4194304] [--repeats 5]

Prints, per op and size, the median time of a tpu fill (issued and synchronized) and of the
same fill on CPU, and their ratio. The tpu kernel computes one Philox4x32-10 block per
element on host cores (csrc/aten/random_ops.cc); CPU's uses mt19937.
"""

import argparse
import statistics
import time

import torch

import torch_tpu  # noqa: F401

OPS = {
    "uniform_": lambda t: t.uniform_(),
    "normal_": lambda t: t.normal_(),
    "bernoulli_": lambda t: t.bernoulli_(0.5),
    "random_": lambda t: t.random_(0, 1000),
}


def median_s(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="65536,4194304")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"{'op':12} {'n':>9} {'tpu ms':>9} {'cpu ms':>9} {'tpu/cpu':>8}")
    for n in (int(s) for s in args.sizes.split(",")):
        tpu, cpu = torch.empty(n, device="tpu"), torch.empty(n)
        for name, op in OPS.items():
            op(tpu)
            torch.tpu.synchronize()

            def on_tpu(op=op, t=tpu):
                op(t)
                torch.tpu.synchronize()

            t = median_s(on_tpu, args.repeats)
            c = median_s(lambda op=op, c=cpu: op(c), args.repeats)
            print(f"{name:12} {n:>9} {t * 1e3:>9.2f} {c * 1e3:>9.2f} {t / c:>8.2f}")


if __name__ == "__main__":
    main()
