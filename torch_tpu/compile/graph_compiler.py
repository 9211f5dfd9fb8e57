"""FX graph of core ATen ops -> program.

A *program* is a sequence of steps over slots (one slot per FX value):

* ``region``: a maximal fusible subgraph (elementwise, broadcast, reductions,
  softmax, casts: whatever ``defer_and_fuse``'s lowerings map to the IR) built
  into an IR region, compiled into fused tile kernels and queued on the chip's
  stream over tpu tensors (``torch_tpu._C._compile.Region``);
* ``call``: a *library call*, the ATen op run on its (tpu) tensors through the
  PrivateUse1 fallback, queued on the chip's stream like any eager op;
* ``getitem`` / ``getattr``: tuple element / graph constant.

Passes, in order: FX dead-code elimination and CSE; partitioning into regions
(greedy in topological order, a node joins a producer's region unless that
would create a cycle through a library call), then a topological order of the
steps; liveness (a slot is dropped after its last use, so intermediates are
freed as early as eager frees them) and the program's peak physical HBM bytes
(inputs plus live intermediates, tiled sizes), checked against the chip's
capacity at compile time.

The program is described by plain data (:class:`Program.description`): IR op
records per region, ATen op names and arguments per call. That is what the
disk cache (:mod:`.cache`) stores; :class:`Program` instantiates it.
"""

import importlib
import logging
import operator
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx

from .. import _C
from . import cache as _cache
from . import stats

log = logging.getLogger("torch_tpu.compile")

_RC = _C._compile
FORMAT_VERSION = _cache.FORMAT_VERSION
MAX_REGION_NODES = 512

_TPU = "tpu"

# ---------------------------------------------------------------- encoding


def _op_name(target) -> Optional[str]:
    """"aten::add.Tensor" for an OpOverload (default overload: "aten::exp.default")."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    return None


def _resolve_op(name: str):
    if name == "getitem":
        return operator.getitem
    if name.startswith("obj:"):
        return _tls.objects[int(name[4:])]
    if "::" in name:
        ns, rest = name.split("::", 1)
        base, overload = rest.rsplit(".", 1)
        return getattr(getattr(getattr(torch.ops, ns), base), overload)
    mod, _, qual = name.rpartition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# While a program is built or instantiated without the disk cache: Python objects
# plain data cannot name (a callable target, an exotic argument) by index.
_tls = threading.local()


def _object_ref(obj, what: str):
    table = getattr(_tls, "objects", None)
    if table is None:
        raise _cache.Uncacheable(what)
    table.append(obj)
    return {"obj": len(table) - 1}


def _target_name(target) -> str:
    name = _op_name(target)
    if name:
        return name
    if target is operator.getitem:
        return "getitem"
    mod = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None)
    if not mod or not qual or "<" in qual:
        return f"obj:{_object_ref(target, f'call of {target!r}')['obj']}"
    return f"{mod}:{qual}"


def _encode(a, slot_of):
    """FX argument -> JSON-able plain data ({"$": slot} for a value)."""
    if isinstance(a, torch.fx.Node):
        return {"$": slot_of[a]}
    if isinstance(a, (list, tuple)):
        return {"l": [_encode(x, slot_of) for x in a], "t": isinstance(a, tuple)}
    if isinstance(a, dict):
        return {"d": {k: _encode(v, slot_of) for k, v in a.items()}}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    return _object_ref(a, f"argument {a!r} of type {type(a).__name__}")


def _decode(a):
    """Plain data -> a getter (env -> value) and whether it reads the env."""
    if isinstance(a, dict):
        if "$" in a:
            s = a["$"]
            return (lambda env: env[s]), True
        if "l" in a:
            parts = [_decode(x) for x in a["l"]]
            tup = a.get("t", False)
            if not any(p[1] for p in parts):
                const = tuple(p[0](None) for p in parts) if tup else [p[0](None) for p in parts]
                return (lambda env: const), False
            getters = [p[0] for p in parts]
            if tup:
                return (lambda env: tuple(g(env) for g in getters)), True
            return (lambda env: [g(env) for g in getters]), True
        if "d" in a:
            items = {k: _decode(v) for k, v in a["d"].items()}
            return (lambda env: {k: g(env) for k, (g, _) in items.items()}), any(d for _, d in items.values())
        if "obj" in a:
            v = _tls.objects[a["obj"]]
        elif "dtype" in a:
            v = getattr(torch, a["dtype"])
        elif "device" in a:
            v = torch.device(a["device"])
        elif "memory_format" in a:
            v = getattr(torch, a["memory_format"])
        elif "layout" in a:
            v = getattr(torch, a["layout"])
        else:
            raise ValueError(f"bad program argument record {a!r}")
        return (lambda env: v), False
    return (lambda env: a), False


# ---------------------------------------------------------------- analysis


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _is_tpu_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == _TPU


def _is_host_scalar(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0


_NOT_FUSIBLE_TAGS = (torch.Tag.nondeterministic_seeded,)
# Ops that have lowerings but whose ATen kernels (vectorized, on the intra-op threads)
# beat the executor's multi-pass reductions: library calls.
_ATEN_PREFERRED = {
    "aten::_softmax.default", "aten::_log_softmax.default",
    "aten::_softmax_backward_data.default", "aten::_log_softmax_backward_data.default",
}


def _fusible(n: torch.fx.Node) -> bool:
    """Whether the op lowers to the IR with these arguments (probed on a scratch region)."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if any(t in n.target.tags for t in _NOT_FUSIBLE_TAGS) or _op_name(n.target) in _ATEN_PREFERRED:
        return False
    out = _val(n)
    if not _is_tpu_tensor(out) or out.numel() == 0:
        return False
    ins = _data_inputs(n)
    for a in ins:
        v = _val(a)
        if _is_host_scalar(v):
            continue  # read when the region is queued, as eager reads it
        if not _is_tpu_tensor(v) or v.device != out.device or v.numel() == 0:
            return False
    r = _RC.Region()
    try:  # a dtype without an IR element type (complex) raises here: a library call
        vals = {a: _RC.Value(r.parameter(_val(a).dtype, list(_val(a).shape))) for a in ins}
        res = _lower(r, n, vals)
    except (TypeError, ValueError):
        return False
    return res is not None


