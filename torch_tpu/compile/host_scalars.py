"""Chains of 0-dim CPU tensor ops evaluated on the host as Python floats: one ``scalars`` step.

A compiled optimizer's step counts are 0-dim CPU tensors (non-capturable AdamW): its graph
computes each parameter's bias corrections from its own count (``pow``, ``sub``, ``neg``,
``sqrt``, ``div``, ``reciprocal``: about ten ops a parameter, 762 for the demo's GPT) and
writes the incremented counts back with ``copy_``. As library calls each is one ATen dispatch
(several microseconds); here the whole set that depends only on graph inputs is one step that
reads the input values once, evaluates the ops on Python floats rounded to the result dtype
after every op (IEEE float32 for ``add``/``sub``/``mul``/``div``/``sqrt``, exact in float64;
``pow``/``exp``/``log`` within an ulp of ATen's), writes the counts back with ``fill_`` and
makes one 0-dim tensor per distinct value that later steps read (regions read host scalars
when they are queued).

Only float32 / float64 ops of :data:`_IMPLS`, whose tensor arguments are 0-dim CPU tensors
(graph inputs or other members) and whose other arguments are Python numbers.
"""

import math
import struct
from typing import Any

import torch
import torch.fx

from .description import encode, op_name, type_str

_F32 = struct.Struct("f")
_INF = math.inf
_NAN = math.nan
_HOST_DTYPES = (torch.float32, torch.float64)


def round32(x: float) -> float:
    """`x` rounded to the nearest float32 (as a Python float); overflow gives +-inf."""
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return math.copysign(_INF, x)


