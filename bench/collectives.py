"""Collective bandwidth: tpu_dist on tpu tensors against gloo on CPU tensors, same machine, same run.

For 2 and 4 ranks (one process each) and buffers from 1 KiB to 256 MiB, times
all_reduce, all_gather (into tensor) and reduce_scatter (tensor) and prints the
bus bandwidth (nccl-tests convention):

    algbw = S / t,  busbw = algbw * 2(n-1)/n (all_reduce) or * (n-1)/n (all_gather, reduce_scatter)

where S is the size of the full buffer (all_reduce: the tensor; all_gather: the output;
reduce_scatter: the input), t the median time of one call (synchronized; the slowest rank's
median) and n the ranks. The columns of a row are timed round robin, one call each per round,
so that all of them see the same load on a shared machine.
The physical limit printed beside it is memcpy bandwidth: bytes copied per second by
``dst.copy_(src)`` of the same size in one process, measured right before each row (the
machine's load drifts), plus 64 MiB copies per process when n processes copy at once.
"traffic floor" is the bus bandwidth the op would have if it did nothing but the memory
traffic any algorithm needs when each rank's tensors are private to its process: every
rank reads its input and writes its output once, all ranks at the same time (through a
2 MiB window, so the copies go through the cache as tpu_dist's do); no synchronization,
no reduction arithmetic.

``--sleep-column`` adds tpu_dist with TORCH_TPU_DIST_SPIN=0 (waits sleep on the futex at
once instead of spinning and yielding first), timed in the same run.

Ranks run with OMP_NUM_THREADS=1 unless it is set, as under torchrun and torch_tpu.run.

Run: python bench/collectives.py [--ranks 2 4] [--max-bytes 256MiB] [--ops all_reduce ...]
Prints a markdown table; ``--json PATH`` also writes the raw numbers.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
OPS = ["all_reduce", "all_gather", "reduce_scatter"]


def _fmt_bytes(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"


def _parse_bytes(s):
    s = s.strip()
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * k)
    return int(s)


def _bus_factor(op, n):
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def _time(fn, sync, iters):
    """Median seconds of fn() + sync() over `iters` calls (after one warm-up call)."""
    fn()
    sync()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def memcpy_bandwidth(nbytes=64 << 20):
    """Bytes/s of dst.copy_(src) between two CPU buffers in this process (median of repeats)."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = _time(lambda: dst.copy_(src), lambda: None, max(5, min(200, (64 << 20) // nbytes)))
    return nbytes / t


def traffic_floor(inp, out, window=2 << 20):
    """A function doing only the memory traffic any collective on private buffers needs: read
    every byte of ``inp`` and write every byte of ``out`` (through a cache-sized window, in
    slices, as tpu_dist does). All ranks run it at once: its time is a floor for the op here."""
    import torch

    win = torch.empty(window, dtype=torch.uint8)
    src, dst = inp.view(torch.uint8), out.view(torch.uint8)

    def run():
        for o in range(0, src.numel(), window):
            n = min(window, src.numel() - o)
            win[:n].copy_(src[o:o + n])
        for o in range(0, dst.numel(), window):
            n = min(window, dst.numel() - o)
            dst[o:o + n].copy_(win[:n])
    return run


