"""tpu_dist registration, launchers (torch_tpu.run, torchrun) and topology-aware meshes."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import torch_tpu
from helpers.devices import needs_v6e_8
from helpers.dist import WORKER, clean_env, segments


def test_backend_registered_for_tpu():
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert "tpu_dist" in dist.Backend.backend_list and "tpu" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["tpu_dist"] == ["tpu", "cpu"]
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def _hops(a, b):
    return torch_tpu._C._hops(a, b)


@needs_v6e_8
@pytest.mark.parametrize("shape,far_axes", [((2, 4), ()), ((4, 2), ()), ((8,), ()), ((1, 8), ()), ((4, 1, 2), ()),
                                            # a 2x2 cannot embed in the 4-chip line of v6e-8 (no
                                            # wraparound): the outer axis steps 2 hops
                                            ((2, 2, 2), (0,))])
def test_topology_aware_mesh_axes_follow_links(shape, far_axes):
    """Consecutive ranks along each mesh axis are one ICI hop apart (the inner axes always)."""
    layout = torch.tpu.topology_aware_mesh(shape)
    assert tuple(layout.shape) == shape
    assert sorted(layout.flatten().tolist()) == list(range(8))
    assert torch.equal(layout, torch.tpu.topology_aware_mesh(shape))  # deterministic
    for axis in range(len(shape)):
        lines = layout.movedim(axis, -1).reshape(-1, shape[axis]).tolist()
        for line in lines:
            for a, b in zip(line, line[1:]):
                assert _hops(a, b) == (2 if axis in far_axes else 1), (shape, axis, line)


@needs_v6e_8
def test_topology_aware_mesh_rejects_bad_shapes():
    with pytest.raises(ValueError, match="positions for 8 ranks"):
        torch.tpu.topology_aware_mesh((3, 3))
    with pytest.raises(ValueError, match="positions"):
        torch.tpu.topology_aware_mesh((2, 2), world_size=8)


@needs_v6e_8
def test_ring_order_and_links():
    order = torch_tpu._C._tpu_dist_ring_order(list(range(8)))
    assert sorted(order) == list(range(8))
    for a, b in zip(order, order[1:]):
        assert _hops(a, b) == 1
    assert torch_tpu._C._tpu_dist_ring_order([2, 0, 4, 6]) == [1, 0, 2, 3]  # the y ring through x=0
    assert torch_tpu._C._tpu_dist_ring_links([0, 2, 4, 6]) == 1  # an open line (v6e-8 does not wrap)
    assert torch_tpu._C._tpu_dist_ring_links(list(range(8))) == 2  # two axes


def _check_launch(outdir, world):
    for r in range(world):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            res = json.load(f)
        assert res["backend"] == "tpu_dist"
        assert res["value"] == [float(sum(range(1, world + 1)))] * 4
        assert res["local_rank"] == r
        assert res["device_map"]["tpu"] == "tpu_dist"
    assert segments() == []


def test_torch_tpu_run(tmp_path):
    env = clean_env()
    del env["OMP_NUM_THREADS"]  # the launcher sets 1 for several ranks, as torchrun does
    proc = subprocess.run([sys.executable, "-m", "torch_tpu.run", "-n", "2", WORKER, "launch", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_launch(tmp_path, 2)
    for r in range(2):
        with open(os.path.join(tmp_path, f"rank{r}.json")) as f:
            assert json.load(f)["omp_num_threads"] == "1"


def test_torch_tpu_run_stops_others_on_failure(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1': sys.exit(3)\n"
                      "time.sleep(60)\n")
    proc = subprocess.run([sys.executable, "-m", "torch_tpu.run", "-n", "2", "--grace", "1", str(script)],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "local rank 1" in proc.stderr


def test_torchrun(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           WORKER, "launch", str(tmp_path)],
                          env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_launch(tmp_path, 2)


def test_topology_aware_mesh_on_a_torus(run_python):
    """On v5p 4x4x4 (wraparound on every axis, 16 hosts of 4 chips) every mesh axis of these
    shapes is a closed ring: each step, including last -> first, is one ICI hop."""
    out = run_python("""
        import json, torch, torch_tpu
        from torch_tpu.distributed import rank_chips
        chips = rank_chips(64)
        worst = {}
        for shape in [(4, 16), (16, 4), (4, 4, 4), (64,)]:
            layout = torch.tpu.topology_aware_mesh(shape)
            assert sorted(layout.flatten().tolist()) == list(range(64))
            worst[str(shape)] = [max(torch_tpu._C._hops(chips[a], chips[b])
                                     for line in layout.movedim(ax, -1).reshape(-1, shape[ax]).tolist()
                                     for a, b in zip(line, line[1:] + line[:1])) for ax in range(len(shape))]
        print(json.dumps(worst))
    """, env={"TORCH_TPU_TOPOLOGY": "v5p:4x4x4"}).json()
    assert all(h == [1] * len(h) for h in out.values()), out
