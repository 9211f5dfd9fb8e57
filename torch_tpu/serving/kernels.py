"""Torch versions of the Triton kernels vLLM's model runner launches (no Triton for tpu)."""

from __future__ import annotations

import torch

_registered = False


def compute_slot_mapping(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    slot_mapping_ptr,
    KV_CACHE_BLOCK_SIZE,
    TOTAL_CP_WORLD_SIZE,
    TOTAL_CP_RANK,
    CP_KV_CACHE_INTERLEAVE_SIZE,
    PAD_ID,
    BLOCK_SIZE,
):  # noqa: N803
    """Slot of each scheduled token in the paged KV cache (vLLM's ``ComputeSlotMappingKernel``).

    ``query_start_loc_ptr [R + 1]`` int32 (token offsets of the R requests), ``positions_ptr
    [T]`` int64, ``block_table_ptr [max_reqs, block_table_stride]`` int32; writes
    ``slot_mapping_ptr[:T] = block * block_size + position % block_size`` and ``PAD_ID`` in
    ``[T, max_num_tokens)``. Context parallelism is not supported.
    """
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("vLLM on tpu: context parallelism (decode_context_parallel_size > 1)")
    n = positions_ptr.numel()
    dev = positions_ptr.device
    if n:
        tok = torch.arange(n, device=dev, dtype=torch.int64)
        req = torch.searchsorted(query_start_loc_ptr[1:].to(torch.int64), tok, right=True)
        pos = positions_ptr[:n].to(torch.int64)
        bt = block_table_ptr.view(-1, block_table_stride)
        block = bt[req, torch.div(pos, KV_CACHE_BLOCK_SIZE, rounding_mode="floor")].to(torch.int64)
        slot_mapping_ptr[:n] = block * KV_CACHE_BLOCK_SIZE + pos % KV_CACHE_BLOCK_SIZE
    if max_num_tokens > n:
        slot_mapping_ptr[n:max_num_tokens] = PAD_ID


def register() -> None:
    """Installs the torch versions in vLLM's Triton kernel dispatcher (once per process)."""
    global _registered
    if _registered:
        return
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping})
    _registered = True
