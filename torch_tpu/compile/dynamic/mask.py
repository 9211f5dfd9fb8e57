"""Masks of a padded ATen graph: :class:`Mask` (a boolean node broadcastable to its tensor,
true on entries derived from real data, with a per-dim layout) and :class:`MaskGraph`,
which builds, combines and applies them as graph nodes."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .unsupported import Unsupported

aten = torch.ops.aten


class Subs(tuple):
    """Layout of a dim merged from several padded ones (``[B, S] -> [B*S]``): its sub-dims,
    outer to inner, as ``(size, (sym, offset) or None)``; ``None``: all entries real."""


def simple(p) -> bool:
    """``p`` is a plain prefix ``(sym, offset)``, not a merged dim's :class:`Subs`."""
    return p is not None and not isinstance(p, Subs)


@dataclass
class Mask:
    """A boolean mask node broadcastable to its tensor (same ndim; size 1 or the tensor's size
    per dim). ``prefix[d] = (sym, offset)``: along ``d`` the mask is ``index < len(sym) +
    offset`` and separable from the other dims; ``prefix[d] = Subs(...)``: ``d`` is a merged
    dim with that layout. ``exact``: the mask is the product of its per-dim descriptions
    (every dim of size > 1 has one), so views can rebuild it without materializing it."""

    node: torch.fx.Node
    shape: tuple[int, ...]
    prefix: dict[int, Any] = field(default_factory=dict)
    exact: bool = False


def node_value(node):
    """The traced value of an FX node (None for a non-node or a node without one)."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def lowest(dtype):
    """The dtype's lowest finite value (False for bool)."""
    return _extreme(dtype, "min")


def highest(dtype):
    """The dtype's highest finite value (True for bool)."""
    return _extreme(dtype, "max")


def _extreme(dtype, end: str):
    if dtype.is_floating_point:
        return getattr(torch.finfo(dtype), end)
    if dtype == torch.bool:
        return end == "max"
    return getattr(torch.iinfo(dtype), end)


def norm_dims(dims, ndim):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % ndim if ndim else 0 for d in dims})


