"""transformers' Trainer through accelerate 1.15 on tpu, against the same run on CPU.

accelerate's PartialState picks its device from a fixed list of device names that has no "tpu", so
it falls back to CPU while Trainer (transformers 5.24) picks tpu:0: the model stays on CPU and the
first batch fails with a device mismatch. ACCELERATE_TORCH_DEVICE=tpu makes both agree; torch_tpu
leaves the variable to the user (it sets no other library's environment at import).
"""

import tempfile

import pytest
import torch
from accelerate.state import AcceleratorState, PartialState
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps its device in process-wide state: each run here chooses it anew."""
    AcceleratorState._reset_state(reset_partial_state=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    hf_logging.set_verbosity(verbosity)


def train(use_cpu):
    """Three Trainer steps of a one-layer GPT-2 (no dropout) on a fixed batch order; the logged losses."""
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (12, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=3,
            per_device_train_batch_size=4,
            learning_rate=1e-2,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=use_cpu,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, args.device, next(model.parameters()).device


def test_trainer_on_tpu_matches_cpu(fresh_accelerate_state, monkeypatch):
    ref, ref_device, _ = train(use_cpu=True)
    assert ref_device.type == "cpu" and len(ref) == 3
    AcceleratorState._reset_state(reset_partial_state=True)
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "tpu")
    losses, device, param_device = train(use_cpu=False)
    assert device.type == "tpu" and param_device.type == "tpu"
    assert PartialState().device.type == "tpu"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), atol=1e-4, rtol=1e-4)


def test_trainer_without_the_variable_fails_with_device_mismatch(fresh_accelerate_state, monkeypatch):
    # What docs/ecosystem.md tells users to avoid: accelerate chooses CPU, Trainer tpu.
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    assert PartialState().device.type == "cpu"
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        train(use_cpu=False)
    assert torch.ones(2, device="tpu").sum().item() == 2.0  # the process keeps working


def test_import_sets_no_environment_variable(run_python):
    result = run_python(
        """
        import json, os
        before = dict(os.environ)
        import torch, torch_tpu
        torch.ones(1, device="tpu")
        after = dict(os.environ)
        print(json.dumps({k: after[k] for k in after if before.get(k) != after[k]}))
        """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert result.json() == {}


def test_from_pretrained_device_map_tpu_loads_onto_the_chip(tmp_path):
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    ref = GPT2LMHeadModel.from_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    for device_map in ("tpu", {"": "tpu"}):
        model = GPT2LMHeadModel.from_pretrained(tmp_path, device_map=device_map)
        assert {p.device.type for p in model.parameters()} == {"tpu"}
        with torch.no_grad():
            torch.testing.assert_close(model(ids.to("tpu")).logits.cpu(), ref(ids).logits, atol=1e-5, rtol=1e-4)
    # docs/ecosystem.md: "auto" plans with accelerate's device list, which has no tpu: it loads on CPU.
    auto = GPT2LMHeadModel.from_pretrained(tmp_path, device_map="auto")
    assert {p.device.type for p in auto.parameters()} == {"cpu"}
