"""A program description as one StableHLO module (``TORCH_TPU_DUMP_IR``, the XLA executor, export):
one ``func.func`` per fused region and a typed ``@main`` calling them in order, with the library
calls lowered to StableHLO ops (:mod:`.hlo_emit`); an op with no lowering stays a named
``stablehlo.custom_call @torch_tpu.<op>``."""

import inspect
import logging
import os
import re
from typing import Any

import torch

from .. import _C
from . import hlo_emit as hlo
from .description import library_ops, records_from_json

log = logging.getLogger("torch_tpu.compile")

_RC = _C._compile


class Lowered:
    """A program lowered to one StableHLO module.

    Attributes:
        text: the module (``func.func @main`` plus one function per fused region).
        params: the program inputs that are ``@main``'s arguments, in order (non-tensor inputs are not).
        outputs: the program's output structure (encoded as in the description) with each value
            replaced by ``{"r": i}`` (``@main``'s i-th result) or ``{"c": constant}``.
        mutations: (program input index, ``@main`` result index): an input the program copies into.
        custom_calls: (op name, reason) of every op that stayed a ``stablehlo.custom_call``.
        problems: why the module cannot stand in for the program (custom calls, non-tensor values).
    """

    def __init__(self):
        self.text = ""
        self.params: list[int] = []
        self.outputs: Any = None
        self.mutations: list[tuple[int, int]] = []
        self.custom_calls: list[tuple[str, str]] = []
        self.problems: list[str] = []

    @property
    def complete(self) -> bool:
        """True when the module computes everything the program does (no custom call)."""
        return not self.problems


class _NonTensor:
    def __init__(self, what: str):
        self.what = what


def _precision() -> str:
    try:
        return hlo.PRECISION.get(_C._effective_matmul_precision(), "HIGHEST")
    except AttributeError:  # an older extension
        return "HIGHEST"


def lower(desc: dict[str, Any], name: str = "program", precision: str | None = None) -> Lowered:
    """The program as one StableHLO module (see :class:`Lowered`).

    Fused regions become functions called from ``@main``; library calls are lowered by
    :data:`.hlo_emit.LOWERINGS` (matmuls as ``stablehlo.dot_general`` with the precision of
    the matmul precision level, `precision` a StableHLO name overriding it); an op with no
    lowering stays a ``stablehlo.custom_call @torch_tpu.<op>`` (listed in ``custom_calls``).
    """
    low = Lowered()
    em = hlo.Emitter("v", precision or _precision())
    env: dict[int, Any] = {}
    params = []
    for i, t in enumerate(desc["input_types"]):
        tt = hlo.parse_type(t)
        if tt is None:
            env[i] = _NonTensor(f"input {i}")
            continue
        env[i] = hlo.V(f"%arg{len(params)}", tt.et, tt.shape)
        params.append(env[i])
        low.params.append(i)
    n_in = len(desc["input_types"])
    tuple_types = _tuple_types(desc)
    funcs = []
    mutated: dict[int, Any] = {}
    ridx = 0
    for st in desc["steps"]:
        kind = st["kind"]
        if kind == "region":
            region = _RC.Region.from_records(records_from_json(st["records"]))
            fname = f"region_{ridx}"
            ridx += 1
            funcs.append("// ATen ops: " + ", ".join(st["ops"]))
            funcs += region.stablehlo(fname).splitlines()
            ins = [env.get(s) for s in st["inputs"]]
            outs = [hlo.TType(hlo.et_of(getattr(torch, dt)), shape) for dt, shape in st["types"]]
            if not all(isinstance(v, hlo.V) for v in ins):
                for s in st["outputs"]:
                    env[s] = _NonTensor("region of a non-tensor input")
                low.problems.append(f"region {fname} reads a non-tensor value")
                continue
            vs = [hlo.V(em.fresh(), t.et, t.shape) for t in outs]
            em.lines.append(f"{', '.join(v.name for v in vs)} = func.call @{fname}({', '.join(v.name for v in ins)}) "
                            f": ({', '.join(v.ty for v in ins)}) -> ({', '.join(v.ty for v in vs)})")
            for s, v in zip(st["outputs"], vs):
                env[s] = v
            # Outputs the region writes into graph inputs (their copy_ dropped): mutations of those inputs.
            written = {}
            for v, d in zip(vs, st.get("into", ())):
                if d >= 0:
                    written[d] = v
                    if d < n_in:
                        mutated[d] = v
            for copy_slot, dst in st.get("aliases", ()):  # the dropped copy_'s result is the written input
                if dst in written:
                    env[copy_slot] = written[dst]
        elif kind == "copies":
            for (d, src), o in zip(st["pairs"], st["outputs"]):
                dv, sv = env.get(d), env.get(src)
                if not (isinstance(dv, hlo.V) and isinstance(sv, hlo.V)):
                    env[o] = _NonTensor("copy of a non-tensor")
                    low.problems.append("copy_ of a non-tensor value")
                    continue
                nv = em.broadcast(em.convert(sv, dv.et), dv.shape)
                env[o] = nv
                if d < n_in:
                    mutated[d] = nv
        elif kind == "scalars":  # host float arithmetic: the ops as they are (0-dim tensors)
            for sub in st["ops"]:
                if not (sub["op"] == "aten::copy_.default" and _copy_call(em, sub, env, n_in, mutated)):
                    _lower_call(em, sub, env, {}, low)
        elif kind == "getattr":
            env[st["outputs"][0]] = _NonTensor(f"graph constant {st['name']}")
        elif kind == "getitem":
            args = _decode(st["args"], env)
            seq, i = args[0], args[1]
            env[st["outputs"][0]] = seq[i] if isinstance(seq, (list, tuple)) else _NonTensor("getitem")
        elif st["op"] == "aten::copy_.default" and _copy_call(em, st, env, n_in, mutated):
            pass
        else:
            _lower_call(em, st, env, tuple_types.get(st["outputs"][0], {}), low)
    results: list = []
    index: dict[str, int] = {}

    def result(v) -> int:
        if v.name not in index:
            index[v.name] = len(results)
            results.append(v)
        return index[v.name]

    def out(a):
        if isinstance(a, dict):
            if "$" in a:
                v = env.get(a["$"])
                if isinstance(v, hlo.V):
                    return {"r": result(v)}
                if v is None or isinstance(v, (int, float, bool)):
                    return {"c": v}
                low.problems.append(f"output %{a['$']} is not a tensor ({getattr(v, 'what', type(v).__name__)})")
                return {"c": None}
            if "l" in a:
                return {"l": [out(x) for x in a["l"]], "t": a.get("t", False)}
            if "d" in a:
                return {"d": {k: out(v) for k, v in a["d"].items()}}
        return {"c": a}

    low.outputs = out(desc["outputs"])
    for i, v in sorted(mutated.items()):
        low.mutations.append((i, result(v)))
    sig = ", ".join(f"{v.name}: {v.ty}" for v in params)
    res_t = ", ".join(v.ty for v in results)
    n_regions = sum(1 for s in desc["steps"] if s["kind"] == "region")
    lines = [f"// torch.compile(backend='tpu') {desc['kind']} program: {len(desc['steps'])} steps, "
             f"{n_regions} fused regions, {len(library_ops(desc))} library calls lowered to StableHLO, "
             f"{len(low.custom_calls)} custom calls; peak {desc['input_bytes'] + desc['peak_intermediate_bytes']} "
             f"physical HBM bytes ({desc['input_bytes']} inputs)",
             f"module @{name} {{"]
    lines += ["  " + ln for ln in funcs]
    lines.append(f"  func.func @main({sig}) -> ({res_t}) {{")
    lines += ["    " + ln for ln in em.lines]
    lines.append(f"    return {', '.join(v.name for v in results)}" + (f" : {res_t}" if results else ""))
    lines.append("  }")
    lines.append("}")
    low.text = "\n".join(lines) + "\n"
    return low


