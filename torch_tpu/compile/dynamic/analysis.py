"""What a Dynamo graph with symbolic sizes allows: its dynamic dimensions, the inputs they
come from, its outputs' size expressions, and why (if so) padding cannot be made safe."""

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx


def sym_expr(s):
    """sympy expression of a size (int or SymInt)."""
    import sympy  # not at module level: ~0.4 s, and Dynamo has loaded it by the time a graph arrives

    if isinstance(s, torch.SymInt):
        return s.node.expr
    return sympy.Integer(int(s))


def example_value(node: torch.fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


# Callables / methods a SymInt may flow into as a *size* (not a value): under padding they
# see the bucket size, which is what a padded tensor needs.
_SIZE_METHODS = {"view", "reshape", "expand", "new_zeros", "new_ones", "new_empty", "size",
                 "unflatten", "repeat", "view_as", "expand_as", "permute", "transpose"}
_SIZE_FUNCTIONS = {torch.zeros, torch.ones, torch.empty, torch.arange, torch.reshape,
                   torch.randn, torch.rand, operator.getitem,
                   torch.nn.functional.multi_head_attention_forward,
                   torch.nn.functional.layer_norm, torch.nn.functional.group_norm}
# Autograd cuts: the ATen trace of a bucket runs below autograd, where they are plain aliases
_GRAD_CUT_FUNCTIONS = {torch.detach, torch.Tensor.detach, torch._C._set_grad_enabled,
                       torch.Tensor.requires_grad_, torch.Tensor.detach_}
_SYM_ARITH = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
              operator.neg, operator.pos}


@dataclass
class Analysis:
    # placeholder index -> {dim: symbol} for dims whose size is a bare dynamic symbol
    dyn_dims: dict[int, dict[int, Any]]
    symbols: list[Any]  # bucketed symbols, in a fixed order
    # symbol -> (placeholder index, dim) or (placeholder index, None) for SymInt inputs
    sources: dict[Any, tuple[int, int | None]]
    symint_inputs: dict[int, Any]  # placeholder index -> sympy expr of a SymInt input
    item_inputs: list[int]  # 0-dim tensor inputs read with .item() (folded as constants)
    tensor_inputs: list[int]  # placeholder indices passed to the bucket program
    out_exprs: list[tuple[Any, ...] | None]  # per output: size exprs (None: not a tensor)
    unsupported: str | None = None
    grad_cut: str | None = None  # a detach / no_grad node (kept only by the exact path)


def analyze(gm: torch.fx.GraphModule) -> Analysis:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dyn_dims: dict[int, dict[int, Any]] = {}
    sources: dict[Any, tuple[int, int | None]] = {}
    symint_inputs: dict[int, Any] = {}
    item_inputs: list[int] = []
    tensor_inputs: list[int] = []
    all_tensor_syms = set()
    unsupported = None

    for i, n in enumerate(placeholders):
        ev = example_value(n)
        if isinstance(ev, torch.SymInt):
            symint_inputs[i] = ev.node.expr
            continue
        if not isinstance(ev, torch.Tensor):
            continue
        if ev.dim() == 0 and n.users and all(
                u.op == "call_method" and u.target == "item" for u in n.users):
            item_inputs.append(i)
            continue
        tensor_inputs.append(i)
        for d, s in enumerate(ev.shape):
            e = sym_expr(s)
            if e.is_number:
                continue
            all_tensor_syms |= e.free_symbols
            if e.is_Symbol:
                dyn_dims.setdefault(i, {})[d] = e
                sources.setdefault(e, (i, d))
            elif unsupported is None:
                unsupported = (f"input {n.name} dim {d} has size {e} (not a single dynamic size)")
    for i, e in symint_inputs.items():
        if e.is_Symbol:
            sources.setdefault(e, (i, None))
    # Symbols that size some tensor are bucketed; a symbol only passed as an int stays exact.
    symbols = sorted((s for s in all_tensor_syms if s in sources and sources[s][1] is not None),
                     key=str)
    for s in all_tensor_syms:
        if s not in sources and unsupported is None:
            unsupported = f"dynamic size {s} has no input dimension of its own"

    if unsupported is None:
        unsupported = _check_size_uses(gm, set(symbols))

    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    out_exprs: list[tuple[Any, ...] | None] = []
    for o in outs:
        ev = example_value(o) if isinstance(o, torch.fx.Node) else None
        if isinstance(ev, torch.Tensor):
            exprs = tuple(sym_expr(s) for s in ev.shape)
            for e in exprs:
                if not e.is_number and not is_shifted_symbol(e) and unsupported is None:
                    unsupported = (f"output {o.name} has size {tuple(ev.shape)}: a dynamic "
                                   f"dimension that is not one size plus a constant")
            out_exprs.append(exprs)
        elif isinstance(ev, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            out_exprs.append(None)
            if unsupported is None:
                unsupported = f"output {o.name} is a size ({ev}); padded sizes would leak"
        else:
            out_exprs.append(None)
    grad_cut = None
    for n in gm.graph.nodes:
        if (n.op == "call_method" and n.target in ("detach", "detach_", "requires_grad_")) or (
                n.op == "call_function" and (n.target in _GRAD_CUT_FUNCTIONS or isinstance(
                    n.target, torch._ops.HigherOrderOperator))):
            # higher-order ops (custom autograd.Function, ...) may define their own backward
            grad_cut = (f".{n.target}()" if n.op == "call_method" else
                        f"{getattr(n.target, '__module__', '')}.{getattr(n.target, '__name__', n.target)}")
            break
    return Analysis(dyn_dims, symbols, sources, symint_inputs, item_inputs, tensor_inputs,
                     out_exprs, unsupported, grad_cut)


def is_shifted_symbol(e) -> bool:
    """``e`` is ``s + c`` for one symbol ``s`` and an integer ``c`` (``x[:, 1:]`` has size
    ``s - 1``)."""
    syms = e.free_symbols
    if len(syms) != 1:
        return False
    (sym,) = syms
    return (e - sym).is_number


def _is_symbolic_value(v) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _check_size_uses(gm: torch.fx.GraphModule, symbols) -> str | None:
    """A dynamic size used as a *value* (``x / x.size(1)``) would see the bucket size, and
    ``narrow`` with a negative start counts from the padded end (the ATen trace no longer
    shows it; negative ``slice`` / ``select`` bounds are handled by the masking pass): say
    why if any node does so, else ``None``."""
    for n in gm.graph.nodes:
        ev = example_value(n)
        if _is_symbolic_value(ev) and ev.node.expr.free_symbols & symbols:
            for u in n.users:
                if u.op == "call_method" and u.target in _SIZE_METHODS:
                    continue
                if u.op == "call_function" and (u.target in _SIZE_FUNCTIONS
                                                or u.target in _SYM_ARITH):
                    if u.target in _SYM_ARITH and not _is_symbolic_value(example_value(u)):
                        return f"dynamic size {ev} used as a value by {u.format_node()}"
                    continue
                if u.op == "output":
                    continue
                return f"dynamic size {ev} used as a value by {u.format_node()}"
        if (n.op == "call_method" and n.target == "narrow") or (
                n.op == "call_function" and n.target is torch.narrow):
            src = example_value(n.args[0])
            dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            if isinstance(src, torch.Tensor) and isinstance(dim, int) and \
                    not sym_expr(src.shape[dim]).is_number:
                return f"narrow on dynamic dim {dim} ({n.format_node()})"
    return None
