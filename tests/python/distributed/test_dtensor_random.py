"""DTensor's random ops over tpu_dist with the philox chip generator: a DTensor drawn by
shards (torch.distributed.tensor.randn / rand, uniform_, normal_, bernoulli_, rand_like,
nn.init on a DTensor parameter) equals the same op drawn whole on one chip, and the
generator ends in the same state, on 1, 2 and 4 ranks."""

import pytest

from helpers.dist import run_scenario


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sharded_random_init_equals_whole(tmp_path, world):
    results, status = run_scenario("dtensor_random", world, tmp_path, timeout=240)
    for r, (rc, tail) in status.items():
        assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"
    assert sorted(results) == list(range(world))
    for r, res in results.items():
        bad = [k for k, v in res.items() if v is not True]
        assert not bad, f"rank {r}: {bad}"
        assert len(res) == 15
