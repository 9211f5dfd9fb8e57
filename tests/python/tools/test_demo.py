"""The main job, torch_tpu.demo: data, model, training CLI (checkpoints, resume, errors).

CLI runs are subprocesses on a small corpus (a few standard-library files) with the
tiny model, so that the whole file stays well under two minutes on two cores.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers.paths import REPO_ROOT
from torch_tpu.demo import data
from torch_tpu.estimate.models.gpt import GPT, PRESETS, GPTConfig

TINY = ["--model-size", "tiny", "--batch-size", "4", "--seq-len", "32", "--eval-batches", "2",
        "--sample-tokens", "8", "--warmup", "1"]


def _env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCH_TPU_", "TPU_")) and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(extra or {})
    return env


def demo(*args, env=None, timeout=120):
    """Run ``python -m torch_tpu.demo *args``; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "torch_tpu.demo", *map(str, args)], cwd=REPO_ROOT,
                          env=_env(env), capture_output=True, text=True, timeout=timeout)


def last_json(proc):
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- data -----------------------------------------------------------------------------


def test_split_is_deterministic_and_disjoint():
    files = data.list_source_files(data.default_corpus())
    assert len(files) > 100 and not any("site-packages" in f for f in files)
    train, val = data.split_files(files, 0.05)
    assert (train, val) == data.split_files(list(files), 0.05)
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(files)
    assert 0.01 < len(val) / len(files) < 0.1
    # Membership depends on the path alone, not on the other files or their order.
    assert data.split_files(list(reversed(files)), 0.05)[1] == list(reversed(val))
    assert all(data.is_validation(f, 0.05) for f in val)


