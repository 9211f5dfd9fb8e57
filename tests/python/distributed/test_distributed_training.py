"""tpu_dist under PyTorch's parallelism APIs: DDP, FSDP2 (fully_shard + DCP), DTensor / TP."""

import pytest

from helpers.dist import run_scenario


def _run(name, world, tmp_path, env=None):
    results, status = run_scenario(name, world, tmp_path, env=env, timeout=240)
    for r, (rc, tail) in status.items():
        assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"
    assert sorted(results) == list(range(world))
    return results


def test_ddp_gradients_equal_single_process(tmp_path):
    """DDP over 2 ranks (several buckets) = one process on the whole global batch."""
    results = _run("ddp", 2, tmp_path)
    for r in results.values():
        assert r["max_grad_diff"] < 1e-5
        assert r["max_param_diff"] < 1e-5


def test_fsdp2_loss_trajectory_and_checkpoint(tmp_path):
    """fully_shard on a small GPT: the loss of each step equals unsharded training; a DCP
    checkpoint reloads into a fresh sharded model with the same outputs."""
    results = _run("fsdp", 2, tmp_path, env={"FSDP_STEPS": "6"})
    for r in results.values():
        assert len(r["losses"]) == 6
        for got, want in zip(r["losses"], r["ref_losses"]):
            assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
        assert r["reload_diff"] == 0.0
    assert results[0]["losses"] == results[1]["losses"]


def test_dtensor_and_tensor_parallel_mlp(tmp_path):
    """Shard/Replicate placements, redistribute, a ColwiseParallel/RowwiseParallel MLP equal
    to the dense one (output and gradient), and a 2x2 DeviceMesh from topology_aware_mesh."""
    results = _run("dtensor", 4, tmp_path)
    for r in results.values():
        assert r["local_shape"] == [2, 6]
        assert r["shard_ok"] and r["replicate_ok"] and r["shard1_ok"] and r["sum_ok"]
        assert r["tp_diff"] < 1e-5 and r["tp_grad_diff"] < 1e-5
        assert r["mesh2_ok"]
        assert r["layout"] == [[0, 1], [2, 3]]
