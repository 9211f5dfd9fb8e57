"""The static trace of one bucket: Dynamo's graph re-traced by ``make_fx`` at the bucket's
sizes (or exact ones) into core ATen ops, with tensors created at a dynamic size marked
(:data:`FRESH`) for the masking pass."""

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from .analysis import Analysis, example_value, is_shifted_symbol, sym_expr
from .decompositions import trace_decompositions


@torch.library.custom_op("torch_tpu_bucketing::fresh", mutates_args=())
def _fresh(x: torch.Tensor, dims: list[int], syms: list[int], offsets: list[int]) -> torch.Tensor:
    """Marks a tensor created at a dynamic size (``torch.zeros(b, s)``, ``arange(s)``) in the
    bucket's trace: along ``dims`` its entries past length ``len(syms[i]) + offsets[i]`` are
    padding. The masking pass removes it."""
    return x.clone()


@_fresh.register_fake
def _(x, dims, syms, offsets):
    return torch.empty_like(x)


FRESH = torch.ops.torch_tpu_bucketing.fresh.default  # the marker, as the traced graph holds it


_FRESH_METHODS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}
_FRESH_FUNCTIONS = {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like,
                    torch.rand_like, torch.randn_like}


class _MarkingInterpreter(torch.fx.Interpreter):
    """Runs Dynamo's graph and marks every fresh tensor of dynamic size with
    :func:`_fresh`: a factory has no padded input for the mask to come from."""

    def __init__(self, gm, symbols):
        super().__init__(gm)
        self.sym_ids = {s: i for i, s in enumerate(symbols)}

    def run_node(self, n):
        out = super().run_node(n)
        ev = example_value(n)
        if not isinstance(out, torch.Tensor) or not isinstance(ev, torch.Tensor) or \
                not self._is_fresh(n):
            return out
        dims, syms, offs = [], [], []
        for d, sz in enumerate(ev.shape):
            e = sym_expr(sz)
            if e.is_number or not is_shifted_symbol(e):
                continue
            (sym,) = e.free_symbols
            if sym in self.sym_ids:
                dims.append(d)
                syms.append(self.sym_ids[sym])
                offs.append(int(e - sym))
        return torch.ops.torch_tpu_bucketing.fresh(out, dims, syms, offs) if dims else out

    def _is_fresh(self, n) -> bool:
        if n.op == "call_method" and n.target in _FRESH_METHODS:
            return True
        if n.op == "call_function" and n.target in _FRESH_FUNCTIONS:
            return True
        if n.op not in ("call_function", "call_method"):
            return False
        # a tensor made from sizes alone (torch.zeros(b, s), torch.arange(s))
        for a in n.all_input_nodes:
            ev = example_value(a)
            if isinstance(ev, torch.Tensor):
                return False
            # getitem of a multi-output op (var_mean(x)[0]) reads tensors too
            if isinstance(ev, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in ev):
                return False
        return True


def fold_item_inputs(gm: torch.fx.GraphModule, item_nodes: dict[torch.fx.Node, float]):
    """A copy of ``gm`` with ``.item()`` of 0-dim tensor inputs (dropout p, eps Dynamo lifted
    to inputs) replaced by their values; the values are part of the bucket key."""
    gm2 = copy.deepcopy(gm)
    name_to_val = {n.name: v for n, v in item_nodes.items()}
    for n in list(gm2.graph.nodes):
        if n.op == "call_method" and n.target == "item" and n.args[0].op == "placeholder" \
                and n.args[0].name in name_to_val:
            v = name_to_val[n.args[0].name]
            n.replace_all_uses_with(v)  # type: ignore[arg-type]
            gm2.graph.erase_node(n)
    gm2.recompile()
    return gm2


def trace_static(gm, analysis: Analysis, args: Sequence, sizes: dict[Any, int],
                  extra_syms: dict[Any, int], symbols: Sequence[Any] = ()):
    """make_fx trace of ``gm`` (Dynamo graph) on fake inputs whose dynamic dims have the
    sizes in ``sizes`` (bucket or exact). Returns an ATen-level GraphModule taking only the
    tensor inputs (``analysis.tensor_inputs``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    item_vals = {placeholders[i]: float(args[i].item()) if args[i].is_floating_point()
                 else int(args[i].item()) for i in analysis.item_inputs}
    gm2 = fold_item_inputs(gm, item_vals) if item_vals else gm
    env = dict(sizes)
    env.update(extra_syms)

    def size_of(e):
        return int(e.subs(env)) if not e.is_number else int(e)

    consts: dict[int, Any] = {}
    for i, e in analysis.symint_inputs.items():
        consts[i] = size_of(e)
    for i in analysis.item_inputs:
        consts[i] = args[i]  # unused after folding; keeps the signature
    nargs = len(placeholders)
    tensor_pos = analysis.tensor_inputs

    def fn(*tensors):
        full = [None] * nargs
        for i, v in consts.items():
            full[i] = v
        for i, t in zip(tensor_pos, tensors):
            full[i] = t
        return _MarkingInterpreter(gm2, symbols).run(*full)

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = []
    for i in tensor_pos:
        ev = example_value(placeholders[i])
        shape = [size_of(sym_expr(s)) for s in ev.shape]
        real = args[i]
        with fake_mode:  # a fake tensor on the input's device, nothing allocated
            f = torch.empty_strided(shape, _contiguous_strides(shape), dtype=ev.dtype,
                                    device=real.device)
        if isinstance(real, torch.nn.Parameter) or real.requires_grad:
            f.requires_grad_(real.requires_grad)
        fakes.append(f)
    with fake_mode:
        # functionalized: in-place ops (relu_, +=) become out-of-place ones the masking
        # handles; a mutation of an input stays as a trailing copy_
        traced = make_fx(torch.func.functionalize(fn, remove="mutations"),
                         decomposition_table=trace_decompositions())(*fakes)
    return traced


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))