def test_batches_depend_on_seed_and_step_only():
    tokens = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    a = data.get_batch(tokens, 3, 8, data.batch_generator(7, 5))
    b = data.get_batch(tokens, 3, 8, data.batch_generator(7, 5))
    c = data.get_batch(tokens, 3, 8, data.batch_generator(7, 6))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    x, y = a
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_unigram_entropy_by_hand(tmp_path):
    assert data.unigram_entropy_nats(np.frombuffer(b"aab", np.uint8)) == pytest.approx(
        -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    assert data.unigram_entropy_nats(np.frombuffer(b"zzzz", np.uint8)) == 0.0
    # A two-file corpus: one file per split whatever the hash says; entropy of the train split.
    (tmp_path / "a.py").write_bytes(b"abcd" * 10)
    (tmp_path / "b.py").write_bytes(b"xy" * 10)
    c = data.load_corpus(str(tmp_path))
    assert sorted(c.train_files + c.val_files) == ["a.py", "b.py"]
    expected = {"a.py": math.log(4), "b.py": math.log(2)}[c.train_files[0]]
    assert c.unigram_nats == pytest.approx(expected)


def test_missing_or_empty_corpus(tmp_path):
    with pytest.raises(data.CorpusError, match="does not exist"):
        data.load_corpus(str(tmp_path / "nope"))
    with pytest.raises(data.CorpusError, match="no \\*.py files"):
        data.load_corpus(str(tmp_path))
    p = demo("--corpus", tmp_path / "nope")
    assert p.returncode != 0 and "does not exist" in p.stderr and "Traceback" not in p.stderr


# --- model ----------------------------------------------------------------------------


def test_model_forward_tpu_matches_cpu():
    torch.manual_seed(0)
    cpu = GPT(GPTConfig(seq_len=32, **PRESETS["tiny"]))
    tpu = GPT(GPTConfig(seq_len=32, **PRESETS["tiny"]))
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    assert tpu.head.weight is tpu.tok_emb.weight and tpu.num_params() == cpu.num_params()
    idx = torch.randint(0, 256, (3, 32))
    logits_cpu, loss_cpu = cpu(idx, idx)
    logits_tpu, loss_tpu = tpu(idx.to("tpu"), idx.to("tpu"))
    assert logits_tpu.device.type == "tpu" and logits_tpu.shape == (3, 32, 256)
    torch.testing.assert_close(logits_tpu.cpu(), logits_cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_tpu.cpu(), loss_cpu, atol=1e-5, rtol=1e-5)


# --- the CLI --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_run(corpus_dir, tmp_path_factory):
    """An uninterrupted 3-step run, checkpoints at steps 2 and 3, on a v5p topology (re-exec path)."""
    out = tmp_path_factory.mktemp("run")
    p = demo("--corpus", corpus_dir, "--out", out, "--steps", 3, "--eval-every", 1, "--checkpoint-every", 2,
             "--topology", "v5p-8", *TINY)
    return out, p


def test_three_step_run_writes_checkpoints_and_json(full_run):
    out, p = full_run
    res = last_json(p)
    assert set(res) >= {"val_loss", "unigram_nats", "tokens_per_s", "steps", "params", "estimate"}
    assert res["steps"] == 3 and res["params"] > 0 and res["tokens_per_s"] > 0
    assert 0 < res["val_loss"] < 6 and 2 < res["unigram_nats"] < 5
    names = sorted(os.listdir(out))
    assert "ckpt-0000002.pt" in names and "ckpt-0000003.pt" in names and "log.jsonl" in names
    assert (out / "latest").read_text().strip() == "ckpt-0000003.pt"
    assert not any(".tmp" in n for n in names)
    est = res["estimate"]
    assert est["generation"] == "v5p" and est["topology"] == "v5p-8"
    assert set(est["by_generation"]) == {"v5p", "v5e", "v6e", "tpu7x"}
    for g, e in est["by_generation"].items():
        assert e["step_time_s"] > 0 and 0 < e["mfu"] < 1 and e["fits"] is True, (g, e)
    assert est["hbm_peak_bytes"] > 0
    assert "--- sample ---" in p.stdout and "val loss" in p.stdout


# Runs the CLI in a child whose first evaluation (after step 1) ends with a real SIGINT
# to itself: the signal arrives at a known step, and the real handler deals with it.
_INTERRUPT_AFTER_FIRST_EVAL = """
import os, signal, sys
import torch
from torch_tpu.demo import loop
from torch_tpu.demo.__main__ import main
evaluate = loop.evaluate
def interrupting_evaluate(*args, **kwargs):
    value = evaluate(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    return value
loop.evaluate = interrupting_evaluate
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_saves_and_resume_matches_uninterrupted(full_run, corpus_dir, tmp_path):
    _, ref = full_run
    args = ["--corpus", corpus_dir, "--out", tmp_path, "--steps", 3, "--eval-every", 1, "--checkpoint-every", 100,
            "--topology", "v5p-8", *TINY]
    # TORCH_TPU_TOPOLOGY equal to --topology: no re-exec, so the patched child stays in charge.
    p = subprocess.run([sys.executable, "-c", _INTERRUPT_AFTER_FIRST_EVAL, *map(str, args)], cwd=REPO_ROOT,
                       env=_env({"TORCH_TPU_TOPOLOGY": "v5p-8"}), capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, p.stderr[-3000:]
    assert "interrupted at step 1: checkpoint saved" in p.stdout
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-")) == ["ckpt-0000001.pt"]
    res = demo(*args, "--resume")
    assert "at step 1" in res.stdout + res.stderr
    assert last_json(res)["val_loss"] == last_json(ref)["val_loss"]


def test_corrupted_latest_checkpoint_falls_back(full_run, corpus_dir, tmp_path):
    src, ref = full_run
    for n in ("ckpt-0000002.pt", "ckpt-0000003.pt", "latest"):
        shutil.copy(src / n, tmp_path / n)
    blob = (tmp_path / "ckpt-0000003.pt").read_bytes()
    (tmp_path / "ckpt-0000003.pt").write_bytes(blob[: len(blob) // 2])  # truncated
    res = demo("--corpus", corpus_dir, "--out", tmp_path, "--steps", 3, "--eval-every", 1,
               "--checkpoint-every", 2, "--topology", "v5p-8", "--resume", *TINY)
    text = res.stdout + res.stderr
    assert "corrupted or truncated" in text and "at step 2" in text
    assert last_json(res)["val_loss"] == last_json(ref)["val_loss"]
    assert (tmp_path / "ckpt-0000003.pt.corrupt").exists() and (tmp_path / "ckpt-0000002.pt").exists()
    # Every checkpoint unusable: a clear error, no traceback.
    (tmp_path / "ckpt-0000002.pt").write_bytes(b"garbage")
    (tmp_path / "ckpt-0000003.pt").write_bytes(b"")
    bad = demo("--corpus", corpus_dir, "--out", tmp_path, "--steps", 3, "--resume", *TINY)
    assert bad.returncode == 1 and "no usable checkpoint" in bad.stderr and "Traceback" not in bad.stderr


def test_unknown_topology_lists_valid_names(corpus_dir, tmp_path):
    p = demo("--topology", "v9z-8", "--corpus", corpus_dir, "--out", tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "v9z-8" in p.stderr and "v5e" in p.stderr and "v6e" in p.stderr and "tpu7x" in p.stderr
    assert "Exception raised from" not in p.stderr
    # The same name from the environment fails at the runtime's first use, as cleanly.
    p = demo("--corpus", corpus_dir, "--out", tmp_path, env={"TORCH_TPU_TOPOLOGY": "v9z-8"})
    assert p.returncode == 2 and "v9z-8" in p.stderr and "tpu7x" in p.stderr and "Traceback" not in p.stderr


def test_compile_mode(corpus_dir, tmp_path):
    # torch.compile(backend="tpu") of the model and the AdamW step
    p = demo("--mode", "compile", "--corpus", corpus_dir, "--out", tmp_path, "--steps", 3, *TINY,
             env={"TORCH_TPU_CACHE_DIR": str(tmp_path / "cache")}, timeout=300)
    out = last_json(p)
    assert out["steps"] == 3 and math.isfinite(out["val_loss"])
    assert len(list((tmp_path / "cache" / "programs").glob("*.json"))) >= 3  # forward, backward, AdamW


def test_out_of_hbm_message(corpus_dir, tmp_path):
    p = demo("--corpus", corpus_dir, "--out", tmp_path, "--steps", 2, "--model-size", "small",
             env={"TORCH_TPU_HBM_BYTES": "64MiB"})
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "out of HBM" in p.stderr and "needed at least" in p.stderr and "64.0 MiB per chip" in p.stderr
