"""AdamW with its first moment stored in another dtype: MaxText's ``opt_type=adamw`` with
``mu_dtype`` (optax's ``adamw(mu_dtype=...)``), which the TPU7x recipes of tpu-recipes set to
bfloat16 (github.com/AI-Hypercomputer/tpu-recipes, training/ironwood/*/run_recipe.sh).
"""

from __future__ import annotations

import math

import torch


class AdamWMu(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's update: decoupled weight decay, bias-corrected moments) whose
    first moment ``exp_avg`` is stored in ``mu_dtype``; the second moment keeps the parameter's
    dtype. As optax's ``scale_by_adam``, each step computes the new first moment in the
    gradient's dtype from the stored one, uses that unrounded value for the update, and stores
    it cast to ``mu_dtype``. State per element: ``mu_dtype``'s size + the parameter's (bf16 first
    moment of float32 parameters: 6 bytes instead of 8).

    Raises ValueError for a ``mu_dtype`` that is not a floating dtype or a non-positive ``lr``.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 mu_dtype: torch.dtype = torch.bfloat16):
        if not isinstance(mu_dtype, torch.dtype) or not mu_dtype.is_floating_point:
            raise ValueError(f"AdamWMu: mu_dtype must be a floating torch.dtype, got {mu_dtype!r}")
        if not lr > 0:
            raise ValueError(f"AdamWMu: lr must be positive, got {lr!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.mu_dtype = mu_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.mu_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                mu = torch.lerp(state["exp_avg"].to(g.dtype), g, 1 - b1)  # b1 * mu + (1 - b1) * g
                state["exp_avg"].copy_(mu)
                nu = state["exp_avg_sq"]
                nu.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (nu.sqrt() / math.sqrt(1 - b2**t)).add_(eps)
                p.mul_(1 - lr * wd)
                p.addcdiv_(mu, denom, value=-lr / (1 - b1**t))
        return loss