# Factories whose result is a splat: constants inside a region (no allocation, no pass).
_FACTORIES = {
    "aten::full_like.default": lambda n: n.args[1],
    "aten::full.default": lambda n: n.args[1],
    "aten::scalar_tensor.default": lambda n: n.args[0],
    "aten::zeros_like.default": lambda n: 0,
    "aten::ones_like.default": lambda n: 1,
}


def _data_inputs(n) -> List[torch.fx.Node]:
    """The inputs whose values a node reads (a full_like reads only its input's shape)."""
    if _op_name(n.target) in _FACTORIES:
        return []
    return n.all_input_nodes


def _lower(region, n, vals):
    fac = _FACTORIES.get(_op_name(n.target))
    if fac is not None:
        value = fac(n)
        out = _val(n)
        if not isinstance(value, (int, float, bool)) or out.layout != torch.strided:
            return None
        if out.dtype == torch.bool:
            value = float(bool(value))
        if not (out.dtype.is_floating_point or out.dtype == torch.bool) and value != int(value):
            return None
        if float(value) != value:  # an integer a double cannot hold (|v| > 2**53): ATen's kernel
            return None
        try:
            return [region.constant(float(value), out.dtype, list(out.shape))]
        except (TypeError, ValueError):
            return None

    def sub(a):
        if isinstance(a, torch.fx.Node):
            return vals[a]
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        return a

    args = tuple(sub(a) for a in n.args)
    kwargs = {k: sub(v) for k, v in n.kwargs.items()}
    if n.target is torch.ops.aten._to_copy.default and "device" in kwargs:
        if torch.device(kwargs["device"]).type != _TPU:
            return None
        kwargs.pop("device")  # the lowering sees meta operands; the device was checked here
    out = _val(n)
    schema = n.target._schema
    return region.lower(schema.name, n.target._overloadname, args, kwargs, [(out.dtype, list(out.shape))])


def _dense_strides(v) -> List[int]:
    """The FX value's strides when they are a permutation of dense ones (eager's
    layout, which later views may rely on); [] for row-major or anything else."""
    shape, stride = list(v.shape), list(v.stride())
    if stride == list(torch._prims_common.make_contiguous_strides_for(shape)):
        return []
    if not torch._prims_common.is_non_overlapping_and_dense_or_false(v):
        return []
    return stride


def _physical_bytes(v) -> int:
    if not isinstance(v, torch.Tensor) or v.device.type != _TPU:
        return 0
    return int(_C._physical_bytes(list(v.shape), v.element_size()))


def _returns_alias(target) -> bool:
    """Whether an op's result shares memory with an argument (a view or in-place op)."""
    if not isinstance(target, torch._ops.OpOverload):
        return target is operator.getitem
    return any(r.alias_info is not None for r in target._schema.returns)


# ---------------------------------------------------------------- FX passes


