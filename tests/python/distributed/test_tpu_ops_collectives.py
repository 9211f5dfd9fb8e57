"""torch.tpu.ops collectives over tpu_dist (all_gather_dim, reduce_scatter_dim, send/recv,
ragged_all_to_all) with 2 and 4 ranks, against CPU computations over all ranks' inputs."""

import pytest

from helpers.dist import run_scenario, segments

FAMILIES = ["all_gather_dim", "reduce_scatter_dim", "autograd", "subgroup", "send_recv", "ragged_all_to_all",
            "stats", "bad_inputs"]


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"tpu_ops_{world}")
    results, status = run_scenario("tpu_ops", world, out, env={"TORCH_TPU_DIST_TIMEOUT": "60"}, timeout=240)
    for r, (rc, tail) in status.items():
        assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"
    assert sorted(results) == list(range(world)), f"missing ranks: {status}"
    return world, results


@pytest.mark.parametrize("family", FAMILIES)
def test_tpu_ops_collective(results, family):
    world, res = results
    for r in range(world):
        checks = {k: v for k, v in res[r]["checks"].items() if k.split("/")[0] == family}
        assert checks, f"no checks ran for {family}"
        bad = {k: v for k, v in checks.items() if v != "ok"}
        assert not bad, f"rank {r}: {len(bad)} of {len(checks)} {family} checks failed:\n" + "\n".join(
            f"{k}: {v}" for k, v in list(bad.items())[:3])


def test_no_segments_left(results):
    assert segments() == []
