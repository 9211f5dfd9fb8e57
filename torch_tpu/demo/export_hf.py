"""``--export-hf DIR``: the demo's GPT as a Hugging Face GPT-2 checkpoint (vLLM and transformers load it).

The demo's GPT is GPT-2's architecture (learned positions, pre-norm blocks, tanh GELU,
LayerNorm eps 1e-5, tied output projection), so the export is an exact renaming of its
weights; GPT-2's ``Conv1D`` stores ``[in, out]``, the transpose of ``nn.Linear``'s ``weight``.
DIR gets ``config.json`` (``GPT2LMHeadModel``, ``n_positions`` = the demo's ``--seq-len``,
so vLLM's ``max_model_len`` defaults to it), ``generation_config.json``,
``model.safetensors`` (float32), and a byte-level tokenizer: token id b is byte b (0..255),
``tokenizer.json`` for the ``tokenizers`` library (GPT-2's byte-to-unicode alphabet, no
merges) with ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` and a chat
template, so ``AutoTokenizer.from_pretrained(DIR)`` needs no custom code.

Byte 0 (NUL, absent from Python source) is the end-of-sequence token.
"""

from __future__ import annotations

import json
import os

import torch

from ..estimate.models.gpt import GPT, GPTConfig

EOS_BYTE = 0

#: A plain chat template: "role: content" lines, then "assistant: " for the reply.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def hf_config(cfg: GPTConfig) -> dict:
    """``config.json`` of the GPT-2 equivalent of ``cfg``."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.seq_len,
        "n_ctx": cfg.seq_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.mlp_ratio * cfg.d_model,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": EOS_BYTE,
        "eos_token_id": EOS_BYTE,
        "torch_dtype": "float32",
    }


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The GPT's weights under GPT-2's names (float32, contiguous, on the host; the tied output
    projection is ``transformer.wte.weight``)."""
    sd = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    out = {
        "transformer.wte.weight": sd["tok_emb.weight"],
        "transformer.wpe.weight": sd["pos_emb.weight"],
        "transformer.ln_f.weight": sd["ln_f.weight"],
        "transformer.ln_f.bias": sd["ln_f.bias"],
    }
    for i in range(model.cfg.n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[dst + b + ".weight"] = sd[src + a + ".weight"]
            out[dst + b + ".bias"] = sd[src + a + ".bias"]
        for a, b in (
            ("attn.qkv", "attn.c_attn"),
            ("attn.proj", "attn.c_proj"),
            ("mlp.0", "mlp.c_fc"),
            ("mlp.2", "mlp.c_proj"),
        ):
            out[dst + b + ".weight"] = sd[src + a + ".weight"].t()  # nn.Linear [out, in] -> Conv1D [in, out]
            out[dst + b + ".bias"] = sd[src + a + ".bias"]
    return {k: v.contiguous() for k, v in out.items()}


def tokenizer_json() -> dict:
    """``tokenizer.json``: byte-level BPE with the 256 single-byte tokens and no merges."""
    b2u = bytes_to_unicode()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {b2u[b]: b for b in range(256)},
            "merges": [],
        },
    }


def export(model: GPT, out_dir: str) -> str:
    """Writes the Hugging Face checkpoint of ``model`` into ``out_dir`` (created); returns its path.

    Raises ValueError when the model's vocabulary is not the 256 bytes.
    """
    from safetensors.torch import save_file

    cfg = model.cfg
    if cfg.vocab_size != 256:
        raise ValueError(f"--export-hf: the byte tokenizer needs vocab_size 256, the model has {cfg.vocab_size}")
    os.makedirs(out_dir, exist_ok=True)

    def write_json(name: str, obj: dict) -> None:
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    save_file(hf_state_dict(model), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json("config.json", hf_config(cfg))
    write_json("generation_config.json", {"bos_token_id": EOS_BYTE, "eos_token_id": EOS_BYTE, "pad_token_id": EOS_BYTE})
    write_json("tokenizer.json", tokenizer_json())
    eos = bytes_to_unicode()[EOS_BYTE]
    write_json(
        "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.seq_len,
            "clean_up_tokenization_spaces": False,
            "add_prefix_space": False,
            "eos_token": eos,
            "pad_token": eos,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    return out_dir