def _cse(gm: torch.fx.GraphModule) -> int:
    """Merges call_function nodes with the same target and arguments (pure ops only)."""
    seen: Dict[Any, torch.fx.Node] = {}
    removed = 0

    def key_of(a):
        if isinstance(a, torch.fx.Node):
            return ("n", id(a))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(key_of(x) for x in a))
        if isinstance(a, dict):
            return ("d", tuple(sorted((k, key_of(v)) for k, v in a.items())))
        if isinstance(a, float):
            return ("f", repr(a))
        return (type(a).__name__, a)

    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            if t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags:
                continue
        elif t is not operator.getitem:
            continue
        try:
            k = (t, key_of(n.args), key_of(n.kwargs))
            hash(k)
        except TypeError:
            continue
        prev = seen.get(k)
        if prev is None:
            seen[k] = n
        else:
            n.replace_all_uses_with(prev)
            gm.graph.erase_node(n)
            removed += 1
    return removed


# ---------------------------------------------------------------- building


def build_description(gm: torch.fx.GraphModule, example_inputs: Sequence, kind: str,
                      objects: Optional[List[Any]] = None) -> Dict[str, Any]:
    """See :func:`_build_description`; `objects`: a list that takes the Python objects
    plain data cannot name (then the description is for this process only)."""
    _tls.objects = objects
    try:
        desc = _build_description(gm, example_inputs, kind)
    finally:
        _tls.objects = None
    if objects:
        desc["_objects"] = objects
    return desc


