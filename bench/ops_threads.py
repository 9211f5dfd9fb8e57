"""Where an op's host time goes between the calling thread and the chip's threads.

For each op, issues `--iters` calls on tpu and reads the kernel's per-thread scheduler counters
(/proc/self/task/*/schedstat and status) before and after: wall time per call, CPU time of the
whole process per call, the calling thread's CPU time and sleeps per call, how often the stream
worker or its OpenMP helper was preempted per call and how long they waited, runnable, for a core
per call (schedstat's run-queue wait: time the kernel's threads lost, e.g. to the calling thread).
Unlike wall time, the counts barely move with machine load, so they show a change in how the
threads share the cores (e.g. the run-ahead wait's wake-ups) on a loaded machine. Linux only.

Run: python bench/ops_threads.py [--sizes 1024] [--iters 400] [--ops exp,add]
Best of `--repeats` runs (by wall time) per op.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F


def ops(n):
    """name -> (make() -> args, fn(*args)); the same calls as bench/ops.py."""
    sq = lambda: torch.randn(n, n, device="tpu")  # noqa: E731
    return {
        "add": (lambda: (sq(), sq()), lambda a, b: a + b),
        "mul_scalar": (lambda: (sq(),), lambda a: a * 2.0),
        "exp": (lambda: (sq(),), torch.exp),
        "gelu": (lambda: (sq(),), F.gelu),
        "mean": (lambda: (sq(),), torch.mean),
        "softmax": (lambda: (sq(),), lambda a: a.softmax(-1)),
        "layer_norm": (lambda: (sq(),), lambda a: F.layer_norm(a, (n,))),
        "embedding": (lambda: (torch.randint(0, n, (n,), device="tpu"), sq()), F.embedding),
        "cat": (lambda: (sq(), sq()), lambda a, b: torch.cat([a, b])),
    }


def counters():
    """tid -> (CPU ns, voluntary switches, involuntary switches, run-queue wait ns) per thread."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns, waited = map(int, f.read().split()[:2])
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
            switches = int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])
            out[int(tid)] = (ns, *switches, waited)
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024")
    p.add_argument("--iters", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    a = p.parse_args()
    import torch_tpu  # noqa: F401

    me = os.getpid()  # the calling thread's tid
    cols = ("wall us", "process cpu us", "caller cpu us", "caller sleeps", "worker preempted", "chip runq-wait us")
    print(f"{'op':12} {'n':>5} " + " ".join(f"{c:>16}" for c in cols))
    for n in [int(s) for s in a.sizes.split(",")]:
        for name, (make, fn) in ops(n).items():
            if a.ops and name not in a.ops.split(","):
                continue
            torch.manual_seed(0)
            args = make()
            for _ in range(30):
                fn(*args)
            torch.tpu.synchronize()
            best = None
            for _ in range(a.repeats):
                before, t0 = counters(), time.perf_counter()
                for _ in range(a.iters):
                    fn(*args)
                torch.tpu.synchronize()
                wall = (time.perf_counter() - t0) / a.iters
                after = counters()
                d = {t: [x - y for x, y in zip(after[t], before[t])] for t in after if t in before}
                row = (
                    wall * 1e6,
                    sum(v[0] for v in d.values()) / a.iters / 1e3,
                    d[me][0] / a.iters / 1e3,
                    d[me][1] / a.iters,
                    sum(v[2] for t, v in d.items() if t != me) / a.iters,
                    sum(v[3] for t, v in d.items() if t != me) / a.iters / 1e3,
                )
                best = row if best is None or row[0] < best[0] else best
            print(f"{name:12} {n:5d} " + " ".join(f"{v:16.2f}" for v in best), flush=True)


if __name__ == "__main__":
    main()
