"""tpu_dist failures never hang: dead ranks, stalled ranks, mismatched collectives, shm cleanup."""

import os

from helpers.dist import clean_env, run_scenario, segments


def _statuses_ok(status, ranks):
    for r in ranks:
        rc, tail = status[r]
        assert rc == 0, f"rank {r} exited with {rc}:\n{tail}"


def test_rank_killed_mid_collective(tmp_path):
    """Rank 2 is SIGKILLed while a large all_reduce runs: ranks 0 and 1 raise DistBackendError
    naming rank 2 well within the timeout; the group then refuses further work."""
    results, status = run_scenario("kill", 3, tmp_path, env={"DIST_TIMEOUT": "30"}, timeout=120)
    assert status[2][0] == -9
    _statuses_ok(status, [0, 1])
    for r in (0, 1):
        err = results[r]["error"]
        assert err is not None and "DistBackendError" in err, err
        assert "rank 2" in err and ("died" in err or "failed" in err), err
        assert results[r]["elapsed"] < 10, results[r]
        assert "unusable after an earlier failure" in results[r]["after"]
    assert segments() == []


def test_rank_killed_before_collective(tmp_path):
    """The victim dies before entering; the others, already waiting in the collective, raise."""
    results, status = run_scenario("kill", 3, tmp_path, env={"DIST_TIMEOUT": "30", "KILL_BEFORE": "1"},
                                   timeout=120)
    _statuses_ok(status, [0, 1])
    for r in (0, 1):
        assert "rank 2" in results[r]["error"], results[r]
        assert results[r]["elapsed"] < 10


def test_stalled_rank_times_out(tmp_path):
    """Rank 1 is alive but never calls the collective: rank 0 raises after the group's timeout
    (3 s here), naming rank 1."""
    results, status = run_scenario("stall", 2, tmp_path, env={"DIST_TIMEOUT": "3", "STALL": "5"}, timeout=120)
    _statuses_ok(status, [0, 1])
    err = results[0]["error"]
    assert "timed out after 3 s" in err and "rank 1" in err, err
    assert 2.5 < results[0]["elapsed"] < 5, results[0]


def test_mismatched_collectives_raise_on_all_ranks(tmp_path):
    """Different element counts, dtypes, collectives, reduce ops or roots: the same clear
    RuntimeError on every rank, and the group keeps working afterwards."""
    results, status = run_scenario("mismatch", 2, tmp_path, timeout=120)
    _statuses_ok(status, [0, 1])
    for r in (0, 1):
        res = results[r]
        assert "float32[10]" in res["numel"] and "float32[12]" in res["numel"], res["numel"]
        assert "int64" in res["dtype"] and "float32" in res["dtype"]
        assert "broadcast" in res["op"] and "all_reduce" in res["op"]
        assert "SUM" in res["redop"] and "MAX" in res["redop"]
        assert "root 0" in res["root"] and "root 1" in res["root"]
        for key in ("numel", "dtype", "op", "redop", "root"):
            assert res[key].startswith("RuntimeError"), res[key]
            assert "rank 0" in res[key] and "rank 1" in res[key]
        assert res["after"] is None and res["after_value"] == [3.0] * 6
    assert results[0]["numel"].split(":", 1)[1].count("\n") == results[1]["numel"].split(":", 1)[1].count("\n")


def test_stale_segments_are_removed(tmp_path, run_python):
    """A segment left by a dead process (crash between creation and unlink) is removed by the
    next process that creates a group; live processes' segments are kept."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE,
                            text=True)
    pid = int(dead.communicate()[0])
    stale = f"/dev/shm/tpudist_p{pid}_deadbeef_r0"
    live = f"/dev/shm/tpudist_p{os.getpid()}_cafe_r0"
    for path in (stale, live):
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
    try:
        out = run_python("""
            import json, torch, torch_tpu.distributed as td
            print(json.dumps({"removed": td.remove_stale_segments(), "left": td.leftover_segments()}))
        """, env=clean_env()).json()
        assert out["removed"] >= 1
        assert os.path.basename(stale) not in out["left"]
        assert os.path.exists(live)
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.unlink(path)


def test_rank_killed_on_another_host(tmp_path):
    """Two simulated hosts (v5p-16, 2 ranks each): rank 3 dies; rank 2 (same host) sees it in
    shared memory, ranks 0 and 1 see gloo fail and name rank 3 from the cause rank 2 posts."""
    results, status = run_scenario("kill", 4, tmp_path, env={"TORCH_TPU_TOPOLOGY": "v5p-16", "DIST_TIMEOUT": "20"},
                                   timeout=120, hosts=2)
    assert status[3][0] == -9
    _statuses_ok(status, [0, 1, 2])
    for r in (0, 1, 2):
        err = results[r]["error"]
        assert "DistBackendError" in err and "rank 3" in err and "died" in err, err
        assert results[r]["elapsed"] < 10