def _build_description(gm: torch.fx.GraphModule, example_inputs: Sequence, kind: str) -> Dict[str, Any]:
    """Lower `gm` to a program description (plain data), see the module docstring;
    its peak physical HBM bytes are in it (``check_memory`` compares them with the chip).

    Raises:
        _cache.Uncacheable: a node or argument plain data cannot describe (then the caller
            builds it again without caching; it still runs).
    """
    graph = gm.graph
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output_node = next(n for n in nodes if n.op == "output")
    body = [n for n in nodes if n.op not in ("placeholder", "output")]

    # ---- partition into regions (cycle-free through library calls)
    fusible = {n for n in body if _fusible(n)}
    region_of: Dict[torch.fx.Node, int] = {}
    # regions each node depends on (itself included): n may join region R unless
    # an input outside R depends on R, which would make R wait for itself
    anc: Dict[torch.fx.Node, frozenset] = {}
    region_size: List[int] = []
    empty = frozenset()
    for n in body:
        ins = n.all_input_nodes
        if n in fusible:
            chosen = None
            cands = sorted({region_of[a] for a in ins if a in region_of}, reverse=True)
            for r in cands:
                if region_size[r] >= MAX_REGION_NODES:
                    continue
                if all(region_of.get(a) == r or r not in anc.get(a, empty) for a in ins):
                    chosen = r
                    break
            if chosen is None:
                chosen = len(region_size)
                region_size.append(0)
            region_of[n] = chosen
            region_size[chosen] += 1
        d = set()
        for a in ins:
            d |= anc.get(a, empty)
        if n in region_of:
            d.add(region_of[n])
        anc[n] = frozenset(d)

    # A region of one op runs ATen's kernel instead (a library call): fusion gains
    # nothing there, and ATen's kernel (vectorized, on the intra-op threads) is faster
    # than the executor's for a lone softmax, gelu or cast (defer_and_fuse does the same).
    if os.environ.get("TORCH_TPU_COMPILE_SINGLE_OP_REGIONS", "0") != "1":
        for n in [n for n in region_of if region_size[region_of[n]] == 1]:
            del region_of[n]

    # ---- steps: condensed DAG in topological order (stable by first node)
    step_of: Dict[torch.fx.Node, Tuple[str, int]] = {}
    groups: Dict[Tuple[str, int], List[torch.fx.Node]] = {}
    order_key: Dict[Tuple[str, int], int] = {}
    for i, n in enumerate(body):
        k = ("r", region_of[n]) if n in region_of else ("n", i)
        step_of[n] = k
        groups.setdefault(k, []).append(n)
        order_key.setdefault(k, i)
    preds: Dict[Any, set] = {k: set() for k in groups}
    succs: Dict[Any, set] = {k: set() for k in groups}
    for n in body:
        for a in n.all_input_nodes:
            if a in step_of and step_of[a] != step_of[n]:
                preds[step_of[n]].add(step_of[a])
                succs[step_of[a]].add(step_of[n])
    import heapq

    ready = [(order_key[k], k) for k in groups if not preds[k]]
    heapq.heapify(ready)
    ordered = []
    indeg = {k: len(v) for k, v in preds.items()}
    while ready:
        _, k = heapq.heappop(ready)
        ordered.append(k)
        for s in succs[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (order_key[s], s))
    if len(ordered) != len(groups):
        raise RuntimeError("torch.compile(backend='tpu'): internal error, cyclic step graph")

    # ---- slots
    slot_of: Dict[torch.fx.Node, int] = {}
    for i, p in enumerate(placeholders):
        slot_of[p] = i
    next_slot = len(placeholders)
    for n in body:
        slot_of[n] = next_slot
        next_slot += 1

    out_args = output_node.args[0]
    graph_outputs = set()
    torch.fx.node.map_arg(out_args, lambda x: graph_outputs.add(x))

    steps: List[Dict[str, Any]] = []
    step_nodes: List[List[torch.fx.Node]] = []
    device_index = 0
    for p in placeholders:
        v = _val(p)
        if _is_tpu_tensor(v):
            device_index = v.device.index or 0
            break
    for k in ordered:
        members = groups[k]
        if k[0] == "r":
            r = _RC.Region()
            vals: Dict[torch.fx.Node, Any] = {}
            inputs: List[torch.fx.Node] = []
            member_set = set(members)
            ops = []
            for n in members:
                for a in _data_inputs(n):
                    if a not in vals:
                        va = _val(a)
                        vals[a] = _RC.Value(r.parameter(va.dtype, list(va.shape)))
                        inputs.append(a)
                res = _lower(r, n, vals)
                if res is None:  # cannot happen: probed above
                    raise RuntimeError(f"torch.compile(backend='tpu'): {n.target} failed to lower in region")
                vals[n] = _RC.Value(res[0])
                ops.append(_op_name(n.target))
            outs = [n for n in members if n in graph_outputs or any(u not in member_set for u in n.users)]
            if not outs:
                continue  # dead region (DCE ran, so only if nothing uses it)
            r.finish([vals[n].id for n in outs])
            dev = _val(members[0]).device.index or 0
            steps.append({
                "kind": "region",
                "records": _records_to_json(r.records()),
                "inputs": [slot_of[a] for a in inputs],
                "outputs": [slot_of[n] for n in outs],
                "device": dev,
                "ops": ops,
                "types": [[str(_val(n).dtype).replace("torch.", ""), list(_val(n).shape)] for n in outs],
                "strides": [_dense_strides(_val(n)) for n in outs],
            })
            step_nodes.append(outs)
        else:
            n = members[0]
            if n.op == "get_attr":
                steps.append({"kind": "getattr", "name": n.target, "outputs": [slot_of[n]]})
            elif n.op == "call_function":
                name = _target_name(n.target)
                steps.append({
                    "kind": "getitem" if name == "getitem" else "call",
                    "op": name,
                    "args": _encode(list(n.args), slot_of),
                    "kwargs": _encode(dict(n.kwargs), slot_of),
                    "outputs": [slot_of[n]],
                    "type": _type_str(_val(n)),
                })
            else:
                raise _cache.Uncacheable(f"FX node {n.op} {n.target}")
            step_nodes.append([n])

    steps, step_nodes = _batch_copies(steps, step_nodes, slot_of)

    # ---- liveness: a slot is dropped after its last use; a view keeps its base alive
    last_use: Dict[int, int] = {}
    for i, st in enumerate(steps):
        for s in _step_reads(st):
            last_use[s] = i
    end = len(steps)
    out_enc = _encode(out_args, slot_of)
    for s in _slots_in(out_enc):
        last_use[s] = end
    free_after: List[List[int]] = [[] for _ in range(end + 1)]
    for s, i in last_use.items():
        if i < end:
            free_after[i].append(s)
    # slots written but never read: dropped at once
    for i, st in enumerate(steps):
        for s in st["outputs"]:
            if s not in last_use:
                free_after[i].append(s)

    # ---- peak physical HBM bytes
    root: Dict[torch.fx.Node, torch.fx.Node] = {}
    for n in body:
        base = n
        if n.op == "call_function" and _returns_alias(n.target) and n.args and isinstance(n.args[0], torch.fx.Node):
            base = root.get(n.args[0], n.args[0])
        root[n] = base
    node_of_slot = {s: n for n, s in slot_of.items()}
    root_last: Dict[torch.fx.Node, int] = {}
    for s, i in last_use.items():
        n = node_of_slot[s]
        r0 = root.get(n, n)
        root_last[r0] = max(root_last.get(r0, -1), i)
    seen_storage = set()
    input_bytes = 0
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == _TPU:
            try:
                key = x.untyped_storage()._cdata
            except Exception:  # noqa: BLE001 (fake tensors)
                key = id(x)
            if key in seen_storage:
                continue
            seen_storage.add(key)
            input_bytes += _physical_bytes(x)
    live = 0
    peak = 0
    peak_step = -1
    frees_at: Dict[int, int] = {}
    for i, nodes_i in enumerate(step_nodes):
        for n in nodes_i if steps[i]["kind"] == "region" else [nodes_i[0]]:
            if root.get(n, n) is not n:
                continue
            v = _val(n)
            b = sum(_physical_bytes(t) for t in (v if isinstance(v, (list, tuple)) else [v]))
            if b == 0:
                continue
            live += b
            last = root_last.get(n, i)
            frees_at[last] = frees_at.get(last, 0) + b
        if live > peak:
            peak, peak_step = live, i
        live -= frees_at.pop(i, 0)
    return {
        "format": FORMAT_VERSION,
        "kind": kind,
        "num_inputs": len(placeholders),
        "num_slots": next_slot,
        "device": device_index,
        "steps": steps,
        "free_after": free_after,
        "outputs": out_enc,
        "input_bytes": input_bytes,
        "peak_intermediate_bytes": peak,
        "peak_step": peak_step,
        "input_types": [_type_str(_val(p)) for p in placeholders],
        "output_types": _output_types(out_args),
    }