def to_stablehlo(desc: dict[str, Any], name: str = "program") -> str:
    """The program as StableHLO text (:func:`lower`'s module)."""
    return lower(desc, name).text


def _copy_call(em, st, env, n_in: int, mutated: dict) -> bool:
    """``copy_(dst, src)`` as a library call (dtypes or shapes differ): dst's new value; False
    when it reads a non-tensor."""
    try:
        args = _decode(st["args"], env)
    except Exception:  # noqa: BLE001
        return False
    if len(args) < 2 or not (isinstance(args[0], hlo.V) and isinstance(args[1], hlo.V)):
        return False
    d, src = args[0], args[1]
    try:
        nv = em.broadcast(em.convert(src, d.et), d.shape)
    except hlo.Unlowerable:
        return False
    env[st["outputs"][0]] = nv
    slot = st["args"]["l"][0]["$"] if isinstance(st["args"], dict) else st["args"][0]["$"]
    if slot < n_in:
        mutated[slot] = nv
    return True


def _tuple_types(desc) -> dict[int, dict[int, str]]:
    """slot of a tuple-valued call -> {element index: MLIR type} (from the getitems reading it)."""
    out: dict[int, dict[int, str]] = {}
    for st in desc["steps"]:
        if st["kind"] == "getitem":
            a = st["args"]["l"] if isinstance(st["args"], dict) else st["args"]
            if isinstance(a[0], dict) and "$" in a[0] and isinstance(a[1], int):
                out.setdefault(a[0]["$"], {})[a[1]] = st.get("type", "!torch.any")
    return out


def _decode(a, env):
    """An encoded argument with slots replaced by their lowered values."""
    if isinstance(a, dict):
        if "$" in a:
            return env.get(a["$"])
        if "l" in a:
            xs = [_decode(x, env) for x in a["l"]]
            return tuple(xs) if a.get("t") else xs
        if "d" in a:
            return {k: _decode(v, env) for k, v in a["d"].items()}
        if "dtype" in a:
            return getattr(torch, a["dtype"])
        if "device" in a:
            return torch.device(a["device"])
        if "memory_format" in a or "layout" in a:
            return None
        return _NonTensor(f"argument {a!r}")
    return a


