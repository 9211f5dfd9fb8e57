"""Llama-style decoders, built per chip for the estimator.

Shapes: B = sequences per chip, T = sequence length, C = ``d_model``, H = query heads,
K = key/value heads, D = C / H (head size), F = MLP width, V = vocabulary.

A Llama model here is built *per chip*: with tensor parallelism ``tp`` (Megatron-style) it
holds H/tp query heads, max(1, K/tp) key/value heads, F/tp of the MLP and V/tp of the
vocabulary (embedding and output projection are vocabulary-parallel), and calls the
``tp_copy`` / ``tp_reduce`` hooks where Megatron's ``f`` / ``g`` operators sit (the
all-reduces: 2 per layer forward, 2 backward, plus one after the embedding).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP,
    untied output projection). ``batch`` is the global batch in sequences per step."""

    vocab_size: int = 32000
    n_layers: int = 32
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 32
    ffn_dim: int = 11008
    seq_len: int = 4096
    batch: int = 8

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def num_params(self) -> int:
        """Parameters of the whole (unsharded) model: embedding, per layer attention
        (C·(H + 2K)·D + H·D·C), MLP (3·C·F) and two RMSNorm weights, final norm, output."""
        c, d = self.d_model, self.head_dim
        attn = c * (self.n_heads + 2 * self.n_kv_heads) * d + self.n_heads * d * c
        layer = attn + 3 * c * self.ffn_dim + 2 * c
        return 2 * self.vocab_size * c + self.n_layers * layer + c

    def validate(self) -> None:
        """Raises ValueError for sizes that do not make a model."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:  # JSON true is not 1 layer
                raise ValueError(f"Llama config: {f.name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"Llama config: d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Llama config: n_heads {self.n_heads} is not a multiple of n_kv_heads "
                             f"{self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"Llama config: head size {self.head_dim} must be even (rotary embedding)")


# Public configurations (the models' config.json on Hugging Face, meta-llama/*; the Llama 2
# paper, arXiv 2307.09288, Table 1 and the Llama 3 paper, arXiv 2407.21783, Table 3).
# ``batch`` is only a default, chosen per preset to match common pre-training setups.
LLAMA_PRESETS: dict[str, LlamaConfig] = {
    "llama2-7b": LlamaConfig(32000, 32, 4096, 32, 32, 11008, 4096, 256),
    "llama2-13b": LlamaConfig(32000, 40, 5120, 40, 40, 13824, 4096, 256),
    "llama2-70b": LlamaConfig(32000, 80, 8192, 64, 8, 28672, 4096, 256),
    "llama3-8b": LlamaConfig(128256, 32, 4096, 32, 8, 14336, 8192, 256),
    "llama3-70b": LlamaConfig(128256, 80, 8192, 64, 8, 28672, 8192, 256),
    "llama3-405b": LlamaConfig(128256, 126, 16384, 128, 8, 53248, 8192, 256),
    # Small enough to run for real on the vTPU (tests, sanity checks).
    "llama-tiny": LlamaConfig(512, 2, 128, 4, 2, 256, 64, 4),
}


def llama_config(preset: str | None = None, json_text: str | None = None, **overrides) -> LlamaConfig:
    """A LlamaConfig from a preset name, JSON (a string or a path to a file; Hugging Face
    ``config.json`` keys are accepted too) and keyword overrides, in that order.

    Raises ValueError naming the valid presets or the bad key.
    """
    cfg = LlamaConfig()
    if preset is not None:
        if preset not in LLAMA_PRESETS:
            raise ValueError(f"unknown Llama preset '{preset}'; valid: {', '.join(LLAMA_PRESETS)}")
        cfg = LLAMA_PRESETS[preset]
    if json_text:
        text = json_text
        if not text.lstrip().startswith(("{", "[")):  # JSON text is an object; anything else names a file
            try:
                with open(text) as f:
                    text = f.read()
            except OSError as e:
                raise ValueError(f"--config: cannot read the file {json_text!r} ({e.strerror or e}); "
                                 "give JSON text or a readable JSON file") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--config: invalid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"--config: a JSON object is expected, got {type(raw).__name__}")
        hf = {"num_hidden_layers": "n_layers", "hidden_size": "d_model", "num_attention_heads": "n_heads",
              "num_key_value_heads": "n_kv_heads", "intermediate_size": "ffn_dim",
              "max_position_embeddings": "seq_len"}
        names = {f.name for f in dataclasses.fields(LlamaConfig)}
        values = {}
        for k, v in raw.items():
            k = hf.get(k, k)
            if k in names:
                values[k] = v
        if not values:
            raise ValueError(f"Llama config JSON has none of the keys {sorted(names)}")
        cfg = dataclasses.replace(cfg, **values)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    cfg.validate()
    return cfg


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class TPHooks:
    """Megatron's operators around a tensor-parallel region: ``copy`` (f: identity forward,
    all-reduce of the gradient backward) and ``reduce`` (g: all-reduce forward, identity
    backward). Identity for tp = 1."""

    copy: Callable[[torch.Tensor], torch.Tensor] = _identity
    reduce: Callable[[torch.Tensor], torch.Tensor] = _identity


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary positions: [B, T, C] -> [B, T, C] (this
    chip's heads; the caller all-reduces the output when tensor-parallel)."""

    def __init__(self, cfg: LlamaConfig, tp: int, attention: str):
        super().__init__()
        self.d = cfg.head_dim
        self.h = cfg.n_heads // tp
        self.kv = max(1, cfg.n_kv_heads // tp)  # K < tp: each chip keeps one replicated K/V head
        self.attention = attention
        c = cfg.d_model
        self.wq = nn.Linear(c, self.h * self.d, bias=False)
        self.wk = nn.Linear(c, self.kv * self.d, bias=False)
        self.wv = nn.Linear(c, self.kv * self.d, bias=False)
        self.wo = nn.Linear(self.h * self.d, c, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.h, self.d).transpose(1, 2)  # [B, h, T, D]
        k = self.wk(x).view(B, T, self.kv, self.d).transpose(1, 2)
        v = self.wv(x).view(B, T, self.kv, self.d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # keep q, k in the compute dtype
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.attention == "flash":
            # PyTorch's fused kernel: scores never reach HBM, as with a TPU's flash attention.
            if self.kv != self.h:
                k = k.repeat_interleave(self.h // self.kv, dim=1)
                v = v.repeat_interleave(self.h // self.kv, dim=1)
            y = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.h * self.d))


class LlamaMLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), this chip's F/tp columns."""

    def __init__(self, cfg: LlamaConfig, tp: int):
        super().__init__()
        f = cfg.ffn_dim // tp
        self.w1 = nn.Linear(cfg.d_model, f, bias=False)
        self.w3 = nn.Linear(cfg.d_model, f, bias=False)
        self.w2 = nn.Linear(f, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class LlamaLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); [B, T, C] -> [B, T, C]."""

    def __init__(self, cfg: LlamaConfig, tp: int, attention: str, hooks: TPHooks):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = LlamaAttention(cfg, tp, attention)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = LlamaMLP(cfg, tp)
        self.hooks = hooks

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        f, g = self.hooks.copy, self.hooks.reduce
        x = x + g(self.attn(f(self.attn_norm(x)), cos, sin))
        return x + g(self.mlp(f(self.mlp_norm(x))))


class Llama(nn.Module):
    """This chip's part of a Llama-style decoder.

    ``forward(idx [B, T] int64, targets [B, T] int64)`` returns the mean cross-entropy
    (0-dim float32). With tp > 1 the logits are this chip's V/tp vocabulary columns and the
    loss is computed over them (the max and sum-exp all-reduces of a vocabulary-parallel
    cross-entropy are priced by ``hooks``' owner, not here).

    ``loss_chunks`` > 1 computes the output projection and the loss over that many chunks of
    tokens, each recomputed in backward (activation checkpointing), so that the float32
    logits of only one chunk are alive at a time (the usual fix for large vocabularies).
    """

    def __init__(self, cfg: LlamaConfig, tp: int = 1, attention: str = "flash", hooks: TPHooks | None = None,
                 loss_chunks: int = 1):
        super().__init__()
        self.cfg = cfg
        self.loss_chunks = loss_chunks
        self.hooks = hooks or TPHooks()
        c = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size // tp, c)
        self.layers = nn.ModuleList(LlamaLayer(cfg, tp, attention, self.hooks) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(c)
        self.output = nn.Linear(c, cfg.vocab_size // tp, bias=False)
        d = cfg.head_dim
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device="cpu").float() / d))
        self._inv_freq = inv  # host; cos/sin tables are built on the model's device in forward

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.hooks.reduce(self.embed(idx))  # vocabulary-parallel lookup: partial sums
        freqs = torch.outer(torch.arange(T, dtype=torch.float32, device="cpu"), self._inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(idx.device)  # [T, D]
        cos, sin = emb.cos(), emb.sin()
        for layer in self.layers:
            x = layer(x, cos, sin)
        h = self.hooks.copy(self.norm(x))
        if self.loss_chunks <= 1:
            logits = self.output(h)  # [B, T, V/tp]
            return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))
        from torch.utils.checkpoint import checkpoint

        total = None
        for hc, tc in zip(h.reshape(B * T, -1).chunk(self.loss_chunks), targets.reshape(B * T).chunk(self.loss_chunks)):
            part = checkpoint(self._chunk_loss, hc, tc, use_reentrant=False, preserve_rng_state=False)
            total = part if total is None else total + part
        return total / (B * T)

    def _chunk_loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.output(h).float(), targets, reduction="sum")

