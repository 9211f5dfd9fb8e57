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

from ..remat import tag


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
    # Qwen3-style options (0 / False: Llama's). head_size: per-head width D when it is not
    # C / H (Qwen3's head_dim); qk_norm: RMSNorm of each query and key head (Qwen3).
    head_size: int = 0
    qk_norm: bool = False
    # Mixture of experts (n_experts > 0): every layer's MLP is a router over n_experts SwiGLU
    # experts of width moe_ffn_dim, top_k of them per token (weights renormalised), plus
    # n_shared_experts always-on experts of width shared_ffn_dim (Qwen2-MoE / DeepSeek style;
    # Qwen3-MoE has none).
    n_experts: int = 0
    top_k: int = 0
    moe_ffn_dim: int = 0
    n_shared_experts: int = 0
    shared_ffn_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def _attn_params(self) -> int:
        c, d = self.d_model, self.head_dim
        return c * (self.n_heads + 2 * self.n_kv_heads) * d + self.n_heads * d * c + (2 * d if self.qk_norm else 0)

    def _mlp_params(self, active: bool) -> int:
        c = self.d_model
        if not self.is_moe:
            return 3 * c * self.ffn_dim
        experts = self.top_k if active else self.n_experts
        shared = self.n_shared_experts * 3 * c * self.shared_ffn_dim
        return c * self.n_experts + experts * 3 * c * self.moe_ffn_dim + shared

    def num_params(self, active: bool = False) -> int:
        """Parameters of the whole (unsharded) model: embedding, per layer attention
        (C·(H + 2K)·D + H·D·C, + 2·D with qk_norm), MLP (3·C·F; MoE: router C·E, E experts of
        3·C·F_moe, shared experts) and two RMSNorm weights, final norm, output. ``active``:
        those one token uses (MoE: top_k experts), the N of 6·N FLOPs per token."""
        c = self.d_model
        layer = self._attn_params() + self._mlp_params(active) + 2 * c
        return 2 * self.vocab_size * c + self.n_layers * layer + c

    def validate(self) -> None:
        """Raises ValueError for sizes that do not make a model."""
        optional = {"head_size", "n_experts", "top_k", "moe_ffn_dim", "n_shared_experts", "shared_ffn_dim"}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "qk_norm":
                if not isinstance(v, bool):
                    raise ValueError(f"Llama config: qk_norm must be true or false, got {v!r}")
                continue
            low = 0 if f.name in optional else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:  # JSON true is not 1 layer
                what = "a non-negative" if low == 0 else "a positive"
                raise ValueError(f"Llama config: {f.name} must be {what} integer, got {v!r}")
        if self.is_moe:
            if not 1 <= self.top_k <= self.n_experts:
                raise ValueError(f"Llama config: top_k {self.top_k} must be between 1 and n_experts {self.n_experts}")
            if self.moe_ffn_dim < 1:
                raise ValueError("Llama config: a mixture of experts needs moe_ffn_dim (the expert MLP width)")
            if self.n_shared_experts and self.shared_ffn_dim < 1:
                raise ValueError("Llama config: n_shared_experts needs shared_ffn_dim")
        if not self.head_size and self.d_model % self.n_heads:
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


