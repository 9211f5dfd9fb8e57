"""torch.tpu.ops collectives over tpu_dist (all_gather_dim, reduce_scatter_dim, send/recv,
ragged_all_to_all) with 2 and 4 ranks launched by ``python -m torch_tpu.run``, against CPU
computations over all ranks' inputs."""

import json
import os
import subprocess
import sys

import pytest

from helpers.dist import WORKER, assert_family_ok, clean_env, run_scenario, segments

FAMILIES = ["all_gather_dim", "reduce_scatter_dim", "autograd", "compiled", "subgroup", "send_recv",
            "ragged_all_to_all", "stats", "bad_inputs"]


@pytest.fixture(scope="module", params=[2, 4, "4ranks_2hosts"], ids=["2ranks", "4ranks", "4ranks_2hosts"])
def results(request, tmp_path_factory):
    if request.param == "4ranks_2hosts":
        # two simulated hosts of a v5p-16 slice: shared memory inside a host, gloo (the DCN) across
        out = tmp_path_factory.mktemp("tpu_ops_2hosts")
        res, status = run_scenario("tpu_ops", 4, out, env={"TORCH_TPU_TOPOLOGY": "v5p-16"}, timeout=240, hosts=2)
        for r, (rc, tail) in status.items():
            assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"
        return 4, res
    world = request.param
    out = tmp_path_factory.mktemp(f"tpu_ops_{world}")
    proc = subprocess.run([sys.executable, "-m", "torch_tpu.run", "-n", str(world), WORKER, "tpu_ops", str(out)],
                          env=clean_env({"TORCH_TPU_DIST_TIMEOUT": "60"}), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    res = {}
    for r in range(world):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            res[r] = json.load(f)
    return world, res


@pytest.mark.parametrize("family", FAMILIES)
def test_tpu_ops_collective(results, family):
    world, res = results
    assert_family_ok(res, world, family)


def test_no_segments_left(results):
    assert segments() == []
