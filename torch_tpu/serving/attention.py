"""Paged attention on tpu: vLLM's KV cache in HBM, addressed through block tables.

Cache of one layer: vLLM's logical ``[num_blocks, H_kv, block_size, 2 * D]`` (keys in
``[..., :D]``, values in ``[..., D:]``), stored block-then-token-major (layout ``LBNHC``):
``cache.permute(0, 2, 1, 3)`` is a contiguous ``[num_blocks, block_size, H_kv, 2 * D]``, so
the slot ``s = block * block_size + offset`` of a token is row ``s`` of
``view(num_blocks * block_size, H_kv, 2 * D)``.

A step's batch is ragged: R requests, request r with ``q_r`` new tokens (a prefill chunk or
one decode token) after ``L_r - q_r`` cached ones. :meth:`TpuPagedAttentionImpl.forward`
gathers each request's blocks from its block-table row (``[R, nb * block_size]`` keys and
values), scores the ``[R, q_max]`` padded queries against them under the causal mask
``key position <= query position < L_r``, and scatters the outputs back to the token order.
Slots never written (allocated but not yet filled, the cache is not zero-filled) are masked
before the softmax and their values zeroed, so whatever bytes HBM holds there cannot leak.
All tensor work runs on the chip; the host builds only the small index tensors per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout


class TpuPagedAttentionBackend(AttentionBackend):
    """vLLM attention backend ``TPU_PAGED``: decoder self-attention over the paged KV cache."""

    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "TPU_PAGED"

    @staticmethod
    def get_impl_cls() -> type[TpuPagedAttentionImpl]:
        return TpuPagedAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TpuPagedAttentionMetadataBuilder]:
        return TpuPagedAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class TpuPagedAttentionMetadata:
    """One step's batch. R requests, T scheduled tokens, Q = longest query, S = the widest
    gathered context (blocks of the longest request x block_size). Device tensors:

    - ``slot_mapping [T]`` int64: KV-cache slot of each new token (-1: padding, not written)
    - ``block_table [R, nb]`` int32: cache blocks of each request
    - ``q_index [R, Q]`` int64: token index of query j of request r (0 where padding)
    - ``q_valid [R, Q]`` bool, ``mask [R, Q, S]`` bool: query j of r sees key k
    - ``token_req [T_real]``, ``token_pos [T_real]`` int64: (r, j) of each real token
    """

    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    q_index: torch.Tensor
    mask: torch.Tensor
    key_valid: torch.Tensor
    token_req: torch.Tensor
    token_pos: torch.Tensor
    causal: bool = True


class TpuPagedAttentionMetadataBuilder(AttentionMetadataBuilder[TpuPagedAttentionMetadata]):
    """Builds :class:`TpuPagedAttentionMetadata` from vLLM's common metadata (host-side index math)."""

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names, vllm_config, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> TpuPagedAttentionMetadata:
        m = common_attn_metadata
        if not isinstance(m.causal, bool) or not m.causal:
            raise NotImplementedError("vLLM on tpu: only causal decoder attention is supported")
        R = m.num_reqs
        T = m.num_actual_tokens
        qsl = m.query_start_loc_cpu[: R + 1].to(torch.int64)
        q_lens = qsl[1:] - qsl[:-1]
        seq_lens = m.seq_lens[:R].to("cpu", torch.int64)
        Q = max(int(q_lens.max()) if R else 1, 1)
        nb = max(int((seq_lens.max() + self.block_size - 1) // self.block_size) if R else 1, 1)
        S = nb * self.block_size
        j = torch.arange(Q)
        q_valid = j[None, :] < q_lens[:, None]  # [R, Q]
        q_index = torch.where(q_valid, qsl[:-1, None] + j[None, :], 0)
        # Absolute position of query j of request r: L_r - q_r + j.
        q_abs = (seq_lens - q_lens)[:, None] + j[None, :]  # [R, Q]
        k = torch.arange(S)
        mask = (k[None, None, :] <= q_abs[:, :, None]) & q_valid[:, :, None]  # [R, Q, S]
        mask[:, :, 0] |= ~q_valid  # a padding query sees key 0: no all-masked rows (NaN-free softmax)
        key_valid = k[None, :] < seq_lens[:, None]  # [R, S]
        token_req = torch.repeat_interleave(torch.arange(R), q_lens)
        token_pos = torch.arange(T) - qsl[:-1].repeat_interleave(q_lens)
        dev = self.device
        return TpuPagedAttentionMetadata(
            num_actual_tokens=T,
            num_reqs=R,
            max_query_len=Q,
            slot_mapping=m.slot_mapping[:T],
            block_table=m.block_table_tensor[:R, :nb],
            q_index=q_index.to(dev),
            mask=mask.to(dev),
            key_valid=key_valid.to(dev),
            token_req=token_req.to(dev),
            token_pos=token_pos.to(dev),
        )


class TpuPagedAttentionImpl(AttentionImpl):
    """Attention of one layer over its paged KV cache (see the module docstring)."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes,
        sliding_window,
        kv_cache_dtype: str,
        logits_soft_cap=None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks=None,
    ) -> None:
        if alibi_slopes is not None or sliding_window is not None or sinks is not None or logits_soft_cap:
            raise NotImplementedError(
                "vLLM on tpu: ALiBi, sliding windows, attention sinks and logit soft-capping "
                "are not supported by the TPU_PAGED attention backend"
            )
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"vLLM on tpu: attention type {attn_type} is not supported (decoder only)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type

    @staticmethod
    def _rows(kv_cache: torch.Tensor) -> torch.Tensor:
        """``[num_blocks, H, N, 2D]`` (layout LBNHC) -> the contiguous ``[num_blocks, N, H, 2D]``."""
        return kv_cache.permute(0, 2, 1, 3)

    def do_kv_cache_update(
        self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Writes the new tokens' keys and values ``[T, H_kv, D]`` to their slots ``[T]`` (-1: skipped)."""
        rows = self._rows(kv_cache)
        nblk, bs, h, d2 = rows.shape
        flat = rows.reshape(nblk * bs, h, d2)  # a view: the layout is contiguous in this order
        n = slot_mapping.shape[0]
        keep = slot_mapping >= 0
        slots = torch.where(keep, slot_mapping, 0)
        kv = torch.cat([key[:n], value[:n]], dim=-1).to(flat.dtype)
        # Padding tokens (slot -1) rewrite slot 0's current content, leaving it unchanged.
        kv = torch.where(keep[:, None, None], kv, flat.index_select(0, slots))
        flat.index_copy_(0, slots, kv)

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TpuPagedAttentionMetadata | None,
        output: torch.Tensor,
        output_scale=None,
        output_block_scale=None,
    ) -> torch.Tensor:
        """``query [T, H, D]`` -> ``output [T, H, D]`` (written in place and returned)."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("vLLM on tpu: fused output quantization is not supported")
        if attn_metadata is None:  # profiling / dummy runs without a cache
            return output.fill_(0)
        md = attn_metadata
        T, D, H, Hk = md.num_actual_tokens, self.head_size, self.num_heads, self.num_kv_heads
        R, Q = md.num_reqs, md.max_query_len
        rows = self._rows(kv_cache)  # [nblk, N, Hk, 2D]
        gathered = rows[md.block_table.to(torch.int64)]  # [R, nb, N, Hk, 2D]
        S = gathered.shape[1] * gathered.shape[2]
        gathered = gathered.reshape(R, S, Hk, 2 * D)
        valid = md.key_valid[:, :, None, None]
        k = torch.where(valid, gathered[..., :D], 0).to(query.dtype).transpose(1, 2)  # [R, Hk, S, D]
        v = torch.where(valid, gathered[..., D:], 0).to(query.dtype).transpose(1, 2)
        q = query[md.q_index.reshape(-1)].reshape(R, Q, H, D).transpose(1, 2)  # [R, H, Q, D]
        if Hk != H:
            k = k.repeat_interleave(H // Hk, dim=1)
            v = v.repeat_interleave(H // Hk, dim=1)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=md.mask[:, None], scale=self.scale)
        o = o.transpose(1, 2)  # [R, Q, H, D]
        output[:T] = o[md.token_req, md.token_pos].to(output.dtype)
        return output
