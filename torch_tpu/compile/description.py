"""The plain-data description of a program: what the disk cache stores, and what
:class:`.program.Program` instantiates.

A description is a dict (``format``, ``kind``, ``steps``, ``free_after``, ``outputs``,
slot and byte counts, MLIR type strings). Each step reads and writes *slots* (one per FX
value): a ``region`` carries its IR op records, a ``call`` / ``getitem`` its op name and
encoded arguments, ``copies`` its (destination, source) slot pairs, ``getattr`` a graph
constant's name, ``scalars`` the 0-dim CPU ops it evaluates on the host (call records,
:mod:`.host_scalars`). Arguments are JSON: ``{"$": slot}`` for a value, ``{"l": [...]}`` for a
list, ``{"dtype": ...}`` and the like for torch objects.
"""

import contextlib
import importlib
import operator
import threading
from typing import Any

import torch
import torch.fx

from .cache import Uncacheable


def op_name(target) -> str | None:
    """"aten::add.Tensor" for an OpOverload (default overload: "aten::exp.default")."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    return None


def resolve_op(name: str):
    """The callable a step names (inverse of :func:`target_name`)."""
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


@contextlib.contextmanager
def object_table(objects: list[Any] | None):
    """Within it, :func:`encode` / :func:`target_name` put what plain data cannot name into
    `objects` (None: they raise Uncacheable), and :func:`decode` / :func:`resolve_op` read it."""
    _tls.objects = objects
    try:
        yield
    finally:
        _tls.objects = None


def _object_ref(obj, what: str):
    table = getattr(_tls, "objects", None)
    if table is None:
        raise Uncacheable(what)
    table.append(obj)
    return {"obj": len(table) - 1}


def target_name(target) -> str:
    """The name a step records for an FX target (see :func:`resolve_op`)."""
    name = op_name(target)
    if name:
        return name
    if target is operator.getitem:
        return "getitem"
    mod = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None)
    if not mod or not qual or "<" in qual:
        return f"obj:{_object_ref(target, f'call of {target!r}')['obj']}"
    return f"{mod}:{qual}"


def encode(a, slot_of):
    """FX argument -> JSON-able plain data ({"$": slot} for a value)."""
    if isinstance(a, torch.fx.Node):
        return {"$": slot_of[a]}
    if isinstance(a, (list, tuple)):
        return {"l": [encode(x, slot_of) for x in a], "t": isinstance(a, tuple)}
    if isinstance(a, dict):
        return {"d": {k: encode(v, slot_of) for k, v in a.items()}}
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


def decode(a):
    """Plain data -> a getter (env -> value) and whether it reads the env."""
    if isinstance(a, dict):
        if "$" in a:
            s = a["$"]
            return (lambda env: env[s]), True
        if "l" in a:
            parts = [decode(x) for x in a["l"]]
            tup = a.get("t", False)
            if not any(p[1] for p in parts):
                const = tuple(p[0](None) for p in parts) if tup else [p[0](None) for p in parts]
                return (lambda env: const), False
            getters = [p[0] for p in parts]
            if tup:
                return (lambda env: tuple(g(env) for g in getters)), True
            return (lambda env: [g(env) for g in getters]), True
        if "d" in a:
            items = {k: decode(v) for k, v in a["d"].items()}
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


def type_str(v) -> str:
    """The MLIR type of an FX value (``tensor<2x3xf32>``; ``!torch.any`` for a non-tensor)."""
    if isinstance(v, torch.Tensor):
        return mlir_type(v.dtype, list(v.shape))
    return "!torch.any"


_MLIR = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64",
         torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "ui8", torch.bool: "i1",
         torch.int16: "i16", torch.complex64: "complex<f32>"}


def mlir_type(dtype, shape) -> str:
    et = _MLIR.get(dtype, str(dtype).replace("torch.", ""))
    return "tensor<" + "".join(f"{s}x" for s in shape) + et + ">"


def records_to_json(rec):
    """A region's IR op records (``Region.records()``) as JSON lists."""
    ops, outs = rec
    return [[list(op[0:1]) + [list(op[1]), op[2], list(op[3]), list(op[4][:4]) + [list(op[4][4])] + list(op[4][5:])]
             for op in ops], list(outs)]


def records_from_json(j):
    """Inverse of :func:`records_to_json` (for ``Region.from_records``)."""
    ops, outs = j
    rec_ops = []
    for op in ops:
        kind, operands, dtype, shape, at = op
        rec_ops.append((kind, list(operands), dtype, list(shape),
                        (at[0], float(at[1]), at[2], at[3], list(at[4]), at[5], float(at[6]), at[7])))
    return (rec_ops, list(outs))


def slots_in(enc) -> list[int]:
    """The slots an encoded argument reads."""
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


def step_reads(st) -> list[int]:
    """The slots a step reads."""
    if st["kind"] == "region":
        return list(st["inputs"]) + [s for s in st.get("into", ()) if s >= 0]
    if st["kind"] == "getattr":
        return []
    if st["kind"] == "copies":
        return [x for pair in st["pairs"] for x in pair]
    if st["kind"] == "scalars":
        return list(st["inputs"])
    return slots_in(st["args"]) + slots_in(st["kwargs"])


def library_ops(desc: dict[str, Any]) -> list[str]:
    """ATen ops a program runs as library calls, once per call (batched copies included)."""
    out = []
    for st in desc["steps"]:
        if st["kind"] == "call":
            out.append(st["op"])
        elif st["kind"] == "copies":
            out += ["aten::copy_.default"] * len(st["pairs"])
    return out