def _wants_op(fn) -> bool:
    w = _WANTS_OP.get(fn)
    if w is None:
        w = _WANTS_OP[fn] = "_op" in inspect.signature(fn).parameters
    return w


_WANTS_OP: dict = {}


def _lower_call(em: hlo.Emitter, st, env, tuple_types: dict[int, str], low: Lowered) -> None:
    op = st["op"]
    outs = st["outputs"]
    out_t = hlo.parse_type(st.get("type", ""))
    fn = hlo.LOWERINGS.get(op)
    reason = "no StableHLO lowering"
    if fn is not None:
        mark = len(em.lines)
        try:
            args = _decode(st["args"], env)
            kwargs = _decode(st["kwargs"], env)
            kwargs = {k: v for k, v in kwargs.items() if k not in ("dtype", "layout", "device", "pin_memory",
                                                                    "memory_format", "non_blocking")
                      or op.startswith(("aten::sum", "aten::mean"))}
            if any(isinstance(v, _NonTensor) for v in _leaves(args) + _leaves(kwargs)):
                raise hlo.Unlowerable("reads a non-tensor value")
            if _wants_op(fn):
                kwargs["_op"] = op
            r = fn(em, out_t, *args, **kwargs)
            if isinstance(r, hlo.V) and out_t is not None and (r.et, r.shape) != (out_t.et, out_t.shape):
                raise hlo.Unlowerable(f"lowered to {r.ty}, the op gives {out_t.ty}")
            env[outs[0]] = r
            return
        except Exception as e:  # noqa: BLE001 (any argument the lowering does not cover: a custom call)
            del em.lines[mark:]
            reason = f"{type(e).__name__}: {e}"
    _custom_call(em, st, env, out_t, tuple_types, low, reason)


def _leaves(x) -> list:
    if isinstance(x, (list, tuple)):
        return [y for a in x for y in _leaves(a)]
    if isinstance(x, dict):
        return [y for a in x.values() for y in _leaves(a)]
    return [x]


def _custom_call(em, st, env, out_t, tuple_types, low: Lowered, reason: str) -> None:
    op = st["op"]
    target = "torch_tpu." + op.replace("::", ".")
    low.custom_calls.append((op, reason))
    low.problems.append(f"{op} stays a custom call ({reason})")
    try:
        ins = [v for v in _leaves(_decode(st["args"], env)) + _leaves(_decode(st["kwargs"], env))
               if isinstance(v, hlo.V)]
    except Exception:  # noqa: BLE001
        ins = []
    if out_t is not None:
        res_types = [out_t]
    else:
        res_types = [hlo.parse_type(tuple_types[i]) for i in sorted(tuple_types)] if tuple_types else []
        res_types = [t for t in res_types if t is not None]
    consts = _describe_args(st["args"]).replace("\\", "")
    vs = [hlo.V(em.fresh(), t.et, t.shape) for t in res_types]
    if vs:
        em.lines.append(f"{', '.join(v.name for v in vs)} = stablehlo.custom_call @{target}"
                        f"({', '.join(v.name for v in ins)}) {{backend_config = \"{consts}\"}} : "
                        f"({', '.join(v.ty for v in ins)}) -> ({', '.join(v.ty for v in vs)})")
    if out_t is not None:
        env[st["outputs"][0]] = vs[0]
    elif tuple_types:
        it = iter(vs)
        n = max(tuple_types) + 1
        env[st["outputs"][0]] = tuple(next(it) if i in tuple_types and hlo.parse_type(tuple_types[i]) else
                                      _NonTensor(op) for i in range(n))
    else:
        env[st["outputs"][0]] = _NonTensor(op)


def _describe_args(enc) -> str:
    def fmt(a):
        if isinstance(a, dict):
            if "$" in a:
                return f"%{a['$']}"
            if "l" in a:
                return "[" + ", ".join(fmt(x) for x in a["l"]) + "]"
            if "d" in a:
                return "{" + ", ".join(f"{k}={fmt(v)}" for k, v in a["d"].items()) + "}"
            return str(next(iter(a.values())))
        return repr(a)

    return fmt(enc).replace('"', "'")


def module_name(key: str, kind: str, name: str | None = None) -> str:
    """The StableHLO module / dump file stem of a program: ``[<name>_]<kind>_<key[:16]>``
    (``name`` reduced to letters, digits and ``_``)."""
    stem = f"{kind}_{key[:16]}"
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{stem}" if name else stem


def dump_path(folder: str, key: str, kind: str, name: str | None = None) -> str:
    return os.path.join(folder, f"program_{module_name(key, kind, name)}.mlir")


def dump_program(folder: str, desc, key: str, kind: str, name: str | None = None, text: str | None = None) -> None:
    """Write the program as StableHLO text to :func:`dump_path` (``text``: already printed)."""
    try:
        os.makedirs(folder, exist_ok=True)
        path = dump_path(folder, key, kind, name)
        with open(path, "w") as f:
            f.write(text if text is not None else to_stablehlo(desc, module_name(key, kind, name)))
    except OSError as e:
        log.warning("TORCH_TPU_DUMP_IR / xla_dump_to: could not write %s: %s", folder, e)
