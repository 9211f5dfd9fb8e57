"""Decompositions for the trace of a bucket: core ATen, with ``nll_loss_forward`` kept whole
(its masking rule sends padded positions to ``ignore_index``) and the fused inference fast
paths of ``nn.TransformerEncoderLayer`` / ``nn.MultiheadAttention`` in their math form,
which padding can be made safe for."""

import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions

from .unsupported import Unsupported

aten = torch.ops.aten


def _sdpa_mask(mask, mask_type, batch, heads, length):
    """The native fast-path mask (True = masked out, or additive float) as SDPA's
    ``attn_mask`` (True = attend, or additive)."""
    if mask is None:
        return None
    if mask_type == 1:  # key padding mask [B, L]
        mask = mask.view(batch, 1, 1, length)
    elif mask_type not in (0, 2, None):
        raise Unsupported(f"_native_multi_head_attention with mask_type {mask_type}")
    return mask.logical_not() if mask.dtype == torch.bool else mask


def _decomp_native_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                       proj_weight, proj_bias, mask=None, need_weights=True,
                       average_attn_weights=True, mask_type=None):
    """``aten._native_multi_head_attention`` (nn.MultiheadAttention's inference fast path,
    batch-first ``[B, L, E]``) as linear / SDPA / linear, ops the masking pass knows."""
    if need_weights:
        raise Unsupported("_native_multi_head_attention with need_weights=True")
    b, lq, e = query.shape
    lk = key.shape[1]
    dh = e // num_head
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3)
    q = F.linear(query, wq, bq).view(b, lq, num_head, dh).transpose(1, 2)
    k = F.linear(key, wk, bk).view(b, lk, num_head, dh).transpose(1, 2)
    v = F.linear(value, wv, bv).view(b, lk, num_head, dh).transpose(1, 2)
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=_sdpa_mask(mask, mask_type, b,
                                                                         num_head, lk))
    out = F.linear(attn.transpose(1, 2).reshape(b, lq, e), proj_weight, proj_bias)
    return out, query.new_empty((0,))


def _decomp_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                          proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                          norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                          ffn_bias_2, mask=None, mask_type=None):
    """``aten._transformer_encoder_layer_fwd`` (nn.TransformerEncoderLayer's inference fast
    path) in its math form, following ATen's ``transformer_encoder_layer_forward``."""
    def ln(x, w, b_):
        return F.layer_norm(x, (embed_dim,), w, b_, eps)

    x = ln(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _decomp_native_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                           proj_bias, mask, False, True, mask_type)[0]
    x = x + src
    if not norm_first:
        x = ln(x, norm_weight_1, norm_bias_1)
    res = x
    if norm_first:
        x = ln(x, norm_weight_2, norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + res
    if not norm_first:
        x = ln(x, norm_weight_2, norm_bias_2)
    return x


def trace_decompositions():
    table = dict(core_aten_decompositions())
    # kept whole: its masking rule sends padded positions to ignore_index
    table.pop(aten.nll_loss_forward.default, None)
    # inference fast paths of nn.TransformerEncoderLayer / nn.MultiheadAttention are single
    # fused ops; their math form is what padding can be made safe for
    table[aten._transformer_encoder_layer_fwd.default] = _decomp_encoder_layer
    table[aten._native_multi_head_attention.default] = _decomp_native_mha
    return table
