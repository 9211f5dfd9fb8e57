"""TorchTitan (the ``titan`` extra) trains its llama3 model on tpu through ``torchtitan.train``.

Smoke-sized: the ``tpu_smoke`` flavor (TorchTitan's flex-attention debug architecture with 2 layers
of width 64, registered by examples/torchtitan/tpu_flavors.py), 2 steps of 2 x 64 tokens. Oracle: the
same model, initial weights and data trained by a plain loop on CPU (examples/torchtitan/train.py),
per-step losses compared. Float32 parameters, so the bound is far inside bf16's 1.6e-2.
The longer run is ``python examples/torchtitan/train.py`` (docs/ecosystem.md).
"""

import os
import sys

import pytest
import torch

import torch_tpu  # noqa: F401

pytest.importorskip("torchtitan", reason="TorchTitan is the 'titan' extra: pip install -e '.[titan]'")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "torchtitan")
sys.path.insert(0, os.path.abspath(EXAMPLES))
import train  # noqa: E402

RTOL = 1e-4


def _counter_based_generator() -> bool:
    return torch.tpu.get_rng_state().numel() == 16


def _train(tmp_path, nproc):
    r = train.run(str(tmp_path), nproc=nproc, steps=2, flavor="tpu_smoke", seq_len=64, batch=2, timeout=600)
    assert "TPU capacity" in r["log"]  # TorchTitan picked the tpu device by itself
    assert "Loading the checkpoint from" in r["log"]  # the oracle's initial weights
    assert len(r["tpu"]) == len(r["cpu"]) == 2
    for step, (t, c) in enumerate(zip(r["tpu"], r["cpu"]), 1):
        assert abs(t - c) <= RTOL * abs(c), f"step {step}: torchtitan on tpu {t} vs CPU oracle {c}"
    assert r["cpu"][0] > 7.0  # ~ln(2048) at initialisation: a real model, not a constant
    return r


def test_one_process(tmp_path):
    _train(tmp_path, 1)


@pytest.mark.skipif(
    not _counter_based_generator(),
    reason="FSDP initialises DTensor parameters with random ops, which need the tpu generator's 16-byte "
    "(seed, offset) Philox state (torch/distributed/tensor/_random.py _PhiloxState); TORCH_TPU_RNG=cpu "
    "selects the mt19937 stream",
)
def test_two_processes_fsdp(tmp_path):
    r = _train(tmp_path, 2)
    assert "Applied FSDP to the model" in r["log"]
