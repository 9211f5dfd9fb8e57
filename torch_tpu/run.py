"""Launch one process per vTPU chip of this host: ``python -m torch_tpu.run -n N script.py ...``.

Usage::

    python -m torch_tpu.run -n 4 train.py --lr 3e-4
    python -m torch_tpu.run -n 4 -m torch_tpu.demo --fsdp

Each process gets the environment ``torchrun`` would set — ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``NODE_RANK``, and ``OMP_NUM_THREADS=1`` when several processes share
the host and it is unset — and sees the whole host topology; rank ``r``
uses ``tpu:LOCAL_RANK`` (call ``torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))``
or pass ``device_id`` to ``init_process_group``). ``torchrun --nproc-per-node N``
works the same way. Several hosts: ``--nnodes``, ``--node-rank`` and
``--master-addr``/``--master-port`` as in torchrun; a node's rank also becomes
its ``TORCH_TPU_HOST_ID``.

When a process fails, the others are terminated (SIGTERM, then SIGKILL after
``--grace`` seconds) and the launcher exits with the failed process's code.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_nproc() -> int:
    try:
        import torch_tpu  # noqa: F401

        from . import _C

        return int(_C._topology()["chips_per_host"])
    except Exception:  # noqa: BLE001
        return 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the launcher (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m torch_tpu.run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--nproc-per-node", "--nproc_per_node", type=int, default=None,
                   help="processes on this host (default: the host's chips)")
    p.add_argument("--nnodes", type=int, default=1, help="hosts (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this host's index")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="rendezvous port (default: a free port; required with --nnodes > 1)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when tearing down after a failure")
    p.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m)")
    p.add_argument("target", help="script path, or module name with -m")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the target")
    args = p.parse_args(argv)
    if args.nproc_per_node is None:
        args.nproc_per_node = _default_nproc()
    if args.nproc_per_node < 1:
        p.error("-n must be at least 1")
    if args.nnodes > 1 and args.master_port is None:
        p.error("--master-port is required with --nnodes > 1")
    return args


def rank_environment(args: argparse.Namespace, local_rank: int, port: int) -> dict:
    """Environment of one process: the launcher's plus the torchrun-compatible variables."""
    n = args.nproc_per_node
    env = dict(os.environ)
    env.update(
        MASTER_ADDR=args.master_addr,
        MASTER_PORT=str(port),
        WORLD_SIZE=str(n * args.nnodes),
        RANK=str(args.node_rank * n + local_rank),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(n),
        GROUP_RANK=str(args.node_rank),
        NODE_RANK=str(args.node_rank),
        ROLE_RANK=str(args.node_rank * n + local_rank),
        ROLE_WORLD_SIZE=str(n * args.nnodes),
    )
    if args.nnodes > 1:
        env.setdefault("TORCH_TPU_HOST_ID", str(args.node_rank))
    if n > 1:
        # As torchrun: one intra-op thread per process unless asked. Several ranks per host
        # with a thread pool each oversubscribe the cores, and an OpenMP region waits for all
        # its threads (64 KiB copies took 20-40 ms instead of 0.03 on 2 cores with 2 ranks).
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def main(argv: list[str] | None = None) -> int:
    """Starts the processes, waits for them, tears all down when one fails. Returns the exit code."""
    args = parse_args(argv)
    port = args.master_port or _free_port()
    command = [sys.executable] + (["-m", args.target] if args.module else [args.target]) + list(args.args)
    procs: list[subprocess.Popen] = []
    for local_rank in range(args.nproc_per_node):
        procs.append(subprocess.Popen(command, env=rank_environment(args, local_rank, port)))

    def terminate(sig=signal.SIGTERM):
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def forward(signum, _frame):
        terminate(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        while True:
            running = False
            for rank, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    running = True
                elif rc != 0 and code == 0:
                    code = rc if rc > 0 else 128 - rc
                    print(f"torch_tpu.run: local rank {rank} (pid {p.pid}) exited with "
                          f"{'signal ' + str(-rc) if rc < 0 else 'code ' + str(rc)}; stopping the others",
                          file=sys.stderr, flush=True)
                    terminate()
                    deadline = time.monotonic() + args.grace
                    while time.monotonic() < deadline and any(q.poll() is None for q in procs):
                        time.sleep(0.05)
                    terminate(signal.SIGKILL)
            if not running:
                break
            time.sleep(0.05)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            p.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
