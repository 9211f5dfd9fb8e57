"""Launch tpu_dist test scenarios (tests/python/helpers/dist_worker.py) as one process per rank."""

import json
import os
import socket
import subprocess
import sys
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")
_BACKEND_ENV_PREFIXES = ("TORCH_TPU_", "TPU_")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_BACKEND_ENV_PREFIXES)}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env.update({"OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def run_scenario(name, world, outdir, env=None, timeout=180, hosts=1, host_setup=None, master_addr="127.0.0.1"):
    """Runs `name` on `world` ranks; returns (results by rank, {rank: (returncode, stderr tail)}).

    hosts > 1 simulates a multi-host slice: rank r is on host r * hosts // world
    (TORCH_TPU_HOST_ID) and runs on that host's tpu:LOCAL_RANK. ``host_setup(host)`` may
    return (command prefix, extra environment) for a host's processes, e.g. to run them
    in that host's network namespace.
    """
    port = free_port()
    procs = []
    for r in range(world):
        e = clean_env(env)
        host = r * hosts // world
        prefix, host_env = host_setup(host) if host_setup else ([], {})
        e.update(host_env)
        local = r - min(q for q in range(world) if q * hosts // world == host)
        e.update(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR=master_addr, MASTER_PORT=str(port),
                 LOCAL_RANK=str(local))
        e["LOCAL_WORLD_SIZE"] = str(sum(1 for q in range(world) if q * hosts // world == host))
        if hosts > 1:
            e["TORCH_TPU_HOST_ID"] = str(host)
        procs.append(subprocess.Popen([*prefix, sys.executable, WORKER, name, str(outdir)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + timeout
    status = {}
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            status[r] = ("timeout", err[-3000:])
            continue
        status[r] = (p.returncode, (out + err)[-3000:])
    results = {}
    for r in range(world):
        path = os.path.join(str(outdir), f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[r] = json.load(f)
    return results, status


def segments():
    """tpu_dist segments currently in /dev/shm."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith("tpudist_"))
    except FileNotFoundError:
        return []


def assert_family_ok(results, world, family, shown=5):
    """Every rank ran checks of ``family`` (names "family/...") and all of them are "ok"."""
    for r in range(world):
        checks = {k: v for k, v in results[r]["checks"].items() if k.split("/")[0] == family}
        assert checks, f"no checks ran for {family}"
        bad = {k: v for k, v in checks.items() if v != "ok"}
        assert not bad, f"rank {r}: {len(bad)} of {len(checks)} {family} checks failed:\n" + "\n".join(
            f"{k}: {v}" for k, v in list(bad.items())[:shown])
