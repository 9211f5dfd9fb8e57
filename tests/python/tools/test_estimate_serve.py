"""``python -m torch_tpu.estimate --serve``: serving step times and KV-cache blocks per generation.

Oracles: hand-computed KV-block counts from the generations' HBM capacities, and the
ordering a roofline implies (a decode step of one token per sequence costs less than a prefill
of the same batch; a longer context costs more)."""

import subprocess
import sys

import pytest

import torch_tpu.runtime
from torch_tpu.estimate.core import model_spec
from torch_tpu.estimate.serve import serve_estimate


@pytest.fixture(scope="module")
def gpt_small():
    spec = model_spec("gpt-small", batch=4, seq_len=128)
    return spec, serve_estimate(spec, batch=4, prefill_len=128, context=128, block_size=16, dtype="fp32")


def test_kv_blocks_from_hbm(gpt_small):
    _, r = gpt_small
    hbm = {g["generation"]: g["hbm_bytes"] for g in torch_tpu.runtime.generations()}
    block = 16 * 2 * 6 * 8 * 32 * 4  # tokens x (K, V) x layers x heads x head_dim x float32
    assert r["kv_block_bytes"] == block
    for g, e in r["by_generation"].items():
        assert e["kv_blocks"] == (int(hbm[g] * 0.9) - r["weight_bytes"]) // block
    assert r["by_generation"]["v5e"]["kv_blocks"] < r["by_generation"]["v5p"]["kv_blocks"]


def test_decode_cheaper_than_prefill_and_context_costs(gpt_small):
    spec, r = gpt_small
    for e in r["by_generation"].values():
        # gpt-small's steps are launch-bound (a few hundred us of per-op cost either way): per token,
        # prefill amortises them over batch x prefill_len tokens, decode over batch.
        assert 0 < e["decode_tokens_per_s_per_chip"] < e["prefill_tokens_per_s_per_chip"]
        assert e["decode_tokens_per_s_per_chip"] == pytest.approx(4 / e["decode_step_s"])
    # Where weights and activations dominate, the roofline orders the steps themselves.
    big = model_spec("llama", batch=8, seq_len=512, n_layers=2, d_model=2048, n_heads=16, n_kv_heads=4,
                     ffn_dim=8192, vocab_size=32000)
    for e in serve_estimate(big, batch=8, prefill_len=512, context=512)["by_generation"].values():
        assert 0 < e["decode_step_s"] < e["prefill_step_s"]
    # A model whose KV cache dominates a decode step (GQA, 8 heads over 2 KV heads): 16x the context costs more.
    llama = model_spec("llama", batch=8, seq_len=4096, n_layers=2, d_model=512, n_heads=8, n_kv_heads=2,
                       ffn_dim=1024, vocab_size=1024)
    long_ = serve_estimate(llama, batch=8, prefill_len=256, context=4096)
    short = serve_estimate(llama, batch=8, prefill_len=256, context=256)
    for g in r["by_generation"]:
        assert short["by_generation"][g]["decode_step_s"] < long_["by_generation"][g]["decode_step_s"]
    assert long_["kv_block_bytes"] == 16 * 2 * 2 * 2 * 64 * 2  # tokens x (K, V) x layers x KV heads x 64 x bf16


def test_bad_sizes_raise():
    spec = model_spec("gpt-tiny", batch=2, seq_len=32)
    with pytest.raises(ValueError, match="--serve: the demo GPT's context is its --seq-len 32"):
        serve_estimate(spec, batch=2, prefill_len=16, context=64)
    with pytest.raises(ValueError, match="--serve: batch must be a positive integer"):
        serve_estimate(spec, batch=0, prefill_len=16, context=16)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        serve_estimate(spec, batch=2, prefill_len=16, context=16, gpu_memory_utilization=1.5)


def test_cli():
    r = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", "--serve", "--model", "gpt-tiny", "--batch", "2",
                        "--seq-len", "32", "--topology", "v5e-1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "decode ms" in r.stdout and '"by_generation"' in r.stdout.splitlines()[-1]