def _div(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return _NAN
        return math.copysign(_INF, a) * math.copysign(1.0, b)


def _sqrt(a: float) -> float:
    if a != a or a < 0:
        return _NAN
    return math.sqrt(a)


def _odd_integer(b: float) -> bool:
    return math.isfinite(b) and b == int(b) and int(b) % 2 == 1


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return -_INF if math.copysign(1.0, a) < 0 and _odd_integer(b) else _INF
    except ValueError:  # 0 ** negative (a negative base with a fractional exponent gives nan)
        if a == 0:
            return -_INF if math.copysign(1.0, a) < 0 and _odd_integer(b) else _INF
        return _NAN


def _exp(a: float) -> float:
    try:
        return math.exp(a)
    except OverflowError:
        return _INF


def _log(a: float) -> float:
    if a != a or a < 0:
        return _NAN
    if a == 0:
        return -_INF
    return math.log(a) if a != _INF else _INF


def _pow_tensor_scalar(rnd):
    """ATen's float kernel special-cases these exponents (products, sqrt, reciprocals)."""
    def f(x, e):
        if e == 2:
            return x * x
        if e == 3:
            return rnd(x * x) * x
        if e == 0.5:
            return _sqrt(x)
        if e == -0.5:
            return _div(1.0, rnd(_sqrt(x)))
        if e == -1:
            return _div(1.0, x)
        if e == -2:
            return _div(1.0, rnd(x * x))
        return _pow(x, e)

    return f


# op name -> (number of float operands, whether it takes alpha, impl(rnd) -> fn(*operands[, alpha]))
_IMPLS: dict[str, tuple[int, bool, Any]] = {
    "aten::add.Tensor": (2, True, lambda rnd: lambda a, b, al: a + al * b),
    "aten::add.Scalar": (2, True, lambda rnd: lambda a, b, al: a + al * b),
    "aten::sub.Tensor": (2, True, lambda rnd: lambda a, b, al: a - al * b),
    "aten::sub.Scalar": (2, True, lambda rnd: lambda a, b, al: a - al * b),
    "aten::rsub.Tensor": (2, True, lambda rnd: lambda a, b, al: b - al * a),
    "aten::rsub.Scalar": (2, True, lambda rnd: lambda a, b, al: b - al * a),
    "aten::mul.Tensor": (2, False, lambda rnd: lambda a, b: a * b),
    "aten::mul.Scalar": (2, False, lambda rnd: lambda a, b: a * b),
    "aten::div.Tensor": (2, False, lambda rnd: _div),
    "aten::div.Scalar": (2, False, lambda rnd: _div),
    "aten::neg.default": (1, False, lambda rnd: lambda a: -a),
    "aten::reciprocal.default": (1, False, lambda rnd: lambda a: _div(1.0, a)),
    "aten::sqrt.default": (1, False, lambda rnd: _sqrt),
    "aten::rsqrt.default": (1, False, lambda rnd: lambda a: _div(1.0, rnd(_sqrt(a)))),
    "aten::exp.default": (1, False, lambda rnd: _exp),
    "aten::log.default": (1, False, lambda rnd: _log),
    "aten::pow.Scalar": (2, False, lambda rnd: _pow),
    "aten::pow.Tensor_Tensor": (2, False, lambda rnd: _pow),
    "aten::pow.Tensor_Scalar": (2, False, _pow_tensor_scalar),
}


def _host_value(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0 and v.dtype in _HOST_DTYPES


def _number(a) -> bool:
    return isinstance(a, (int, float))  # bool included


def _member(n: torch.fx.Node, members: set) -> bool:
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    spec = _IMPLS.get(op_name(n.target))
    if spec is None or not _host_value(n.meta.get("val")):
        return False
    nargs, alpha, _ = spec
    if len(n.args) != nargs or set(n.kwargs) - ({"alpha"} if alpha else set()):
        return False
    if alpha and not _number(n.kwargs.get("alpha", 1)):
        return False
    for a in n.args:
        if isinstance(a, torch.fx.Node):
            if a not in members and not (a.op == "placeholder" and _host_value(a.meta.get("val"))):
                return False
        elif not _number(a):
            return False
    return True


def _mutates(user: torch.fx.Node, n: torch.fx.Node) -> bool:
    """Whether `user` may write `n` (an in-place or out= argument, or an op Python runs)."""
    t = user.target
    if not isinstance(t, torch._ops.OpOverload):
        return user.op == "call_function"
    for i, arg in enumerate(t._schema.arguments):
        v = user.args[i] if i < len(user.args) else user.kwargs.get(arg.name)
        if v is n and arg.alias_info is not None and arg.alias_info.is_write:
            return True
    return False


def find(body: list[torch.fx.Node], graph_outputs: set) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The host-scalar members of `body` (in order: they depend only on graph inputs and each
    other) and the ``copy_(input, member)`` nodes that write members back into graph inputs
    read by nothing but members."""
    members: list[torch.fx.Node] = []
    mset: set = set()
    for n in body:
        if _member(n, mset):
            members.append(n)
            mset.add(n)
    if not members:
        return [], []
    writes = []
    written = set()
    for n in body:
        if n.target is not torch.ops.aten.copy_.default or n.kwargs or len(n.args) != 2:
            continue
        dst, src = n.args
        if not (isinstance(dst, torch.fx.Node) and src in mset and dst.op == "placeholder"):
            continue
        d = dst.meta.get("val")
        if (not _host_value(d) or d.dtype != src.meta["val"].dtype or dst in written or dst in graph_outputs
                or n in graph_outputs or n.users):
            continue
        if any(u is not n and u not in mset for u in dst.users):
            continue
        writes.append(n)
        written.add(dst)
    return members, writes


def step(members: list[torch.fx.Node], writes: list[torch.fx.Node], slot_of: dict, graph_outputs: set) -> dict:
    """The ``scalars`` step of these members: ``ops`` (call-step records, the ``copy_`` writes
    last), ``inputs`` (slots read from outside), ``outputs`` (members later steps read, as
    tensors; ``fresh``: those given a tensor of their own, graph outputs and ones a user may
    write), and ``writes`` ([input slot, member slot, copy slot])."""
    mset = set(members)
    wset = set(writes)
    inputs: list[int] = []
    seen = set()
    ops = []
    for n in members + writes:
        for a in n.all_input_nodes:
            if a not in mset and a not in seen:
                seen.add(a)
                inputs.append(slot_of[a])
        ops.append({"kind": "call", "op": op_name(n.target), "args": encode(list(n.args), slot_of),
                    "kwargs": encode(dict(n.kwargs), slot_of), "outputs": [slot_of[n]],
                    "type": type_str(n.meta.get("val"))})
    outs, fresh = [], []
    for n in members:
        external = [u for u in n.users if u not in mset and u not in wset]
        if n in graph_outputs or external:
            outs.append(slot_of[n])
            if n in graph_outputs or any(_mutates(u, n) for u in external):
                fresh.append(slot_of[n])
    return {"kind": "scalars", "ops": ops, "inputs": inputs, "outputs": outs, "fresh": fresh,
            "writes": [[slot_of[w.args[0]], slot_of[w.args[1]], slot_of[w]] for w in writes]}


_DTYPE = {"tensor<f32>": torch.float32, "tensor<f64>": torch.float64}


def make_runner(st: dict):
    """The runner of a ``scalars`` step: env -> None (sets its output slots)."""
    index: dict[int, int] = {}

    def at(s: int) -> int:
        if s not in index:
            index[s] = len(index)
        return index[s]

    ins = [(at(s), s) for s in st["inputs"]]
    dtype_of: dict[int, torch.dtype] = {}
    prog = []  # (fn, operand getters, out index, rounder)
    for sub in st["ops"]:
        if sub["op"] == "aten::copy_.default":
            continue
        nargs, alpha, impl = _IMPLS[sub["op"]]
        dt = _DTYPE[sub["type"]]
        rnd = round32 if dt == torch.float32 else float
        dtype_of[sub["outputs"][0]] = dt
        fn = impl(rnd)
        operands = []
        for a in sub["args"]["l"]:
            if isinstance(a, dict):
                operands.append((True, at(a["$"])))
            else:
                operands.append((False, rnd(float(a))))
        if alpha:
            operands.append((False, rnd(float(sub["kwargs"]["d"].get("alpha", 1) if sub["kwargs"] else 1))))
        prog.append((fn, tuple(operands), at(sub["outputs"][0]), rnd))
    n_vals = len(index)
    prog = tuple(prog)
    fresh = set(st["fresh"])
    outs = tuple((s, index[s], dtype_of[s], s in fresh) for s in st["outputs"])
    writes = tuple((d, index[src], c) for d, src, c in st["writes"])

    def run_scalars(env):
        v = [0.0] * n_vals
        for i, s in ins:
            v[i] = env[s].item()
        for fn, operands, o, rnd in prog:
            v[o] = rnd(fn(*[v[x] if slot else x for slot, x in operands]))
        shared: dict = {}
        for s, i, dt, own in outs:
            x = v[i]
            if own:
                env[s] = torch.tensor(x, dtype=dt)
                continue
            k = (x, math.copysign(1.0, x), dt) if x == x else ("nan", dt)
            t = shared.get(k)
            if t is None:
                t = shared[k] = torch.tensor(x, dtype=dt)
            env[s] = t
        for d, i, c in writes:
            t = env[d]
            t.fill_(v[i])
            env[c] = t

    return run_scalars
