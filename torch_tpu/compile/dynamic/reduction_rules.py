"""Masking rules of ops that combine entries along a dim: contractions (matmuls),
reductions, norms, variance, softmax, scans, layer norm, ``nll_loss``. Before such an
op the padded entries of its input become the op's identity (``0`` for sums and
contractions, the dtype's lowest value for maxima and softmax, ``ignore_index`` for
``nll_loss``); ``mean`` and ``var`` divide by the true count. Each rule ``(mk, n)`` sets
``mk.masks[n]``."""

import operator

import torch
import torch.fx

from .mask import MaskGraph, blame, highest, lowest, node_value, norm_dims, simple
from .unsupported import Unsupported

aten = torch.ops.aten

# reductions and the identity padded entries take
_SUM_LIKE = {aten.sum.dim_IntList: 0, aten.sum.default: 0, aten.prod.dim_int: 1,
             aten.prod.default: 1}
_ANY_ALL = {aten.any.dim: False, aten.any.dims: False, aten.any.default: False,
            aten.all.dim: True, aten.all.dims: True, aten.all.default: True}
_MAX_LIKE = {aten.amax.default: "low", aten.amin.default: "high", aten.max.dim: "low",
             aten.min.dim: "high", aten.argmax.default: "low", aten.argmin.default: "high",
             aten.max.default: "low", aten.min.default: "high"}
_SOFTMAX = {aten._softmax.default, aten._log_softmax.default, aten.logsumexp.default}
_MM = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}


def matmul(mk: MaskGraph, n: torch.fx.Node) -> None:
    op = n.target
    args = list(n.args)
    ia, ib = (1, 2) if op in (aten.addmm.default, aten.baddbmm.default) else (0, 1)
    a, b = args[ia], args[ib]
    ma, mb = mk.mask_of(a), mk.mask_of(b)
    nd = node_value(n).dim()
    ka, kb = nd - 1, nd - 2  # contracted dims of a and b
    if ma is not None and ma.shape[ka] != 1:
        args[ia] = mk.fill(a, ma, 0)
    if mb is not None and mb.shape[kb] != 1:
        args[ib] = mk.fill(b, mb, 0)
    n.args = tuple(args)
    ra = mk.reduce_mask(ma, [ka], True) if ma is not None else None
    rb = mk.reduce_mask(mb, [kb], True) if mb is not None else None
    if ra is not None and len(ra.shape) < nd:
        ra = mk.align(ra, nd)
    if rb is not None and len(rb.shape) < nd:
        rb = mk.align(rb, nd)
    out = mk.both(ra, rb, nd)
    if ia == 1:
        out = mk.both(out, mk.mask_of(args[0]), nd)
    mk.masks[n] = out


def reduction(mk: MaskGraph, n: torch.fx.Node) -> None:
    op = n.target
    args = list(n.args)
    x = args[0]
    m = mk.mask_of(x)
    xv = node_value(x)
    nd = xv.dim()
    if op in (aten.sum.default, aten.prod.default, aten.mean.default, aten.any.default,
              aten.all.default, aten.max.default, aten.min.default):
        dims, keepdim = list(range(nd)), False
    elif op in (aten.argmax.default, aten.argmin.default):
        dim = args[1] if len(args) > 1 else n.kwargs.get("dim")
        dims = norm_dims(dim, nd)
        keepdim = args[2] if len(args) > 2 else n.kwargs.get("keepdim", False)
        if dim is None:
            keepdim = False
    else:
        dims = norm_dims(args[1] if len(args) > 1 else n.kwargs.get("dim"), nd)
        keepdim = args[2] if len(args) > 2 else n.kwargs.get("keepdim", False)
    if m is None or all(m.shape[d] == 1 for d in dims):
        outm = mk.reduce_mask(m, dims, keepdim)
        mk.masks[n] = [outm, outm] if op in (aten.max.dim, aten.min.dim) else outm
        return
    if op in (aten.argmax.default, aten.argmin.default) and len(dims) != 1 and nd > 1:
        raise Unsupported(f"{op} over a flattened padded tensor")
    if op in _SUM_LIKE or op in (aten.mean.dim, aten.mean.default):
        ident = _SUM_LIKE.get(op, 0)
    elif op in _ANY_ALL:
        ident = _ANY_ALL[op]
    else:
        ident = lowest(xv.dtype) if _MAX_LIKE[op] == "low" else highest(xv.dtype)
    args[0] = mk.fill(x, m, ident)
    n.args = tuple(args)
    outm = mk.reduce_mask(m, dims, keepdim)
    if op in (aten.mean.dim, aten.mean.default):
        total = 1
        for d in dims:
            total *= xv.shape[d]
        out_dtype = node_value(n).dtype
        with mk.g.inserting_before(n.next):
            cnt = mk.count(m, xv.shape, dims, keepdim, out_dtype)
            scaled = mk.call(aten.mul.Tensor, n, float(total))
            fixed = mk.call(aten.div.Tensor, scaled, cnt)
        mk.replace_uses(n, fixed, keep={scaled})
        mk.masks[fixed] = outm
    mk.masks[n] = [outm, outm] if op in (aten.max.dim, aten.min.dim) else outm


def vector_norm(mk: MaskGraph, n: torch.fx.Node) -> None:
    """``linalg_vector_norm(x, ord, dim, keepdim)``: padded entries count as 0 (the
    identity of every order > 0)."""
    x = n.args[0]
    m = mk.mask_of(x)
    nd = node_value(x).dim()
    ordv = n.args[1] if len(n.args) > 1 else n.kwargs.get("ord", 2)
    dims = norm_dims(n.args[2] if len(n.args) > 2 else n.kwargs.get("dim"), nd)
    keepdim = n.args[3] if len(n.args) > 3 else n.kwargs.get("keepdim", False)
    if any(m.shape[d] != 1 for d in dims):
        if not ordv > 0:
            raise blame(f"{n.target} of order {ordv} over a padded dim", m, dims)
        n.args = (mk.fill(x, m, 0),) + tuple(n.args[1:])
    mk.masks[n] = mk.reduce_mask(m, dims, keepdim)


