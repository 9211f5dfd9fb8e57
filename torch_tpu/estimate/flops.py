"""Model FLOPs of a training step and MFU: the one formula the estimator and the demo report.

Training FLOPs are forward + backward = 3 x forward; a matmul parameter costs 2 FLOPs per
token forward, so a dense model costs 6·N per token (the 6·N·T rule, attention not counted).
"""

from __future__ import annotations

from .models.gpt import PRESETS as GPT_PRESETS


def dense_flops_per_token(params: int) -> float:
    """6·N: training FLOPs per token of ``params`` matmul parameters."""
    return 6.0 * params


def model_flops_per_token(spec, params: int, causal: bool = False) -> float:
    """Training FLOPs per token of ``spec`` (a ``core.ModelSpec``) used for MFU.

    Llama: 6·(N - V·C) for the matmul parameters (the input embedding is a lookup; the
    untied output projection counts; mixture of experts: the parameters a token uses, top_k
    experts of n_experts) plus attention's 12·L·(H·D)·T (PaLM, arXiv 2204.02311, App. B; H·D = C
    for Llama), or 6·L·(H·D)·T with ``causal`` (the masked half skipped: MaxText's accounting
    since its PR #1988). GPT (tied embedding, counted once as the output projection): 6·N plus the
    same attention term. Other models: 6·N (the demo's rule).
    """
    attn = 6.0 if causal else 12.0
    if spec.kind == "llama":
        c = spec.llama
        if c.is_moe:
            params = c.num_params(active=True)
        width = c.n_heads * c.head_dim
        return dense_flops_per_token(params - c.vocab_size * c.d_model) + attn * c.n_layers * width * c.seq_len
    if spec.kind == "gpt":
        p = GPT_PRESETS[spec.gpt_preset]
        return dense_flops_per_token(params) + attn * p["n_layer"] * p["d_model"] * spec.seq_len
    return dense_flops_per_token(params)


def mfu(model_flops_per_step: float, step_time_s: float | None, peak_flops: float, chips: int = 1
        ) -> float | None:
    """Model FLOPs utilisation: the step's model FLOPs over what ``chips`` chips at ``peak_flops``
    (FLOP/s each) could do in ``step_time_s``; None without a step time."""
    if not step_time_s:
        return None
    return model_flops_per_step / (chips * step_time_s * peak_flops)