# Hugging Face config.json keys (Llama, Qwen3, Qwen3-MoE, Qwen2-MoE, DeepSeek) -> LlamaConfig fields.
_HF_KEYS = {"num_hidden_layers": "n_layers", "hidden_size": "d_model", "num_attention_heads": "n_heads",
            "num_key_value_heads": "n_kv_heads", "intermediate_size": "ffn_dim",
            "max_position_embeddings": "seq_len", "head_dim": "head_size", "num_experts": "n_experts",
            "n_routed_experts": "n_experts", "num_local_experts": "n_experts", "num_experts_per_tok": "top_k",
            "moe_intermediate_size": "moe_ffn_dim", "n_shared_experts": "n_shared_experts",
            "shared_expert_intermediate_size": "shared_ffn_dim"}


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
        names = {f.name for f in dataclasses.fields(LlamaConfig)}
        values = {}
        for k, v in raw.items():
            k = _HF_KEYS.get(k, k)
            if k in names:
                values[k] = v
        if str(raw.get("model_type", "")).startswith("qwen3"):
            values.setdefault("qk_norm", True)  # Qwen3 normalises each query / key head
        if "head_size" in values and values["head_size"] is None:
            del values["head_size"]
        if values.get("n_experts") and "shared_expert_intermediate_size" in raw:
            values.setdefault("n_shared_experts", 1)  # Qwen2-MoE: one shared expert of that width
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
    all_to_all: Callable[[torch.Tensor], torch.Tensor] = _identity  # MoE token exchange over ep


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary positions: [B, T, C] -> [B, T, C] (this
    chip's heads; the caller all-reduces the output when tensor-parallel). The projections
    and the attention kernel's output carry MaxText's checkpoint names (``remat.tag``)."""

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
        self.q_norm = RMSNorm(self.d) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.d) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        with tag("query_proj"):
            q = self.wq(x)
        with tag("key_proj"):
            k = self.wk(x)
        with tag("value_proj"):
            v = self.wv(x)
        q = q.view(B, T, self.h, self.d)
        k = k.view(B, T, self.kv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, h, T, D]
        v = v.view(B, T, self.kv, self.d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # keep q, k in the compute dtype
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        with tag("context"):
            if self.attention == "flash":
                # PyTorch's fused kernel: scores never reach HBM, as with a TPU's flash attention.
                if self.kv != self.h:
                    k = k.repeat_interleave(self.h // self.kv, dim=1)
                    v = v.repeat_interleave(self.h // self.kv, dim=1)
                y = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        with tag("out_proj"):
            return self.wo(y.transpose(1, 2).reshape(B, T, self.h * self.d))


class SwiGLUGate(torch.autograd.Function):
    """``silu(a) * b`` whose backward is one elementwise computation of ``da`` and ``db`` from the
    saved ``a``, ``b`` and the incoming gradient ``g``, as a compiler's fused backward computes it:
    ``s = sigmoid(a)``, ``db = g·a·s``, ``da = g·b·s·(1 + a·(1 - s))``. Autograd's own formula
    would also keep ``silu(a)`` and the two partial products alive; XLA's step does not.

    ``consume`` (the caller owns ``a`` and ``b``: no one reads them after this backward): the
    results are written into the buffers of the inputs that die here (``da`` into ``b``'s,
    ``db`` into ``g``'s, ``a`` holding ``s·(1 + a·(1 - s))`` on the way), as XLA's buffer
    assignment gives an elementwise fusion's output the buffer of an operand whose last use it
    is: the backward allocates only ``s`` ([..., F]), not two new [..., F] results. A second
    backward through the same graph then raises autograd's in-place error instead of reading
    the overwritten inputs."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, consume: bool = False) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.consume = consume
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        a, b = ctx.saved_tensors
        s = torch.sigmoid(a)
        if (not ctx.consume or torch.is_grad_enabled()
                or not (a.shape == b.shape == g.shape and a.dtype == b.dtype == g.dtype)
                or not all(t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
                           for t in (a, b, g))):  # each the whole of its buffer
            return g * b * s * (1 + a * (1 - s)), g * a * s, None
        b.mul_(g)                                    # g·b
        g.mul_(a).mul_(s)                            # db = g·a·s
        a.addcmul_(a, s, value=-1).add_(1).mul_(s)   # s·(1 + a·(1 - s))
        return b.mul_(a), g, None                    # da = g·b·s·(1 + a·(1 - s)), db


def swiglu(a: torch.Tensor, b: torch.Tensor, consume: bool = False) -> torch.Tensor:
    """``silu(a) * b`` with :class:`SwiGLUGate`'s backward: [..., F], [..., F] -> [..., F].
    ``consume``: ``a`` and ``b`` are the caller's temporaries (see :class:`SwiGLUGate`)."""
    return SwiGLUGate.apply(a, b, consume)


class LlamaMLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), this chip's F/tp columns (``width``: F, default the
    config's MLP width)."""

    def __init__(self, cfg: LlamaConfig, tp: int, width: int | None = None):
        super().__init__()
        f = (width or cfg.ffn_dim) // tp
        self.w1 = nn.Linear(cfg.d_model, f, bias=False)
        self.w3 = nn.Linear(cfg.d_model, f, bias=False)
        self.w2 = nn.Linear(f, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with tag("mlpwi_0"):
            a = self.w1(x)
        with tag("mlpwi_1"):
            b = self.w3(x)
        with tag("mlpwo", residual=False):  # feeds only the residual add
            return self.w2(swiglu(a, b, consume=True))  # a, b: this forward's own


class MoEMLP(nn.Module):
    """Mixture of experts: a router (C -> E, softmax, top-k, weights renormalised as Qwen3's
    norm_topk_prob), this chip's E/ep experts as stacked SwiGLU weights [E/ep, C, F_moe/tp]
    applied by batched matmuls (a grouped matmul with balanced groups), shared experts, and the
    token exchange: ``all_to_all`` (priced by the caller: dispatch, then combine, each way in the
    backward too). [B, T, C] -> [B, T, C].

    Routing is balanced: each local expert gets N·k/(E/ep) tokens of the N·k assignments
    the chip's N tokens make (an equal share; real routers are ragged, dropless kernels pad
    per group).
    """

    def __init__(self, cfg: LlamaConfig, tp: int, ep: int, all_to_all: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        c, f = cfg.d_model, cfg.moe_ffn_dim // tp
        self.k = cfg.top_k
        self.local = cfg.n_experts // ep
        self.router = nn.Linear(c, cfg.n_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(self.local, c, f))
        self.w3 = nn.Parameter(torch.empty(self.local, c, f))
        self.w2 = nn.Parameter(torch.empty(self.local, f, c))
        self.shared = nn.ModuleList(LlamaMLP(cfg, tp, cfg.shared_ffn_dim) for _ in range(cfg.n_shared_experts))
        self.all_to_all = all_to_all

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        n = B * T
        h = x.reshape(n, C)
        probs = F.softmax(self.router(h).float(), dim=-1)
        w, idx = probs.topk(self.k, dim=-1)  # [N, k]
        w = w / w.sum(dim=-1, keepdim=True)
        order = idx.reshape(-1).argsort()  # assignments grouped by expert
        xs = self.all_to_all(h.index_select(0, order // self.k))  # [N·k, C], dispatched
        per = -(-n * self.k // self.local)
        pad = self.local * per - n * self.k
        if pad:
            xs = F.pad(xs, (0, 0, 0, pad))
        xe = xs.view(self.local, per, C)
        with tag("mlpwi_0"):
            a = torch.bmm(xe, self.w1)  # autocast: bf16 operands
        with tag("mlpwi_1"):
            b = torch.bmm(xe, self.w3)
        with tag("mlpwo"):
            y = torch.bmm(swiglu(a, b, consume=True), self.w2)  # a, b: this forward's own
        y = self.all_to_all(y.reshape(-1, C)[: n * self.k])  # combined back to the tokens' chips
        out = torch.empty_like(y).index_copy(0, order, y).view(n, self.k, C)
        # Weighted sum over the k experts as one batched matmul [N, 1, k] @ [N, k, C] (autocast
        # keeps it bf16; a sum would be upcast to float32).
        out = torch.bmm(w.unsqueeze(1).to(out.dtype), out).view(B, T, C)
        for s in self.shared:
            out = out + s(x)
        return out


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Output in the input's dtype (bf16 activations under autocast, as MaxText's RMSNorm;
        # autocast would run rms_norm in float32).
        with torch.autocast(x.device.type, enabled=False):
            return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class LlamaLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); [B, T, C] -> [B, T, C]. The MLP is a
    mixture of experts when the config has experts (``ep``: expert-parallel size)."""

    def __init__(self, cfg: LlamaConfig, tp: int, attention: str, hooks: TPHooks, ep: int = 1):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = LlamaAttention(cfg, tp, attention)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = MoEMLP(cfg, tp, ep, hooks.all_to_all) if cfg.is_moe else LlamaMLP(cfg, tp)
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
                 loss_chunks: int = 1, ep: int = 1):
        super().__init__()
        self.cfg = cfg
        self.loss_chunks = loss_chunks
        self.hooks = hooks or TPHooks()
        c = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size // tp, c)
        self.layers = nn.ModuleList(LlamaLayer(cfg, tp, attention, self.hooks, ep) for _ in range(cfg.n_layers))
        self.head = LlamaHead(cfg, tp, self.hooks, loss_chunks)
        d = cfg.head_dim
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device="cpu").float() / d))
        self._inv_freq = inv  # host; cos/sin tables are built on the model's device in forward

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.hooks.reduce(self.embed(idx))  # vocabulary-parallel lookup: partial sums
        if torch.is_autocast_enabled(idx.device.type):
            # Activations in the compute dtype (MaxText's dtype=bfloat16): the residual stream,
            # the layer inputs checkpointing keeps and the tokens MoE exchanges are bf16.
            x = x.to(torch.get_autocast_dtype(idx.device.type))
        freqs = torch.outer(torch.arange(T, dtype=torch.float32, device="cpu"), self._inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(idx.device)  # [T, D]
        cos, sin = emb.cos(), emb.sin()
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(x, targets)


class LlamaHead(nn.Module):
    """Final RMSNorm, output projection (this chip's V/tp columns) and the mean cross-entropy:
    ``forward(x [B, T, C], targets [B, T] int64)`` -> 0-dim float32. One module so that FSDP
    gathers the output projection once for all loss chunks (its own unit, as TorchTitan shards
    ``[norm, output]``). ``loss_chunks``: see :class:`Llama`."""

    def __init__(self, cfg: LlamaConfig, tp: int, hooks: TPHooks, loss_chunks: int):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size // tp, bias=False)
        self.hooks = hooks
        self.loss_chunks = loss_chunks

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = targets.shape
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
