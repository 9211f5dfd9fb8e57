"""The TPU kernels that ship with JAX (``jax.experimental.pallas.ops.tpu``) as PyTorch ops.

Each is a :func:`torch.tpu.pallas.jax_op` in the ``tpu_pallas`` namespace, running JAX's own
Pallas kernel in TPU interpret mode on tpu tensors (also on CPU tensors). Shapes follow the
JAX kernels; block sizes must divide the sequence lengths (ValueError naming the op if not).

* :func:`flash_attention` — ``q, k, v: [B, H, T, D]`` (``jax...ops.tpu.flash_attention``).
* :func:`splash_attention` — ``q: [B, H, T, D]``, ``k, v: [B, H, S, D]``, full or causal mask
  (``jax...ops.tpu.splash_attention``, multi-head); :func:`splash_sdpa` is the same with
  ``torch.nn.functional.scaled_dot_product_attention``'s arguments, for
  ``torch.tpu.ops.splash_sdpa(..., implementation="pallas")``.
* :func:`ragged_paged_attention` — paged KV-cache attention over ragged sequences
  (``jax...ops.tpu.ragged_paged_attention``).
* :func:`gmm` — megablox grouped matmul ``lhs: [M, K]``, ``rhs: [G, K, N]``,
  ``group_sizes: int32[G]`` summing to M (``jax...ops.tpu.megablox``).
"""

from __future__ import annotations

import torch

from . import _jax
from ._op import jax_op

jax = _jax.jax()
jnp = jax.numpy

from jax.experimental.pallas.ops.tpu import flash_attention as _fa  # noqa: E402
from jax.experimental.pallas.ops.tpu import megablox as _megablox  # noqa: E402
from jax.experimental.pallas.ops.tpu import ragged_paged_attention as _rpa  # noqa: E402
from jax.experimental.pallas.ops.tpu import splash_attention as _splash  # noqa: E402

__all__ = ["flash_attention", "gmm", "ragged_paged_attention", "splash_attention", "splash_sdpa"]


def _divides(op: str, what: str, size: int, block: int) -> None:
    if size % block:
        raise ValueError(f"{op}: block size {block} does not divide {what} {size}; pass a block that divides it")


@jax_op("tpu_pallas::flash_attention")
def _flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, sm_scale: float, block_q: int,
                     block_k: int) -> jax.Array:
    t, s = q.shape[2], k.shape[2]
    _divides("tpu_pallas::flash_attention", "q's sequence length", t, block_q)
    _divides("tpu_pallas::flash_attention", "k's sequence length", s, block_k)
    bs = _fa.BlockSizes(block_q=block_q, block_k_major=block_k, block_k=block_k, block_b=1)
    return _fa.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, block_sizes=bs)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    sm_scale: float = 1.0, block_q: int = 128, block_k: int = 128) -> torch.Tensor:
    """softmax(sm_scale · q kᵀ (+ causal mask)) v by JAX's Pallas flash-attention kernel.

    q, k, v: [B, H, T, D] (same T for k and v as q's S); returns [B, H, T, D]. ``block_q`` /
    ``block_k`` are clipped to the sequence lengths and must divide them.
    """
    return _flash_attention(q, k, v, causal, float(sm_scale), min(block_q, q.shape[2]), min(block_k, k.shape[2]))


@jax_op("tpu_pallas::splash_attention")
def _splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, scale: float, block_q: int,
                      block_kv: int) -> jax.Array:
    _, h, t, _ = q.shape
    s = k.shape[2]
    _divides("tpu_pallas::splash_attention", "q's sequence length", t, block_q)
    _divides("tpu_pallas::splash_attention", "k's sequence length", s, block_kv)
    one = _splash.CausalMask((t, s)) if causal else _splash.FullMask((t, s))
    kernel = _splash.make_splash_mha_single_device(
        _splash.MultiHeadMask([one] * h),
        block_sizes=_splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv))
    scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
    return jax.vmap(kernel)(scaled, k, v)


def splash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     scale: float | None = None, block_q: int = 128, block_kv: int = 128) -> torch.Tensor:
    """Attention by JAX's Pallas splash-attention kernel (multi-head, full or causal mask).

    q: [B, H, T, D], k, v: [B, H, S, D]; scale defaults to 1/sqrt(D); returns [B, H, T, D].
    Blocks are clipped to the sequence lengths and must divide them.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _splash_attention(q, k, v, causal, scale, min(block_q, q.shape[2]), min(block_kv, k.shape[2]))


def splash_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, is_causal: bool = False,
                scale: float | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention(query, key, value, is_causal=, scale=)`` by the splash kernel
    (no attn_mask, no dropout): what ``torch.tpu.ops.splash_sdpa(implementation="pallas")`` calls."""
    return splash_attention(query, key, value, causal=is_causal, scale=scale)


@jax_op("tpu_pallas::ragged_paged_attention")
def _ragged_paged_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array,
                            cu_q_lens: jax.Array, num_seqs: jax.Array, sm_scale: float, num_kv_pages_per_block: int,
                            num_queries_per_block: int) -> jax.Array:
    return _rpa.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale,
                                       num_kv_pages_per_block=num_kv_pages_per_block,
                                       num_queries_per_block=num_queries_per_block)


def ragged_paged_attention(q: torch.Tensor, kv_pages: torch.Tensor, kv_lens: torch.Tensor,
                           page_indices: torch.Tensor, cu_q_lens: torch.Tensor, num_seqs: torch.Tensor, *,
                           sm_scale: float = 1.0, num_kv_pages_per_block: int = 1,
                           num_queries_per_block: int = 8) -> torch.Tensor:
    """Causal attention of ragged query sequences over a paged KV cache (JAX's kernel).

    q: [tokens, Hq, D]; kv_pages: [pages, page_size, 2·Hkv, D] (K and V heads interleaved);
    kv_lens: int32[max_seqs]; page_indices: int32[max_seqs, pages_per_seq]; cu_q_lens:
    int32[max_seqs + 1]; num_seqs: int32[1]. Returns [tokens, Hq, D].
    """
    return _ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, float(sm_scale),
                                   num_kv_pages_per_block, num_queries_per_block)


@jax_op("tpu_pallas::gmm")
def _gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, tile_m: int, tile_k: int, tile_n: int) -> jax.Array:
    m, k = lhs.shape
    n = rhs.shape[2]
    for what, size, tile in (("M", m, tile_m), ("K", k, tile_k), ("N", n, tile_n)):
        _divides("tpu_pallas::gmm", what, size, tile)
    return _megablox.gmm(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=(tile_m, tile_k, tile_n))


def gmm(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *, tiling: tuple[int, int, int] = (128, 128,
                                                                                                             128)):
    """Grouped matmul: rows ``[sum(group_sizes[:g]), sum(group_sizes[:g+1]))`` of ``lhs [M, K]``
    times ``rhs[g] [K, N]``; returns [M, N] in lhs's dtype. group_sizes: int32[G]. Tiles are
    clipped to M, K, N and must divide them."""
    tm, tk, tn = (min(t, s) for t, s in zip(tiling, (lhs.shape[0], lhs.shape[1], rhs.shape[2])))
    return _gmm(lhs, rhs, group_sizes, tm, tk, tn)
