"""Masking rules of ops whose result mask is their inputs' masks: elementwise ops (every op
tagged ``pointwise``, plus copies, ``where``, dropout, ``*_like`` factories) and per-sample
ops (convolution, pooling, eval batch norm, group norm) padded along the batch only."""

import torch
import torch.fx

from .mask import Mask, MaskGraph, blame, node_value, simple

aten = torch.ops.aten

_CARRY_OPS = {aten._to_copy.default, aten.clone.default, aten.alias.default,
              aten.detach.default, aten.lift_fresh_copy.default, aten.contiguous.default,
              aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.where.self,
              aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar,
              aten.native_dropout.default, aten.bernoulli.p, aten.bernoulli.default,
              aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
              aten.empty_like.default, aten.rand_like.default, aten.randn_like.default}
# ops that treat each sample of dim 0 (batch) on its own: a mask along dim 0 only carries over
_BATCH_WISE = {aten.convolution.default, aten.max_pool2d_with_indices.default,
               aten.max_pool3d_with_indices.default, aten.avg_pool2d.default,
               aten.avg_pool3d.default, aten._adaptive_avg_pool2d.default,
               aten._adaptive_avg_pool3d.default, aten.adaptive_max_pool2d.default,
               aten.upsample_nearest2d.default, aten.upsample_bilinear2d.default,
               aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec,
               aten.constant_pad_nd.default, aten.reflection_pad2d.default,
               aten._native_batch_norm_legit_no_training.default,
               aten.native_group_norm.default, aten.im2col.default, aten.col2im.default}


def elementwise(mk: MaskGraph, n: torch.fx.Node) -> None:
    """The logical and of the inputs' masks (one per output of a multi-output op)."""
    v = node_value(n)
    outs = v if isinstance(v, (tuple, list)) else [v]
    nd = outs[0].dim()
    m = None
    for a in n.all_input_nodes:
        am = mk.mask_of(a)
        if am is not None:
            m = mk.both(m, am, nd)
    mk.masks[n] = [m] * len(outs) if isinstance(v, (tuple, list)) else m


def per_sample(mk: MaskGraph, n: torch.fx.Node) -> None:
    """Per-sample ops (convolution, pooling, eval batch norm, group norm): fine when only
    the batch dim (0) of the input is padded; the outputs keep that mask."""
    x = n.args[0]
    m = mk.mask_of(x)
    for a in n.all_input_nodes[1:]:
        if mk.mask_of(a) is not None:
            raise blame(f"{n.target} with padded weights or statistics",
                               mk.mask_of(a), range(len(mk.mask_of(a).shape)))
    live = [d for d in range(len(m.shape)) if m.shape[d] != 1]
    if live != [0]:
        raise blame(f"{n.target} over a padded dim other than the batch", m,
                           [d for d in live if d != 0])
    v = node_value(n)
    outs = v if isinstance(v, (tuple, list)) else [v]
    res = []
    for o in outs:
        nd = o.dim() if isinstance(o, torch.Tensor) else 0
        if nd == 0:
            res.append(None)
            continue
        p = m.prefix.get(0)
        if m.exact and simple(p):
            res.append(mk.prefix_mask(p[0], p[1], m.shape[0], 0, nd))
        else:
            shape = (m.shape[0],) + (1,) * (nd - 1)
            node = mk.call(aten.view.default, m.node, list(shape))
            res.append(Mask(node, shape, {0: p} if p is not None else {}, False))
    mk.masks[n] = res if isinstance(v, (tuple, list)) else res[0]


RULES = {**{op: elementwise for op in _CARRY_OPS}, **{op: per_sample for op in _BATCH_WISE}}