def _batch_copies(steps, step_nodes, slot_of):
    """Consecutive ``copy_(dst, src)`` calls between tpu tensors of one dtype and shape
    (the write-back of parameters and optimizer state) become one ``copies`` step: one
    queued item instead of one dispatch per tensor."""
    out_steps, out_nodes = [], []
    for st, nodes in zip(steps, step_nodes):
        n = nodes[0]
        ok = (st["kind"] == "call" and st["op"] == "aten::copy_.default" and len(n.args) == 2 and not n.kwargs
              and all(isinstance(a, torch.fx.Node) for a in n.args))
        if ok:
            d, s_ = _val(n.args[0]), _val(n.args[1])
            ok = (_is_tpu_tensor(d) and _is_tpu_tensor(s_) and d.dtype == s_.dtype and d.shape == s_.shape
                  and d.device == s_.device)
        if ok and out_steps and out_steps[-1]["kind"] == "copies" and out_steps[-1]["device"] == (d.device.index or 0):
            out_steps[-1]["pairs"].append([slot_of[n.args[0]], slot_of[n.args[1]]])
            out_steps[-1]["outputs"].append(slot_of[n])
            out_nodes[-1].append(n)
            continue
        if ok:
            out_steps.append({"kind": "copies", "pairs": [[slot_of[n.args[0]], slot_of[n.args[1]]]],
                              "outputs": [slot_of[n]], "device": d.device.index or 0})
            out_nodes.append([n])
            continue
        out_steps.append(st)
        out_nodes.append(nodes)
    return out_steps, out_nodes


def _type_str(v) -> str:
    if isinstance(v, torch.Tensor):
        return _mlir_type(v.dtype, list(v.shape))
    return "!torch.any"


def _output_types(out_args) -> List[str]:
    types = []
    torch.fx.node.map_arg(out_args, lambda n: types.append(_type_str(_val(n))))
    return types


_MLIR = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64",
         torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "ui8", torch.bool: "i1",
         torch.int16: "i16", torch.complex64: "complex<f32>"}


def _mlir_type(dtype, shape) -> str:
    et = _MLIR.get(dtype, str(dtype).replace("torch.", ""))
    return "tensor<" + "".join(f"{s}x" for s in shape) + et + ">"


def _records_to_json(rec):
    ops, outs = rec
    return [[list(op[0:1]) + [list(op[1]), op[2], list(op[3]), list(op[4][:4]) + [list(op[4][4])] + list(op[4][5:])]
             for op in ops], list(outs)]


def _records_from_json(j):
    ops, outs = j
    rec_ops = []
    for op in ops:
        kind, operands, dtype, shape, at = op
        rec_ops.append((kind, list(operands), dtype, list(shape),
                        (at[0], float(at[1]), at[2], at[3], list(at[4]), at[5], float(at[6]), at[7])))
    return (rec_ops, list(outs))


def _slots_in(enc) -> List[int]:
    out = []

    def walk(a):
        if isinstance(a, dict):
            if "$" in a:
                out.append(a["$"])
            elif "l" in a:
                for x in a["l"]:
                    walk(x)
            elif "d" in a:
                for x in a["d"].values():
                    walk(x)

    walk(enc)
    return out


def _step_reads(st) -> List[int]:
    if st["kind"] == "region":
        return list(st["inputs"])
    if st["kind"] == "getattr":
        return []
    if st["kind"] == "copies":
        return [x for pair in st["pairs"] for x in pair]
    return _slots_in(st["args"]) + _slots_in(st["kwargs"])


# ---------------------------------------------------------------- the program