def worker(args):
    """One rank: times every (op, size) on tpu_dist and on a gloo group, writes rank0's numbers."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("tpu", rank)
    torch.tpu.set_device(dev)
    dist.init_process_group("tpu_dist", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    # The same backend whose waits sleep at once instead of spinning first, same load.
    os.environ["TORCH_TPU_DIST_SPIN"] = "0"
    sleep = dist.new_group(backend="tpu_dist") if args.sleep_column else None
    del os.environ["TORCH_TPU_DIST_SPIN"]
    # PyTorch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    results = {"memcpy_parallel": None, "rows": []}
    dist.barrier()
    results["memcpy_parallel"] = memcpy_bandwidth()  # all ranks copy at once
    dist.barrier()
    for op in args.ops:
        for size in [s for s in SIZES if args.min_bytes <= s <= args.max_bytes]:
            numel = size // 4
            numel -= numel % world
            row = {"op": op, "bytes": size, "ranks": world}
            # The physical limit at this size, measured now (the machine's load drifts): rank 0
            # copies `size` bytes while the others wait.
            dist.barrier(group=gloo)
            if rank == 0:
                row["memcpy"] = memcpy_bandwidth(size)
            dist.barrier(group=gloo)
            fns, syncs = {}, {}
            for backend in ("tpu_dist", "sleep", "gloo") if args.sleep_column else ("tpu_dist", "gloo"):
                device = torch.device("cpu") if backend == "gloo" else dev
                group = {"tpu_dist": None, "sleep": sleep, "gloo": gloo}[backend]
                syncs[backend] = (lambda: None) if backend == "gloo" else torch.tpu.synchronize
                if op == "all_reduce":
                    t = torch.ones(numel, device=device)
                    fns[backend] = lambda t=t, group=group: dist.all_reduce(t, group=group)  # noqa: E731
                elif op == "all_gather":
                    inp = torch.ones(numel // world, device=device)
                    out = torch.empty(numel, device=device)
                    fns[backend] = lambda i=inp, o=out, group=group: all_gather(o, i, group=group)  # noqa
                else:
                    inp = torch.ones(numel, device=device)
                    out = torch.empty(numel // world, device=device)
                    fns[backend] = lambda i=inp, o=out, group=group: reduce_scatter(o, i, group=group)  # noqa
            # The floor: every rank reads its input and writes its output once, all at once.
            if op == "all_reduce":
                buf = torch.ones(numel)
                fns["floor"] = traffic_floor(buf, buf)
            elif op == "all_gather":
                fns["floor"] = traffic_floor(torch.ones(numel // world), torch.empty(numel))
            else:
                fns["floor"] = traffic_floor(torch.ones(numel), torch.empty(numel // world))
            syncs["floor"] = lambda: None
            # Every rank must make the same calls: agree on the iteration count first.
            dist.barrier()
            probe = torch.tensor([sum(_time(fns[b], syncs[b], 1) for b in fns)], dtype=torch.float64)
            dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=gloo)
            budget = 1.0 if size < (16 << 20) else 3.0
            iters = int(max(3, min(100 if size < (1 << 20) else 15, budget / probe.item())))
            # Round robin over the columns, one call each per round: the machine's load (other
            # jobs share its cores) drifts, and every column then sees the same drift.
            samples = {b: [] for b in fns}
            for _ in range(iters):
                for b, fn in fns.items():
                    t0 = time.perf_counter()
                    fn()
                    syncs[b]()
                    samples[b].append(time.perf_counter() - t0)
            for b in fns:
                t_all = torch.tensor([statistics.median(samples[b])], dtype=torch.float64)
                dist.all_reduce(t_all, op=dist.ReduceOp.MAX, group=gloo)
                row[b] = {"seconds": t_all.item(), "busbw": numel * 4 / t_all.item() * _bus_factor(op, world)}
            del fns
            results["rows"].append(row)
            if rank == 0:
                print(f"  {op:15s} {_fmt_bytes(size):>8s} n={world}: tpu_dist {row['tpu_dist']['busbw'] / 1e9:7.2f} "
                      f"GB/s  gloo {row['gloo']['busbw'] / 1e9:7.2f} GB/s", file=sys.stderr, flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world, args):
    out = tempfile.mktemp(suffix=".json")
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun and torch_tpu.run set it
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out, "--min-bytes",
               str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--ops", *args.ops]
        cmd += ["--sleep-column"] if args.sleep_column else []
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")
    with open(out) as f:
        data = json.load(f)
    os.unlink(out)
    return data


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--min-bytes", type=_parse_bytes, default=1 << 10)
    p.add_argument("--max-bytes", type=_parse_bytes, default=256 << 20)
    p.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    p.add_argument("--json", help="also write the raw numbers here")
    p.add_argument("--sleep-column", action="store_true",
                   help="also time tpu_dist with TORCH_TPU_DIST_SPIN=0 (waits sleep on the futex at once)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    single = memcpy_bandwidth()
    report = {"memcpy_single": single, "worlds": {}}
    for world in args.ranks:
        print(f"{world} ranks ...", file=sys.stderr, flush=True)
        report["worlds"][world] = run_world(world, args)
    print(f"\nmemcpy (one process, 64 MiB): {single / 1e9:.2f} GB/s")
    for world, data in report["worlds"].items():
        print(f"memcpy ({world} processes at once, per process): {data['memcpy_parallel'] / 1e9:.2f} GB/s")
    s_head, s_rule = (" SPIN=0 GB/s |", " --- |") if args.sleep_column else ("", "")
    print(f"\n| op | bytes | ranks | tpu_dist busbw GB/s |{s_head} gloo busbw GB/s | memcpy GB/s | traffic floor GB/s "
          "| tpu_dist / gloo | tpu_dist / memcpy | tpu_dist / floor |")
    print(f"| --- | --- | --- | --- |{s_rule} --- | --- | --- | --- | --- | --- |")
    for world, data in report["worlds"].items():
        for row in data["rows"]:
            t, g, m, f = row["tpu_dist"]["busbw"], row["gloo"]["busbw"], row["memcpy"], row["floor"]["busbw"]
            sp = f" {row['sleep']['busbw'] / 1e9:.2f} |" if args.sleep_column else ""
            print(f"| {row['op']} | {_fmt_bytes(row['bytes'])} | {world} | {t / 1e9:.2f} |{sp} {g / 1e9:.2f} | "
                  f"{m / 1e9:.2f} | {f / 1e9:.2f} | {t / g:.1f}x | {t / m:.0%} | {t / f:.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
