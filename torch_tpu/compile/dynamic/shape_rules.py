"""Masking rules of ops that move entries without combining them: views, permutes,
slices, selects, indexing, concatenation, splits. Each rule ``(mk, n)`` sets
``mk.masks[n]``, the mask of ``n``'s result, from its inputs' masks, or raises
:class:`~.unsupported.Unsupported` when padding would land among real entries."""

from typing import Any

import torch
import torch.fx

from .mask import Mask, MaskGraph, Subs, blame, node_value, norm_dims, simple, view_groups
from .unsupported import Unsupported

aten = torch.ops.aten


def view(mk: MaskGraph, n: torch.fx.Node) -> None:
    mk.masks[n] = _view_mask(mk, n.args[0], list(node_value(n).shape))


def _view_mask(mk: MaskGraph, src: torch.fx.Node, out_shape: list[int]) -> Mask | None:
    m = mk.mask_of(src)
    in_shape = list(node_value(src).shape)
    groups = view_groups(in_shape, out_shape)
    if m.exact:
        rebuilt = _view_exact(mk, m, in_shape, out_shape, groups)
        if rebuilt is not False:
            return rebuilt
    expand_shape = list(m.shape)
    new_shape = [1] * len(out_shape)
    prefix = {}
    materialize = False
    for gi, go in groups:
        live = [d for d in gi if m.shape[d] != 1]
        if not live:
            continue
        if len(gi) == 1 and len(go) == 1:
            new_shape[go[0]] = m.shape[gi[0]]
            if gi[0] in m.prefix:
                prefix[go[0]] = m.prefix[gi[0]]
            continue
        materialize = True
        for d in gi:
            expand_shape[d] = in_shape[d]
        for d in go:
            new_shape[d] = out_shape[d]
    node = m.node
    if materialize:
        node = mk.call(aten.expand.default, node, expand_shape)
        node = mk.call(aten.clone.default, node, memory_format=torch.contiguous_format)
    node = mk.call(aten.view.default, node, new_shape)
    return Mask(node, tuple(new_shape), prefix)


