"""``splash_sdpa``: blocked (flash) attention with causal and local-window masks and grouped K/V heads.

Forward and backward are ``torch.library`` custom ops (``torch.ops.tpu.splash_attention`` and
``torch.ops.tpu.splash_attention_backward``) with fake kernels and autograd, so they trace under
``torch.compile(backend="tpu")`` as library calls. Both run ATen's blocked attention kernel
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward) on the chip: the T x S scores
exist one block at a time in the kernel's host scratch (a TPU keeps them in VMEM), never in HBM,
which holds q, k, v, the output, the per-row log-sum-exp and the gradients. A local window runs
one query block (``block_q`` rows) at a time over the key range the window reaches, with a
``block_q`` x range mask, so its cost and memory grow with T x window, not T x T.
``F.scaled_dot_product_attention`` on tpu takes the same kernel where its arguments allow
(csrc/aten/ops_attention.cc).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading

import torch

__all__ = ["splash_sdpa"]

_LAYOUTS = ("HEAD_DIM_MINOR", "SEQ_MINOR")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _positive_int(name: str, value, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        what = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"splash_sdpa: {name} must be {what}, got {value!r}")


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> None:
    """Shape, dtype and device checks (no tensor values); raised at the call and by the fake kernel."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"splash_sdpa: {name} must be a Tensor, got {type(t).__name__}")
    if q.dim() not in (3, 4):
        raise ValueError(f"splash_sdpa: q must be [B, H, T, D] or [H, T, D], got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"splash_sdpa: {name} has {t.dim()} dimensions, q has {q.dim()} "
                             f"(shapes q {tuple(q.shape)}, {name} {tuple(t.shape)})")
    if q.dtype not in _FLOATS:
        raise TypeError(f"splash_sdpa: q must be float32, bfloat16, float16 or float64, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"splash_sdpa: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"splash_sdpa: {name} is on {t.device}, q on {q.device}")
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"splash_sdpa: {name} head dim {t.shape[-1]} differs from q head dim {q.shape[-1]} "
                             f"(shapes q {tuple(q.shape)}, {name} {tuple(t.shape)})")
    if q.dim() == 4 and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"splash_sdpa: batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"splash_sdpa: k has {k.shape[-2]} keys, v has {v.shape[-2]} values")
    if k.shape[-3] != v.shape[-3]:
        raise ValueError(f"splash_sdpa: k has {k.shape[-3]} heads, v has {v.shape[-3]}")
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq != hkv:
        if not enable_gqa:
            raise ValueError(f"splash_sdpa: q has {hq} heads, k and v have {hkv}: pass enable_gqa=True for "
                             "grouped-query attention")
        if hkv == 0 or hq % hkv:
            raise ValueError(f"splash_sdpa: with enable_gqa, q's {hq} heads must be a multiple of k's {hkv} heads")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"splash_sdpa: q and k need at least one position, got {q.shape[-2]} queries and "
                         f"{k.shape[-2]} keys")


def _span(i0: int, i1: int, keys: int, window: int, is_causal: bool) -> tuple[int, int]:
    """Keys [k0, k1) that queries [i0, i1) can reach through the window."""
    k0 = max(0, i0 - window + 1)
    k1 = min(keys, i1 if is_causal else i1 + window - 1)
    return k0, max(k0, k1)


def _window_mask(i0: int, i1: int, k0: int, k1: int, window: int, is_causal: bool, like: torch.Tensor):
    """Additive mask [i1 - i0, k1 - k0]: 0 where key j is within the window of query i, -inf elsewhere."""
    i = torch.arange(i0, i1).unsqueeze(1)
    j = torch.arange(k0, k1).unsqueeze(0)
    keep = (i - j < window) & ((j <= i) if is_causal else (j - i < window))
    mask = torch.zeros(keep.shape, dtype=like.dtype).masked_fill_(~keep, float("-inf"))
    return mask.to(like.device)


def _windowed(window: int, queries: int, keys: int, is_causal: bool) -> bool:
    """Whether the window masks anything beyond what is_causal already does."""
    if window <= 0:
        return False
    reach_back = queries - 1  # the farthest any query looks back (i - j <= T - 1 for j >= 0)
    reach_fwd = 0 if is_causal else keys - 1
    return window <= max(reach_back, reach_fwd)


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@torch.library.custom_op("tpu::splash_attention", mutates_args=())
def _splash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, is_causal: bool, window: int,
                      block_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check_tensors(q, k, v, True)
    groups = q.shape[1] // k.shape[1]
    k, v = _expand(k, groups), _expand(v, groups)
    T, S = q.shape[2], k.shape[2]
    if not _windowed(window, T, S, is_causal):
        out, lse = _flash(q, k, v, 0.0, is_causal, scale=scale)
        return out.contiguous(), lse.contiguous()
    outs, lses = [], []
    for i0 in range(0, T, block_q):
        i1 = min(T, i0 + block_q)
        k0, k1 = _span(i0, i1, S, window, is_causal)
        if k1 == k0:  # no key in reach: zero output, -inf log-sum-exp (as an empty softmax)
            outs.append(q.new_zeros(q.shape[0], q.shape[1], i1 - i0, v.shape[3]))
            lses.append(torch.full((q.shape[0], q.shape[1], i1 - i0), float("-inf"), device=q.device))
            continue
        mask = _window_mask(i0, i1, k0, k1, window, is_causal, q)
        o, lse = _flash(q[:, :, i0:i1], k[:, :, k0:k1], v[:, :, k0:k1], 0.0, False, attn_mask=mask, scale=scale)
        outs.append(o)
        lses.append(lse.float())
    return torch.cat(outs, 2), torch.cat(lses, 2)


