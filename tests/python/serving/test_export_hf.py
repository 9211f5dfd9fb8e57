"""``python -m torch_tpu.demo --export-hf DIR``: the demo GPT as a Hugging Face GPT-2 checkpoint.

Oracle: the demo model's own logits (on the host) against ``transformers``' GPT-2 loading the
export, and the byte values of the text against the tokenizer's ids.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from torch_tpu.demo.export_hf import export, hf_state_dict
from torch_tpu.estimate.models.gpt import GPT, GPTConfig

transformers = pytest.importorskip("transformers")

TEXT = "def f(x):\n    return {'ü': x ** 2}  # ok\t\x01"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(1)
    model = GPT(GPTConfig(seq_len=48, n_layer=2, n_head=4, d_model=64)).eval()
    with torch.no_grad():  # trained-looking weights: biases and norms away from their init
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    path = export(model, str(tmp_path_factory.mktemp("gpt_hf")))
    return model, path


def test_logits_equal_demo_model(exported):
    model, path = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    x = torch.randint(0, 256, (3, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _ = model(x)
        theirs = hf(x).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_files_and_config(exported):
    model, path = exported
    assert sorted(os.listdir(path)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert (cfg["n_positions"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["vocab_size"]) == (48, 64, 2, 4, 256)
    from safetensors.torch import load_file

    sd = load_file(os.path.join(path, "model.safetensors"))
    assert set(sd) == set(hf_state_dict(model))
    torch.testing.assert_close(sd["transformer.h.1.attn.c_attn.weight"], model.blocks[1].attn.qkv.weight.t())


def test_byte_tokenizer_round_trip(exported):
    _, path = exported
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert ids == list(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert len(tok) == 256
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "user: hi\nassistant: "


def test_export_rejects_other_vocabularies(tmp_path):
    model = GPT(GPTConfig(vocab_size=300, seq_len=8, n_layer=1, n_head=1, d_model=8))
    with pytest.raises(ValueError, match="--export-hf: the byte tokenizer needs vocab_size 256"):
        export(model, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_cli_rejects_export_with_fsdp(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "torch_tpu.demo", "--fsdp", "--export-hf", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "--export-hf: not supported with --fsdp" in r.stderr
