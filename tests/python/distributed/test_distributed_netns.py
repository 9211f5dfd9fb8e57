"""Two simulated hosts in separate Linux network namespaces joined by a veth pair: the
cross-host part of tpu_dist (gloo over TCP, the DCN) runs through real network stacks,
not the loopback device of one stack.

Needs CAP_SYS_ADMIN and CAP_NET_ADMIN (``ip netns add``); without them the tests skip
with the exact error, and the same hierarchical paths stay covered over TCP loopback
(test_distributed.py, configurations ``*_2hosts``).
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.dist import WORKER, clean_env, free_port, run_scenario, segments


def _ip(*args, ns=None, check=True):
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def hosts():
    """Namespaces h0 and h1 with 10.213.<k>.1 and .2 on the two ends of a veth pair.
    Yields [(namespace, interface, address)] for host 0 and host 1; removes them after."""
    tag = os.getpid() % 100000
    k = os.getpid() % 250
    spec = [(f"tpud{tag}h{i}", f"tpud{tag}v{i}", f"10.213.{k}.{i + 1}") for i in range(2)]
    made = []
    try:
        for ns, _, _ in spec:
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", spec[0][1], "netns", spec[0][0], "type", "veth", "peer", "name", spec[1][1],
            "netns", spec[1][0])
        for ns, dev, addr in spec:
            _ip("addr", "add", f"{addr}/24", "dev", dev, ns=ns)
            _ip("link", "set", dev, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
    except FileNotFoundError as e:
        pytest.skip(f"network namespaces unavailable: {e}")
    except subprocess.CalledProcessError as e:
        for ns in made:
            _ip("netns", "del", ns, check=False)
        pytest.skip(f"network namespaces unavailable: `{' '.join(e.cmd)}` failed: {e.stderr.strip()}")
    yield spec
    for ns, _, _ in spec:
        _ip("netns", "del", ns, check=False)


def _link_bytes(ns, dev):
    stats = json.loads(_ip("-j", "-s", "link", "show", "dev", dev, ns=ns).stdout)[0]["stats64"]
    return stats["tx"]["bytes"] + stats["rx"]["bytes"]


def _setup(spec):
    def host_setup(h):
        ns, dev, _ = spec[h]
        # gloo binds to this host's side of the link; the store lives on rank 0 (host 0).
        return ["ip", "netns", "exec", ns], {"GLOO_SOCKET_IFNAME": dev}
    return host_setup


def test_namespaces_are_separate_stacks(hosts):
    """Host 1 reaches host 0 only through the link: host 0's address is not local to it."""
    (ns0, _, a0), (ns1, _, a1) = hosts
    local1 = _ip("-j", "addr", ns=ns1).stdout
    assert a1 in local1 and a0 not in local1


def test_collectives_across_namespaces(hosts, tmp_path):
    """The whole collective battery on 2 hosts x 2 ranks, each host in its own namespace:
    hierarchical all_reduce / all_gather / reduce_scatter / broadcast, flat gloo for the rest."""
    before = _link_bytes(hosts[0][0], hosts[0][1])
    env = {"TORCH_TPU_TOPOLOGY": "v5p-16", "TORCH_TPU_DIST_BUFFER_BYTES": "64KiB", "TORCH_TPU_DIST_SMALL_BYTES": "1KiB"}
    results, status = run_scenario("collectives", 4, tmp_path, env=env, timeout=240, hosts=2,
                                   host_setup=_setup(hosts), master_addr=hosts[0][2])
    for r, (rc, tail) in status.items():
        assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"
    assert sorted(results) == [0, 1, 2, 3]
    for r in range(4):
        bad = {k: v for k, v in results[r]["checks"].items() if v != "ok"}
        assert not bad and len(results[r]["checks"]) > 150, f"rank {r}: {list(bad.items())[:5]}"
    # The DCN traffic went over the veth pair (megabytes: the battery's large cases).
    assert _link_bytes(hosts[0][0], hosts[0][1]) - before > 1 << 20
    assert segments() == []


def test_launcher_on_two_hosts(hosts, tmp_path):
    """python -m torch_tpu.run --nnodes 2 --node-rank k, one launcher per namespace."""
    port = free_port()
    procs = []
    for node, (ns, dev, _) in enumerate(hosts):
        env = clean_env({"TORCH_TPU_TOPOLOGY": "v5p-16", "GLOO_SOCKET_IFNAME": dev})
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch_tpu.run", "--nnodes", "2", "--node-rank",
               str(node), "-n", "2", "--master-addr", hosts[0][2], "--master-port", str(port), WORKER, "launch",
               str(tmp_path)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]
    for r in range(4):
        with open(tmp_path / f"rank{r}.json") as f:
            res = json.load(f)
        assert res["backend"] == "tpu_dist" and res["local_rank"] == r % 2
        assert res["value"] == [10.0] * 4  # 1 + 2 + 3 + 4
