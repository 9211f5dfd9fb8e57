"""``_foreach_*`` ops (optimizers' multi-tensor path) split into one ATen op per tensor, which
fuse per parameter (kept as library calls they would each be a separate pass).

The split runs on AOTAutograd's functional graph (:func:`expand`), not as a decomposition
inside its trace: AOTAutograd traces one ``_foreach_*`` op per list instead of one op per
tensor (the demo's AdamW: about 30 ops instead of 1,600, each a functionalization, fake-tensor
and proxy dispatch), and the per-tensor nodes are made here with their values taken from the
list's (no dispatch).
"""

import operator

import torch
import torch.fx

from .host_scalars import round32

_BASES = ("add", "sub", "mul", "div", "addcmul", "addcdiv", "sqrt", "rsqrt", "neg", "reciprocal", "pow", "lerp",
          "maximum", "minimum", "clamp_min", "clamp_max", "abs", "exp", "log", "sign", "sigmoid", "tanh")
_KWARG_ONLY = ("alpha", "value")  # keyword-only in the per-tensor ops, positional in some foreach ones
_VALUE_OPS = (torch.ops.aten.addcmul, torch.ops.aten.addcdiv)  # a foreach op's "scalars" is their keyword "value"
_LIST_TYPES = ("List[Tensor]", "Tensor[]", "List[number]", "Scalar[]")
_OTHER_TYPES = ("Tensor", "number", "Scalar", "Optional[number]")

_table: dict | None = None


def table() -> dict:
    """foreach OpOverload -> (per-tensor OpOverloadPacket, argument names, kinds "list" / "other")."""
    global _table
    if _table is None:
        t = {}
        for base in _BASES:
            packet = getattr(torch.ops.aten, f"_foreach_{base}", None)
            per_tensor = getattr(torch.ops.aten, base, None)
            if packet is None or per_tensor is None:
                continue
            for name in packet.overloads():
                op = getattr(packet, name)
                args = op._schema.arguments
                kinds = ["list" if str(a.type) in _LIST_TYPES else "other" if str(a.type) in _OTHER_TYPES else None
                         for a in args]
                if None in kinds or "list" not in kinds or len(op._schema.returns) != 1:
                    continue
                if name == "Tensor" and base in ("addcmul", "addcdiv"):  # per-element scalars tensor
                    continue
                t[op] = (per_tensor, [a.name for a in args], kinds)
        _table = t
    return _table


def _value(a):
    if isinstance(a, torch.fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_value(x) for x in a)
    return a


def _same_type(args, out) -> bool:
    return all(isinstance(a, torch.fx.Node) and isinstance(v := a.meta.get("val"), torch.Tensor)
               and v.dtype == out.dtype and v.shape == out.shape for a in args)


def _per_tensor(graph: torch.fx.Graph, op, pos: list, kw: dict, val) -> torch.fx.Node:
    """The node of `op` on one element; ``addcmul`` / ``addcdiv`` as core ATen decomposes them
    (``self + value * tensor1 * tensor2``, ``self + value * tensor1 / tensor2``) when the three
    tensors have the result's dtype and shape (every intermediate then has the result's value type)."""
    aten = torch.ops.aten
    if op in (aten.addcmul.default, aten.addcdiv.default) and len(pos) == 3 and set(kw) <= {"value"}:
        if _same_type(pos, val):
            value = kw.get("value", 1)
            if not isinstance(value, torch.fx.Node) or _host_number(value):
                self_, t1, t2 = pos
                scaled = graph.call_function(aten.mul.Tensor, (t1, value))
                prod = graph.call_function(aten.mul.Tensor if op is aten.addcmul.default else aten.div.Tensor,
                                           (scaled, t2))
                out = graph.call_function(aten.add.Tensor, (self_, prod))
                for m in (scaled, prod, out):
                    m.meta["val"] = val
                return out
    if (op is aten.lerp.Scalar and len(pos) == 3 and not kw and isinstance(pos[2], (int, float))
            and val.dtype == torch.float32 and _same_type(pos[:2], val)):
        # core ATen's lerp: coeff * (end - start) + base, coeff and base picked by |weight| >= 0.5
        start, end, w = pos[0], pos[1], round32(float(pos[2]))
        coeff, base = (round32(w - 1.0), end) if abs(w) >= 0.5 else (w, start)
        diff = graph.call_function(aten.sub.Tensor, (end, start))
        scaled = graph.call_function(aten.mul.Tensor, (diff, coeff))
        out = graph.call_function(aten.add.Tensor, (scaled, base))
        for m in (diff, scaled, out):
            m.meta["val"] = val
        return out
    m = graph.call_function(op, tuple(pos), kw)
    m.meta["val"] = val
    return m


def _host_number(a: torch.fx.Node) -> bool:
    v = a.meta.get("val")
    return isinstance(v, torch.Tensor) and v.dim() == 0


def expand(gm: torch.fx.GraphModule) -> int:
    """Replace each functional ``_foreach_*`` node of :func:`table` by one per-tensor node per
    list element (its ``val`` the list's element); the list's ``getitem`` users read those
    nodes. A node with another kind of user keeps its list (later per-tensor nodes read it
    through ``getitem``). Returns the number of foreach nodes replaced."""
    tab = table()
    graph = gm.graph
    expanded: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    getitems: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
    replaced = 0

    def element(x, i, before):
        if isinstance(x, torch.fx.Node):
            if x in expanded:
                return expanded[x][i]
            key = (x, i)
            if key not in getitems:
                with graph.inserting_before(before):
                    g = graph.call_function(operator.getitem, (x, i))
                g.meta["val"] = x.meta["val"][i]
                getitems[key] = g
            return getitems[key]
        return x[i]

    for n in list(graph.nodes):
        spec = tab.get(n.target) if n.op == "call_function" else None
        vals = n.meta.get("val") if spec is not None else None
        if not isinstance(vals, (list, tuple)):
            continue
        per_tensor, names, kinds = spec
        given = dict(zip(names, n.args))
        given.update(n.kwargs)
        if any(k not in names for k in given):
            continue
        outs = []
        for i in range(len(vals)):
            pos, kw = [], {}
            for name, kind in zip(names, kinds):
                if name not in given:
                    continue
                x = element(given[name], i, n) if kind == "list" else given[name]
                if name in _KWARG_ONLY or (name == "scalars" and per_tensor in _VALUE_OPS):
                    kw["value" if name == "scalars" else name] = x
                else:
                    pos.append(x)
            overload = torch._C._jit_resolve_packet(per_tensor._qualified_op_name, *_value(pos), **_value(kw))
            with graph.inserting_before(n):
                outs.append(_per_tensor(graph, getattr(per_tensor, overload), pos, kw, vals[i]))
        expanded[n] = outs
        replaced += 1
        for u in list(n.users):
            if u.target is operator.getitem and len(u.args) == 2 and isinstance(u.args[1], int):
                u.replace_all_uses_with(outs[u.args[1]])
                graph.erase_node(u)
    for n in reversed(list(expanded)):
        if not n.users:
            graph.erase_node(n)
    if replaced:
        gm.recompile()
    return replaced