@_splash_attention.register_fake
def _(q, k, v, scale, is_causal, window, block_q):
    _check_tensors(q, k, v, True)
    B, H, T, D = q.shape
    return q.new_empty((B, H, T, D)), q.new_empty((B, H, T), dtype=torch.float32)


@torch.library.custom_op("tpu::splash_attention_backward", mutates_args=())
def _splash_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, scale: float, is_causal: bool, window: int,
                               block_q: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups = q.shape[1] // k.shape[1]
    ke, ve = _expand(k, groups), _expand(v, groups)
    T, S = q.shape[2], ke.shape[2]
    grad = grad.contiguous()
    if not _windowed(window, T, S, is_causal):
        dq, dk, dv = _flash_bwd(grad, q, ke, ve, out, lse, 0.0, is_causal, scale=scale)
    else:
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        dq = torch.zeros_like(q)
        dk = torch.zeros(ke.shape, dtype=acc, device=q.device)
        dv = torch.zeros(ve.shape, dtype=acc, device=q.device)
        for i0 in range(0, T, block_q):
            i1 = min(T, i0 + block_q)
            k0, k1 = _span(i0, i1, S, window, is_causal)
            if k1 == k0:
                continue
            mask = _window_mask(i0, i1, k0, k1, window, is_causal, q)
            dqb, dkb, dvb = _flash_bwd(grad[:, :, i0:i1], q[:, :, i0:i1], ke[:, :, k0:k1], ve[:, :, k0:k1],
                                       out[:, :, i0:i1], lse[:, :, i0:i1].contiguous(), 0.0, False, attn_mask=mask,
                                       scale=scale)
            dq[:, :, i0:i1] = dqb
            dk[:, :, k0:k1] += dkb
            dv[:, :, k0:k1] += dvb
    if groups > 1:  # each K/V head's gradient is the sum over the query heads that share it
        B, H, _, D = dk.shape
        dk = dk.view(B, H // groups, groups, S, D).sum(2)
        dv = dv.view(B, H // groups, groups, S, D).sum(2)
    return dq.contiguous(), dk.to(q.dtype).contiguous(), dv.to(q.dtype).contiguous()


@_splash_attention_backward.register_fake
def _(grad, q, k, v, out, lse, scale, is_causal, window, block_q):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, scale, is_causal, window, block_q = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (scale, is_causal, window, block_q)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        return None, None, None, None, None, None, None
    dq, dk, dv = torch.ops.tpu.splash_attention_backward(grad_out, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None


_splash_attention.register_autograd(_backward, setup_context=_setup)


def splash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                is_causal: bool = True, local_window_size: int | None = None, enable_gqa: bool = False,
                block_q: int = 512, block_kv: int = 512, block_dkv: int = 512, block_kv_compute: int = 512,
                block_q_dkv: int = 512, block_kv_dkv: int = 512, block_kv_dkv_compute: int = 512,
                block_q_dq: int | None = None, block_kv_dq: int | None = None, use_fused_bwd_kernel: bool = True,
                use_vmap_bwd: bool = True, q_layout: str = "HEAD_DIM_MINOR", k_layout: str = "HEAD_DIM_MINOR",
                v_layout: str = "HEAD_DIM_MINOR") -> torch.Tensor:
    """Blocked (flash / splash) attention ``softmax(q k^T * scale + mask) v``, differentiable in q, k, v.

    Shapes: ``q`` is ``[B, Hq, T, D]`` (or ``[Hq, T, D]``), ``k`` and ``v`` are ``[B, Hkv, S, D]``
    with the same dtype (float32, bfloat16, float16, float64) and device; the result is
    ``[B, Hq, T, D]`` in q's dtype. ``scale`` defaults to ``1 / sqrt(D)``.

    Masks: query ``i`` may attend key ``j`` when ``j <= i`` if ``is_causal`` (top-left aligned, as
    ``F.scaled_dot_product_attention``), and, with ``local_window_size = W``, when ``i - j < W``
    (the W most recent keys including its own position) and, if not causal, ``j - i < W``.
    With ``enable_gqa=True``, ``Hq`` may be a multiple of ``Hkv`` (grouped-query / multi-query
    attention): query head ``h`` uses K/V head ``h // (Hq // Hkv)``, as in SDPA.

    No T x S buffer is ever in HBM, forward or backward (the kernel's score blocks are host
    scratch, as they are VMEM on a TPU). ``block_q`` sets the query rows per masked block of
    a local window; the other ``block_*`` sizes, ``use_fused_bwd_kernel``, ``use_vmap_bwd`` and
    the ``*_layout`` names (``"HEAD_DIM_MINOR"`` or ``"SEQ_MINOR"``; tensors are always given as
    ``[..., T, D]``) are TorchTPU's Pallas kernel's tiling and layout choices: checked, then
    unused by the vTPU's kernel. Which kernel runs is chosen with :func:`implementation` (a
    context manager of this module, not in TorchTPU's signature): ``"flash"`` (default, ATen's
    blocked kernel on the chip) or ``"pallas"`` (JAX's splash kernel run by ``torch.tpu.pallas``
    in Pallas's TPU interpret mode: needs the ``pallas`` extra; forward only, no local window —
    NotImplementedError otherwise; block sizes must divide the sequence lengths).

    Raises TypeError for non-tensors, a dtype mismatch or an unsupported dtype; ValueError naming
    the argument for a rank, batch, head-count or head-dim mismatch (``v``'s head dim must equal
    ``q``'s), K/V heads that differ from q's without ``enable_gqa`` or do not divide them, tensors
    on different devices, empty sequences, a ``local_window_size`` or block size that is not a
    positive int, or an unknown layout.
    """
    _check_tensors(q, k, v, enable_gqa)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                              or not math.isfinite(scale)):
        raise ValueError(f"splash_sdpa: scale must be a finite float or None, got {scale!r}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"splash_sdpa: is_causal must be a bool, got {is_causal!r}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"splash_sdpa: enable_gqa must be a bool, got {enable_gqa!r}")
    _positive_int("local_window_size", local_window_size, optional=True)
    for name, value in (("block_q", block_q), ("block_kv", block_kv), ("block_dkv", block_dkv),
                        ("block_kv_compute", block_kv_compute), ("block_q_dkv", block_q_dkv),
                        ("block_kv_dkv", block_kv_dkv), ("block_kv_dkv_compute", block_kv_dkv_compute)):
        _positive_int(name, value)
    _positive_int("block_q_dq", block_q_dq, optional=True)
    _positive_int("block_kv_dq", block_kv_dq, optional=True)
    for name, value in (("use_fused_bwd_kernel", use_fused_bwd_kernel), ("use_vmap_bwd", use_vmap_bwd)):
        if not isinstance(value, bool):
            raise TypeError(f"splash_sdpa: {name} must be a bool, got {value!r}")
    for name, value in (("q_layout", q_layout), ("k_layout", k_layout), ("v_layout", v_layout)):
        if value not in _LAYOUTS:
            raise ValueError(f"splash_sdpa: {name} must be one of {_LAYOUTS}, got {value!r}")
    unbatched = q.dim() == 3
    if unbatched:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    s = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = _IMPLEMENTATIONS[_choice.name](q, k, v, s, is_causal, local_window_size or 0, int(block_q))
    return out.squeeze(0) if unbatched else out


def _flash_implementation(q, k, v, scale, is_causal, window, block_q):
    return torch.ops.tpu.splash_attention(q, k, v, scale, is_causal, window, block_q)[0]


def _pallas_implementation(q, k, v, scale, is_causal, window, block_q):
    # JAX's splash kernel in Pallas's TPU interpret mode (the pallas extra); forward only, full or causal mask.
    if window:
        raise NotImplementedError("splash_sdpa: the 'pallas' implementation has no local window; use 'flash'")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("splash_sdpa: the 'pallas' implementation has no backward (JAX's splash kernel "
                                  "is wrapped forward only); use 'flash' for training")
    from torch_tpu.tpu.pallas import kernels  # imports JAX: only when asked for

    if k.shape[1] != q.shape[1]:  # grouped-query: the kernel takes as many K/V heads as query heads
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return kernels.splash_attention(q, k, v, causal=is_causal, scale=scale, block_q=block_q)


# name -> fn(q, k, v, scale, is_causal, window (0: none), block_q) -> out [B, Hq, T, D].
_IMPLEMENTATIONS = {"flash": _flash_implementation, "pallas": _pallas_implementation}
class _Choice(threading.local):
    name = "flash"


_choice = _Choice()


@contextlib.contextmanager
def implementation(name: str):
    """Run :func:`splash_sdpa` calls of this thread inside the block with kernel ``name``
    (``"flash"``, the default, or ``"pallas"``); ValueError for another name."""
    if name not in _IMPLEMENTATIONS:
        raise ValueError(f"splash_sdpa: implementation must be one of {sorted(_IMPLEMENTATIONS)}, got {name!r}")
    previous, _choice.name = _choice.name, name
    try:
        yield
    finally:
        _choice.name = previous