def variance(mk: MaskGraph, n: torch.fx.Node) -> None:
    x = n.args[0]
    m = mk.mask_of(x)
    xv = node_value(x)
    nd = xv.dim()
    dims = norm_dims(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim"), nd)
    correction = n.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    keepdim = n.kwargs.get("keepdim", False)
    if all(m.shape[d] == 1 for d in dims):
        outm = mk.reduce_mask(m, dims, keepdim)
        mk.masks[n] = outm if n.target is aten.var.correction else [outm, outm]
        return
    with mk.g.inserting_before(n.next):
        cnt = mk.count(m, xv.shape, dims, True, xv.dtype)
        xs = mk.fill(x, m, 0)
        s = mk.call(aten.sum.dim_IntList, xs, dims, True)
        mean = mk.call(aten.div.Tensor, s, cnt)
        dev = mk.call(aten.sub.Tensor, x, mean)
        dev = mk.fill(dev, m, 0, like=x)
        sq = mk.call(aten.mul.Tensor, dev, dev)
        ss = mk.call(aten.sum.dim_IntList, sq, dims, keepdim)
        c = cnt if keepdim else mk.call(aten.squeeze.dims, cnt, dims)
        denom = mk.call(aten.clamp_min.default, mk.call(aten.sub.Tensor, c, correction), 0)
        var = mk.call(aten.div.Tensor, ss, denom)
        outm = mk.reduce_mask(m, dims, keepdim)
        if n.target is aten.var.correction:
            mk.replace_uses(n, var)
            mk.masks[var] = outm
        else:
            mean_out = mean if keepdim else mk.call(aten.squeeze.dims, mean, dims)
            for u in list(n.users):
                if u.target is operator.getitem:
                    repl = var if u.args[1] == 0 else mean_out
                    mk.replace_uses(u, repl)
                    mk.masks[repl] = outm
    mk.masks[n] = outm if n.target is aten.var.correction else [outm, outm]


def softmax(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = list(n.args)
    x = args[0]
    m = mk.mask_of(x)
    xv = node_value(x)
    nd = xv.dim()
    dims = norm_dims(args[1], nd)
    keepdim = args[2] if n.target is aten.logsumexp.default and len(args) > 2 else False
    if any(m.shape[d] != 1 for d in dims):
        # lowest finite value, not -inf: padded weights are exactly 0 and a row with no
        # real entry stays finite (no NaN reaching gradients through padded rows)
        args[0] = mk.fill(x, m, lowest(xv.dtype))
        n.args = tuple(args)
    if n.target is aten.logsumexp.default:
        mk.masks[n] = mk.reduce_mask(m, dims, keepdim)
    else:
        mk.masks[n] = m


def scan(mk: MaskGraph, n: torch.fx.Node) -> None:
    """``cumsum`` / ``cumprod``: padding sits at the end, so prefixes of real entries stay real."""
    m = mk.mask_of(n.args[0])
    d = n.args[1] % len(m.shape)
    if m.shape[d] != 1 and not simple(m.prefix.get(d)):
        raise blame(f"{n.target} along a merged padded dim {d}", m, [d])
    mk.masks[n] = m


def layer_norm(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = n.args
    m = mk.mask_of(args[0])
    nd = node_value(args[0]).dim()
    k = len(args[1])
    if m is not None and any(m.shape[d] != 1 for d in range(nd - k, nd)):
        raise blame(f"{n.target} normalizes over a padded dim", m, range(nd - k, nd))
    for a in args[2:4]:
        if mk.mask_of(a) is not None:
            raise Unsupported(f"{n.target}: padded weight or bias")
    stat = None
    if m is not None:
        stat = m  # mean/rstd keep the normalized dims as size 1
    mk.masks[n] = [m, stat, stat]


def nll_loss(mk: MaskGraph, n: torch.fx.Node) -> None:
    x, target, weight, reduction, ignore_index = n.args[:5]
    mx, mt = mk.mask_of(x), mk.mask_of(target)
    if mk.mask_of(weight) is not None:
        raise Unsupported("nll_loss with padded class weights")
    xv = node_value(x)
    if mx is not None and xv.dim() == 2 and mx.shape[1] != 1:
        raise Unsupported("nll_loss over padded classes")
    args = list(n.args)
    if mx is not None:
        args[0] = mk.fill(x, mx, 0)
    m = mt
    if mx is not None:
        mrow = mk.reduce_mask(mx, [1], False) if xv.dim() == 2 else None
        m = mk.both(m, mrow, 1) if mrow is not None else m
    if m is not None:
        # padded positions become ignore_index: out of the sum and of the mean's count
        args[1] = mk.fill(target, m, ignore_index)
    n.args = tuple(args)
    out = m if reduction == 0 else None  # reduction none keeps per-position values
    mk.masks[n] = [out, None]


RULES = {
    **{op: matmul for op in _MM},
    **{op: reduction for op in (*_SUM_LIKE, *_ANY_ALL, *_MAX_LIKE, aten.mean.dim, aten.mean.default)},
    aten.linalg_vector_norm.default: vector_norm,
    aten.var.correction: variance, aten.var_mean.correction: variance,
    **{op: softmax for op in _SOFTMAX},
    aten.cumsum.default: scan, aten.cumprod.default: scan,
    aten.native_layer_norm.default: layer_norm,
    aten.nll_loss_forward.default: nll_loss,
}
