"""Queued small ops after the process idled: tpu (strict) against CPU eager.

Each sample sleeps --gap-ms, then times --ops calls of one op and waits for them (tpu:
torch.tpu.synchronize()); the figure is the median over --samples samples, per op. After a few
milliseconds of idling, a 2-vCPU KVM guest woke the main thread and the chip's worker onto one
vCPU, where they stayed while the other idled (bench/README.md, 2026-12-07): compare
`TORCH_TPU_SPREAD_THREADS=0` with the default. Each side runs in its own process, the CPU one
without torch_tpu (TORCH_DEVICE_BACKEND_AUTOLOAD=0), alternating --rounds times.

`--sync-each` waits for every call instead (a latency loop) and also counts the calls that took
over 2 ms: with `--op exp64k` (a parallel kernel) these are the scheduler ticks of docs/limits.md
that a woken OpenMP helper can wait for; the side `tpu-gomp-spin-1000` runs with
GOMP_SPINCOUNT=1000.

Run: python bench/idle_gap.py [--op gather|add64|exp64k] [--gap-ms 25] [--ops 5000] [--samples 25]
     [--rounds 2] [--sync-each]
e.g. python bench/idle_gap.py --op exp64k --sync-each --ops 20 --gap-ms 50 --samples 30
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

CHILD = "--child"


def child(device, op, gap_s, ops, samples, sync_each):
    import torch

    if device == "tpu":
        import torch_tpu  # noqa: F401
    a = torch.randn(1024, 1024, device=device)
    index = torch.randint(0, 1024, (1024, 4), device=device)
    b = torch.randn(64, 64, device=device)
    c = torch.randn(65536, device=device)
    fn = {"gather": lambda: a.gather(1, index), "add64": lambda: b + b, "exp64k": lambda: torch.exp(c, out=c)}[op]

    def sync():
        if device == "tpu":
            torch.tpu.synchronize()

    fn()
    sync()
    times, over_2ms = [], 0
    for _ in range(samples):
        time.sleep(gap_s)
        if not sync_each:
            fn()
            sync()
        t = time.perf_counter()
        for _ in range(ops):
            fn()
            if sync_each:
                sync()
                now = time.perf_counter()
                over_2ms += now - t > 2e-3
                times.append(now - t)
                t = now
        if not sync_each:
            sync()
            times.append((time.perf_counter() - t) / ops)
    print(statistics.median(times), over_2ms)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="gather", choices=["gather", "add64", "exp64k"])
    p.add_argument("--gap-ms", type=float, default=25.0)
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--samples", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sync-each", action="store_true", help="wait for every call; count calls over 2 ms")
    a = p.parse_args()
    sides = {
        "cpu": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        "tpu": {},
        "tpu-no-spread": {"TORCH_TPU_SPREAD_THREADS": "0"},
    }
    if a.sync_each:
        sides["tpu-gomp-spin-1000"] = {"GOMP_SPINCOUNT": "1000"}
    results = {name: [] for name in sides}
    slow = {name: 0 for name in sides}
    for _ in range(a.rounds):
        for name, env in sides.items():
            device = "cpu" if name == "cpu" else "tpu"
            args = [sys.executable, __file__, CHILD, device, a.op, str(a.gap_ms / 1e3), str(a.ops), str(a.samples)]
            args += ["1" if a.sync_each else "0"]
            out = subprocess.run(args, env=os.environ | env, capture_output=True, text=True, check=True).stdout
            median_s, over_2ms = out.split()[-2:]
            results[name].append(float(median_s))
            slow[name] += int(over_2ms)
    cpu = statistics.median(results["cpu"])
    calls = a.rounds * a.samples * a.ops
    print(f"{'side':20} {'us per op (each round)':32} {'median vs cpu':>14} {'calls over 2 ms':>16}")
    for name, r in results.items():
        runs = " ".join(f"{x * 1e6:.2f}" for x in r)
        over = f"{slow[name]} of {calls}" if a.sync_each else "-"
        print(f"{name:20} {runs:32} {statistics.median(r) / cpu:14.2f} {over:>16}")


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "1")
    else:
        main()
