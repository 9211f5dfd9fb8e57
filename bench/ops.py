"""Operator benchmark: about 20 common operators at three sizes, vTPU against
CPU eager, interleaved op by op. CPU eager runs in a child process that never
loads torch_tpu: in one process, the stream worker's OpenMP team and the main
thread's would make libgomp stop spinning and slow both sides' parallel
kernels (docs/limits.md). Each figure is the median over repeats of the
time to issue `--iters` calls and wait for them (tpu: torch.tpu.synchronize()),
divided by `--iters`; the two sides take their samples in turn, and the last
column is tpu / cpu.

Run: python bench/ops.py [--iters N] [--sizes 64,1024,4096] [--ops exp,sum(dim=1)]

A/B of a setting, same machine, interleaved: `--ab TORCH_TPU_VALIDATE_FIRST_CALL=0` runs the
table `--rounds` times in child processes alternately with and without that environment
setting and prints, per op, the fastest tpu time of each and their ratio (under load the
minimum over rounds is the stable figure). `--baseline DIR` does the same with another checkout's
build (DIR holding its torch_tpu package with its _C extension) in place of the setting:
`python bench/ops.py --sizes 64 --baseline /path/to/other --rounds 5`.
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

CPU_PEER = "--cpu-peer"  # child mode: reads "n op_index" lines, answers the CPU time in seconds


def ops(n: int):
    """(name, fn(tensors), make(device) -> tensors) for an n-sized problem."""

    def sq(dev, dtype=torch.float32):
        return torch.randn(n, n, device=dev, dtype=dtype)

    conv_n = max(8, n // 16)
    return [
        ("add", lambda a, b: a + b, lambda d: (sq(d), sq(d))),
        ("mul_scalar", lambda a: a * 2.0, lambda d: (sq(d),)),
        ("add_ (in-place)", lambda a, b: a.add_(b), lambda d: (sq(d), sq(d))),
        ("exp", torch.exp, lambda d: (sq(d),)),
        ("gelu", F.gelu, lambda d: (sq(d),)),
        ("where", lambda c, a, b: torch.where(c, a, b), lambda d: (sq(d) > 0, sq(d), sq(d))),
        ("sum", torch.sum, lambda d: (sq(d),)),
        ("sum(dim=1)", lambda a: a.sum(1), lambda d: (sq(d),)),
        ("amax(dim=0)", lambda a: a.amax(0), lambda d: (sq(d),)),
        ("mean", torch.mean, lambda d: (sq(d),)),
        ("matmul", torch.matmul, lambda d: (sq(d), sq(d))),
        ("linear+bias", F.linear, lambda d: (sq(d), sq(d), torch.randn(n, device=d))),
        # A decode step's vocabulary projection: 4 rows by an [8n, 512] weight.
        ("linear (4 rows)", F.linear, lambda d: (torch.randn(4, 512, device=d), torch.randn(8 * n, 512, device=d))),
        ("softmax", lambda a: a.softmax(-1), lambda d: (sq(d),)),
        ("layer_norm", lambda a: F.layer_norm(a, (n,)), lambda d: (sq(d),)),
        ("embedding", F.embedding, lambda d: (torch.randint(0, n, (n,), device=d), sq(d))),
        (
            "index_select",
            lambda a, i: a.index_select(0, i),
            lambda d: (sq(d), torch.randint(0, n, (n // 2,), device=d)),
        ),
        ("gather", lambda a, i: a.gather(1, i), lambda d: (sq(d), torch.randint(0, n, (n, 4), device=d))),
        ("transpose+contiguous", lambda a: a.t().contiguous(), lambda d: (sq(d),)),
        ("cat", lambda a, b: torch.cat([a, b]), lambda d: (sq(d), sq(d))),
        (
            "conv2d",
            lambda x, w: F.conv2d(x, w, padding=1),
            lambda d: (torch.randn(2, 8, conv_n, conv_n, device=d), torch.randn(8, 8, 3, 3, device=d)),
        ),
        ("bf16 add", lambda a, b: a + b, lambda d: (sq(d, torch.bfloat16), sq(d, torch.bfloat16))),
        # Added 2026-12-07 (seventeenth session): a fill, and kernels that allocate their result.
        ("zeros_like", torch.zeros_like, lambda d: (sq(d),)),
        ("relu", torch.relu, lambda d: (sq(d),)),
        ("flip", lambda a: a.flip(0), lambda d: (sq(d),)),
    ]


def wait_until_idle(pid, least_s=0.005, most_s=0.2):
    """Sleeps until no thread of process `pid` is running (at least `least_s`, at most `most_s`).

    After its last parallel kernel, the other side's idle OpenMP threads spin (libgomp: 3 ms on
    one VM, 8-10 ms on another) and would take a core from this side's sample. Not much longer
    than needed: after 20 ms idle, one sample in five ran 5-10x slow on a 2-vCPU VM (its OpenMP
    thread's vCPU slow to come back), at 5-10 ms none did. Without /proc: `least_s`.
    """
    start = time.perf_counter()
    time.sleep(least_s)
    tasks = f"/proc/{pid}/task"
    while time.perf_counter() - start < most_s:
        try:
            states = []
            for t in os.listdir(tasks):
                with open(f"{tasks}/{t}/stat") as f:
                    states.append(f.read().rpartition(")")[2].split()[0])  # state follows "(comm)"
        except OSError:
            return
        if "R" not in states:
            return
        time.sleep(0.0005)


def measure(fn, args, iters, repeats, sync, other_pid):
    wait_until_idle(other_pid)
    fn(*args)
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        sync()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sample-ms", type=float, default=20.0, help="least length of one sample (raises --iters)")
    p.add_argument("--sizes", default="64,1024,4096")
    p.add_argument("--ab", metavar="VAR=VALUE", help="compare tpu times with and without this environment setting")
    p.add_argument("--baseline", metavar="DIR", help="compare tpu times with another checkout's torch_tpu build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", help="comma-separated op names to run (default: all)")
    a = p.parse_args()
    if a.baseline:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.environ.get("PYTHONPATH", "")
        a.ab = "PYTHONPATH=" + os.pathsep.join([os.path.abspath(a.baseline)] + [p for p in path.split(os.pathsep) if p])
        os.environ["PYTHONPATH"] = os.pathsep.join([here] + [p for p in path.split(os.pathsep) if p])
    if a.ab:
        return ab(a)
    import torch_tpu  # noqa: F401  (not in the CPU peer)

    peer = CpuPeer()
    print(f"{'op':22} {'n':>5} {'tpu us':>10} {'cpu us':>10} {'tpu/cpu':>8}")
    ratios = {}
    for n in [int(s) for s in a.sizes.split(",")]:
        for index, (name, fn, make) in enumerate(ops(n)):
            iters = a.iters if n <= 1024 else max(2, a.iters // 10)
            if a.ops and name not in a.ops.split(","):
                continue
            torch.manual_seed(0)
            tpu_args = make("tpu")  # built on the chip: CPU kernels here would start a second OpenMP team
            # Samples of at least --sample-ms: a core slow to come back from idle (on a VM, up to
            # a few ms) then costs a sample little. One sample each way in turn: a change of the
            # machine's speed meets both sides.
            per_call = peer.measure(n, index, iters, 1)
            iters = max(iters, min(100000, math.ceil(a.sample_ms * 1e-3 / per_call)))
            cpu_samples, tpu_samples = [], []
            for _ in range(a.repeats):
                cpu_samples.append(peer.measure(n, index, iters, 1))
                tpu_samples.append(measure(fn, tpu_args, iters, 1, torch.tpu.synchronize, peer.child.pid))
            c, t = statistics.median(cpu_samples), statistics.median(tpu_samples)
            ratios.setdefault(n, []).append(t / c)
            print(f"{name:22} {n:5d} {t * 1e6:10.1f} {c * 1e6:10.1f} {t / c:8.2f}", flush=True)
    for n, r in ratios.items():
        print(f"n={n}: geometric-mean tpu/cpu {statistics.geometric_mean(r):.2f}")


class CpuPeer:
    """CPU eager timings from a child process that never loads torch_tpu."""

    def __init__(self):
        env = os.environ | {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        self.child = subprocess.Popen(
            [sys.executable, __file__, CPU_PEER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def measure(self, n, index, iters, repeats):
        self.child.stdin.write(f"{n} {index} {iters} {repeats}\n")
        self.child.stdin.flush()
        return float(self.child.stdout.readline())


def serve_cpu_peer():
    for line in sys.stdin:
        n, index, iters, repeats = map(int, line.split())
        _, fn, make = ops(n)[index]
        torch.manual_seed(0)
        print(measure(fn, make("cpu"), iters, repeats, lambda: None, os.getppid()), flush=True)


def ab(a):
    """Runs the table alternately with and without `a.ab` set (with `--baseline`: this build and the
    baseline's); prints per-op minimum tpu times, and each side's tpu/cpu from its fastest times."""
    var, _, value = a.ab.partition("=")
    best = {}
    for _ in range(a.rounds):
        for label, extra in (("without", {}), ("with", {var: value})):
            keep = a.baseline and label == "without"  # this checkout: PYTHONPATH as set in main()
            env = {k: v for k, v in os.environ.items() if k != var or keep} | extra
            out = subprocess.run(
                [sys.executable, __file__, "--iters", str(a.iters), "--repeats", str(a.repeats), "--sizes", a.sizes]
                + ["--sample-ms", str(a.sample_ms)]
                + (["--ops", a.ops] if a.ops else []),
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for line in out.splitlines()[1:]:
                parts = line.rsplit(None, 4)
                if len(parts) == 5 and parts[1].isdigit():
                    key = (parts[0], int(parts[1]))
                    t, c = float(parts[2]), float(parts[3])
                    side = best.setdefault(key, {}).setdefault(label, [t, c])
                    side[0], side[1] = min(side[0], t), min(side[1], c)
    other = "baseline" if a.baseline else a.ab
    head = f"{'op':22} {'n':>5} {'default us':>10} {other + ' us':>24}"
    print(f"{head} {'default/other':>13} {'tpu/cpu':>8} {'other':>8}")
    ratios, mine, theirs = {}, {}, {}
    for (name, n), t in best.items():
        (tw, cw), (to, co) = t["without"], t["with"]
        ratios.setdefault(n, []).append(tw / to)
        mine.setdefault(n, []).append(tw / cw)
        theirs.setdefault(n, []).append(to / co)
        print(f"{name:22} {n:5d} {tw:10.1f} {to:24.1f} {tw / to:13.2f} {tw / cw:8.2f} {to / co:8.2f}")
    for n in ratios:
        print(
            f"n={n}: geometric-mean default/other {statistics.geometric_mean(ratios[n]):.3f}; tpu/cpu "
            f"{statistics.geometric_mean(mine[n]):.2f} (other: {statistics.geometric_mean(theirs[n]):.2f})"
        )


if __name__ == "__main__":
    serve_cpu_peer() if sys.argv[1:] == [CPU_PEER] else main()