def view_groups(a: Sequence[int], b: Sequence[int]):
    """Split a view ``a -> b`` into groups ``(in_dims, out_dims)`` of equal element count,
    each as small as possible (size-1 dims form their own groups)."""
    groups = []
    i = j = 0
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1 and not (j < len(b) and b[j] == 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(b) and b[j] == 1 and not (i < len(a) and a[i] == 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(a) or j >= len(b):
            raise Unsupported(f"view {list(a)} -> {list(b)} has no dimension grouping")
        gi, gj = [i], [j]
        pa, pb = a[i], b[j]
        while pa != pb:
            if pa < pb:
                i += 1
                if i >= len(a):
                    raise Unsupported(f"view {list(a)} -> {list(b)}")
                gi.append(i)
                pa *= a[i]
            else:
                j += 1
                if j >= len(b):
                    raise Unsupported(f"view {list(a)} -> {list(b)}")
                gj.append(j)
                pb *= b[j]
        groups.append((gi, gj))
        i += 1
        j += 1
    return groups


def syms_of(*masks, dims=None) -> frozenset | None:
    """The dynamic sizes a set of masks pads, along ``dims`` if given (``None`` when a
    mask dim has no layout)."""
    out = set()
    for m in masks:
        if m is None:
            continue
        for d, size in enumerate(m.shape):
            p = m.prefix.get(d)
            if size == 1 or (dims is not None and d not in dims):
                continue
            if p is None:
                return None
            out.update(sd[1][0] for sd in p if sd[1] is not None) if isinstance(
                p, Subs) else out.add(p[0])
    return frozenset(out)


def blame(msg: str, m: Mask | None = None, dims: Sequence[int] = ()) -> Unsupported:
    """An :class:`Unsupported` blaming the sizes padded along ``dims`` of mask ``m``."""
    e = Unsupported(msg)
    if m is not None and dims:
        e.syms = syms_of(m, dims=dims)
    return e


class MaskGraph:
    """The masks of an ATen graph's values, and the nodes that build, combine and apply them
    (inserted at the graph's current insertion point)."""

    def __init__(self, gm: torch.fx.GraphModule, symbols: Sequence[Any], device: torch.device):
        self.gm = gm
        self.g = gm.graph
        self.symbols = list(symbols)
        self.device = device
        self.masks: dict[torch.fx.Node, Any] = {}
        self._cache: dict[Any, torch.fx.Node] = {}
        self.len_nodes: dict[Any, torch.fx.Node] = {}  # symbol -> its true-length placeholder

    def call(self, op, *args, **kwargs) -> torch.fx.Node:
        return self.g.call_function(op, args, kwargs)

    def cached(self, key, make):
        n = self._cache.get(key)
        if n is None:
            n = make()
            self._cache[key] = n
        return n

    def prefix_mask(self, sym, offset: int, size: int, dim: int, ndim: int) -> Mask:
        """``index < len(sym) + offset`` along ``dim`` of an ``ndim``-d tensor of size
        ``size`` there."""
        shape = [1] * ndim
        shape[dim] = size

        def make():
            ar = self.call(aten.arange.start, 0, size, dtype=torch.int64, device=self.device)
            bound = self.len_nodes[sym]
            if offset:
                bound = self.call(aten.add.Tensor, bound, offset)
            lt = self.call(aten.lt.Tensor, ar, bound)
            return self.call(aten.view.default, lt, shape) if ndim != 1 else lt

        node = self.cached(("prefix", sym, offset, size, dim, ndim), make)
        return Mask(node, tuple(shape), {dim: (sym, offset)}, exact=True)

    def merged_mask(self, subs: Subs, dim: int, ndim: int) -> Mask:
        """The mask of a merged dim with layout ``subs`` (1-D along ``dim``)."""
        k = len(subs)
        size = 1
        for n, _ in subs:
            size *= n

        def make():
            m = None
            for i, (n, p) in enumerate(subs):
                if p is not None:
                    m = self.both(m, self.prefix_mask(p[0], p[1], n, i, k), k)
            full = self.call(aten.expand.default, m.node, [n for n, _ in subs])
            full = self.call(aten.clone.default, full, memory_format=torch.contiguous_format)
            shape = [1] * ndim
            shape[dim] = size
            return self.call(aten.view.default, full, shape)

        node = self.cached(("merged", subs, dim, ndim), make)
        shape = [1] * ndim
        shape[dim] = size
        return Mask(node, tuple(shape), {dim: subs}, exact=True)

    def both(self, a: Mask | None, b: Mask | None, ndim: int) -> Mask | None:
        """Logical and of two masks, aligned (right) to ``ndim`` dims."""
        if a is None and b is None:
            return None
        a = self.align(a, ndim) if a is not None else None
        b = self.align(b, ndim) if b is not None else None
        if a is None:
            return b
        if b is None or a.node is b.node:
            return a
        if a.exact and b.exact and a.shape == b.shape and a.prefix == b.prefix:
            return a  # the same mask, built twice
        shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
        node = self.cached(("and", a.node, b.node),
                           lambda: self.call(aten.logical_and.default, a.node, b.node))
        prefix = {}
        for d in range(ndim):
            pa, pb = a.prefix.get(d), b.prefix.get(d)
            if a.shape[d] == 1 and pb is not None:
                prefix[d] = pb
            elif b.shape[d] == 1 and pa is not None:
                prefix[d] = pa
            elif pa is not None and pa == pb:
                prefix[d] = pa
        exact = a.exact and b.exact and all(s == 1 or d in prefix for d, s in enumerate(shape))
        return Mask(node, shape, prefix, exact)

    def align(self, m: Mask, ndim: int) -> Mask:
        k = ndim - len(m.shape)
        if k == 0:
            return m
        if k < 0:
            # a lower-rank result (reductions handle their own masks)
            raise Unsupported("mask of higher rank than its tensor")
        shape = (1,) * k + m.shape
        node = self.cached(("view", m.node, shape),
                           lambda: self.call(aten.view.default, m.node, list(shape)))
        return Mask(node, shape, {d + k: p for d, p in m.prefix.items()}, m.exact)

    def fill(self, x: torch.fx.Node, m: Mask, value, like=None) -> torch.fx.Node:
        """``where(m, x, value)``: padded entries of ``x`` become ``value``. ``like``: a node
        with ``x``'s shape and dtype when ``x`` is new (no ``meta["val"]``)."""
        v = node_value(like if like is not None else x)
        nd = v.dim()
        m = self.align(m, nd)
        key = ("fill", x, m.node, value)

        def make():
            scalar = self.call(aten.scalar_tensor.default, value, dtype=v.dtype, device=v.device)
            return self.call(aten.where.self, m.node, x, scalar)

        return self.cached(key, make)

    def mask_of(self, a) -> Mask | None:
        return self.masks.get(a) if isinstance(a, torch.fx.Node) else None

    def reduce_mask(self, m: Mask | None, dims: Sequence[int], keepdim: bool) -> Mask | None:
        """Mask of a reduction's result over ``dims``: true where any reduced entry was real."""
        if m is None:
            return None
        nd = len(m.shape)
        live = [d for d in dims if m.shape[d] != 1]
        node = m.node
        if live:
            node = self.call(aten.any.dims, node, live, True)
        shape = tuple(1 if d in dims else s for d, s in enumerate(m.shape))
        prefix = {d: p for d, p in m.prefix.items() if d not in dims}
        if not keepdim:
            if dims:
                node = self.call(aten.squeeze.dims, node, list(dims))
            keep = [d for d in range(nd) if d not in dims]
            shape = tuple(shape[d] for d in keep)
            prefix = {keep.index(d): p for d, p in prefix.items()}
        if all(s == 1 for s in shape):
            return None
        return Mask(node, shape, prefix, m.exact)

    def count(self, m: Mask, x_shape, dims, keepdim, dtype) -> torch.fx.Node:
        """Number of real entries reduced into each result element, at least 1."""
        live = [d for d in dims if m.shape[d] != 1]
        dead = 1
        for d in dims:
            if m.shape[d] == 1:
                dead *= x_shape[d]
        c = self.call(aten.sum.dim_IntList, m.node, live, True, dtype=dtype)
        if dead != 1:
            c = self.call(aten.mul.Tensor, c, dead)
        if not keepdim:
            c = self.call(aten.squeeze.dims, c, list(dims))
        return self.call(aten.clamp_min.default, c, 1)

    def drop_dim(self, m: Mask, d: int) -> Mask | None:
        """``m`` with dim ``d`` made trivial (valid along ``d``); needs ``d`` separable."""
        others = [k for k in range(len(m.shape)) if m.shape[k] != 1 and k != d]
        if not others:
            return None
        if d not in m.prefix:
            raise Unsupported("mask not separable along a sliced dim")
        node = self.call(aten.any.dims, m.node, [d], True)
        shape = list(m.shape)
        shape[d] = 1
        return Mask(node, tuple(shape), {k: p for k, p in m.prefix.items() if k != d}, m.exact)

    def replace_uses(self, old, new, keep=()):
        skip = set(keep) | {new}
        old.replace_all_uses_with(new, delete_user_cb=lambda u: u not in skip)
