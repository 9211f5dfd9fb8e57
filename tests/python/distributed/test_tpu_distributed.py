"""torch.tpu.distributed: topology-aware meshes on one slice and across slices, spmd_safe,
set_tpu_launch_env and the window tunables."""

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu
from helpers.devices import needs_v6e_8
from helpers.dist import clean_env, free_port, run_scenario, segments

tmesh = torch.tpu.distributed.topology_aware_mesh


def test_namespace_is_importable_and_matches_torchtpu_signatures():
    import torch.tpu.distributed as d

    assert d is torch_tpu.tpu.distributed and torch.tpu.distributed is d
    sig = inspect.signature(d.topology_aware_mesh)
    assert [(p.name, p.kind.name, p.default) for p in sig.parameters.values()] == [
        ("mesh_shape", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("dcn_mesh_shape", "KEYWORD_ONLY", None), ("allow_split_physical_axes", "KEYWORD_ONLY", False),
        ("contiguous_submeshes", "KEYWORD_ONLY", False)]
    sig = inspect.signature(d.set_tpu_launch_env)
    assert [(p.name, p.kind.name, p.default) for p in sig.parameters.values()] == [
        ("nnodes", "KEYWORD_ONLY", None), ("nproc_per_node", "KEYWORD_ONLY", None)]
    assert list(inspect.signature(d.spmd_safe).parameters) == ["func"]
    assert set(d.__all__) == {"set_tpu_launch_env", "spmd_safe", "topology_aware_mesh", "window_num_stripes",
                              "window_stripe_chunk_mb"}
    assert callable(torch.tpu.topology_aware_mesh)  # ours stays


# ---------------------------------------------------------------- one slice

@needs_v6e_8
def test_one_slice_layouts_are_the_hand_computed_ones():
    """v6e-8 is 2x4 (chip = x + 2y): the last mesh axis takes a whole physical axis first;
    an axis over both snakes (x, then y with x reversed every other row)."""
    assert tmesh((2, 4)).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert tmesh((4, 2)).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tmesh((8,)).tolist() == [0, 1, 3, 2, 4, 5, 7, 6]
    assert tmesh((1, 8)).tolist() == [[0, 1, 3, 2, 4, 5, 7, 6]]
    layout = tmesh((2, 4), dcn_mesh_shape=(1, 1))
    assert layout.dtype == torch.int64 and layout.device.type == "cpu" and tuple(layout.shape) == (2, 4)
    # (2, 2, 2) must split y (4) between two mesh axes.
    assert tmesh((2, 2, 2), allow_split_physical_axes=True).tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert torch.equal(torch.tpu.topology_aware_mesh((2, 2, 2)), torch.arange(8).reshape(2, 2, 2))
    assert tmesh((8,), contiguous_submeshes=True).tolist() == [0, 1, 3, 2, 4, 5, 7, 6]  # one host


@needs_v6e_8
def test_bad_mesh_arguments_raise_naming_them():
    with pytest.raises(ValueError, match=r"mesh_shape \(3, 3\) has 9 positions for 8 ranks"):
        tmesh((3, 3))
    with pytest.raises(ValueError, match="allow_split_physical_axes=True"):
        tmesh((2, 2, 2))
    with pytest.raises(ValueError, match=r"dcn_mesh_shape \(1, 1, 1\) has 3 axes; mesh_shape \(2, 4\) has 2"):
        tmesh((2, 4), dcn_mesh_shape=(1, 1, 1))
    with pytest.raises(ValueError, match=r"dcn_mesh_shape \(2, 1\) places 2 slices; the 8 ranks span 1"):
        tmesh((2, 4), dcn_mesh_shape=(2, 1))
    with pytest.raises(TypeError, match="mesh_shape must be a tuple of ints"):
        tmesh(8)
    with pytest.raises(TypeError, match="mesh_shape must be a tuple of ints"):
        tmesh((2, "4"))
    with pytest.raises(ValueError, match="mesh_shape .* axis of size 0"):
        tmesh((0, 8))
    with pytest.raises(TypeError, match="dcn_mesh_shape must be a tuple of ints"):
        tmesh((2, 4), dcn_mesh_shape=2)
    assert tmesh((2, 4)).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]  # still working


def test_mesh_that_does_not_fit_the_torus(run_python):
    out = run_python("""
        import json, torch
        try:
            torch.tpu.distributed.topology_aware_mesh((4, 9), allow_split_physical_axes=True)
        except ValueError as e:
            print(json.dumps(str(e)))
    """, env={"TORCH_TPU_TOPOLOGY": "v6e:6x6"}).json()
    assert "mesh_shape (4, 9) does not fit the torus" in out and "6x6x1" in out


