"""The demo's GPT: a decoder-only transformer over byte tokens, its named sizes and its AdamW.

The demo (``torch_tpu.demo``) trains it; the estimator prices it (``--model gpt-small``).
Shapes use B = batch, T = sequence length (tokens), C = ``d_model``, H = heads,
D = C / H (head size), V = vocabulary size (256 for bytes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Model hyper-parameters. ``seq_len`` is the longest context (learned positions)."""

    vocab_size: int = 256
    seq_len: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    mlp_ratio: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


# Named sizes for --model-size. "small" is the default (about 5 M parameters at
# seq_len 256); parameters ~= 12 * n_layer * d_model^2 + (V + T) * d_model.
PRESETS = {
    "tiny": dict(n_layer=2, n_head=2, d_model=64),
    "small": dict(n_layer=6, n_head=8, d_model=256),
    "base": dict(n_layer=8, n_head=8, d_model=384),
}


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask: x [B, T, C] -> [B, T, C]."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model {cfg.d_model} is not a multiple of n_head {cfg.n_head}")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each [B, T, C]
        # [B, T, C] -> [B, H, T, D]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); [B, T, C] -> [B, T, C]."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(approximate="tanh"),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, ``n_layer`` blocks, final layer norm, and an
    output projection tied to the token embedding.

    ``forward(idx [B, T] int64, targets [B, T] int64 | None)`` returns
    ``(logits [B, T, V] float32, loss)`` where ``loss`` is the mean cross-entropy in nats
    per token (a 0-dim tensor) or None without targets. T must be <= ``cfg.seq_len``.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def _apply(self, fn, *args, **kwargs):
        # Module._apply may replace each parameter with a new one when moving between
        # devices (it does for tpu), which would untie head.weight from tok_emb.weight.
        out = super()._apply(fn, *args, **kwargs)
        self.head.weight = self.tok_emb.weight
        return out

    def num_params(self) -> int:
        """Number of distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's seq_len {self.cfg.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # [B, T, V]
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 top_k: int | None = 40, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``idx [B, T0]``; returns ``[B, T0 + max_new_tokens]``.

        Sampling draws on the host (``generator`` is a CPU generator) so that it is
        reproducible independently of the device's random state.
        """
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.cfg.seq_len:]
            logits, _ = self(ctx)
            logits = logits[:, -1, :].float().cpu() / max(temperature, 1e-6)  # [B, V]
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)  # [B, 1]
            idx = torch.cat([idx, nxt.to(idx.device)], dim=1)
        return idx


def demo_gpt(preset: str = "small", seq_len: int = 128, **overrides) -> GPT:
    """The GPT with a named size (tiny, small, base), e.g. as an estimator factory."""
    if preset not in PRESETS:
        raise ValueError(f"unknown GPT preset '{preset}'; valid: {', '.join(PRESETS)}")
    return GPT(GPTConfig(seq_len=seq_len, **{**PRESETS[preset], **overrides}))


def make_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """The demo's AdamW, betas (0.9, 0.95); weight decay on matrices only (not biases, norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
