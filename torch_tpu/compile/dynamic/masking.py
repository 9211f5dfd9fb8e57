"""Bounded dynamism for ``torch.compile(backend="tpu")``: dynamic dimensions padded to buckets.

When Dynamo hands the backend a graph with symbolic sizes (``dynamic=True``, or the
automatic-dynamic recompile after a size changed), :func:`compile_bucketed` compiles it
once per *bucket* instead of once per size. Each call

1. reads the true value of every dynamic dimension (sequence length, batch, ...) from the
   inputs and rounds it up to its bucket (default: powers of two up to 128, then multiples
   of 128; see :func:`set_buckets` and ``TORCH_TPU_COMPILE_BUCKETS``);
2. pads the tensor inputs with zeros to the bucket sizes (``torch.nn.functional.pad``, so
   autograd flows back through the padding);
3. runs the bucket's program, compiled once by the static pipeline (``compile_static``) from
   a rewritten graph with the bucket's static shapes and one extra input per dynamic
   dimension: its true length, a 0-dim ``int64`` tensor;
4. slices every output back to its true sizes.

The rewritten graph carries *masks*: for every intermediate tensor, a boolean tensor
(broadcastable to it) that is true on entries derived from real, unpadded data. Before any
op that mixes entries along a padded dimension the padded entries are replaced by the op's
identity: ``sum``/``mean``/matmul contractions see ``0`` (``mean`` divides by the true
count), ``amax``/softmax/log-softmax see the dtype's lowest value (so attention over padded
keys gets weight exactly 0 and fully padded rows stay finite, keeping gradients free of
NaN), ``nll_loss`` sees ``ignore_index`` on padded positions. Elementwise ops, views,
permutes and matmuls on non-contracted dims just carry masks along. So one program serves
every length of its bucket and returns what the unpadded computation returns.

What the masking cannot prove safe falls back, with the reason recorded in
``torch_tpu.compile_stats()["recompile_reasons"]`` and :func:`bucket_stats`: a size whose
padding is at fault (layer norm over it, ``x[:, -1]``) stays exact while the others are
still bucketed; otherwise (an op without a masking rule on a padded dim, a size used as a
value, a write into a padded input, ``detach`` / ``no_grad`` / a custom autograd.Function
when gradients are needed: the bucket's ATen trace runs below autograd) Dynamo's own graph
is compiled for each exact shape.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx

from . import stats as _compile_stats
from .stats import bucket_stats, reset_bucket_stats

log = logging.getLogger("torch_tpu.compile")

aten = torch.ops.aten

ENV_VAR = "TORCH_TPU_COMPILE_BUCKETS"
DEFAULT_SPEC = "1,2,4,8,16,32,64,128,+128"

# ---------------------------------------------------------------------------
# Bucket configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketConfig:
    """Bucket sizes for dynamic dimensions.

    Attributes:
        sizes: ascending bucket sizes (elements along the dimension).
        step: past ``sizes[-1]``, sizes round up to a multiple of ``step``; ``None``: a size
            past the largest bucket is compiled exactly (with a recorded reason).
        enabled: ``False`` (spec ``"off"``): every dynamic shape is compiled exactly.
    """

    sizes: Tuple[int, ...]
    step: Optional[int]
    enabled: bool = True

    def bucket(self, n: int) -> Optional[int]:
        """The bucket for a dimension of true size ``n``, or ``None`` when ``n`` has none
        (bucketing off, or past the largest size with no step)."""
        if not self.enabled:
            return None
        for s in self.sizes:
            if n <= s:
                return s
        if self.step is None:
            return None
        return -(-n // self.step) * self.step

    def spec(self) -> str:
        if not self.enabled:
            return "off"
        return ",".join([str(s) for s in self.sizes] + ([f"+{self.step}"] if self.step else []))


def _config_error(msg: str) -> ValueError:
    """A ValueError that torch.compile lets through to the caller as it is (Dynamo wraps
    other backend errors in BackendCompilerFailed)."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:
        return ValueError(msg)

    class BucketSpecError(ValueError, ShortenTraceback):
        def __init__(self, message):
            ValueError.__init__(self, message)
            self.first_useful_frame = None

    BucketSpecError.__module__ = "builtins"
    BucketSpecError.__name__ = BucketSpecError.__qualname__ = "ValueError"
    return BucketSpecError(msg)


