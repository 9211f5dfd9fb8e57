"""The demo trained with FSDP2 on 4 vTPU chips (python -m torch_tpu.run -n 4 -m torch_tpu.demo --fsdp)
against the single-chip demo on the same global batches, and its DCP checkpoint/resume.

Tiny model, fp32 (bf16 autocast would add rounding that differs with the row split), a
small corpus; the whole file takes well under 90 s on two cores.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.dist import clean_env, segments
from helpers.paths import REPO_ROOT

COMMON = ["--model-size", "tiny", "--batch-size", "8", "--seq-len", "32", "--eval-batches", "2",
          "--sample-tokens", "8", "--warmup", "1", "--dtype", "fp32", "--eval-every", "1"]


def _run(cmd, timeout=120):
    return subprocess.run([sys.executable, *cmd], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def _demo(out, corpus, *extra, ranks=None):
    launch = ["-m", "torch_tpu.run", "-n", str(ranks), "-m", "torch_tpu.demo", "--fsdp"] if ranks else \
        ["-m", "torch_tpu.demo"]
    proc = _run([*launch, *COMMON, "--corpus", corpus, "--out", str(out), *map(str, extra)])
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    with open(os.path.join(out, "log.jsonl")) as f:
        evals = {e["step"]: e for e in map(json.loads, f) if e["event"] == "eval"}
    return final, evals, proc


def test_fsdp_demo_matches_single_chip_and_resumes(tmp_path, corpus_dir):
    ref, ref_evals, _ = _demo(tmp_path / "single", corpus_dir, "--steps", 6)
    got, evals, proc = _demo(tmp_path / "fsdp", corpus_dir, "--steps", 6, "--checkpoint-every", 3, ranks=4)
    # Rank 0 alone prints the result line and the sample.
    assert proc.stdout.count("--- sample ---") == 1
    assert got["world_size"] == 4 and got["fsdp"] and got["steps"] == 6 and got["params"] == ref["params"]
    assert sorted(evals) == sorted(ref_evals) == [1, 2, 3, 4, 5, 6]
    for s in range(1, 7):
        # Same global batch and weights: only the reduction order of the gradients differs.
        assert evals[s]["train_loss"] == pytest.approx(ref_evals[s]["train_loss"], rel=1e-4), s
        assert evals[s]["val_loss"] == pytest.approx(ref_evals[s]["val_loss"], rel=1e-4), s
    assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-4)
    assert evals[6]["val_loss"] < evals[1]["val_loss"] - 0.3  # it learns

    # DCP checkpoints at steps 3 and 6, one shard file per rank; drop step 6 and resume from 3.
    out = tmp_path / "fsdp"
    ckpts = sorted(p for p in os.listdir(out) if p.startswith("dcp-"))
    assert ckpts == ["dcp-0000003", "dcp-0000006"]
    assert sorted(f for f in os.listdir(out / ckpts[0]) if f.endswith(".distcp")) == \
        [f"__{r}_0.distcp" for r in range(4)]
    shutil.rmtree(out / "dcp-0000006")
    os.remove(out / "log.jsonl")
    again, evals2, proc2 = _demo(out, corpus_dir, "--steps", 6, "--checkpoint-every", 3, "--resume", ranks=4)
    assert "resumed from" in proc2.stdout + proc2.stderr
    assert sorted(evals2) == [4, 5, 6]
    for s in (4, 5, 6):
        assert evals2[s]["train_loss"] == pytest.approx(evals[s]["train_loss"], rel=1e-5), s
    assert again["val_loss"] == pytest.approx(got["val_loss"], rel=1e-5)
    assert not segments()


def test_fsdp_demo_errors(tmp_path, corpus_dir):
    # Without a launcher: a clear message, no traceback.
    proc = _run(["-m", "torch_tpu.demo", "--fsdp", "--corpus", corpus_dir, "--out", str(tmp_path / "a")])
    assert proc.returncode == 2 and "torch_tpu.run -n 4" in proc.stderr and "Traceback" not in proc.stderr
    # A global batch that does not split evenly over the ranks.
    proc = _run(["-m", "torch_tpu.run", "-n", "2", "-m", "torch_tpu.demo", "--fsdp", *COMMON, "--batch-size", "3",
                 "--corpus", corpus_dir, "--out", str(tmp_path / "b")])
    assert proc.returncode == 2 and "--batch-size 3 (the global batch) is not a multiple of the 2 ranks" in proc.stderr
