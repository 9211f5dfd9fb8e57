"""tpu_dist collectives: every collective against expected values, in separate processes.

One battery per configuration runs every check (dtypes float32/bfloat16/int64, in-place and
out-of-place, contiguous and strided, one-shot, ring and multi-window sizes) in one process
group; the tests below assert the checks of one collective family each.
"""

import pytest

from helpers.dist import assert_family_ok, run_scenario, segments

FAMILIES = [
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all_single", "all_to_all",
    "coalesced", "async_op", "send_recv", "new_group", "objects", "cpu_tensors", "barrier",
]

CONFIGS = {
    # Three ranks (uneven chunking, a snake ring over 2x2 chips) with tiny buffers so that
    # the sizes of the battery go through one-shot, one-window and multi-window paths.
    "3ranks_small_buffers": (3, {"TORCH_TPU_DIST_BUFFER_BYTES": "64KiB", "TORCH_TPU_DIST_SMALL_BYTES": "1KiB",
                                 "TORCH_TPU_DIST_P2P_BYTES": "64KiB"}),
    "2ranks_defaults": (2, {}),
    # Two simulated hosts (TORCH_TPU_HOST_ID) of a v5p-16 slice: shared memory inside a host,
    # gloo across; 4 ranks = 2 per host (hierarchical), 3 ranks = 2 + 1 (flat gloo fallback).
    "4ranks_2hosts": (4, {"TORCH_TPU_TOPOLOGY": "v5p-16", "TORCH_TPU_DIST_BUFFER_BYTES": "64KiB",
                          "TORCH_TPU_DIST_SMALL_BYTES": "1KiB"}, 2),
    "3ranks_2hosts_uneven": (3, {"TORCH_TPU_TOPOLOGY": "v5p-16"}, 2),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def battery(request, tmp_path_factory):
    world, env, *hosts = CONFIGS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    results, status = run_scenario("collectives", world, out, env=env, timeout=240, hosts=hosts[0] if hosts else 1)
    for r, (rc, tail) in status.items():
        assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"
    assert sorted(results) == list(range(world)), f"missing ranks: {status}"
    return world, results


@pytest.mark.parametrize("family", FAMILIES)
def test_collective_family(battery, family):
    world, results = battery
    assert_family_ok(results, world, family)


def test_battery_size(battery):
    world, results = battery
    assert len(results[0]["checks"]) > 150


def test_no_segments_left(battery):
    assert segments() == []
