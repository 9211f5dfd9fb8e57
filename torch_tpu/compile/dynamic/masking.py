"""The masking pass over a bucket's static ATen graph: every value gets a mask (true on
entries derived from real, unpadded data) and, before any op that mixes entries along a
padded dim, padded entries are replaced by the op's identity, so padding never reaches a
real entry. The rule for each op comes from an op -> rule table (:data:`RULES`), built
from the rule modules; an op not in it that is tagged ``pointwise`` carries its inputs'
masks; any other op that reads a padded tensor raises :class:`~.unsupported.Unsupported`."""

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from . import carry_rules, reduction_rules, shape_rules
from .mask import MaskGraph, blame, node_value, syms_of
from .retrace import FRESH
from .unsupported import Unsupported

aten = torch.ops.aten

Rule = Callable[[MaskGraph, torch.fx.Node], None]


def _rule_table(*tables: dict[Any, Rule]) -> dict[Any, Rule]:
    out: dict[Any, Rule] = {}
    for t in tables:
        both = out.keys() & t.keys()
        if both:
            raise AssertionError(f"masking rules defined twice for {sorted(map(str, both))}")
        out.update(t)
    return out


RULES: dict[Any, Rule] = _rule_table(shape_rules.RULES, reduction_rules.RULES, carry_rules.RULES)

# Factories: a fresh tensor has no padded input (retrace marks the ones of dynamic size).
_FACTORY_OPS = {aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
                aten.arange.default, aten.arange.start, aten.arange.start_step,
                aten.scalar_tensor.default, aten.empty_strided.default, aten.rand.default,
                aten.randn.default}


def mask_padded_graph(gm: torch.fx.GraphModule, input_dims: dict[int, dict[int, Any]], symbols: Sequence[Any],
                      device: torch.device) -> list[Any | None]:
    """Rewrites `gm` in place (see the module docstring): one length input per symbol is
    appended to its inputs. Returns the masks of its outputs (None: all real)."""
    masker = _Masker(gm, input_dims, symbols, device)
    masker.run()
    return masker.out_masks


class _Masker(MaskGraph):
    """Rewrites a static ATen graph of padded shapes so padded entries never reach a real
    one (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, input_dims: dict[int, dict[int, Any]],
                 symbols: Sequence[Any], device: torch.device):
        super().__init__(gm, symbols, device)
        self.input_dims = input_dims  # placeholder index -> {dim: symbol} of padded dims

    def run(self) -> torch.fx.GraphModule:
        placeholders = [n for n in self.g.nodes if n.op == "placeholder"]
        # length inputs go after the tensor inputs, in symbol order
        last = placeholders[-1]
        for s in self.symbols:
            with self.g.inserting_after(last):
                ph = self.g.placeholder(f"len_{s}")
            ph.meta["val"] = None
            self.len_nodes[s] = ph
            last = ph
        first_compute = last.next
        with self.g.inserting_before(first_compute):
            for i, n in enumerate(placeholders):
                dims = self.input_dims.get(i)
                if not dims:
                    continue
                v = node_value(n)
                m = None
                for d, s in sorted(dims.items()):
                    m = self.both(m, self.prefix_mask(s, 0, v.shape[d], d, v.dim()), v.dim())
                self.masks[n] = m
        for n in list(self.g.nodes):
            if n.op != "call_function":
                continue
            with self.g.inserting_before(n):
                try:
                    self.visit(n)
                except Unsupported as e:
                    if e.syms is None:
                        e.syms = syms_of(*[self.mask_of(a) for a in n.all_input_nodes])
                    raise
        out = next(n for n in self.g.nodes if n.op == "output")
        outs = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
        self.out_masks = [self.mask_of(o) for o in outs]
        self.g.eliminate_dead_code()
        self.g.lint()
        self.gm.recompile()
        return self.gm

    def visit(self, n: torch.fx.Node) -> None:
        """Sets the mask of ``n``'s result (and rewrites ``n``'s inputs where needed)."""
        op = n.target
        args = n.args
        if op is FRESH:
            x, dims, syms, offs = args
            v = node_value(x)
            if v is None:
                raise blame(f"a tensor of dynamic size without a traced value ({x.format_node()})")
            m = self.mask_of(x)
            for d, si, off in zip(dims, syms, offs):
                m = self.both(m, self.prefix_mask(self.symbols[si], off, v.shape[d], d, v.dim()),
                              v.dim())
            self.masks[x] = m
            n.replace_all_uses_with(x)
            return
        if op is operator.getitem:
            ms = self.masks.get(args[0])
            if isinstance(ms, list):
                self.masks[n] = ms[args[1]]
            elif ms is not None:
                raise Unsupported(f"getitem on a masked non-tuple {args[0].name}")
            return
        if not isinstance(op, torch._ops.OpOverload):
            if any(self.mask_of(a) is not None for a in n.all_input_nodes):
                raise Unsupported(f"{op} on a padded tensor")
            return
        if op in _FACTORY_OPS or all(self.mask_of(a) is None for a in n.all_input_nodes):
            return  # nothing padded flows in
        if op._schema.is_mutable:
            raise Unsupported(f"{op} writes into a tensor (in place) and reads a padded one")
        rule = RULES.get(op)
        if rule is None and torch.Tag.pointwise in op.tags:
            rule = carry_rules.elementwise
        if rule is None:
            masked = [a.name for a in n.all_input_nodes if self.mask_of(a) is not None]
            raise Unsupported(f"{op} has no masking rule (padded inputs: {', '.join(masked)})")
        rule(self, n)
