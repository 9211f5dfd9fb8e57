"""Queued small ops after the process idled: tpu (strict) against CPU eager.

Each sample sleeps --gap-ms, then times --ops calls of one op and waits for them (tpu:
torch.tpu.synchronize()); the figure is the median over --samples samples, per op. After a few
milliseconds of idling, a 2-vCPU KVM guest woke the main thread and the chip's worker onto one
vCPU, where they stayed while the other idled (bench/README.md, 2026-12-07): compare
`TORCH_TPU_SPREAD_THREADS=0` with the default. Each side runs in its own process, the CPU one
without torch_tpu (TORCH_DEVICE_BACKEND_AUTOLOAD=0), alternating --rounds times.

Run: python bench/idle_gap.py [--op gather] [--gap-ms 25] [--ops 5000] [--samples 25] [--rounds 2]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

CHILD = "--child"


def child(device, op, gap_s, ops, samples):
    import torch

    if device == "tpu":
        import torch_tpu  # noqa: F401
    a = torch.randn(1024, 1024, device=device)
    index = torch.randint(0, 1024, (1024, 4), device=device)
    b = torch.randn(64, 64, device=device)
    fn = {"gather": lambda: a.gather(1, index), "add64": lambda: b + b}[op]

    def sync():
        if device == "tpu":
            torch.tpu.synchronize()

    times = []
    for _ in range(samples):
        time.sleep(gap_s)
        fn()
        sync()
        t = time.perf_counter()
        for _ in range(ops):
            fn()
        sync()
        times.append((time.perf_counter() - t) / ops)
    print(statistics.median(times))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="gather", choices=["gather", "add64"])
    p.add_argument("--gap-ms", type=float, default=25.0)
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--samples", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    sides = {
        "cpu": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        "tpu": {},
        "tpu-no-spread": {"TORCH_TPU_SPREAD_THREADS": "0"},
    }
    results = {name: [] for name in sides}
    for _ in range(a.rounds):
        for name, env in sides.items():
            device = "cpu" if name == "cpu" else "tpu"
            args = [sys.executable, __file__, CHILD, device, a.op, str(a.gap_ms / 1e3), str(a.ops), str(a.samples)]
            out = subprocess.run(args, env=os.environ | env, capture_output=True, text=True, check=True).stdout
            results[name].append(float(out.split()[-1]))
    cpu = statistics.median(results["cpu"])
    print(f"{'side':16} {'us per op (each round)':32} {'median vs cpu':>14}")
    for name, r in results.items():
        runs = " ".join(f"{x * 1e6:.2f}" for x in r)
        print(f"{name:16} {runs:32} {statistics.median(r) / cpu:14.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()