def parse_buckets(spec) -> BucketConfig:
    """Parse a bucket specification.

    Args:
        spec: ``"off"``; or a string of ascending positive integers separated by commas,
            optionally ending with ``+N`` (past the last size, round up to a multiple of
            ``N``), e.g. ``"1,2,4,8,16,32,64,128,+128"`` (the default); or a sequence of
            ints (same meaning, ``"+N"`` allowed as the last item).

    Returns:
        The :class:`BucketConfig`.

    Raises:
        ValueError: empty spec, a non-integer or non-positive size, sizes not strictly
            ascending, or ``+N`` anywhere but last.
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() in ("off", "none", "0"):
            return BucketConfig((), None, enabled=False)
        items = [t.strip() for t in text.split(",")]
    else:
        items = [str(t).strip() for t in spec]
    if not items or items == [""]:
        raise _config_error(f"{ENV_VAR}: empty bucket specification {spec!r}; expected e.g. "
                         f"'{DEFAULT_SPEC}' or 'off'")
    sizes: List[int] = []
    step = None
    for i, t in enumerate(items):
        is_step = t.startswith("+")
        body = t[1:] if is_step else t
        try:
            v = int(body)
        except ValueError:
            raise _config_error(f"{ENV_VAR}: bucket {t!r} in {spec!r} is not an integer; expected "
                             f"ascending sizes like '{DEFAULT_SPEC}' or 'off'") from None
        if v <= 0:
            raise _config_error(f"{ENV_VAR}: bucket {t!r} in {spec!r} must be positive")
        if is_step:
            if i != len(items) - 1:
                raise _config_error(f"{ENV_VAR}: step {t!r} in {spec!r} must be the last item")
            step = v
        else:
            if sizes and v <= sizes[-1]:
                raise _config_error(f"{ENV_VAR}: bucket sizes in {spec!r} must be strictly "
                                 f"ascending ({v} after {sizes[-1]})")
            sizes.append(v)
    if not sizes and step is None:
        raise _config_error(f"{ENV_VAR}: no bucket sizes in {spec!r}")
    return BucketConfig(tuple(sizes), step)


_config_lock = threading.Lock()
_config: Optional[BucketConfig] = None


def get_buckets() -> BucketConfig:
    """The bucket configuration in force: the last :func:`set_buckets`, else
    ``TORCH_TPU_COMPILE_BUCKETS``, else the default (powers of two up to 128, then
    multiples of 128).

    Raises:
        ValueError: ``TORCH_TPU_COMPILE_BUCKETS`` does not parse (see :func:`parse_buckets`).
    """
    global _config
    with _config_lock:
        if _config is None:
            _config = parse_buckets(os.environ.get(ENV_VAR) or DEFAULT_SPEC)
        return _config


def set_buckets(spec=None) -> BucketConfig:
    """Set the buckets dynamic dimensions are padded to (``None``: back to the environment
    variable / default). Takes effect at the next call of a compiled function: a new size
    outside the buckets already compiled compiles a new program.

    Args:
        spec: see :func:`parse_buckets`; ``None`` re-reads ``TORCH_TPU_COMPILE_BUCKETS``.

    Returns:
        The new :class:`BucketConfig`.

    Raises:
        ValueError: ``spec`` (or the environment variable) does not parse.
    """
    global _config
    cfg = parse_buckets(os.environ.get(ENV_VAR) or DEFAULT_SPEC) if spec is None else parse_buckets(spec)
    with _config_lock:
        _config = cfg
    return cfg


class Unsupported(Exception):
    """The masking cannot prove a graph pad-safe; the message says why. ``syms``: the
    dynamic sizes whose padding is at fault (``None``: not known)."""

    syms: Optional[frozenset] = None


def _unsupported(msg: str, m: Optional["_Mask"] = None, dims: Sequence[int] = ()) -> Unsupported:
    """An :class:`Unsupported` blaming the sizes padded along ``dims`` of mask ``m``."""
    e = Unsupported(msg)
    if m is not None and dims:
        e.syms = _Masker.syms_of(m, dims=dims)
    return e


# ---------------------------------------------------------------------------
# Dynamo graph analysis
# ---------------------------------------------------------------------------


def _sym_expr(s):
    """sympy expression of a size (int or SymInt)."""
    import sympy

    if isinstance(s, torch.SymInt):
        return s.node.expr
    return sympy.Integer(int(s))


def _example(node: torch.fx.Node):
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
class _Analysis:
    # placeholder index -> {dim: symbol} for dims whose size is a bare dynamic symbol
    dyn_dims: Dict[int, Dict[int, Any]]
    symbols: List[Any]  # bucketed symbols, in a fixed order
    # symbol -> (placeholder index, dim) or (placeholder index, None) for SymInt inputs
    sources: Dict[Any, Tuple[int, Optional[int]]]
    symint_inputs: Dict[int, Any]  # placeholder index -> sympy expr of a SymInt input
    item_inputs: List[int]  # 0-dim tensor inputs read with .item() (folded as constants)
    tensor_inputs: List[int]  # placeholder indices passed to the bucket program
    out_exprs: List[Optional[Tuple[Any, ...]]]  # per output: size exprs (None: not a tensor)
    unsupported: Optional[str] = None
    grad_cut: Optional[str] = None  # a detach / no_grad node (kept only by the exact path)


def _analyze(gm: torch.fx.GraphModule) -> _Analysis:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dyn_dims: Dict[int, Dict[int, Any]] = {}
    sources: Dict[Any, Tuple[int, Optional[int]]] = {}
    symint_inputs: Dict[int, Any] = {}
    item_inputs: List[int] = []
    tensor_inputs: List[int] = []
    all_tensor_syms = set()
    unsupported = None

    for i, n in enumerate(placeholders):
        ev = _example(n)
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
            e = _sym_expr(s)
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
    out_exprs: List[Optional[Tuple[Any, ...]]] = []
    for o in outs:
        ev = _example(o) if isinstance(o, torch.fx.Node) else None
        if isinstance(ev, torch.Tensor):
            exprs = tuple(_sym_expr(s) for s in ev.shape)
            for e in exprs:
                if not e.is_number and not _is_shifted_symbol(e) and unsupported is None:
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
    return _Analysis(dyn_dims, symbols, sources, symint_inputs, item_inputs, tensor_inputs,
                     out_exprs, unsupported, grad_cut)


def _is_shifted_symbol(e) -> bool:
    """``e`` is ``s + c`` for one symbol ``s`` and an integer ``c`` (``x[:, 1:]`` has size
    ``s - 1``)."""
    syms = e.free_symbols
    if len(syms) != 1:
        return False
    (sym,) = syms
    return (e - sym).is_number


def _is_symbolic_value(v) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _check_size_uses(gm: torch.fx.GraphModule, symbols) -> Optional[str]:
    """A dynamic size used as a *value* (``x / x.size(1)``) would see the bucket size, and
    ``narrow`` with a negative start counts from the padded end (the ATen trace no longer
    shows it; negative ``slice`` / ``select`` bounds are handled by the masking pass): say
    why if any node does so, else ``None``."""
    for n in gm.graph.nodes:
        ev = _example(n)
        if _is_symbolic_value(ev) and ev.node.expr.free_symbols & symbols:
            for u in n.users:
                if u.op == "call_method" and u.target in _SIZE_METHODS:
                    continue
                if u.op == "call_function" and (u.target in _SIZE_FUNCTIONS
                                                or u.target in _SYM_ARITH):
                    if u.target in _SYM_ARITH and not _is_symbolic_value(_example(u)):
                        return f"dynamic size {ev} used as a value by {u.format_node()}"
                    continue
                if u.op == "output":
                    continue
                return f"dynamic size {ev} used as a value by {u.format_node()}"
        if (n.op == "call_method" and n.target == "narrow") or (
                n.op == "call_function" and n.target is torch.narrow):
            src = _example(n.args[0])
            dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            if isinstance(src, torch.Tensor) and isinstance(dim, int) and \
                    not _sym_expr(src.shape[dim]).is_number:
                return f"narrow on dynamic dim {dim} ({n.format_node()})"
    return None


# ---------------------------------------------------------------------------
# Static trace of one bucket
# ---------------------------------------------------------------------------


@torch.library.custom_op("torch_tpu_bucketing::fresh", mutates_args=())
def _fresh(x: torch.Tensor, dims: List[int], syms: List[int], offsets: List[int]) -> torch.Tensor:
    """Marks a tensor created at a dynamic size (``torch.zeros(b, s)``, ``arange(s)``) in the
    bucket's trace: along ``dims`` its entries past length ``len(syms[i]) + offsets[i]`` are
    padding. The masking pass removes it."""
    return x.clone()


@_fresh.register_fake
def _(x, dims, syms, offsets):
    return torch.empty_like(x)


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
        ev = _example(n)
        if not isinstance(out, torch.Tensor) or not isinstance(ev, torch.Tensor) or \
                not self._is_fresh(n):
            return out
        dims, syms, offs = [], [], []
        for d, sz in enumerate(ev.shape):
            e = _sym_expr(sz)
            if e.is_number or not _is_shifted_symbol(e):
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
            ev = _example(a)
            if isinstance(ev, torch.Tensor):
                return False
            # getitem of a multi-output op (var_mean(x)[0]) reads tensors too
            if isinstance(ev, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in ev):
                return False
        return True


def _fold_item_inputs(gm: torch.fx.GraphModule, item_nodes: Dict[torch.fx.Node, float]):
    """A copy of ``gm`` with ``.item()`` of 0-dim tensor inputs (dropout p, eps Dynamo lifted
    to inputs) replaced by their values; the values are part of the bucket key."""
    import copy

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


def _trace_static(gm, analysis: _Analysis, args: Sequence, sizes: Dict[Any, int],
                  extra_syms: Dict[Any, int], symbols: Sequence[Any] = ()):
    """make_fx trace of ``gm`` (Dynamo graph) on fake inputs whose dynamic dims have the
    sizes in ``sizes`` (bucket or exact). Returns an ATen-level GraphModule taking only the
    tensor inputs (``analysis.tensor_inputs``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    item_vals = {placeholders[i]: float(args[i].item()) if args[i].is_floating_point()
                 else int(args[i].item()) for i in analysis.item_inputs}
    gm2 = _fold_item_inputs(gm, item_vals) if item_vals else gm
    env = dict(sizes)
    env.update(extra_syms)

    def size_of(e):
        return int(e.subs(env)) if not e.is_number else int(e)

    consts: Dict[int, Any] = {}
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
        ev = _example(placeholders[i])
        shape = [size_of(_sym_expr(s)) for s in ev.shape]
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
                         decomposition_table=_trace_decompositions())(*fakes)
    return traced


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
    import torch.nn.functional as F

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
    import torch.nn.functional as F

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