class Program:
    """A program description instantiated: compiled regions and resolved ops.

    Calling it (boxed: one list of inputs, which it empties) runs the steps and
    returns the graph's outputs as a list.
    """

    _boxed_call = True

    def __init__(self, desc: Dict[str, Any], gm: Optional[torch.fx.GraphModule] = None, name: str = "program"):
        self.desc = desc
        self.name = name
        self.regions = []
        self.num_kernels = 0
        runners = []
        _tls.objects = desc.get("_objects")
        try:
            for i, st in enumerate(desc["steps"]):
                runners.append(self._make_step(i, st, gm))
            self._out, _ = _decode(desc["outputs"])
        finally:
            _tls.objects = None
        frees = desc["free_after"]
        self._plan = [(run, tuple(frees[i])) for i, run in enumerate(runners)]
        self._num_slots = desc["num_slots"]
        self._num_inputs = desc["num_inputs"]

    def _make_step(self, i, st, gm):
        outs = st["outputs"]
        if st["kind"] == "region":
            region = _RC.Region.from_records(_records_from_json(st["records"]))
            region.compile()
            self.regions.append(region)
            self.num_kernels += region.num_kernels
            ins = tuple(st["inputs"])
            dev = st["device"]
            label = f"{self.name} region {len(self.regions) - 1} ({len(st['ops'])} ATen ops)"
            strides = st.get("strides") or []

            def run_region(env, region=region, ins=ins, outs=outs, dev=dev, label=label, strides=strides):
                res = region.run([env[s] for s in ins], dev, label, strides)
                for s, t in zip(outs, res):
                    env[s] = t

            return run_region
        if st["kind"] == "copies":
            dsts = tuple(p[0] for p in st["pairs"])
            srcs = tuple(p[1] for p in st["pairs"])
            dev = st["device"]

            def run_copies(env, dsts=dsts, srcs=srcs, outs=tuple(outs), dev=dev):
                d = [env[s] for s in dsts]
                _RC.copy_many(d, [env[s] for s in srcs], dev)
                for o, t in zip(outs, d):
                    env[o] = t

            return run_copies
        if st["kind"] == "getattr":
            if gm is None:
                raise RuntimeError("program with graph constants needs its GraphModule")
            obj = gm
            for part in st["name"].split("."):
                obj = getattr(obj, part)
            out = outs[0]

            def run_getattr(env, obj=obj, out=out):
                env[out] = obj

            return run_getattr
        fn = _resolve_op(st["op"])
        args, _ = _decode(st["args"])
        kwargs, _ = _decode(st["kwargs"])
        out = outs[0]
        if st["kind"] == "getitem":
            def run_getitem(env, args=args, out=out):
                a = args(env)
                env[out] = a[0][a[1]]

            return run_getitem

        def run_call(env, fn=fn, args=args, kwargs=kwargs, out=out):
            env[out] = fn(*args(env), **kwargs(env))

        return run_call

    def _error(self, i: int, env: List, e: Exception) -> Exception:
        """`e` re-raised with the step that failed: its op and its inputs' shapes, dtypes, devices."""
        st = self.desc["steps"][i]
        what = "fused region of " + ", ".join(st["ops"]) if st["kind"] == "region" else st.get("op", st["kind"])

        def show(s):
            v = env[s]
            if isinstance(v, torch.Tensor):
                return f"%{s}: {v.dtype} {list(v.shape)} strides {list(v.stride())} on {v.device}"
            return f"%{s}: {type(v).__name__}"

        ins = "; ".join(show(s) for s in _step_reads(st))
        msg = f"{self.name}, step {i} ({what}) with inputs [{ins}]: {e}"
        try:
            return type(e)(msg)
        except Exception:  # noqa: BLE001 (exception types with other constructors)
            return RuntimeError(msg)

    def __call__(self, args: List) -> List:
        env = [None] * self._num_slots
        n = self._num_inputs
        env[:n] = args[:n]
        args.clear()
        try:
            for i, (run, frees) in enumerate(self._plan):
                run(env)
                for s in frees:
                    env[s] = None
        except Exception as e:  # noqa: BLE001
            raise self._error(i, env, e) from e
        out = self._out(env)
        stats.add("programs_run")
        return list(out) if isinstance(out, (list, tuple)) else [out]