def test_contiguous_submeshes_keep_each_host_in_one_block(run_python):
    """v6e-16 is 4x4 with a 2x2 block of chips per host (ranks 4h..4h+3 on host h); v5p-16 is
    2x2x2 with one z layer per host. Hand-computed layouts."""
    out = run_python("""
        import json, torch
        m = torch.tpu.distributed.topology_aware_mesh
        print(json.dumps({"flat": m((16,)).tolist(), "flat_c": m((16,), contiguous_submeshes=True).tolist(),
                          "square": m((4, 4)).tolist()}))
    """, env={"TORCH_TPU_TOPOLOGY": "v6e-16"}).json()
    assert out["flat"] == [0, 1, 4, 5, 7, 6, 3, 2, 8, 9, 12, 13, 15, 14, 11, 10]  # host 0 is split
    assert out["flat_c"] == [0, 1, 3, 2, 4, 5, 7, 6, 12, 13, 15, 14, 8, 9, 11, 10]
    assert out["square"] == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    out = run_python("""
        import json, torch
        m = torch.tpu.distributed.topology_aware_mesh
        res = {"plain": m((4, 2)).tolist(), "contiguous": m((4, 2), contiguous_submeshes=True).tolist()}
        try:
            m((8,), contiguous_submeshes=True, dcn_mesh_shape=(1,))
            res["ok"] = True
        except ValueError as e:
            res["error"] = str(e)
        print(json.dumps(res))
    """, env={"TORCH_TPU_TOPOLOGY": "v5p-16"}).json()
    assert out["plain"] == [[0, 1], [2, 3], [6, 7], [4, 5]]
    assert out["contiguous"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.get("ok"), out


# ---------------------------------------------------------------- two slices

def test_two_slice_layouts_are_the_hand_computed_ones(run_python):
    """Two v6e-8 slices (16 ranks, slice s = ranks 8s..8s+7): each slice is laid out on ICI
    with the per-slice shape, and axis a holds dcn_mesh_shape[a] blocks of one slice."""
    out = run_python("""
        import json, torch, torch_tpu
        m = torch.tpu.distributed.topology_aware_mesh
        res = {"topo": {k: torch_tpu._C._topology()[k] for k in ("num_slices", "slice", "host", "num_chips")},
               "chip_slice": torch_tpu._C._chip_info(0)["slice"], "chip_host": torch_tpu._C._chip_info(0)["host"],
               "count": torch.tpu.device_count(),
               "a": m((2, 8), dcn_mesh_shape=(2, 1)).tolist(), "b": m((4, 4), dcn_mesh_shape=(1, 2)).tolist(),
               "default": m((4, 4)).tolist(), "flat": m((16,)).tolist()}
        errors = {}
        for name, kw in [("length", dict(dcn_mesh_shape=(2,))), ("product", dict(dcn_mesh_shape=(2, 2))),
                         ("divide", dict(dcn_mesh_shape=(1, 2), mesh_shape=(16, 1))),
                         ("world", dict(mesh_shape=(2, 4)))]:
            try:
                m(kw.pop("mesh_shape", (4, 4)), **kw)
            except ValueError as e:
                errors[name] = str(e)
        res["errors"] = errors
        res["ours"] = torch.tpu.topology_aware_mesh((2, 4), world_size=8).tolist()  # slice 0 alone
        print(json.dumps(res))
    """, env={"TORCH_TPU_TOPOLOGY": "v6e-8", "TORCH_TPU_SLICES": "2", "TORCH_TPU_HOST_ID": "1"}).json()
    assert out["topo"] == {"num_slices": 2, "slice": 1, "host": 1, "num_chips": 8}
    assert out["chip_slice"] == 1 and out["chip_host"] == 1 and out["count"] == 8
    assert out["a"] == [[0, 1, 3, 2, 4, 5, 7, 6], [8, 9, 11, 10, 12, 13, 15, 14]]
    assert out["b"] == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    assert out["default"] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]  # slices on axis 0
    assert out["flat"] == [0, 1, 3, 2, 4, 5, 7, 6, 8, 9, 11, 10, 12, 13, 15, 14]
    err = out["errors"]
    assert "dcn_mesh_shape (2,) has 1 axes; mesh_shape (4, 4) has 2" in err["length"]
    assert "dcn_mesh_shape (2, 2) places 4 slices; the 16 ranks span 2 (TORCH_TPU_SLICES=2)" in err["product"]
    assert "dcn_mesh_shape[1]=2 does not divide mesh_shape[1]=1" in err["divide"]
    assert "mesh_shape (2, 4) has 8 positions for 16 ranks" in err["world"]
    assert out["ours"] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_two_slices_device_mesh_and_spmd_safe(tmp_path):
    """4 ranks on two v5e-4 slices (one host each, 2 ranks per host): DeviceMesh("tpu",
    mesh=layout) with a DCN axis and an ICI axis reduces over the right ranks, priced as DCN and
    ICI. spmd_safe: shapes that differ with equal element counts raise inside it (not outside),
    and disagreements across hosts that the host-local checks cannot see raise on every rank,
    naming both descriptors; the group keeps working."""
    results, status = run_scenario("multislice", 4, tmp_path, hosts=2, timeout=240,
                                   env={"TORCH_TPU_TOPOLOGY": "v5e-4", "TORCH_TPU_SLICES": "2"})
    assert all(s[0] == 0 for s in status.values()), status
    for r in range(4):
        res = results[r]
        assert res["slice"] == r // 2 and res["chip"] == r % 2
        assert res["layout"] == [[0, 1], [2, 3]]
        assert res["dcn"]["ranks"] == [r % 2, r % 2 + 2] and res["dcn"]["value"] == [float(2 * (r % 2) + 4)]
        assert res["dcn"]["dcn_bytes"] == 4096 and res["dcn"]["ici_bytes"] == 0  # 2(H-1)/H * 1024 * 4
        assert res["ici"]["ranks"] == [r // 2 * 2, r // 2 * 2 + 1]
        assert res["ici"]["value"] == [float(4 * (r // 2) + 3)]
        assert res["ici"]["dcn_bytes"] == 0 and res["ici"]["ici_bytes"] == 4096  # 2(n-1)/n * 4096
        assert res["inside"] is True and res["outside_after"] is False
        assert res["shape_outside"] is None  # only element counts are compared outside spmd_safe
        err = res["shape_inside"]
        assert err.startswith("RuntimeError") and "float32[2, 3]" in err and "float32[3, 2]" in err, err
        assert "spmd_safe" in err and "shape" in err
        err = res["numel_across_hosts"]
        assert err.startswith("RuntimeError") and "float32[10]" in err and "float32[12]" in err, err
        assert "rank 0 (host 0)" in err and "rank 3 (host 1)" in err
        err = res["op_across_hosts"]
        assert err.startswith("RuntimeError") and "all_reduce" in err and "broadcast" in err, err
        assert res["after"] is None and res["after_value"] == [10.0] * 6
    listing = [results[r]["numel_across_hosts"].split("ranks called", 1)[1] for r in range(4)]
    assert listing.count(listing[0]) == 4  # the same listing of every rank's collective on every rank
    assert segments() == []


def test_spmd_safe_flag_nesting_errors_and_flush():
    check = torch_tpu._C._tpu_dist_spmd_check
    seen = []

    @torch.tpu.distributed.spmd_safe
    def inner(x):
        seen.append(("inner", check()))
        return x + 1

    @torch.tpu.distributed.spmd_safe
    def outer(x):
        """doc"""
        seen.append(("outer", check()))
        y = inner(x)
        seen.append(("after inner", check()))
        return y

    assert outer(1) == 2 and outer.__name__ == "outer" and outer.__doc__ == "doc"
    assert seen == [("outer", True), ("inner", True), ("after inner", True)] and check() is False

    @torch.tpu.distributed.spmd_safe
    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        boom()
    assert check() is False

    # defer_and_fuse: work queued before the call is issued first, and the call's own on return.
    pending = []

    @torch.tpu.distributed.spmd_safe
    def body(x):
        pending.append(torch_tpu.debug.pending_ops())
        return x * 2

    with torch_tpu.eager_mode("defer_and_fuse"):
        a = torch.ones(4, device="tpu") + 1
        assert torch_tpu.debug.pending_ops() > 0
        b = body(a)
        pending.append(torch_tpu.debug.pending_ops())
    assert pending == [0, 0] and b.cpu().tolist() == [4.0] * 4


def test_spmd_safe_single_process_group(tmp_path):
    """A one-rank group: collectives inside spmd_safe run and give the right value."""
    script = tmp_path / "one.py"
    script.write_text(
        "import os, json, torch, torch.distributed as dist\n"
        "dist.init_process_group('tpu_dist', rank=0, world_size=1)\n"
        "@torch.tpu.distributed.spmd_safe\n"
        "def f(t):\n"
        "    dist.all_reduce(t)\n"
        "    return t\n"
        "print(json.dumps(f(torch.full((3,), 2.0, device='tpu')).cpu().tolist()))\n"
        "dist.destroy_process_group()\n")
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [2.0] * 3


# ---------------------------------------------------------------- set_tpu_launch_env

_LAUNCH_VARS = ("TPU_VISIBLE_CHIPS", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICES", "TORCH_TPU_HOST_ID", "WORLD_SIZE",
                "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


@pytest.fixture
def launch_env():
    """os.environ without the launch variables, restored afterwards."""
    saved = dict(os.environ)
    for name in _LAUNCH_VARS:
        os.environ.pop(name, None)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


@needs_v6e_8
def test_set_tpu_launch_env_defaults(launch_env):
    torch.tpu.distributed.set_tpu_launch_env()
    env = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    port = int(env.pop("MASTER_PORT"))
    assert 0 < port < 65536
    assert env == {"TPU_VISIBLE_CHIPS": "0,1,2,3,4,5,6,7", "TORCH_TPU_TOPOLOGY": "v6e-8", "TORCH_TPU_SLICES": "1",
                   "TORCH_TPU_HOST_ID": None, "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
                   "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    launch_env.update(MASTER_ADDR="10.0.0.7", MASTER_PORT="1234")
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=1)
    assert os.environ["TPU_VISIBLE_CHIPS"] == "0" and os.environ["WORLD_SIZE"] == "1"
    assert os.environ["MASTER_ADDR"] == "10.0.0.7" and os.environ["MASTER_PORT"] == "1234"  # defaults only


@needs_v6e_8
def test_set_tpu_launch_env_bad_input(launch_env):
    before = dict(os.environ)
    with pytest.raises(ValueError, match=r"nproc_per_node=9: this host offers 8 chip\(s\)"):
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=9)
    with pytest.raises(ValueError, match=r"nnodes=2: 1 slice\(s\) of v6e-8 have 1 host\(s\)"):
        torch.tpu.distributed.set_tpu_launch_env(nnodes=2)
    with pytest.raises(ValueError, match="nnodes=0: must be at least 1"):
        torch.tpu.distributed.set_tpu_launch_env(nnodes=0)
    with pytest.raises(TypeError, match="nproc_per_node must be an int or None"):
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node="2")
    with pytest.raises(TypeError):
        torch.tpu.distributed.set_tpu_launch_env(2)  # keyword-only
    assert dict(os.environ) == before  # nothing set by a failed call


def test_set_tpu_launch_env_worker_sees_its_chip(run_python):
    """The second host of a v5p-16 slice (chips 4..7): two workers per host on two hosts; the
    worker with LOCAL_RANK=1, started with the environment the launcher set, runs on chip 5."""
    out = run_python("""
        import json, os, subprocess, sys, torch
        torch.tpu.distributed.set_tpu_launch_env(nnodes=2, nproc_per_node=2)
        names = ("TPU_VISIBLE_CHIPS", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICES", "TORCH_TPU_HOST_ID", "WORLD_SIZE",
                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
        env = {k: os.environ.get(k) for k in names}
        worker = ("import json, os, torch; i = int(os.environ['LOCAL_RANK']); p = torch.tpu.get_device_properties(i);"
                  "print(json.dumps([torch.tpu.device_count(), p.global_id, p.host, p.topology]))")
        w = subprocess.run([sys.executable, "-c", worker], env=dict(os.environ, LOCAL_RANK="1"),
                           capture_output=True, text=True, timeout=120)
        print(json.dumps({"env": env, "worker": w.stdout.splitlines()[-1] if w.returncode == 0 else w.stderr}))
    """, env={"TORCH_TPU_TOPOLOGY": "v5p-16", "TORCH_TPU_HOST_ID": "1"}).json()
    assert out["env"] == {"TPU_VISIBLE_CHIPS": "4,5", "TORCH_TPU_TOPOLOGY": "v5p-16", "TORCH_TPU_SLICES": "1",
                          "TORCH_TPU_HOST_ID": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "1"}
    assert json.loads(out["worker"]) == [2, 5, 1, "v5p-16"], out["worker"]


# ---------------------------------------------------------------- window tunables

def test_window_tunables_read_assign_and_validate():
    d = torch.tpu.distributed
    assert (d.window_num_stripes, d.window_stripe_chunk_mb) == (4, 8)  # TorchTPU's defaults
    try:
        d.window_num_stripes = 2
        d.window_stripe_chunk_mb = 16
        assert (d.window_num_stripes, d.window_stripe_chunk_mb) == (2, 16)
        with pytest.raises(ValueError, match="expected window_num_stripes to be > 0, got 0"):
            d.window_num_stripes = 0
        with pytest.raises(ValueError, match="expected window_stripe_chunk_mb to be > 0, got -1"):
            d.window_stripe_chunk_mb = -1
        with pytest.raises(TypeError, match="window_num_stripes must be an int"):
            d.window_num_stripes = 2.5
        assert (d.window_num_stripes, d.window_stripe_chunk_mb) == (2, 16)
    finally:
        d.window_num_stripes, d.window_stripe_chunk_mb = 4, 8