def _trace_decompositions():
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # kept whole: its masking rule sends padded positions to ignore_index
    table.pop(aten.nll_loss_forward.default, None)
    # inference fast paths of nn.TransformerEncoderLayer / nn.MultiheadAttention are single
    # fused ops; their math form is what padding can be made safe for
    table[aten._transformer_encoder_layer_fwd.default] = _decomp_encoder_layer
    table[aten._native_multi_head_attention.default] = _decomp_native_mha
    return table


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))


# ---------------------------------------------------------------------------
# Masking pass over the static ATen graph
# ---------------------------------------------------------------------------


class _Subs(tuple):
    """Layout of a dim merged from several padded ones (``[B, S] -> [B*S]``): its sub-dims,
    outer to inner, as ``(size, (sym, offset) or None)``; ``None``: all entries real."""


def _simple(p) -> bool:
    """``p`` is a plain prefix ``(sym, offset)``, not a merged dim's :class:`_Subs`."""
    return p is not None and not isinstance(p, _Subs)


@dataclass
class _Mask:
    """A boolean mask node broadcastable to its tensor (same ndim; size 1 or the tensor's size
    per dim). ``prefix[d] = (sym, offset)``: along ``d`` the mask is ``index < len(sym) +
    offset`` and separable from the other dims; ``prefix[d] = _Subs(...)``: ``d`` is a merged
    dim with that layout. ``exact``: the mask is the product of its per-dim descriptions
    (every dim of size > 1 has one), so views can rebuild it without materializing it."""

    node: torch.fx.Node
    shape: Tuple[int, ...]
    prefix: Dict[int, Any] = field(default_factory=dict)
    exact: bool = False


_VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_CARRY_OPS = {aten._to_copy.default, aten.clone.default, aten.alias.default,
              aten.detach.default, aten.lift_fresh_copy.default, aten.contiguous.default,
              aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.where.self,
              aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar,
              aten.native_dropout.default, aten.bernoulli.p, aten.bernoulli.default,
              aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
              aten.empty_like.default, aten.rand_like.default, aten.randn_like.default}
_FACTORY_OPS = {aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
                aten.arange.default, aten.arange.start, aten.arange.start_step,
                aten.scalar_tensor.default, aten.empty_strided.default, aten.rand.default,
                aten.randn.default}
_SUM_LIKE = {aten.sum.dim_IntList: 0, aten.sum.default: 0, aten.prod.dim_int: 1,
             aten.prod.default: 1}
_ANY_ALL = {aten.any.dim: False, aten.any.dims: False, aten.any.default: False,
            aten.all.dim: True, aten.all.dims: True, aten.all.default: True}
_MAX_LIKE = {aten.amax.default: "low", aten.amin.default: "high", aten.max.dim: "low",
             aten.min.dim: "high", aten.argmax.default: "low", aten.argmin.default: "high",
             aten.max.default: "low", aten.min.default: "high"}
_SOFTMAX = {aten._softmax.default, aten._log_softmax.default, aten.logsumexp.default}
_MM = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}
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


def _val(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v


def _low(dtype):
    if dtype.is_floating_point:
        return torch.finfo(dtype).min
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


def _high(dtype):
    if dtype.is_floating_point:
        return torch.finfo(dtype).max
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def _norm_dims(dims, ndim):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % ndim if ndim else 0 for d in dims})


def _view_groups(a: Sequence[int], b: Sequence[int]):
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