def _out_of_memory(msg: str) -> Exception:
    """A torch.OutOfMemoryError that Dynamo lets through to the caller as it is
    (Dynamo wraps other backend errors in BackendCompilerFailed)."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:
        return torch.OutOfMemoryError(msg)

    class ProgramOutOfMemoryError(torch.OutOfMemoryError, ShortenTraceback):
        pass

    ProgramOutOfMemoryError.__module__ = "torch"
    ProgramOutOfMemoryError.__qualname__ = "OutOfMemoryError"
    return ProgramOutOfMemoryError(msg, first_useful_frame=None)


def check_memory(desc: Dict[str, Any], kind: str) -> None:
    """Raise torch.OutOfMemoryError when the program's peak exceeds the chip's HBM."""
    peak = desc["input_bytes"] + desc["peak_intermediate_bytes"]
    dev = desc["device"]
    cap = torch.tpu.get_device_properties(dev).total_memory
    if peak > cap:
        st = desc["steps"][desc["peak_step"]] if desc["peak_step"] >= 0 else None
        where = ""
        if st is not None:
            where = f" (peak at step {desc['peak_step']}: " + (
                f"fused region of {len(st['ops'])} ops" if st["kind"] == "region" else st.get("op", st["kind"])) + ")"
        raise _out_of_memory(
            f"torch.compile(backend='tpu'): the {kind} program needs {peak} physical HBM bytes at its peak "
            f"({desc['input_bytes']} in inputs + {desc['peak_intermediate_bytes']} in intermediates{where}), "
            f"more than the capacity of tpu:{dev}, {cap} bytes (TORCH_TPU_HBM_BYTES sets it)")


def library_ops(desc: Dict[str, Any]) -> List[str]:
    """ATen ops a program runs as library calls, once per call (batched copies included)."""
    out = []
    for st in desc["steps"]:
        if st["kind"] == "call":
            out.append(st["op"])
        elif st["kind"] == "copies":
            out += ["aten::copy_.default"] * len(st["pairs"])
    return out


# ---------------------------------------------------------------- entry point


def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs: List, kind: str):
    """AOTAutograd's compiler for one graph: the program for `gm` (boxed callable).

    Looks the program up in memory, then on disk (``TORCH_TPU_CACHE_DIR``), and
    builds it otherwise. Raises torch.OutOfMemoryError when its peak physical
    HBM bytes exceed the chip's capacity.
    """
    t0 = time.perf_counter()
    if _symbolic(gm, example_inputs):
        # Dynamic shapes reach here only without the bucketing pass: the graph runs as it
        # is, op by op (each a library call on the chip), for every size.
        log.info("%s graph with symbolic sizes: runs op by op (no program built)", kind)
        stats.add("graphs")
        stats.count_library_ops(_op_name(n.target) for n in gm.graph.nodes
                                if n.op == "call_function" and _op_name(n.target))
        run_gm = gm.forward

        def run_dynamic(args: List) -> List:
            a = list(args)
            args.clear()
            out = run_gm(*a)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        run_dynamic._boxed_call = True
        return run_dynamic
    gm.graph.eliminate_dead_code()
    _cse(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    stats.add("graphs")
    key = None
    try:
        key = _cache.program_key(gm, example_inputs)
    except _cache.Uncacheable as e:
        log.info("program not cached (%s)", e)
    desc = None
    source = "built"
    if key is not None:
        desc = _cache.memory_get(key)
        if desc is not None:
            source = "memory"
        else:
            desc = _cache.disk_get(key)
            if desc is not None:
                source = "disk"
                prog = _instantiate_disk_entry(key, desc, gm, kind)
                if prog is None:
                    desc, source = None, "built"
    if desc is None:
        try:
            desc = build_description(gm, example_inputs, kind)
        except _cache.Uncacheable as e:
            log.info("program not cached (%s)", e)
            key = None
            desc = build_description(gm, example_inputs, kind, objects=[])
        check_memory(desc, kind)
        if key is not None:
            _cache.disk_put(key, desc)
        stats.add("compilations")
    else:
        check_memory(desc, kind)
        stats.add("cache_hits_memory" if source == "memory" else "cache_hits_disk")
    if key is not None:
        _cache.memory_put(key, desc)
    name = f"{kind} program {key[:12] if key else 'uncached'}"
    if source != "disk":
        prog = Program(desc, gm, name)
    stats.add("regions", len(prog.regions))
    stats.count_library_ops(library_ops(desc))
    stats.add("compile_seconds", time.perf_counter() - t0)
    dump = os.environ.get("TORCH_TPU_DUMP_IR")
    if dump and source != "memory":
        _dump(dump, desc, key or "uncached", kind)
    log.debug("%s: %d steps, %d regions (%d kernels), %d library calls, from %s", name, len(desc["steps"]),
              len(prog.regions), prog.num_kernels, len(library_ops(desc)), source)
    def run(args: List) -> List:
        return prog(args)

    run._boxed_call = True  # AOTAutograd passes one list, which the program empties
    run.program = prog
    return run


def _instantiate_disk_entry(key: str, desc, gm, kind: str) -> Optional["Program"]:
    """The program of a disk entry, or None when the entry (checksum intact) does not
    describe a valid program: another format, or a body this code cannot instantiate.
    Such an entry is reported as corrupted, removed and rebuilt."""
    try:
        if not isinstance(desc, dict) or desc.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {desc.get('format') if isinstance(desc, dict) else type(desc).__name__}, "
                             f"expected {FORMAT_VERSION}")
        for k in ("steps", "free_after", "outputs", "num_slots", "num_inputs", "device", "input_bytes",
                  "peak_intermediate_bytes", "peak_step"):
            if k not in desc:
                raise ValueError(f"missing {k!r}")
        return Program(desc, gm, f"{kind} program {key[:12]}")
    except Exception as e:  # noqa: BLE001 (any malformed body: rebuild rather than fail the user's compile)
        _cache.report_corrupt_entry(key, e)
        return None


def _symbolic(gm, example_inputs) -> bool:
    def sym(v):
        if isinstance(v, torch.SymInt):
            return True
        return isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)

    if any(sym(x) for x in example_inputs):
        return True
    return any(n.op == "placeholder" and sym(n.meta.get("val")) for n in gm.graph.nodes)


def to_stablehlo(desc: Dict[str, Any], name: str = "program") -> str:
    """The program as StableHLO text: one func.func per fused region and a
    ``main`` that calls them in order, with library calls as
    ``stablehlo.custom_call @<ATen op>``."""
    lines = [f"// torch.compile(backend='tpu') {desc['kind']} program: {len(desc['steps'])} steps, "
             f"{sum(1 for s in desc['steps'] if s['kind'] == 'region')} fused regions, "
             f"{len(library_ops(desc))} library calls; peak {desc['input_bytes'] + desc['peak_intermediate_bytes']} "
             f"physical HBM bytes ({desc['input_bytes']} inputs)",
             f"module @{name} {{"]
    types: Dict[int, str] = {}
    for i, t in enumerate(desc["input_types"]):
        types[i] = t
    body = []
    ridx = 0
    for st in desc["steps"]:
        if st["kind"] == "region":
            region = _RC.Region.from_records(_records_from_json(st["records"]))
            fname = f"region_{ridx}"
            ridx += 1
            text = region.stablehlo(fname)
            lines.append("  // ATen ops: " + ", ".join(st["ops"]))
            lines += ["  " + ln for ln in text.splitlines()]
            out_types = []
            for s, (dt, shape) in zip(st["outputs"], st["types"]):
                types[s] = _mlir_type(getattr(torch, dt), shape)
                out_types.append(types[s])
            ins = ", ".join(f"%{s}" for s in st["inputs"])
            in_t = ", ".join(types.get(s, "!torch.any") for s in st["inputs"])
            res = ", ".join(f"%{s}" for s in st["outputs"])
            body.append(f"    {res} = func.call @{fname}({ins}) : ({in_t}) -> ({', '.join(out_types)})")
        elif st["kind"] == "copies":
            for (d, src), o in zip(st["pairs"], st["outputs"]):
                body.append(f"    %{o} = stablehlo.custom_call @\"aten::copy_.default\"(%{d}, %{src}) "
                            f"{{backend_config = \"batched\"}} : ({types.get(d, '!torch.any')}, "
                            f"{types.get(src, '!torch.any')}) -> !torch.any")
        elif st["kind"] == "getattr":
            body.append(f"    %{st['outputs'][0]} = \"torch.constant\"() {{name = \"{st['name']}\"}} : () -> !torch.any")
        else:
            reads = _slots_in(st["args"]) + _slots_in(st["kwargs"])
            ins = ", ".join(f"%{s}" for s in reads)
            consts = _describe_args(st["args"]) + (" " + _describe_args(st["kwargs"]) if st["kwargs"].get("d") else "")
            op = "getitem" if st["kind"] == "getitem" else st["op"]
            out_t = st.get("type", "!torch.any")
            types[st["outputs"][0]] = out_t
            body.append(f"    %{st['outputs'][0]} = stablehlo.custom_call @\"{op}\"({ins}) "
                        f"{{backend_config = \"{consts}\"}} : ({', '.join(types.get(s, '!torch.any') for s in reads)})"
                        f" -> {out_t}")
    outs = _slots_in(desc["outputs"])
    lines.append(f"  func.func @main({', '.join(f'%{i}: {t}' for i, t in enumerate(desc['input_types']))}) {{")
    lines += body
    lines.append(f"    return {', '.join(f'%{s}' for s in outs)}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _describe_args(enc) -> str:
    def fmt(a):
        if isinstance(a, dict):
            if "$" in a:
                return f"%{a['$']}"
            if "l" in a:
                return "[" + ", ".join(fmt(x) for x in a["l"]) + "]"
            if "d" in a:
                return "{" + ", ".join(f"{k}={fmt(v)}" for k, v in a["d"].items()) + "}"
            return next(iter(a.values()))
        return repr(a)

    return fmt(enc).replace('"', "'")


def _dump(folder: str, desc, key: str, kind: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"program_{kind}_{key[:16]}.mlir")
        with open(path, "w") as f:
            f.write(to_stablehlo(desc, f"{kind}_{key[:16]}"))
    except OSError as e:
        log.warning("TORCH_TPU_DUMP_IR: could not write %s: %s", folder, e)
