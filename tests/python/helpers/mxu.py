"""Hand-rounded oracles of the MXU's float32 matmul precisions (one bf16 pass, three passes)."""

import torch


def bf16(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bfloat16 and back to float32 (what one MXU pass reads)."""
    return t.to(torch.bfloat16).to(torch.float32)


def three_pass(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """XLA's HIGH (bf16_3x) by hand: a_hi*b_hi + a_hi*b_lo + a_lo*b_hi, in float64."""
    a_hi, b_hi = bf16(a), bf16(b)
    a_lo, b_lo = bf16(a - a_hi), bf16(b - b_hi)
    return a_hi.double() @ b_hi.double() + a_hi.double() @ b_lo.double() + a_lo.double() @ b_hi.double()