def _view_exact(mk: MaskGraph, m: Mask, in_shape, out_shape, groups):
    """An exact mask through a view, rebuilt from per-dim layouts (merged dims keep
    their sub-dims, so ``[B, S] -> [B*S] -> [B, S]`` gets plain prefixes back);
    ``False`` when a padded sub-dim would be split."""
    descs: dict[int, Any] = {}
    for gi, go in groups:
        subs = []
        for d in gi:
            p = m.prefix.get(d) if m.shape[d] != 1 else None
            if m.shape[d] != 1 and p is None:
                return False
            subs.extend(p if isinstance(p, Subs) else [(in_shape[d], p)])
        subs = [sd for sd in subs if sd[0] != 1]
        for j in go:
            need = out_shape[j]
            mine = []
            while need > 1:
                if not subs:
                    return False
                n, p = subs.pop(0)
                if need % n == 0:
                    mine.append((n, p))
                    need //= n
                elif n % need == 0 and p is None:
                    mine.append((need, None))  # splitting an all-real sub-dim is free
                    subs.insert(0, (n // need, None))
                    need = 1
                else:
                    return False
            live = [sd for sd in mine if sd[1] is not None]
            if not live:
                continue
            descs[j] = live[0][1] if len(mine) == 1 else Subs(mine)
    nd = len(out_shape)
    out = None
    for j, p in sorted(descs.items()):
        if isinstance(p, Subs):
            dm = mk.merged_mask(p, j, nd)
        else:
            dm = mk.prefix_mask(p[0], p[1], out_shape[j], j, nd)
        out = mk.both(out, dm, nd)
    return out


def _permuted(m: Mask, node: torch.fx.Node, perm: list[int]) -> Mask:
    return Mask(node, tuple(m.shape[d] for d in perm), {perm.index(d): p for d, p in m.prefix.items()}, m.exact)


def permute(mk: MaskGraph, n: torch.fx.Node) -> None:
    m = mk.mask_of(n.args[0])
    perm = [d % len(m.shape) for d in n.args[1]]
    mk.masks[n] = _permuted(m, mk.call(aten.permute.default, m.node, perm), perm)


def transpose(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = n.args
    m = mk.mask_of(args[0])
    nd = len(m.shape)
    d0, d1 = (0, 1) if n.target is aten.t.default else (args[1] % nd, args[2] % nd)
    if nd < 2:
        mk.masks[n] = m
        return
    perm = list(range(nd))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    mk.masks[n] = _permuted(m, mk.call(aten.permute.default, m.node, perm), perm)


def expand(mk: MaskGraph, n: torch.fx.Node) -> None:
    mk.masks[n] = mk.align(mk.mask_of(n.args[0]), node_value(n).dim())


def unsqueeze(mk: MaskGraph, n: torch.fx.Node) -> None:
    m = mk.mask_of(n.args[0])
    d = n.args[1] % (len(m.shape) + 1)
    shape = m.shape[:d] + (1,) + m.shape[d:]
    node = mk.call(aten.unsqueeze.default, m.node, d)
    prefix = {(k + 1 if k >= d else k): p for k, p in m.prefix.items()}
    mk.masks[n] = Mask(node, shape, prefix, m.exact)


def squeeze(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = n.args
    m = mk.mask_of(args[0])
    src = node_value(args[0])
    nd = src.dim()
    if n.target is aten.squeeze.default:
        dims = [d for d in range(nd) if src.shape[d] == 1]
    else:
        dims = [d for d in norm_dims(args[1], nd) if src.shape[d] == 1]
    if not dims:
        mk.masks[n] = m
        return
    node = mk.call(aten.squeeze.dims, m.node, dims)
    keep = [d for d in range(nd) if d not in dims]
    shape = tuple(m.shape[d] for d in keep)
    prefix = {keep.index(d): p for d, p in m.prefix.items() if d in keep}
    mk.masks[n] = Mask(node, shape, prefix, m.exact) if any(s != 1 for s in shape) else None


def slice_(mk: MaskGraph, n: torch.fx.Node) -> None:
    mk.masks[n] = _sliced_mask(mk, n)


def _sliced_mask(mk: MaskGraph, n) -> Mask | None:
    args = n.args
    m = mk.mask_of(args[0])
    nd = len(m.shape)
    d = (args[1] if len(args) > 1 else 0) % nd
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    if m.shape[d] == 1:
        return m
    size = node_value(args[0]).shape[d]
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0 or end < 0:
        if not simple(m.prefix.get(d)) or step != 1:
            raise blame(f"{n.target}: slice [{start}:{end}] from the padded end of dim {d}", m, [d])
        # counted from the end: the true end moves with the true length
        sym, off = m.prefix[d]
        s0 = start if start >= 0 else None
        e0 = end if end < 0 else None
        if s0 is None:
            raise blame(f"{n.target}: slice start {start} from the padded end of dim {d}", m, [d])
        out_size = node_value(n).shape[d]
        # true slice is [start, len + off + end): length len + off + end - start
        pm = mk.prefix_mask(sym, off + (e0 if e0 is not None else 0) - s0, out_size, d, nd)
        rest = mk.drop_dim(m, d)
        return mk.both(rest, pm, nd)
    node = mk.call(aten.slice.Tensor, m.node, d, start, end, step)
    shape = list(m.shape)
    shape[d] = node_value(n).shape[d]
    prefix = dict(m.prefix)
    exact = m.exact
    if d in prefix:
        if step != 1 or not simple(prefix[d]):
            del prefix[d]
            exact = False
        else:
            prefix[d] = (prefix[d][0], prefix[d][1] - start)
    return Mask(node, tuple(shape), prefix, exact)


def select(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = n.args
    m = mk.mask_of(args[0])
    nd = len(m.shape)
    d = args[1] % nd
    idx = args[2]
    if m.shape[d] != 1 and idx < 0:
        raise blame(f"{n.target}: index {idx} counts from the padded end of dim {d}", m, [d])
    node = mk.call(aten.select.int, m.node, d, idx if m.shape[d] != 1 else 0)
    keep = [k for k in range(nd) if k != d]
    shape = tuple(m.shape[k] for k in keep)
    prefix = {keep.index(k): p for k, p in m.prefix.items() if k != d}
    mk.masks[n] = Mask(node, shape, prefix, m.exact) if any(s != 1 for s in shape) else None


def index(mk: MaskGraph, n: torch.fx.Node) -> None:
    mk.masks[n] = _indexed_mask(mk, n)


def _arange_source(node) -> tuple[int, int] | None:
    """``(N, dim)`` when ``node`` is ``arange(N)`` seen through unsqueeze / view / expand /
    ``+ 0`` / copies, laid along its only non-1 ``dim``; else ``None``."""
    v = node_value(node)
    if v is None or v.dtype.is_floating_point:
        return None
    non1 = [i for i, sz in enumerate(v.shape) if sz != 1]
    if len(non1) != 1:
        return None
    cur = node
    while isinstance(cur, torch.fx.Node) and cur.op == "call_function":
        t = cur.target
        if t in (aten.unsqueeze.default, aten.view.default, aten._unsafe_view.default,
                 aten.clone.default, aten._to_copy.default, aten.alias.default,
                 aten.expand.default):
            cur = cur.args[0]
        elif t in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar) \
                and len(cur.args) > 1 and not isinstance(cur.args[1], torch.fx.Node) \
                and cur.args[1] == 0 and cur.kwargs.get("alpha", 1) == 1:
            cur = cur.args[0]
        else:
            break
    if not isinstance(cur, torch.fx.Node) or cur.op != "call_function":
        return None
    a = cur.args
    if cur.target is aten.arange.default:
        return (a[0], non1[0])
    if cur.target in (aten.arange.start, aten.arange.start_step) and a[0] == 0 and (
            len(a) < 3 or a[2] == 1):
        return (a[1], non1[0])
    return None


def _indexed_mask(mk: MaskGraph, n) -> Mask | None:
    """``x[i0, i1, ...]`` (advanced indexing). With index tensors that are ``arange`` over
    a padded dim (``padding_mask[batch_idx, kv_idx]`` in Hugging Face mask builders), the
    dim's layout moves to where its index broadcasts; otherwise validity is gathered
    with the same indices."""
    x, indices = n.args[0], list(n.args[1])
    m = mk.mask_of(x)
    xv = node_value(x)
    out_nd = node_value(n).dim()
    pos = [d for d, i in enumerate(indices) if i is not None]
    bnd = max(node_value(indices[d]).dim() for d in pos)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    # padded index tensors (arange(s) positions): their entries past the true length
    # gather something, but it is padding; their masks sit where they broadcast
    imask = None
    for d in pos:
        mi = mk.mask_of(indices[d])
        if mi is None:
            continue
        mi = mk.align(mi, bnd)
        shape = (1,) * first + mi.shape + (1,) * (out_nd - first - bnd)
        node = mk.call(aten.view.default, mi.node, list(shape))
        imask = mk.both(imask, Mask(node, shape, {k + first: p for k, p in mi.prefix.items()},
                                       mi.exact), out_nd)
    if m is None:
        return imask
    return mk.both(_index_mask(mk, n, m, x, xv, indices, pos, bnd, adjacent, first,
                                     out_nd), imask, out_nd)


def _index_mask(mk: MaskGraph, n, m, x, xv, indices, pos, bnd, adjacent, first, out_nd):
    """The part of ``x[indices]``'s mask that comes from ``x``'s own mask."""
    # where each x dim lands in the output
    where_: dict[int, int] = {}
    rest = [d for d in range(xv.dim()) if d not in pos]
    for k, d in enumerate(rest):
        where_[d] = (k if d < first else k + bnd) if adjacent else bnd + k
    identity = m.exact
    for d in pos:
        if m.shape[d] == 1:
            continue
        src = _arange_source(indices[d])
        if src is None or src[0] != xv.shape[d]:
            identity = False
            break
        where_[d] = first + bnd - node_value(indices[d]).dim() + src[1]
    if identity:
        out = None
        for d, p in m.prefix.items():
            j = where_[d]
            dm = (mk.merged_mask(p, j, out_nd) if isinstance(p, Subs)
                  else mk.prefix_mask(p[0], p[1], xv.shape[d], j, out_nd))
            out = mk.both(out, dm, out_nd)
        return out
    # validity of each gathered entry: the same gather on the mask
    full = [xv.shape[d] if d in pos else m.shape[d] for d in range(xv.dim())]
    mm = mk.call(aten.expand.default, m.node, full)
    idx = mk.call(aten.index.Tensor, mm, indices)
    shape = list(node_value(n).shape)
    for d in rest:
        if m.shape[d] == 1:
            shape[where_[d]] = 1  # dims the mask broadcasts over stay 1
    return Mask(idx, tuple(shape), {})


def gather(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = n.args
    v = node_value(n)
    m, mi = mk.mask_of(args[0]), mk.mask_of(args[2])
    d = args[1] % v.dim()
    if m is not None and m.shape[d] != 1:
        raise blame(f"{n.target} along padded dim {d}", m, [d])
    if m is not None and any(m.shape[k] != 1 and m.shape[k] != v.shape[k] for k in range(v.dim())):
        raise Unsupported(f"{n.target}: index smaller than the padded input")
    mk.masks[n] = mk.both(m, mi, v.dim())


def embedding(mk: MaskGraph, n: torch.fx.Node) -> None:
    if mk.mask_of(n.args[0]) is not None:
        raise Unsupported(f"{n.target}: padded embedding table")
    m = mk.mask_of(n.args[1])
    if m is not None:
        node = mk.call(aten.unsqueeze.default, m.node, -1)
        mk.masks[n] = Mask(node, m.shape + (1,), dict(m.prefix), m.exact)


def cat(mk: MaskGraph, n: torch.fx.Node) -> None:
    tensors = n.args[0]
    nd = node_value(n).dim()
    d = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % nd
    m = None
    for t in tensors:
        tm = mk.mask_of(t)
        if tm is None:
            continue
        if len(tm.shape) != nd:
            raise Unsupported("cat of a padded tensor of another rank")
        if tm.shape[d] != 1:
            raise blame(f"cat along padded dim {d}", tm, [d])
        m = mk.both(m, tm, nd)
    mk.masks[n] = m


def split(mk: MaskGraph, n: torch.fx.Node) -> None:
    args = n.args
    m = mk.mask_of(args[0])
    d = (args[2] if len(args) > 2 else n.kwargs.get("dim", 0)) % len(m.shape)
    if m.shape[d] != 1:
        raise blame(f"{n.target} along padded dim {d}", m, [d])
    mk.masks[n] = [m] * len(node_value(n))


RULES = {
    aten.view.default: view, aten._unsafe_view.default: view, aten.reshape.default: view,
    aten.permute.default: permute,
    aten.t.default: transpose, aten.transpose.int: transpose,
    aten.expand.default: expand,
    aten.unsqueeze.default: unsqueeze,
    aten.squeeze.dim: squeeze, aten.squeeze.dims: squeeze, aten.squeeze.default: squeeze,
    aten.slice.Tensor: slice_,
    aten.select.int: select,
    aten.index.Tensor: index,
    aten.gather.default: gather,
    aten.embedding.default: embedding,
    aten.cat.default: cat,
    aten.split.Tensor: split, aten.split_with_sizes.default: split,
}
