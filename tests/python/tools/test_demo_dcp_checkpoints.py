"""DCP checkpoint bookkeeping of the FSDP demo (rank 0's part, no processes needed): a new run in
an --out folder that holds an older run's higher-numbered checkpoints keeps its own newest ones,
and --resume picks the checkpoint ``latest-dcp`` names."""

import json
import os

from torch_tpu.demo import fsdp


def _complete(out, step, run):
    path = os.path.join(out, f"dcp-{step:07d}")
    os.makedirs(path)
    with open(os.path.join(path, fsdp.META), "w") as f:
        json.dump({"step": step, "run": run}, f)
    return path


def test_new_run_keeps_its_own_checkpoints_over_older_higher_steps(tmp_path):
    out = str(tmp_path)
    old = [_complete(out, s, "old") for s in (100, 200)]
    lineage = []
    for step in (10, 20, 30):
        path = os.path.join(out, f"dcp-{step:07d}")
        os.makedirs(path)
        fsdp.publish_dcp(out, path, {"run": "new"}, step, keep=lineage[-1:])
        lineage.append(path)
    left = sorted(os.listdir(out))
    # This run's two newest survive; the older run's are replaced as this run saves (as for single-chip).
    assert left == ["dcp-0000020", "dcp-0000030", fsdp.LATEST_DCP], left
    assert not any(os.path.exists(p) for p in old)


def test_resume_picks_latest_dcp_not_the_highest_step(tmp_path):
    out = str(tmp_path)
    _complete(out, 200, "old")
    newest = _complete(out, 20, "new")
    with open(os.path.join(out, fsdp.LATEST_DCP), "w") as f:
        f.write(os.path.basename(newest) + "\n")
    meta, path = fsdp.find_dcp_checkpoint(out)
    assert path == newest and meta["run"] == "new"


def test_resume_without_latest_file_takes_the_highest_complete_step(tmp_path):
    out = str(tmp_path)
    _complete(out, 5, "a")
    best = _complete(out, 7, "a")
    os.makedirs(os.path.join(out, "dcp-0000009"))  # incomplete: no demo.json
    assert fsdp.find_dcp_checkpoint(out)[1] == best
    assert fsdp.find_dcp_checkpoint(str(tmp_path / "missing")) is None