class _Masker:
    """Rewrites a static ATen graph of padded shapes so padded entries never reach a real
    one (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, input_dims: Dict[int, Dict[int, Any]],
                 symbols: Sequence[Any], device: torch.device):
        self.gm = gm
        self.g = gm.graph
        self.input_dims = input_dims
        self.symbols = list(symbols)
        self.device = device
        self.masks: Dict[torch.fx.Node, Any] = {}
        self._cache: Dict[Any, torch.fx.Node] = {}
        self.len_nodes: Dict[Any, torch.fx.Node] = {}

    # -- node helpers -------------------------------------------------------
    def call(self, op, *args, **kwargs) -> torch.fx.Node:
        return self.g.call_function(op, args, kwargs)

    def cached(self, key, make):
        n = self._cache.get(key)
        if n is None:
            n = make()
            self._cache[key] = n
        return n

    def prefix_mask(self, sym, offset: int, size: int, dim: int, ndim: int) -> _Mask:
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
        return _Mask(node, tuple(shape), {dim: (sym, offset)}, exact=True)

    def merged_mask(self, subs: "_Subs", dim: int, ndim: int) -> _Mask:
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
        return _Mask(node, tuple(shape), {dim: subs}, exact=True)

    def both(self, a: Optional[_Mask], b: Optional[_Mask], ndim: int) -> Optional[_Mask]:
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
        return _Mask(node, shape, prefix, exact)

    def align(self, m: _Mask, ndim: int) -> _Mask:
        k = ndim - len(m.shape)
        if k == 0:
            return m
        if k < 0:
            # a lower-rank result (reductions handle their own masks)
            raise Unsupported("mask of higher rank than its tensor")
        shape = (1,) * k + m.shape
        node = self.cached(("view", m.node, shape),
                           lambda: self.call(aten.view.default, m.node, list(shape)))
        return _Mask(node, shape, {d + k: p for d, p in m.prefix.items()}, m.exact)

    def fill(self, x: torch.fx.Node, m: _Mask, value, like=None) -> torch.fx.Node:
        """``where(m, x, value)``: padded entries of ``x`` become ``value``. ``like``: a node
        with ``x``'s shape and dtype when ``x`` is new (no ``meta["val"]``)."""
        v = _val(like if like is not None else x)
        nd = v.dim()
        m = self.align(m, nd)
        key = ("fill", x, m.node, value)

        def make():
            scalar = self.call(aten.scalar_tensor.default, value, dtype=v.dtype, device=v.device)
            return self.call(aten.where.self, m.node, x, scalar)

        return self.cached(key, make)

    @staticmethod
    def syms_of(*masks, dims=None) -> Optional[frozenset]:
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
                    p, _Subs) else out.add(p[0])
        return frozenset(out)

    def mask_of(self, a) -> Optional[_Mask]:
        return self.masks.get(a) if isinstance(a, torch.fx.Node) else None

    def reduce_mask(self, m: Optional[_Mask], dims: Sequence[int], keepdim: bool) -> Optional[_Mask]:
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
        return _Mask(node, shape, prefix, m.exact)

    def count(self, m: _Mask, x_shape, dims, keepdim, dtype) -> torch.fx.Node:
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

    # -- the pass ------------------------------------------------------------
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
                v = _val(n)
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
                        e.syms = self.syms_of(*[self.mask_of(a) for a in n.all_input_nodes])
                    raise
        out = next(n for n in self.g.nodes if n.op == "output")
        outs = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
        self.out_masks = [self.mask_of(o) for o in outs]
        self.g.eliminate_dead_code()
        self.g.lint()
        self.gm.recompile()
        return self.gm

    def visit(self, n: torch.fx.Node) -> None:
        op = n.target
        args = n.args
        if op is torch.ops.torch_tpu_bucketing.fresh.default:
            x, dims, syms, offs = args
            v = _val(x)
            if v is None:
                raise _unsupported(f"a tensor of dynamic size without a traced value ({x.format_node()})")
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
        in_masks = [self.mask_of(a) for a in n.all_input_nodes]
        if all(m is None for m in in_masks) and op not in _FACTORY_OPS:
            return  # nothing padded flows in
        if op in _FACTORY_OPS:
            return
        v = _val(n)
        name = str(op)
        if op._schema.is_mutable:
            raise Unsupported(f"{name} writes into a tensor (in place) and reads a padded one")

        if op in _VIEW_OPS:
            self.masks[n] = self.view_rule(args[0], list(v.shape))
            return
        if op is aten.permute.default:
            m = self.mask_of(args[0])
            perm = [d % len(m.shape) for d in args[1]]
            shape = tuple(m.shape[d] for d in perm)
            node = self.call(aten.permute.default, m.node, perm)
            prefix = {perm.index(d): p for d, p in m.prefix.items()}
            self.masks[n] = _Mask(node, shape, prefix, m.exact)
            return
        if op in (aten.t.default, aten.transpose.int):
            m = self.mask_of(args[0])
            nd = len(m.shape)
            d0, d1 = (0, 1) if op is aten.t.default else (args[1] % nd, args[2] % nd)
            if nd < 2:
                self.masks[n] = m
                return
            perm = list(range(nd))
            perm[d0], perm[d1] = perm[d1], perm[d0]
            node = self.call(aten.permute.default, m.node, perm)
            shape = tuple(m.shape[d] for d in perm)
            prefix = {perm.index(d): p for d, p in m.prefix.items()}
            self.masks[n] = _Mask(node, shape, prefix, m.exact)
            return
        if op is aten.expand.default:
            self.masks[n] = self.align(self.mask_of(args[0]), v.dim())
            return
        if op is aten.unsqueeze.default:
            m = self.mask_of(args[0])
            d = args[1] % (len(m.shape) + 1)
            shape = m.shape[:d] + (1,) + m.shape[d:]
            node = self.call(aten.unsqueeze.default, m.node, d)
            prefix = {(k + 1 if k >= d else k): p for k, p in m.prefix.items()}
            self.masks[n] = _Mask(node, shape, prefix, m.exact)
            return
        if op in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
            m = self.mask_of(args[0])
            src = _val(args[0])
            nd = src.dim()
            if op is aten.squeeze.default:
                dims = [d for d in range(nd) if src.shape[d] == 1]
            else:
                dims = [d for d in _norm_dims(args[1], nd) if src.shape[d] == 1]
            if not dims:
                self.masks[n] = m
                return
            node = self.call(aten.squeeze.dims, m.node, dims)
            keep = [d for d in range(nd) if d not in dims]
            shape = tuple(m.shape[d] for d in keep)
            prefix = {keep.index(d): p for d, p in m.prefix.items() if d in keep}
            self.masks[n] = _Mask(node, shape, prefix, m.exact) if any(s != 1 for s in shape) else None
            return
        if op is aten.slice.Tensor:
            self.masks[n] = self.slice_rule(n)
            return
        if op is aten.select.int:
            m = self.mask_of(args[0])
            nd = len(m.shape)
            d = args[1] % nd
            idx = args[2]
            if m.shape[d] != 1 and idx < 0:
                raise _unsupported(f"{name}: index {idx} counts from the padded end of dim {d}", m, [d])
            node = self.call(aten.select.int, m.node, d, idx if m.shape[d] != 1 else 0)
            keep = [k for k in range(nd) if k != d]
            shape = tuple(m.shape[k] for k in keep)
            prefix = {keep.index(k): p for k, p in m.prefix.items() if k != d}
            self.masks[n] = _Mask(node, shape, prefix, m.exact) if any(s != 1 for s in shape) else None
            return
        if op in _MM:
            self.mm_rule(n)
            return
        if op in _SUM_LIKE or op in _ANY_ALL or op in _MAX_LIKE or op in (
                aten.mean.dim, aten.mean.default):
            self.reduce_rule(n)
            return
        if op is aten.linalg_vector_norm.default:
            self.norm_rule(n)
            return
        if op in (aten.var.correction, aten.var_mean.correction):
            self.var_rule(n)
            return
        if op in _SOFTMAX:
            self.softmax_rule(n)
            return
        if op in (aten.cumsum.default, aten.cumprod.default):
            m = self.mask_of(args[0])
            d = args[1] % len(m.shape)
            if m.shape[d] != 1 and not _simple(m.prefix.get(d)):
                raise _unsupported(f"{name} along a merged padded dim {d}", m, [d])
            self.masks[n] = m  # padding sits at the end: prefixes of real entries stay real
            return
        if op is aten.native_layer_norm.default:
            m = self.mask_of(args[0])
            nd = _val(args[0]).dim()
            k = len(args[1])
            if m is not None and any(m.shape[d] != 1 for d in range(nd - k, nd)):
                raise _unsupported(f"{name} normalizes over a padded dim", m, range(nd - k, nd))
            for a in args[2:4]:
                if self.mask_of(a) is not None:
                    raise Unsupported(f"{name}: padded weight or bias")
            stat = None
            if m is not None:
                stat = m  # mean/rstd keep the normalized dims as size 1
            self.masks[n] = [m, stat, stat]
            return
        if op is aten.embedding.default:
            if self.mask_of(args[0]) is not None:
                raise Unsupported(f"{name}: padded embedding table")
            m = self.mask_of(args[1])
            if m is not None:
                node = self.call(aten.unsqueeze.default, m.node, -1)
                self.masks[n] = _Mask(node, m.shape + (1,), dict(m.prefix), m.exact)
            return
        if op is aten.index.Tensor:
            self.masks[n] = self.index_rule(n)
            return
        if op in _BATCH_WISE:
            self.batch_rule(n)
            return
        if op is aten.gather.default:
            m, mi = self.mask_of(args[0]), self.mask_of(args[2])
            d = args[1] % v.dim()
            if m is not None and m.shape[d] != 1:
                raise _unsupported(f"{name} along padded dim {d}", m, [d])
            if m is not None and any(m.shape[k] != 1 and m.shape[k] != v.shape[k]
                                     for k in range(v.dim())):
                raise Unsupported(f"{name}: index smaller than the padded input")
            self.masks[n] = self.both(m, mi, v.dim())
            return
        if op is aten.nll_loss_forward.default:
            self.nll_rule(n)
            return
        if op is aten.cat.default:
            self.cat_rule(n)
            return
        if op in (aten.split.Tensor, aten.split_with_sizes.default):
            m = self.mask_of(args[0])
            d = (args[2] if len(args) > 2 else n.kwargs.get("dim", 0)) % len(m.shape)
            if m.shape[d] != 1:
                raise _unsupported(f"{name} along padded dim {d}", m, [d])
            self.masks[n] = [m] * len(v)
            return
        if torch.Tag.pointwise in op.tags or op in _CARRY_OPS:
            outs = v if isinstance(v, (tuple, list)) else [v]
            nd = outs[0].dim()
            m = None
            for a in n.all_input_nodes:
                am = self.mask_of(a)
                if am is not None:
                    m = self.both(m, am, nd)
            self.masks[n] = [m] * len(outs) if isinstance(v, (tuple, list)) else m
            return
        masked = [a.name for a in n.all_input_nodes if self.mask_of(a) is not None]
        raise Unsupported(f"{name} has no masking rule (padded inputs: {', '.join(masked)})")

    # -- rules ---------------------------------------------------------------
    def view_rule(self, src: torch.fx.Node, out_shape: List[int]) -> Optional[_Mask]:
        m = self.mask_of(src)
        in_shape = list(_val(src).shape)
        groups = _view_groups(in_shape, out_shape)
        if m.exact:
            rebuilt = self.view_exact(m, in_shape, out_shape, groups)
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
            node = self.call(aten.expand.default, node, expand_shape)
            node = self.call(aten.clone.default, node, memory_format=torch.contiguous_format)
        node = self.call(aten.view.default, node, new_shape)
        return _Mask(node, tuple(new_shape), prefix)

    def view_exact(self, m: _Mask, in_shape, out_shape, groups):
        """An exact mask through a view, rebuilt from per-dim layouts (merged dims keep
        their sub-dims, so ``[B, S] -> [B*S] -> [B, S]`` gets plain prefixes back);
        ``False`` when a padded sub-dim would be split."""
        descs: Dict[int, Any] = {}
        for gi, go in groups:
            subs = []
            for d in gi:
                p = m.prefix.get(d) if m.shape[d] != 1 else None
                if m.shape[d] != 1 and p is None:
                    return False
                subs.extend(p if isinstance(p, _Subs) else [(in_shape[d], p)])
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
                descs[j] = live[0][1] if len(mine) == 1 else _Subs(mine)
        nd = len(out_shape)
        out = None
        for j, p in sorted(descs.items()):
            if isinstance(p, _Subs):
                dm = self.merged_mask(p, j, nd)
            else:
                dm = self.prefix_mask(p[0], p[1], out_shape[j], j, nd)
            out = self.both(out, dm, nd)
        return out

    def batch_rule(self, n):
        """Per-sample ops (convolution, pooling, eval batch norm, group norm): fine when only
        the batch dim (0) of the input is padded; the outputs keep that mask."""
        x = n.args[0]
        m = self.mask_of(x)
        for a in n.all_input_nodes[1:]:
            if self.mask_of(a) is not None:
                raise _unsupported(f"{n.target} with padded weights or statistics",
                                   self.mask_of(a), range(len(self.mask_of(a).shape)))
        live = [d for d in range(len(m.shape)) if m.shape[d] != 1]
        if live != [0]:
            raise _unsupported(f"{n.target} over a padded dim other than the batch", m,
                               [d for d in live if d != 0])
        v = _val(n)
        outs = v if isinstance(v, (tuple, list)) else [v]
        res = []
        for o in outs:
            nd = o.dim() if isinstance(o, torch.Tensor) else 0
            if nd == 0:
                res.append(None)
                continue
            p = m.prefix.get(0)
            if m.exact and _simple(p):
                res.append(self.prefix_mask(p[0], p[1], m.shape[0], 0, nd))
            else:
                shape = (m.shape[0],) + (1,) * (nd - 1)
                node = self.call(aten.view.default, m.node, list(shape))
                res.append(_Mask(node, shape, {0: p} if p is not None else {}, False))
        self.masks[n] = res if isinstance(v, (tuple, list)) else res[0]

    @staticmethod
    def arange_source(node) -> Optional[Tuple[int, int]]:
        """``(N, dim)`` when ``node`` is ``arange(N)`` seen through unsqueeze / view / expand /
        ``+ 0`` / copies, laid along its only non-1 ``dim``; else ``None``."""
        v = _val(node)
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

    def index_rule(self, n) -> Optional[_Mask]:
        """``x[i0, i1, ...]`` (advanced indexing). With index tensors that are ``arange`` over
        a padded dim (``padding_mask[batch_idx, kv_idx]`` in Hugging Face mask builders), the
        dim's layout moves to where its index broadcasts; otherwise validity is gathered
        with the same indices."""
        x, indices = n.args[0], list(n.args[1])
        m = self.mask_of(x)
        xv = _val(x)
        out_nd = _val(n).dim()
        pos = [d for d, i in enumerate(indices) if i is not None]
        bnd = max(_val(indices[d]).dim() for d in pos)
        adjacent = pos == list(range(pos[0], pos[-1] + 1))
        first = pos[0] if adjacent else 0
        # padded index tensors (arange(s) positions): their entries past the true length
        # gather something, but it is padding; their masks sit where they broadcast
        imask = None
        for d in pos:
            mi = self.mask_of(indices[d])
            if mi is None:
                continue
            mi = self.align(mi, bnd)
            shape = (1,) * first + mi.shape + (1,) * (out_nd - first - bnd)
            node = self.call(aten.view.default, mi.node, list(shape))
            imask = self.both(imask, _Mask(node, shape, {k + first: p for k, p in mi.prefix.items()},
                                           mi.exact), out_nd)
        if m is None:
            return imask
        return self.both(self.index_mask(n, m, x, xv, indices, pos, bnd, adjacent, first,
                                         out_nd), imask, out_nd)

    def index_mask(self, n, m, x, xv, indices, pos, bnd, adjacent, first, out_nd):
        """The part of ``x[indices]``'s mask that comes from ``x``'s own mask."""
        # where each x dim lands in the output
        where_: Dict[int, int] = {}
        rest = [d for d in range(xv.dim()) if d not in pos]
        for k, d in enumerate(rest):
            where_[d] = (k if d < first else k + bnd) if adjacent else bnd + k
        identity = m.exact
        for d in pos:
            if m.shape[d] == 1:
                continue
            src = self.arange_source(indices[d])
            if src is None or src[0] != xv.shape[d]:
                identity = False
                break
            where_[d] = first + bnd - _val(indices[d]).dim() + src[1]
        if identity:
            out = None
            for d, p in m.prefix.items():
                j = where_[d]
                dm = (self.merged_mask(p, j, out_nd) if isinstance(p, _Subs)
                      else self.prefix_mask(p[0], p[1], xv.shape[d], j, out_nd))
                out = self.both(out, dm, out_nd)
            return out
        # validity of each gathered entry: the same gather on the mask
        full = [xv.shape[d] if d in pos else m.shape[d] for d in range(xv.dim())]
        mm = self.call(aten.expand.default, m.node, full)
        idx = self.call(aten.index.Tensor, mm, indices)
        shape = list(_val(n).shape)
        for d in rest:
            if m.shape[d] == 1:
                shape[where_[d]] = 1  # dims the mask broadcasts over stay 1
        return _Mask(idx, tuple(shape), {})

    def slice_rule(self, n) -> Optional[_Mask]:
        args = n.args
        m = self.mask_of(args[0])
        nd = len(m.shape)
        d = (args[1] if len(args) > 1 else 0) % nd
        start = args[2] if len(args) > 2 else None
        end = args[3] if len(args) > 3 else None
        step = args[4] if len(args) > 4 else 1
        if m.shape[d] == 1:
            return m
        size = _val(args[0]).shape[d]
        start = 0 if start is None else start
        end = size if end is None else end
        if start < 0 or end < 0:
            if not _simple(m.prefix.get(d)) or step != 1:
                raise _unsupported(f"{n.target}: slice [{start}:{end}] from the padded end of dim {d}", m, [d])
            # counted from the end: the true end moves with the true length
            sym, off = m.prefix[d]
            s0 = start if start >= 0 else None
            e0 = end if end < 0 else None
            if s0 is None:
                raise _unsupported(f"{n.target}: slice start {start} from the padded end of dim {d}", m, [d])
            out_size = _val(n).shape[d]
            # true slice is [start, len + off + end): length len + off + end - start
            pm = self.prefix_mask(sym, off + (e0 if e0 is not None else 0) - s0, out_size, d, nd)
            rest = self.drop_dim(m, d)
            return self.both(rest, pm, nd)
        node = self.call(aten.slice.Tensor, m.node, d, start, end, step)
        shape = list(m.shape)
        shape[d] = _val(n).shape[d]
        prefix = dict(m.prefix)
        exact = m.exact
        if d in prefix:
            if step != 1 or not _simple(prefix[d]):
                del prefix[d]
                exact = False
            else:
                prefix[d] = (prefix[d][0], prefix[d][1] - start)
        return _Mask(node, tuple(shape), prefix, exact)

    def drop_dim(self, m: _Mask, d: int) -> Optional[_Mask]:
        """``m`` with dim ``d`` made trivial (valid along ``d``); needs ``d`` separable."""
        others = [k for k in range(len(m.shape)) if m.shape[k] != 1 and k != d]
        if not others:
            return None
        if d not in m.prefix:
            raise Unsupported("mask not separable along a sliced dim")
        node = self.call(aten.any.dims, m.node, [d], True)
        shape = list(m.shape)
        shape[d] = 1
        return _Mask(node, tuple(shape), {k: p for k, p in m.prefix.items() if k != d}, m.exact)

    def mm_rule(self, n):
        op = n.target
        args = list(n.args)
        ia, ib = (1, 2) if op in (aten.addmm.default, aten.baddbmm.default) else (0, 1)
        a, b = args[ia], args[ib]
        ma, mb = self.mask_of(a), self.mask_of(b)
        nd = _val(n).dim()
        ka, kb = nd - 1, nd - 2  # contracted dims of a and b
        if ma is not None and ma.shape[ka] != 1:
            args[ia] = self.fill(a, ma, 0)
        if mb is not None and mb.shape[kb] != 1:
            args[ib] = self.fill(b, mb, 0)
        n.args = tuple(args)
        ra = self.reduce_mask(ma, [ka], True) if ma is not None else None
        rb = self.reduce_mask(mb, [kb], True) if mb is not None else None
        if ra is not None and len(ra.shape) < nd:
            ra = self.align(ra, nd)
        if rb is not None and len(rb.shape) < nd:
            rb = self.align(rb, nd)
        out = self.both(ra, rb, nd)
        if ia == 1:
            out = self.both(out, self.mask_of(args[0]), nd)
        self.masks[n] = out

    def reduce_rule(self, n):
        op = n.target
        args = list(n.args)
        x = args[0]
        m = self.mask_of(x)
        xv = _val(x)
        nd = xv.dim()
        if op in (aten.sum.default, aten.prod.default, aten.mean.default, aten.any.default,
                  aten.all.default, aten.max.default, aten.min.default):
            dims, keepdim = list(range(nd)), False
        elif op in (aten.argmax.default, aten.argmin.default):
            dim = args[1] if len(args) > 1 else n.kwargs.get("dim")
            dims = _norm_dims(dim, nd)
            keepdim = args[2] if len(args) > 2 else n.kwargs.get("keepdim", False)
            if dim is None:
                keepdim = False
        else:
            dims = _norm_dims(args[1] if len(args) > 1 else n.kwargs.get("dim"), nd)
            keepdim = args[2] if len(args) > 2 else n.kwargs.get("keepdim", False)
        if m is None or all(m.shape[d] == 1 for d in dims):
            outm = self.reduce_mask(m, dims, keepdim)
            self.masks[n] = [outm, outm] if op in (aten.max.dim, aten.min.dim) else outm
            return
        if op in (aten.argmax.default, aten.argmin.default) and len(dims) != 1 and nd > 1:
            raise Unsupported(f"{op} over a flattened padded tensor")
        if op in _SUM_LIKE or op in (aten.mean.dim, aten.mean.default):
            ident = _SUM_LIKE.get(op, 0)
        elif op in _ANY_ALL:
            ident = _ANY_ALL[op]
        else:
            ident = _low(xv.dtype) if _MAX_LIKE[op] == "low" else _high(xv.dtype)
        args[0] = self.fill(x, m, ident)
        n.args = tuple(args)
        outm = self.reduce_mask(m, dims, keepdim)
        if op in (aten.mean.dim, aten.mean.default):
            total = 1
            for d in dims:
                total *= xv.shape[d]
            out_dtype = _val(n).dtype
            with self.g.inserting_before(n.next):
                cnt = self.count(m, xv.shape, dims, keepdim, out_dtype)
                scaled = self.call(aten.mul.Tensor, n, float(total))
                fixed = self.call(aten.div.Tensor, scaled, cnt)
            self.replace_uses(n, fixed, keep={scaled})
            self.masks[fixed] = outm
        self.masks[n] = [outm, outm] if op in (aten.max.dim, aten.min.dim) else outm

    def norm_rule(self, n):
        """``linalg_vector_norm(x, ord, dim, keepdim)``: padded entries count as 0 (the
        identity of every order > 0)."""
        x = n.args[0]
        m = self.mask_of(x)
        nd = _val(x).dim()
        ordv = n.args[1] if len(n.args) > 1 else n.kwargs.get("ord", 2)
        dims = _norm_dims(n.args[2] if len(n.args) > 2 else n.kwargs.get("dim"), nd)
        keepdim = n.args[3] if len(n.args) > 3 else n.kwargs.get("keepdim", False)
        if any(m.shape[d] != 1 for d in dims):
            if not ordv > 0:
                raise _unsupported(f"{n.target} of order {ordv} over a padded dim", m, dims)
            n.args = (self.fill(x, m, 0),) + tuple(n.args[1:])
        self.masks[n] = self.reduce_mask(m, dims, keepdim)

    def var_rule(self, n):
        x = n.args[0]
        m = self.mask_of(x)
        xv = _val(x)
        nd = xv.dim()
        dims = _norm_dims(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim"), nd)
        correction = n.kwargs.get("correction", 1)
        correction = 1 if correction is None else correction
        keepdim = n.kwargs.get("keepdim", False)
        if all(m.shape[d] == 1 for d in dims):
            outm = self.reduce_mask(m, dims, keepdim)
            self.masks[n] = outm if n.target is aten.var.correction else [outm, outm]
            return
        with self.g.inserting_before(n.next):
            cnt = self.count(m, xv.shape, dims, True, xv.dtype)
            xs = self.fill(x, m, 0)
            s = self.call(aten.sum.dim_IntList, xs, dims, True)
            mean = self.call(aten.div.Tensor, s, cnt)
            dev = self.call(aten.sub.Tensor, x, mean)
            dev = self.fill(dev, m, 0, like=x)
            sq = self.call(aten.mul.Tensor, dev, dev)
            ss = self.call(aten.sum.dim_IntList, sq, dims, keepdim)
            c = cnt if keepdim else self.call(aten.squeeze.dims, cnt, dims)
            denom = self.call(aten.clamp_min.default, self.call(aten.sub.Tensor, c, correction), 0)
            var = self.call(aten.div.Tensor, ss, denom)
            outm = self.reduce_mask(m, dims, keepdim)
            if n.target is aten.var.correction:
                self.replace_uses(n, var)
                self.masks[var] = outm
            else:
                mean_out = mean if keepdim else self.call(aten.squeeze.dims, mean, dims)
                for u in list(n.users):
                    if u.target is operator.getitem:
                        repl = var if u.args[1] == 0 else mean_out
                        self.replace_uses(u, repl)
                        self.masks[repl] = outm
        self.masks[n] = outm if n.target is aten.var.correction else [outm, outm]

    def softmax_rule(self, n):
        args = list(n.args)
        x = args[0]
        m = self.mask_of(x)
        xv = _val(x)
        nd = xv.dim()
        dims = _norm_dims(args[1], nd)
        keepdim = args[2] if n.target is aten.logsumexp.default and len(args) > 2 else False
        if any(m.shape[d] != 1 for d in dims):
            # lowest finite value, not -inf: padded weights are exactly 0 and a row with no
            # real entry stays finite (no NaN reaching gradients through padded rows)
            args[0] = self.fill(x, m, _low(xv.dtype))
            n.args = tuple(args)
        if n.target is aten.logsumexp.default:
            self.masks[n] = self.reduce_mask(m, dims, keepdim)
        else:
            self.masks[n] = m

    def nll_rule(self, n):
        x, target, weight, reduction, ignore_index = n.args[:5]
        mx, mt = self.mask_of(x), self.mask_of(target)
        if self.mask_of(weight) is not None:
            raise Unsupported("nll_loss with padded class weights")
        xv = _val(x)
        if mx is not None and xv.dim() == 2 and mx.shape[1] != 1:
            raise Unsupported("nll_loss over padded classes")
        args = list(n.args)
        if mx is not None:
            args[0] = self.fill(x, mx, 0)
        m = mt
        if mx is not None:
            mrow = self.reduce_mask(mx, [1], False) if xv.dim() == 2 else None
            m = self.both(m, mrow, 1) if mrow is not None else m
        if m is not None:
            # padded positions become ignore_index: out of the sum and of the mean's count
            args[1] = self.fill(target, m, ignore_index)
        n.args = tuple(args)
        out = m if reduction == 0 else None  # reduction none keeps per-position values
        self.masks[n] = [out, None]

    def cat_rule(self, n):
        tensors = n.args[0]
        nd = _val(n).dim()
        d = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % nd
        m = None
        for t in tensors:
            tm = self.mask_of(t)
            if tm is None:
                continue
            if len(tm.shape) != nd:
                raise Unsupported("cat of a padded tensor of another rank")
            if tm.shape[d] != 1:
                raise _unsupported(f"cat along padded dim {d}", tm, [d])
            m = self.both(m, tm, nd)
        self.masks[n] = m

    def replace_uses(self, old, new, keep=()):
        skip = set(keep) | {new}
        old.replace_all_uses_with(new, delete_user_cb=lambda u: u not in skip)


# ---------------------------------------------------------------------------
# compile_bucketed
# ---------------------------------------------------------------------------


_length_cache: Dict[Tuple[str, int], torch.Tensor] = {}


def _length_tensor(value: int, device: torch.device) -> torch.Tensor:
    """A 0-dim int64 tensor holding a true length, on ``device``; cached (programs only read
    it), so a call does not copy it to the device again."""
    key = (str(device), value)
    t = _length_cache.get(key)
    if t is None:
        if len(_length_cache) > 4096:
            _length_cache.clear()
        t = _length_cache[key] = torch.tensor(value, dtype=torch.int64, device=device)
    return t


class _BucketedFunction:
    """What :func:`compile_bucketed` returns: picks, compiles and runs a bucket's program."""

    def __init__(self, gm, example_inputs, compile_static):
        self.gm = gm
        self.compile_static = compile_static
        self.analysis = _analyze(gm)
        self.programs: Dict[Any, Callable] = {}
        self.exact_syms = set()  # dynamic sizes whose padding the masking cannot make safe
        self.lock = threading.RLock()  # a bucket found unsupported falls back to _run_exact under it
        self.unsupported = self.analysis.unsupported
        if self.unsupported:
            log.info("bucketing off for this graph: %s", self.unsupported)

    # sizes -------------------------------------------------------------
    def _true_sizes(self, args) -> Dict[Any, int]:
        vals = {}
        for s, (i, d) in self.analysis.sources.items():
            a = args[i]
            vals[s] = int(a) if d is None else int(a.shape[d])
        return vals

    def __call__(self, *args):
        a = self.analysis
        _compile_stats.add("calls")
        true = self._true_sizes(args)
        items = tuple(float(args[i].item()) for i in a.item_inputs)
        if a.grad_cut and torch.is_grad_enabled() and any(
                args[i].requires_grad for i in a.tensor_inputs):
            # the gradient would flow through the cut: compile Dynamo's graph as it is
            return self._run_exact(args, true, {}, items,
                                   f"the graph controls its gradients ({a.grad_cut}) and "
                                   f"gradients are needed")
        while True:
            # sizes found unsafe to pad stay exact (part of the key); the others are bucketed
            bsyms = [s for s in a.symbols if s not in self.exact_syms]
            value_syms = {s: v for s, v in true.items() if s not in bsyms}
            cfg = get_buckets()
            buckets = {}
            why_exact = self.unsupported
            if why_exact is None:
                for s in bsyms:
                    b = cfg.bucket(true[s])
                    if b is None:
                        why_exact = ("bucketing is off" if not cfg.enabled else
                                     f"{s}={true[s]} is past the largest bucket {cfg.sizes[-1]}")
                        break
                    buckets[s] = b
            if why_exact is not None:
                return self._run_exact(args, true, value_syms, items, why_exact)
            key = ("bucket", tuple(buckets[s] for s in bsyms),
                   tuple(sorted((str(k), v) for k, v in value_syms.items())), items)
            prog = self.programs.get(key)
            if prog is not None:
                break
            with self.lock:
                prog = self.programs.get(key)
                if prog is not None:
                    break
                try:
                    prog = self._compile_bucket(args, buckets, value_syms, true, bsyms)
                except Unsupported as e:
                    syms = e.syms
                    if syms and set(syms) < set(bsyms):
                        self.exact_syms |= set(syms)
                        names = ", ".join(sorted(str(x) for x in syms))
                        _compile_stats.note_bucketing(None, f"bucketing: {names} kept exact because {e}")
                        continue
                    self.unsupported = str(e)
                    return self._run_exact(args, true, value_syms, items, str(e))
                self.programs[key] = prog
                break
        padded, any_pad, dev = self._pad_inputs(args, buckets, true)
        if any_pad:
            _compile_stats.add("padded_calls")
        outs = prog(*padded, *[_length_tensor(true[s], dev) for s in bsyms])
        return self._unpad_outputs(outs, true)

    # compile -------------------------------------------------------------
    def _compile_bucket(self, args, buckets, value_syms, true, bsyms):
        a = self.analysis
        traced = _trace_static(self.gm, a, args, buckets, value_syms, bsyms)
        ph_map = {}  # traced placeholder index -> {dim: sym}, bucketed sizes only
        for j, i in enumerate(a.tensor_inputs):
            dims = {d: s for d, s in a.dyn_dims.get(i, {}).items() if s in buckets}
            if dims:
                ph_map[j] = dims
        device = self._device(args)
        masker = _Masker(traced, ph_map, bsyms, device)
        masker.run()
        self._check_outputs(masker.out_masks)
        padded, _, dev = self._pad_inputs(args, buckets, true)
        lens = [_length_tensor(true[s], dev) for s in bsyms]
        sizes = ", ".join([f"{s}={true[s]}->{buckets[s]}" for s in bsyms] +
                          [f"{s}={v} exact" for s, v in sorted(value_syms.items(), key=lambda t: str(t[0]))
                           if s in self.exact_syms])
        _compile_stats.note_bucketing("bucket_compilations", f"bucketing: new bucket ({sizes})")
        return self.compile_static(traced, list(padded) + lens)

    def _check_outputs(self, out_masks):
        """Outputs are sliced back with ``narrow``: each dynamic dim must hold its real
        entries as a prefix of the padded dim, of the length Dynamo's size says."""
        for k, (exprs, m) in enumerate(zip(self.analysis.out_exprs, out_masks)):
            if exprs is None or m is None:
                continue
            for d, e in enumerate(exprs):
                if e.is_number or m.shape[d] == 1:
                    continue
                p = m.prefix.get(d)
                if not _simple(p) or (e - (p[0] + p[1])) != 0:
                    err = Unsupported(f"output {k} dim {d} (size {e}) is not a prefix of its "
                                      f"padded dim")
                    err.syms = frozenset(e.free_symbols)
                    raise err

    def _run_exact(self, args, true, value_syms, items, why):
        """Compile Dynamo's graph itself at these exact sizes (AOTAutograd traces it with
        the concrete inputs, keeping every detach / no_grad and mutation as Dynamo saw it)."""
        key = ("exact", tuple(sorted((str(k), v) for k, v in true.items())), items)
        prog = self.programs.get(key)
        if prog is None:
            with self.lock:
                prog = self.programs.get(key)
                if prog is None:
                    shape = ", ".join(f"{k}={v}" for k, v in sorted(true.items(), key=lambda t: str(t[0])))
                    _compile_stats.note_bucketing("exact_compilations",
                            f"bucketing: exact shape ({shape}) compiled because {why}")
                    gm = self.gm
                    if self.analysis.item_inputs:
                        # .item() of lifted scalars (dropout p, momentum) as constants: the
                        # values are part of the key, and AOTAutograd outside Dynamo has no
                        # shape environment for data-dependent scalars
                        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
                        gm = _fold_item_inputs(gm, {phs[i]: args[i].item()
                                                    for i in self.analysis.item_inputs})
                    prog = self.compile_static(gm, list(args))
                    self.programs[key] = prog
        outs = prog(*args)
        return list(outs) if not isinstance(outs, (list, tuple)) else outs

    # padding -------------------------------------------------------------
    def _device(self, args):
        for i in self.analysis.tensor_inputs:
            return args[i].device
        return torch.device("cpu")

    def _pad_inputs(self, args, buckets, true):
        a = self.analysis
        out = []
        any_pad = False
        dev = None
        for i in a.tensor_inputs:
            t = args[i]
            if dev is None or (dev.type == "cpu" and t.device.type != "cpu"):
                dev = t.device
            dims = a.dyn_dims.get(i)
            if dims:
                pad: List[int] = []
                for d in reversed(range(t.dim())):
                    extra = buckets.get(dims[d], t.shape[d]) - t.shape[d] if d in dims else 0
                    pad += [0, extra]
                if any(pad):
                    any_pad = True
                    t = torch.nn.functional.pad(t, pad)
            out.append(t)
        return out, any_pad, dev if dev is not None else torch.device("cpu")

    def _unpad_outputs(self, outs, true):
        env = {s: v for s, v in true.items()}
        res = []
        for o, exprs in zip(outs, self.analysis.out_exprs):
            if exprs is not None and isinstance(o, torch.Tensor):
                for d, e in enumerate(exprs):
                    if not e.is_number:
                        n = int(e.subs(env))
                        if o.shape[d] != n:
                            o = o.narrow(d, 0, n)
            res.append(o)
        return res


def compile_bucketed(gm: torch.fx.GraphModule, example_inputs: Sequence,
                     compile_static: Callable) -> Callable:
    """Compile a Dynamo graph with symbolic sizes so that each bucket of sizes compiles once.

    Args:
        gm: the graph Dynamo captured; its placeholders' ``example_value`` carry symbolic
            shapes (``s0``, ``s1``, ...). Dims whose size is a single symbol are padded.
        example_inputs: the example inputs Dynamo passed (tensors and ``SymInt``); unused
            beyond validation: programs are compiled lazily, per bucket, at the first call
            that needs them.
        compile_static: ``(gm, example_inputs) -> callable``, the static pipeline
            (AOTAutograd included) each bucket's rewritten graph goes through. It receives
            an ATen-level graph whose inputs are the tensor inputs padded to the bucket
            followed by one 0-dim ``int64`` tensor per dynamic size (its true value).

    Returns:
        A callable taking the graph's inputs (as Dynamo calls it) and returning the list of
        outputs with their true (unpadded) sizes. Differentiable when the static pipeline is.
        A graph whose only symbolic values are ints (no tensor size) goes to
        ``compile_static`` as it is.

    Raises:
        ValueError: ``TORCH_TPU_COMPILE_BUCKETS`` does not parse (at the first call).
    """
    get_buckets()  # a bad environment variable fails at compile time, with its name
    fn = _BucketedFunction(gm, example_inputs, compile_static)
    if not fn.analysis.symbols:
        # only ints are symbolic (no tensor size to pad): one program serves every value
        return compile_static(gm, example_inputs)
    return fn


__all__ = ["compile_bucketed", "set_buckets", "get_buckets", "parse_buckets", "BucketConfig",
           "bucket_stats", "reset_bucket_stats", "ENV_VAR", "DEFAULT_SPEC"]
