"""StableHLO text emission for ATen ops (the library calls of a compiled program).

:class:`Emitter` writes one function body: SSA values (:class:`V`: name, element type,
shape) and the ops that make them. :data:`LOWERINGS` maps an ATen op name
(``aten::mm.default``) to a function ``(em, out, *args, **kwargs)`` returning a :class:`V`
or a tuple of them; ``out`` is the op's result type as the program records it
(a :class:`TType`, or None for a tuple result). Arguments are the op's arguments with each
tensor replaced by its :class:`V`. A lowering raises :class:`Unlowerable` (or anything
else) for arguments it does not cover; the caller then emits a named custom call.
"""

import math
import re
import struct
from typing import Any

import torch

_ET = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64",
       torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "ui8",
       torch.bool: "i1", torch.complex64: "complex<f32>", torch.complex128: "complex<f64>"}
_DTYPE = {v: k for k, v in _ET.items()}
FLOATS = ("f32", "bf16", "f16", "f64")

# unary ops StableHLO has only in CHLO (XLA and JAX read them)
CHLO_UNARY = frozenset({"erf", "erf_inv", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh",
                        "digamma", "lgamma"})

# matmul precision level (torch / torch.tpu names) -> StableHLO precision
PRECISION = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


class Unlowerable(Exception):
    """An op (or its arguments) has no StableHLO lowering here."""


class TType:
    """A tensor type: element type (``f32``) and shape."""

    __slots__ = ("et", "shape")

    def __init__(self, et: str, shape):
        self.et, self.shape = et, tuple(int(s) for s in shape)

    @property
    def ty(self) -> str:
        return "tensor<" + "".join(f"{s}x" for s in self.shape) + self.et + ">"

    @property
    def rank(self) -> int:
        return len(self.shape)


class V(TType):
    """An SSA value of the function being emitted."""

    __slots__ = ("name",)

    def __init__(self, name: str, et: str, shape):
        super().__init__(et, shape)
        self.name = name


_TYPE_RE = re.compile(r"^tensor<((?:\d+x)*)([a-z0-9<>]+)>$")


def parse_type(s: str) -> TType | None:
    """``tensor<2x3xf32>`` -> TType; None for anything else (``!torch.any``)."""
    m = _TYPE_RE.match(s or "")
    if not m:
        return None
    dims = [int(d) for d in m.group(1).split("x") if d]
    return TType(m.group(2), dims)


def et_of(dtype: torch.dtype) -> str:
    if dtype not in _ET:
        raise Unlowerable(f"dtype {dtype}")
    return _ET[dtype]


def dtype_of(et: str) -> torch.dtype:
    return _DTYPE[et]


def literal(v, et: str) -> str:
    """A scalar as an MLIR dense literal of element type `et` (inf / NaN as bit patterns)."""
    if et == "i1":
        return "true" if v else "false"
    if et.startswith("complex<"):
        c, inner = complex(v), et[8:-1]
        return f"({literal(c.real, inner)}, {literal(c.imag, inner)})"
    if et not in FLOATS:
        return str(int(v))
    v = float(v)
    if math.isfinite(v):
        r = repr(v)
        mant, e, exp = r.partition("e")
        return (mant if "." in mant else mant + ".0") + e + exp
    if et == "f64":
        return f"0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"
    if et == "f32":
        return f"0x{struct.unpack('<I', struct.pack('<f', v))[0]:08X}"
    bits = {"bf16": (0x7FC0, 0x7F80, 0xFF80), "f16": (0x7E00, 0x7C00, 0xFC00)}[et]
    return f"0x{bits[0] if math.isnan(v) else bits[1] if v > 0 else bits[2]:04X}"


def _dims(d) -> str:
    return "[" + ", ".join(str(int(x)) for x in d) + "]"


def _arr(d) -> str:
    return "array<i64" + (": " + ", ".join(str(int(x)) for x in d) if len(d) else "") + ">"


class Emitter:
    """Writes ops into ``lines`` with fresh SSA names ``%<prefix><n>``."""

    def __init__(self, prefix: str = "v", precision: str = "HIGHEST"):
        self.lines: list[str] = []
        self._n = 0
        self.prefix = prefix
        self.precision = precision

    def fresh(self) -> str:
        self._n += 1
        return f"%{self.prefix}{self._n}"

    def emit(self, rhs: str, et: str, shape) -> V:
        v = V(self.fresh(), et, shape)
        self.lines.append(f"{v.name} = {rhs}")
        return v

    # ---- building blocks -------------------------------------------------------------
    def const(self, value, et: str, shape=()) -> V:
        s = self.emit(f"stablehlo.constant dense<{literal(value, et)}> : tensor<{et}>", et, ())
        return self.broadcast(s, shape) if tuple(shape) else s

    def convert(self, x: V, et: str) -> V:
        if x.et == et:
            return x
        if et == "i1":  # x != 0
            return self.compare("NE", x, self.const(0, x.et, x.shape))
        return self.emit(f"stablehlo.convert {x.name} : ({x.ty}) -> {TType(et, x.shape).ty}", et, x.shape)

    def reshape(self, x: V, shape) -> V:
        shape = tuple(int(s) for s in shape)
        if x.shape == shape:
            return x
        if math.prod(shape) != math.prod(x.shape):
            raise Unlowerable(f"reshape {x.shape} -> {shape}")
        return self.emit(f"stablehlo.reshape {x.name} : ({x.ty}) -> {TType(x.et, shape).ty}", x.et, shape)

    def broadcast(self, x: V, shape, dims=None) -> V:
        """`x` broadcast to `shape`: numpy rules (trailing dims) unless `dims` is given."""
        shape = tuple(int(s) for s in shape)
        if dims is None:
            if x.shape == shape:
                return x
            dims = list(range(len(shape) - x.rank, len(shape)))
            if len(dims) != x.rank or any(x.shape[i] not in (1, shape[d]) for i, d in enumerate(dims)):
                raise Unlowerable(f"broadcast {x.shape} -> {shape}")
        return self.emit(f"stablehlo.broadcast_in_dim {x.name}, dims = {_dims(dims)} : ({x.ty}) -> "
                         f"{TType(x.et, shape).ty}", x.et, shape)

    def transpose(self, x: V, perm) -> V:
        perm = [int(p) % max(x.rank, 1) for p in perm]
        if perm == list(range(x.rank)):
            return x
        shape = [x.shape[p] for p in perm]
        return self.emit(f"stablehlo.transpose {x.name}, dims = {_dims(perm)} : ({x.ty}) -> "
                         f"{TType(x.et, shape).ty}", x.et, shape)

    def unary(self, op: str, x: V) -> V:
        if op in CHLO_UNARY:
            return self.emit(f"chlo.{op} {x.name} : {x.ty} -> {x.ty}", x.et, x.shape)
        return self.emit(f"stablehlo.{op} {x.name} : {x.ty}", x.et, x.shape)

    def binary(self, op: str, a: V, b: V) -> V:
        """Same-typed elementwise binary op (operands broadcast to a common shape)."""
        shape = torch.broadcast_shapes(a.shape, b.shape)
        a, b = self.broadcast(a, shape), self.broadcast(b, shape)
        return self.emit(f"stablehlo.{op} {a.name}, {b.name} : {a.ty}", a.et, a.shape)

    def compare(self, direction: str, a: V, b: V) -> V:
        shape = torch.broadcast_shapes(a.shape, b.shape)
        a, b = self.broadcast(a, shape), self.broadcast(b, shape)
        kind = "FLOAT" if a.et in FLOATS else "UNSIGNED" if a.et in ("ui8", "i1") else "SIGNED"
        return self.emit(f"stablehlo.compare {direction}, {a.name}, {b.name}, {kind} : ({a.ty}, {b.ty}) -> "
                         f"{TType('i1', shape).ty}", "i1", shape)

    def select(self, p: V, a: V, b: V) -> V:
        shape = torch.broadcast_shapes(p.shape, a.shape, b.shape)
        p, a, b = self.broadcast(p, shape), self.broadcast(a, shape), self.broadcast(b, shape)
        return self.emit(f"stablehlo.select {p.name}, {a.name}, {b.name} : {p.ty}, {a.ty}", a.et, shape)

    def reduce(self, x: V, dims, kind: str, keepdim: bool = False) -> V:
        """Reduce `x` over `dims` with ``add`` / ``maximum`` / ``minimum`` / ``multiply`` / ``or`` / ``and``."""
        dims = sorted({int(d) % max(x.rank, 1) for d in dims}) if x.rank else []
        init = {"add": 0, "multiply": 1, "or": 0, "and": 1,
                "maximum": -math.inf if x.et in FLOATS else _int_min(x.et),
                "minimum": math.inf if x.et in FLOATS else _int_max(x.et)}[kind]
        c = self.const(init, x.et)
        shape = [s for i, s in enumerate(x.shape) if i not in dims]
        r = self.emit(f"stablehlo.reduce({x.name} init: {c.name}) applies stablehlo.{kind} across dimensions = "
                      f"{_dims(dims)} : ({x.ty}, {c.ty}) -> {TType(x.et, shape).ty}", x.et, shape)
        if keepdim:
            r = self.reshape(r, [1 if i in dims else s for i, s in enumerate(x.shape)])
        return r

    def iota(self, et: str, shape, dim: int) -> V:
        return self.emit(f"stablehlo.iota dim = {dim} : {TType(et, shape).ty}", et, shape)

    def slice(self, x: V, start, limit, strides) -> V:
        shape = [max(0, -(-(lim - s) // st)) for s, lim, st in zip(start, limit, strides)]
        return self.emit(f"stablehlo.slice {x.name} [" + ", ".join(f"{s}:{lim}:{st}" for s, lim, st in
                                                                  zip(start, limit, strides))
                         + f"] : ({x.ty}) -> {TType(x.et, shape).ty}", x.et, shape)

    def concat(self, xs: list[V], dim: int) -> V:
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        return self.emit(f"stablehlo.concatenate {', '.join(x.name for x in xs)}, dim = {dim} : "
                         f"({', '.join(x.ty for x in xs)}) -> {TType(xs[0].et, shape).ty}", xs[0].et, shape)

    def dot_general(self, a: V, b: V, batch, contract, out_et: str | None = None) -> V:
        """``stablehlo.dot_general``: result dims = batch, a's free, b's free."""
        (ba, bb), (ca, cb) = batch, contract
        shape = ([a.shape[d] for d in ba] + [s for i, s in enumerate(a.shape) if i not in ba and i not in ca]
                 + [s for i, s in enumerate(b.shape) if i not in bb and i not in cb])
        et = out_et or a.et
        bat = f"batching_dims = {_dims(ba)} x {_dims(bb)}, " if ba else ""
        p = self.precision if a.et == "f32" else "DEFAULT"
        return self.emit(f"stablehlo.dot_general {a.name}, {b.name}, {bat}contracting_dims = {_dims(ca)} x "
                         f"{_dims(cb)}, precision = [{p}, {p}] : ({a.ty}, {b.ty}) -> {TType(et, shape).ty}", et, shape)

    def region_op(self, head: str, operands: list[V], body_kind: str | None, scalar_et: str, attrs: str,
                  out: TType, body_lines: list[str] | None = None) -> V:
        """A generic-syntax op with a two-argument scalar body (``"stablehlo.reduce_window"``...):
        the body applies ``stablehlo.<body_kind>`` (None: returns its second argument)."""
        a, b = self.fresh(), self.fresh()
        st = f"tensor<{scalar_et}>"
        if body_kind is None:
            body = [f"  stablehlo.return {b} : {st}"]
        else:
            r = self.fresh()
            body = [f"  {r} = stablehlo.{body_kind} {a}, {b} : {st}", f"  stablehlo.return {r} : {st}"]
        v = V(self.fresh(), out.et, out.shape)
        self.lines.append(f"{v.name} = \"stablehlo.{head}\"({', '.join(o.name for o in operands)}) ({{")
        self.lines.append(f"^bb0({a}: {st}, {b}: {st}):")
        self.lines += body
        self.lines.append(f"}}) {{{attrs}}} : ({', '.join(o.ty for o in operands)}) -> {out.ty}")
        return v

    def gather_points(self, x: V, idx: V) -> V:
        """``x[idx[..., 0], idx[..., 1], ...]``: idx's last dim indexes every dim of x."""
        k = idx.shape[-1]
        out = TType(x.et, idx.shape[:-1] + x.shape[k:])
        nb = idx.rank - 1
        attrs = (f"dimension_numbers = #stablehlo.gather<offset_dims = {_dims(range(nb, nb + x.rank - k))}, "
                 f"collapsed_slice_dims = {_dims(range(k))}, start_index_map = {_dims(range(k))}, "
                 f"index_vector_dim = {nb}>, slice_sizes = {_arr([1] * k + list(x.shape[k:]))}, "
                 "indices_are_sorted = false")
        return self.emit(f"\"stablehlo.gather\"({x.name}, {idx.name}) {{{attrs}}} : ({x.ty}, {idx.ty}) -> {out.ty}",
                         out.et, out.shape)

    def scatter_points(self, x: V, idx: V, upd: V, combine: str | None) -> V:
        """x with ``x[idx[i]] = upd[i]`` (combine None) or ``combine``d into it; idx (N, k)."""
        k = idx.shape[-1]
        nb = idx.rank - 1
        attrs = (f"scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = "
                 f"{_dims(range(nb, nb + x.rank - k))}, inserted_window_dims = {_dims(range(k))}, "
                 f"scatter_dims_to_operand_dims = {_dims(range(k))}, index_vector_dim = {nb}>, "
                 "indices_are_sorted = false, unique_indices = false")
        return self.region_op("scatter", [x, idx, upd], combine, x.et, attrs, TType(x.et, x.shape))


def _int_min(et: str) -> int:
    return 0 if et in ("ui8", "i1") else -(1 << (int(et[1:]) - 1))


def _int_max(et: str) -> int:
    return 1 if et == "i1" else 255 if et == "ui8" else (1 << (int(et[1:]) - 1)) - 1


# ---- ATen lowerings ---------------------------------------------------------------------
LOWERINGS: dict[str, Any] = {}


def lowers(*names):
    def deco(fn):
        for n in names:
            LOWERINGS[n if "::" in n else "aten::" + n] = fn
        return fn

    return deco


def _is_v(x) -> bool:
    return isinstance(x, V)


def _scalar_et(x, other_et: str) -> str:
    """The element type a Python scalar takes next to a tensor of `other_et` (PyTorch's promotion)."""
    if isinstance(x, bool):
        return other_et
    if isinstance(x, float) and other_et not in FLOATS:
        return "f32"
    return other_et


def _common_et(args) -> str:
    """PyTorch's result type of tensors and scalars (tensor dims > 0 dominate 0-dim ones)."""
    vs = [a for a in args if _is_v(a)]
    if not vs:
        raise Unlowerable("no tensor operand")
    probes = []
    for a in args:
        if _is_v(a):
            probes.append(torch.empty([1] * max(a.rank, 1) if a.rank else [], dtype=dtype_of(a.et)))
        elif isinstance(a, (bool, int, float)):
            probes.append(a)
    return et_of(torch.result_type(*probes) if len(probes) == 2 else
                 _fold_result_type(probes))


def _fold_result_type(probes):
    t = probes[0] if isinstance(probes[0], torch.Tensor) else torch.tensor(probes[0])
    for p in probes[1:]:
        t = torch.empty(t.shape if t.dim() else [], dtype=torch.result_type(t, p))
    return t.dtype


def _as(em: Emitter, x, et: str, shape=()) -> V:
    if _is_v(x):
        return em.convert(x, et)
    if isinstance(x, (bool, int, float)):
        return em.const(x, et, ())
    raise Unlowerable(f"operand {x!r}")


def _ew(em: Emitter, op: str, out: TType | None, *args, compute: str | None = None) -> V:
    et = compute or (out.et if out is not None else _common_et(args))
    vs = [_as(em, a, et) for a in args]
    r = em.binary(op, vs[0], vs[1]) if len(vs) == 2 else em.unary(op, vs[0])
    return em.convert(r, out.et) if out is not None else r


_BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "maximum": "maximum", "minimum": "minimum",
           "pow": "power", "bitwise_and": "and", "bitwise_or": "or", "logical_and": "and", "logical_or": "or",
           "bitwise_xor": "xor", "logical_xor": "xor", "fmod": "remainder", "remainder": "remainder"}


def _binop(op, floor_sign=False):
    def f(em, out, a, b, alpha=1):
        if op in ("add", "subtract") and alpha != 1:
            b = _ew(em, "multiply", None, b, alpha, compute=_common_et([a, b]))
        if op in ("and", "or", "xor") and out.et == "i1":
            return em.binary(op, _as(em, a, "i1"), _as(em, b, "i1"))
        if op == "remainder" and floor_sign:  # PyTorch's remainder: the sign of the divisor
            et = out.et
            av, bv = _as(em, a, et), _as(em, b, et)
            shape = torch.broadcast_shapes(av.shape, bv.shape)
            av, bv = em.broadcast(av, shape), em.broadcast(bv, shape)
            r = em.binary("remainder", av, bv)
            zero = em.const(0, et, shape)
            fix = em.binary("and", em.compare("NE", r, zero),
                            em.compare("NE", em.compare("LT", r, zero), em.compare("LT", bv, zero)))
            return em.select(fix, em.binary("add", r, bv), r)
        return _ew(em, op, out, a, b)

    return f


for _name, _op in _BINARY.items():
    for _ov in ("Tensor", "Scalar", "default", "Tensor_Scalar", "Tensor_Tensor"):
        LOWERINGS[f"aten::{_name}.{_ov}"] = _binop(_op, _name == "remainder")


@lowers("pow.Scalar")
def _pow_scalar(em, out, base, exponent):
    return _ew(em, "power", out, base, exponent)


@lowers("rsub.Scalar", "rsub.Tensor")
def _rsub(em, out, a, b, alpha=1):
    return _binop("subtract")(em, out, b, a, alpha) if alpha == 1 else _binop("subtract")(
        em, out, b, _ew(em, "multiply", None, a, alpha, compute=out.et))


@lowers("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode")
def _div(em, out, a, b, rounding_mode=None):
    if rounding_mode is None:
        return _ew(em, "divide", out, a, b)
    et = _common_et([a, b])
    q = em.binary("divide", _as(em, a, et), _as(em, b, et))
    if et in FLOATS and rounding_mode == "floor":
        q = em.unary("floor", q)
    elif et in FLOATS:
        q = em.binary("multiply", em.unary("sign", q), em.unary("floor", em.unary("abs", q)))
    elif rounding_mode == "floor":
        raise Unlowerable("integer floor division")
    return em.convert(q, out.et)


_UNARY = {"neg": "negate", "exp": "exponential", "log": "log", "log1p": "log_plus_one", "expm1":
          "exponential_minus_one", "tanh": "tanh", "sigmoid": "logistic", "sqrt": "sqrt", "rsqrt": "rsqrt",
          "sin": "sine", "cos": "cosine", "erf": "erf", "floor": "floor", "ceil": "ceil", "sign": "sign",
          "abs": "abs", "tan": "tan", "round": "round_nearest_even", "trunc": None, "acos": "acos",
          "acosh": "acosh", "asin": "asin", "asinh": "asinh", "atan": "atan", "atanh": "atanh", "cosh": "cosh",
          "sinh": "sinh", "digamma": "digamma", "lgamma": "lgamma", "erfinv": "erf_inv"}

for _name, _op in _UNARY.items():
    if _op is None:
        continue

    def _un(em, out, x, _hlo=_op):
        et = out.et if out.et in FLOATS or _hlo in ("negate", "abs", "sign") else "f32"
        return em.convert(em.unary(_hlo, _as(em, x, et)), out.et)

    LOWERINGS[f"aten::{_name}.default"] = _un


@lowers("erfc.default")
def _erfc(em, out, x):
    return _ew(em, "subtract", out, 1.0, em.unary("erf", _as(em, x, out.et)))


@lowers("atan2.default")
def _atan2(em, out, a, b):
    return _ew(em, "atan2", out, a, b)


@lowers("reciprocal.default")
def _recip(em, out, x):
    return _ew(em, "divide", out, 1.0, x)


@lowers("exp2.default")
def _exp2(em, out, x):
    return _ew(em, "power", out, 2.0, x)


@lowers("logical_not.default")
def _lnot(em, out, x):
    return em.convert(em.unary("not", _as(em, x, "i1")), out.et)


@lowers("bitwise_not.default")
def _bnot(em, out, x):
    return em.unary("not", x)


@lowers("relu.default")
def _relu(em, out, x):
    return em.binary("maximum", x, em.const(0, x.et))


@lowers("silu.default")
def _silu(em, out, x):
    return em.binary("multiply", x, em.unary("logistic", x))


@lowers("gelu.default")
def _gelu(em, out, x, approximate="none"):
    half = em.binary("multiply", x, em.const(0.5, x.et))
    if approximate == "tanh":
        x3 = em.binary("multiply", em.binary("multiply", x, x), x)
        inner = em.binary("add", x, em.binary("multiply", em.const(0.044715, x.et), x3))
        t = em.unary("tanh", em.binary("multiply", em.const(math.sqrt(2 / math.pi), x.et), inner))
    else:
        t = em.unary("erf", em.binary("multiply", x, em.const(1 / math.sqrt(2), x.et)))
    return em.binary("multiply", half, em.binary("add", em.const(1.0, x.et), t))


@lowers("clamp.default", "clamp.Tensor", "clamp_min.default", "clamp_max.default", "clamp_min.Tensor",
        "clamp_max.Tensor")
def _clamp(em, out, x, lo=None, hi=None):
    r = em.convert(x, out.et)
    if lo is not None:
        r = em.binary("maximum", r, _as(em, lo, out.et))
    if hi is not None:
        r = em.binary("minimum", r, _as(em, hi, out.et))
    return r


LOWERINGS["aten::clamp_max.default"] = lambda em, out, x, hi: _clamp(em, out, x, None, hi)
LOWERINGS["aten::clamp_max.Tensor"] = LOWERINGS["aten::clamp_max.default"]

_CMP = {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}
for _name, _d in _CMP.items():
    def _cmp(em, out, a, b, _d=_d):
        et = _common_et([a, b])
        return em.compare(_d, _as(em, a, et), _as(em, b, et))

    LOWERINGS[f"aten::{_name}.Tensor"] = LOWERINGS[f"aten::{_name}.Scalar"] = _cmp


@lowers("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(em, out, c, a, b):
    return em.select(_as(em, c, "i1"), _as(em, a, out.et), _as(em, b, out.et))


@lowers("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(em, out, x, mask, value):
    return em.select(_as(em, mask, "i1"), _as(em, value, out.et), x)


# ---- shapes ---------------------------------------------------------------------------
@lowers("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default", "squeeze.dims",
        "squeeze.dim", "squeeze.default", "flatten.using_ints", "view.dtype_unused", "unflatten.int")
def _view(em, out, x, *a, **k):
    return em.reshape(x, out.shape)


@lowers("alias.default", "clone.default", "detach.default", "lift_fresh_copy.default", "contiguous.default",
        "_to_copy.default", "to.dtype")
def _identity(em, out, x, *a, **k):
    return em.convert(x, out.et) if out is not None else x


@lowers("copy.default")
def _copy(em, out, dst, src, non_blocking=False):
    return em.broadcast(em.convert(src, out.et), out.shape)


@lowers("permute.default")
def _permute(em, out, x, dims):
    return em.transpose(x, dims)


@lowers("t.default")
def _t(em, out, x):
    return em.transpose(x, [1, 0]) if x.rank == 2 else x


@lowers("transpose.int")
def _transpose(em, out, x, d0, d1):
    p = list(range(x.rank))
    d0, d1 = d0 % x.rank, d1 % x.rank
    p[d0], p[d1] = p[d1], p[d0]
    return em.transpose(x, p)


@lowers("expand.default", "expand_as.default", "broadcast_to.default")
def _expand(em, out, x, *a, **k):
    return em.broadcast(x, out.shape)


@lowers("slice.Tensor")
def _slice(em, out, x, dim=0, start=None, end=None, step=1):
    dim %= x.rank
    n = x.shape[dim]
    s = 0 if start is None else (start + n if start < 0 else start)
    e = n if end is None else (end + n if end < 0 else end)
    s, e = min(max(s, 0), n), min(max(e, 0), n)
    e = max(e, s)
    lo = [0] * x.rank
    hi = list(x.shape)
    st = [1] * x.rank
    lo[dim], hi[dim], st[dim] = s, e, step
    return em.slice(x, lo, hi, st)


@lowers("select.int")
def _select(em, out, x, dim, index):
    dim %= x.rank
    index %= x.shape[dim]
    r = _slice(em, None, x, dim, index, index + 1)
    return em.reshape(r, out.shape)


@lowers("split_with_sizes.default", "split.Tensor")
def _split(em, out, x, sizes, dim=0):
    dim %= x.rank
    if isinstance(sizes, int):
        n = x.shape[dim]
        sizes = [min(sizes, n - i) for i in range(0, n, sizes)]
    res, s = [], 0
    for k in sizes:
        res.append(_slice(em, None, x, dim, s, s + k))
        s += k
    return tuple(res)


@lowers("cat.default", "concat.default")
def _cat(em, out, xs, dim=0):
    xs = [em.convert(x, out.et) for x in xs if not (x.rank == 1 and x.shape[0] == 0)]
    return em.concat(xs, dim % len(out.shape))


@lowers("stack.default")
def _stack(em, out, xs, dim=0):
    dim %= len(out.shape)
    parts = [em.reshape(em.convert(x, out.et), x.shape[:dim] + (1,) + x.shape[dim:]) for x in xs]
    return em.concat(parts, dim)


@lowers("flip.default")
def _flip(em, out, x, dims):
    d = sorted(int(i) % x.rank for i in dims)
    return em.emit(f"stablehlo.reverse {x.name}, dims = {_dims(d)} : {x.ty}", x.et, x.shape)


@lowers("constant_pad_nd.default")
def _pad(em, out, x, pad, value=0):
    lo, hi = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        lo[d], hi[d] = pad[2 * i], pad[2 * i + 1]
    c = em.const(value, x.et)
    return em.emit(f"stablehlo.pad {x.name}, {c.name}, low = {_dims(lo)}, high = {_dims(hi)}, "
                   f"interior = {_dims([0] * x.rank)} : ({x.ty}, {c.ty}) -> {out.ty}", x.et, out.shape)


# ---- factories --------------------------------------------------------------------------
@lowers("full.default", "new_full.default", "full_like.default", "scalar_tensor.default", "zeros.default",
        "ones.default", "zeros_like.default", "ones_like.default", "new_zeros.default", "new_ones.default",
        "empty.memory_format", "empty_like.default", "empty_permuted.default", "new_empty.default",
        "empty_strided.default")
def _full(em, out, *a, _op="", **k):
    value = {"zeros": 0, "ones": 1, "empty": 0}
    base = _op.split("::")[1].split(".")[0].replace("new_", "").replace("_like", "")
    if base.startswith("empty"):
        base = "empty"
    if base in value:
        v = value[base]
    elif base == "full":
        v = a[-1] if _op != "aten::full_like.default" else a[1]
    else:  # scalar_tensor
        v = a[0]
    if _is_v(v):
        raise Unlowerable("fill value is a tensor")
    return em.const(v, out.et, out.shape)


@lowers("arange.start_step", "arange.default", "arange.start")
def _arange(em, out, *a, _op="", **k):
    nums = [x for x in a if isinstance(x, (int, float))]
    start, step = (nums[0], nums[2] if len(nums) > 2 else 1) if len(nums) >= 2 else (0, 1)
    et = out.et if out.et in FLOATS else "i64"
    r = em.iota(et, out.shape, 0)
    r = em.binary("add", em.binary("multiply", r, em.const(step, et)), em.const(start, et))
    return em.convert(r, out.et)


# ---- reductions -----------------------------------------------------------------------
def _red_dims(x: V, dims):
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return list(range(x.rank))
    return [dims] if isinstance(dims, int) else list(dims)


@lowers("sum.dim_IntList", "sum.default", "mean.dim", "mean.default")
def _sum(em, out, x, dims=None, keepdim=False, dtype=None, _op=""):
    et = out.et
    acc = "f32" if et in ("bf16", "f16") else et
    xv = em.convert(x, acc)
    dd = _red_dims(x, dims)
    r = em.reduce(xv, dd, "add", keepdim)
    if _op.startswith("aten::mean"):
        n = math.prod(x.shape[d % max(x.rank, 1)] for d in dd) if x.rank else 1
        r = em.binary("divide", r, em.const(n, acc))
    return em.convert(r, et)


@lowers("amax.default", "amin.default")
def _amax(em, out, x, dims=(), keepdim=False, _op=""):
    return em.reduce(x, _red_dims(x, dims), "maximum" if "amax" in _op else "minimum", keepdim)


@lowers("any.dim", "any.dims", "any.default", "all.dim", "all.dims", "all.default")
def _any(em, out, x, dims=None, keepdim=False, _op=""):
    return em.reduce(_as(em, x, "i1"), _red_dims(x, dims), "or" if "any" in _op else "and", keepdim)


@lowers("prod.dim_int", "prod.default")
def _prod(em, out, x, dims=None, keepdim=False, dtype=None):
    return em.reduce(em.convert(x, out.et), _red_dims(x, dims), "multiply", keepdim)


@lowers("cumsum.default")
def _cumsum(em, out, x, dim, dtype=None):
    dim %= x.rank
    x = em.convert(x, out.et)
    n = x.shape[dim]
    win = [1] * x.rank
    win[dim] = n
    pad = [[0, 0]] * x.rank
    pad[dim] = [n - 1, 0]
    attrs = (f"window_dimensions = {_arr(win)}, window_strides = {_arr([1] * x.rank)}, "
             f"padding = dense<{pad}> : tensor<{x.rank}x2xi64>")
    init = em.const(0, x.et)
    return em.region_op("reduce_window", [x, init], "add", x.et, attrs, TType(x.et, x.shape))


# ---- softmax and norms --------------------------------------------------------------------
def _f32(em, x: V) -> V:
    return em.convert(x, "f32") if x.et in ("bf16", "f16") else x


@lowers("_softmax.default", "_log_softmax.default")
def _softmax(em, out, x, dim, half_to_float=False, _op=""):
    xv = _f32(em, x)
    m = em.reduce(xv, [dim], "maximum", keepdim=True)
    z = em.binary("subtract", xv, m)
    e = em.unary("exponential", z)
    s = em.reduce(e, [dim], "add", keepdim=True)
    r = em.binary("subtract", z, em.unary("log", s)) if "log" in _op else em.binary("divide", e, s)
    return em.convert(r, out.et)


@lowers("_softmax_backward_data.default")
def _softmax_bwd(em, out, g, y, dim, input_dtype):
    g, y = _f32(em, g), _f32(em, y)
    gy = em.binary("multiply", g, y)
    s = em.reduce(gy, [dim], "add", keepdim=True)
    return em.convert(em.binary("subtract", gy, em.binary("multiply", y, s)), out.et)


@lowers("_log_softmax_backward_data.default")
def _log_softmax_bwd(em, out, g, y, dim, input_dtype):
    g, y = _f32(em, g), _f32(em, y)
    s = em.reduce(g, [dim], "add", keepdim=True)
    return em.convert(em.binary("subtract", g, em.binary("multiply", em.unary("exponential", y), s)), out.et)


def _norm_dims(x: V, normalized_shape) -> list[int]:
    return list(range(x.rank - len(normalized_shape), x.rank))


@lowers("native_layer_norm.default")
def _layer_norm(em, out, x, normalized_shape, weight, bias, eps):
    dims = _norm_dims(x, normalized_shape)
    n = math.prod(x.shape[d] for d in dims)
    xv = _f32(em, x)
    mean = em.binary("divide", em.reduce(xv, dims, "add", True), em.const(n, "f32"))
    xc = em.binary("subtract", xv, mean)
    var = em.binary("divide", em.reduce(em.binary("multiply", xc, xc), dims, "add", True), em.const(n, "f32"))
    rstd = em.unary("rsqrt", em.binary("add", var, em.const(eps, "f32")))
    y = em.binary("multiply", xc, rstd)
    if weight is not None:
        y = em.binary("multiply", y, _f32(em, weight))
    if bias is not None:
        y = em.binary("add", y, _f32(em, bias))
    return em.convert(y, x.et), em.convert(mean, x.et), em.convert(rstd, x.et)


@lowers("native_layer_norm_backward.default")
def _layer_norm_bwd(em, out, g, x, normalized_shape, mean, rstd, weight, bias, mask):
    dims = _norm_dims(x, normalized_shape)
    batch = list(range(x.rank - len(dims)))
    n = math.prod(x.shape[d] for d in dims)
    g, xv, mean, rstd = _f32(em, g), _f32(em, x), _f32(em, mean), _f32(em, rstd)
    xhat = em.binary("multiply", em.binary("subtract", xv, mean), rstd)
    gw = em.binary("multiply", g, _f32(em, weight)) if weight is not None else g
    res = [None, None, None]
    if mask[0]:
        s1 = em.reduce(gw, dims, "add", True)
        s2 = em.reduce(em.binary("multiply", gw, xhat), dims, "add", True)
        t = em.binary("subtract", em.binary("subtract", em.binary("multiply", gw, em.const(n, "f32")), s1),
                      em.binary("multiply", xhat, s2))
        res[0] = em.convert(em.binary("multiply", t, em.binary("divide", rstd, em.const(n, "f32"))), x.et)
    if mask[1] and weight is not None:
        res[1] = em.convert(em.reduce(em.binary("multiply", g, xhat), batch, "add"), weight.et)
    if mask[2] and bias is not None:
        res[2] = em.convert(em.reduce(g, batch, "add"), bias.et)
    return tuple(res)


# ---- matmuls and convolutions ---------------------------------------------------------------
@lowers("mm.default")
def _mm(em, out, a, b):
    return em.dot_general(a, b, ([], []), ([1], [0]))


@lowers("bmm.default")
def _bmm(em, out, a, b):
    return em.dot_general(a, b, ([0], [0]), ([2], [1]))


@lowers("addmm.default", "baddbmm.default")
def _addmm(em, out, bias, a, b, beta=1, alpha=1, _op=""):
    r = _bmm(em, out, a, b) if "baddbmm" in _op else _mm(em, out, a, b)
    if alpha != 1:
        r = em.binary("multiply", r, em.const(alpha, r.et))
    if beta != 0:
        bv = em.convert(bias, r.et)
        if beta != 1:
            bv = em.binary("multiply", bv, em.const(beta, r.et))
        r = em.binary("add", r, bv)
    return r


@lowers("dot.default")
def _dot(em, out, a, b):
    return em.dot_general(a, b, ([], []), ([0], [0]))


@lowers("convolution.default")
def _conv(em, out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise Unlowerable("transposed convolution")
    nd = x.rank - 2
    sp = ", ".join(str(i) for i in range(nd))
    p = em.precision if x.et == "f32" else "DEFAULT"
    pad = ", ".join(f"[{int(q)}, {int(q)}]" for q in padding)
    r = em.emit(f"stablehlo.convolution({x.name}, {w.name}) dim_numbers = [b, f, {sp}]x[o, i, {sp}]->[b, f, {sp}], "
                f"window = {{stride = {_dims(stride)}, pad = [{pad}], lhs_dilate = {_dims([1] * nd)}, "
                f"rhs_dilate = {_dims(dilation)}}} {{batch_group_count = 1 : i64, feature_group_count = "
                f"{int(groups)} : i64, precision_config = [#stablehlo<precision {p}>, #stablehlo<precision {p}>]}} "
                f": ({x.ty}, {w.ty}) -> {out.ty}", out.et, out.shape)
    if bias is not None:
        r = em.binary("add", r, em.broadcast(em.convert(bias, out.et), out.shape, [1]))
    return r


# ---- gathers and scatters --------------------------------------------------------------------
def _full_index(em, index: V, dim: int, rank: int) -> V:
    """Index points (index.shape + [rank]) for torch.gather / scatter along `dim`."""
    idx = em.convert(index, "i64")
    parts = []
    for d in range(rank):
        part = idx if d == dim else em.iota("i64", index.shape, d)
        parts.append(em.reshape(part, index.shape + (1,)))
    return em.concat(parts, index.rank)


@lowers("embedding.default")
def _embedding(em, out, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    idx = em.reshape(em.convert(indices, "i64"), indices.shape + (1,))
    return em.gather_points(weight, idx)


@lowers("index_select.default")
def _index_select(em, out, x, dim, index):
    dim %= x.rank
    perm = [dim] + [d for d in range(x.rank) if d != dim]
    xt = em.transpose(x, perm)
    g = em.gather_points(xt, em.reshape(em.convert(index, "i64"), index.shape + (1,)))
    inv = sorted(range(x.rank), key=lambda i: perm[i])
    return em.transpose(g, inv)


@lowers("index.Tensor")
def _index(em, out, x, indices):
    """``x[:, ..., idx]``: one integer index tensor, at any dim (None before it)."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or not _is_v(given[0][1]) or given[0][1].et == "i1":
        raise Unlowerable("advanced indexing beyond one integer index tensor")
    k, i = given[0]
    perm = [k] + [d for d in range(x.rank) if d != k]
    g = em.gather_points(em.transpose(x, perm), em.reshape(em.convert(i, "i64"), i.shape + (1,)))
    # g: idx dims, then x's other dims in order; move the idx dims to position k
    ni = i.rank
    order = list(range(ni, ni + k)) + list(range(ni)) + list(range(ni + k, g.rank))
    return em.transpose(g, order)


@lowers("gather.default")
def _gather(em, out, x, dim, index, sparse_grad=False):
    return em.gather_points(x, _full_index(em, index, dim % x.rank, x.rank))


@lowers("scatter.value", "scatter.src", "scatter_add.default", "scatter.reduce", "scatter.value_reduce")
def _scatter(em, out, x, dim, index, src, reduce=None, _op=""):
    dim %= x.rank
    if _op == "aten::scatter_add.default":
        reduce = "add"
    combine = {None: None, "add": "add", "sum": "add", "multiply": "multiply"}.get(reduce, "bad")
    if combine == "bad":
        raise Unlowerable(f"scatter reduce={reduce!r}")
    upd = _as(em, src, x.et)
    upd = em.broadcast(upd, index.shape) if upd.rank == 0 else _slice_to(em, upd, index.shape)
    return em.scatter_points(x, _full_index(em, index, dim, x.rank), upd, combine)


def _slice_to(em, v: V, shape) -> V:
    if v.shape == tuple(shape):
        return v
    return em.slice(v, [0] * v.rank, list(shape), [1] * v.rank)


@lowers("index_put.default")
def _index_put(em, out, x, indices, values, accumulate=False):
    if len(indices) != 1 or not _is_v(indices[0]) or indices[0].et == "i1":
        raise Unlowerable("index_put beyond one integer index tensor on dim 0")
    i = indices[0]
    n = i.shape
    upd = em.broadcast(em.convert(values, x.et), tuple(n) + x.shape[1:])
    return em.scatter_points(x, em.reshape(em.convert(i, "i64"), tuple(n) + (1,)), upd,
                             "add" if accumulate else None)


# ---- pooling ---------------------------------------------------------------------------------
@lowers("avg_pool2d.default")
def _avg_pool(em, out, x, kernel, stride=(), padding=(0, 0), ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if ceil_mode or any(padding) or divisor_override:
        raise Unlowerable("avg_pool2d with padding / ceil_mode / divisor_override")
    stride = stride or kernel
    k = list(kernel) if len(kernel) == 2 else [kernel[0]] * 2
    s = list(stride) if len(stride) == 2 else [stride[0]] * 2
    lead = x.rank - 2
    attrs = (f"window_dimensions = {_arr([1] * lead + k)}, window_strides = {_arr([1] * lead + s)}")
    init = em.const(0, x.et)
    r = em.region_op("reduce_window", [x, init], "add", x.et, attrs, out)
    return em.binary("divide", r, em.const(k[0] * k[1], x.et))


@lowers("slice_scatter.default")
def _slice_scatter(em, out, x, src, dim=0, start=None, end=None, step=1):
    if step != 1:
        raise Unlowerable("slice_scatter with step > 1")
    dim %= x.rank
    n = x.shape[dim]
    s = 0 if start is None else (start + n if start < 0 else start)
    s = min(max(s, 0), n)
    idx = [em.const(s if d == dim else 0, "i64") for d in range(x.rank)]
    src = em.convert(src, x.et)
    return em.emit(f"stablehlo.dynamic_update_slice {x.name}, {src.name}, {', '.join(i.name for i in idx)} : "
                   f"({x.ty}, {src.ty}, {', '.join(i.ty for i in idx)}) -> {x.ty}", x.et, x.shape)


def _conv_text(em, lhs: V, rhs: V, dn: str, stride, pad, lhs_dil, rhs_dil, out: TType, groups=1) -> V:
    p = em.precision if lhs.et == "f32" else "DEFAULT"
    pads = ", ".join(f"[{int(a)}, {int(b)}]" for a, b in pad)
    return em.emit(f"stablehlo.convolution({lhs.name}, {rhs.name}) dim_numbers = {dn}, window = {{stride = "
                   f"{_dims(stride)}, pad = [{pads}], lhs_dilate = {_dims(lhs_dil)}, rhs_dilate = {_dims(rhs_dil)}}} "
                   f"{{batch_group_count = 1 : i64, feature_group_count = {groups} : i64, precision_config = "
                   f"[#stablehlo<precision {p}>, #stablehlo<precision {p}>]}} : ({lhs.ty}, {rhs.ty}) -> {out.ty}",
                   out.et, out.shape)


@lowers("convolution_backward.default")
def _conv_bwd(em, out, g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask):
    if transposed or groups != 1:
        raise Unlowerable("convolution_backward of a transposed or grouped convolution")
    nd = x.rank - 2
    sp = ", ".join(str(i) for i in range(nd))
    k = w.shape[2:]
    res = [None, None, None]
    if mask[0]:
        # grad_input: grad_out dilated by the stride, convolved with the flipped, transposed kernel
        wf = em.emit(f"stablehlo.reverse {w.name}, dims = {_dims(range(2, 2 + nd))} : {w.ty}", w.et, w.shape)
        pad = []
        for i in range(nd):
            lo = dilation[i] * (k[i] - 1) - padding[i]
            # output size = dilated grad (s*(out-1)+1) + lo + hi - d*(k-1) must equal the input size
            pad.append((lo, x.shape[2 + i] - 1 + dilation[i] * (k[i] - 1) - stride[i] * (g.shape[2 + i] - 1) - lo))
        res[0] = _conv_text(em, g, wf, f"[b, f, {sp}]x[i, o, {sp}]->[b, f, {sp}]", [1] * nd, pad, stride, dilation,
                            TType(x.et, x.shape))
    if mask[1]:
        pad = []
        for i in range(nd):
            hi = dilation[i] * (k[i] - 1) + stride[i] * (g.shape[2 + i] - 1) + 1 - x.shape[2 + i] - padding[i]
            pad.append((padding[i], hi))
        res[1] = _conv_text(em, x, g, f"[f, b, {sp}]x[i, o, {sp}]->[f, b, {sp}]", dilation, pad, [1] * nd, stride,
                            TType(w.et, w.shape))
    if mask[2] and bias_sizes is not None:
        res[2] = em.reduce(em.convert(g, g.et), [0] + list(range(2, 2 + nd)), "add")
    return tuple(res)


def _sort_pair(em, x: V, dim: int, descending: bool) -> tuple[V, V]:
    """(values, int64 indices) of `x` sorted along `dim` (stable; NaN largest, as PyTorch)."""
    dim %= max(x.rank, 1)
    idx = em.iota("i64", x.shape, dim)
    a, b, c, d = (em.fresh() for _ in range(4))
    p = em.fresh()
    st, it = f"tensor<{x.et}>", "tensor<i64>"
    kind = "TOTALORDER" if x.et in FLOATS else "SIGNED" if x.et not in ("ui8", "i1") else "UNSIGNED"
    r = em.fresh()
    em.lines += [f"{r}:2 = \"stablehlo.sort\"({x.name}, {idx.name}) ({{",
                 f"^bb0({a}: {st}, {b}: {st}, {c}: {it}, {d}: {it}):",
                 f"  {p} = stablehlo.compare {'GT' if descending else 'LT'}, {a}, {b}, {kind} : ({st}, {st}) -> "
                 "tensor<i1>",
                 f"  stablehlo.return {p} : tensor<i1>",
                 f"}}) {{dimension = {dim} : i64, is_stable = true}} : ({x.ty}, {idx.ty}) -> ({x.ty}, {idx.ty})"]
    return V(f"{r}#0", x.et, x.shape), V(f"{r}#1", "i64", x.shape)


@lowers("sort.default", "sort.stable")
def _sort(em, out, x, *a, _op="", **k):
    if _op == "aten::sort.stable":
        dim, descending = k.get("dim", -1), k.get("descending", False)
    else:
        dim = a[0] if a else k.get("dim", -1)
        descending = a[1] if len(a) > 1 else k.get("descending", False)
    return _sort_pair(em, x, dim, descending)


@lowers("topk.default")
def _topk(em, out, x, k, dim=-1, largest=True, sorted=True):
    dim %= max(x.rank, 1)
    v, i = _sort_pair(em, x, dim, largest)
    hi = list(x.shape)
    hi[dim] = k
    return em.slice(v, [0] * x.rank, hi, [1] * x.rank), em.slice(i, [0] * x.rank, hi, [1] * x.rank)


@lowers("linalg_vector_norm.default")
def _vector_norm(em, out, x, ord=2, dim=None, keepdim=False, dtype=None):
    acc = "f32" if out.et in ("bf16", "f16") else out.et
    a = em.unary("abs", em.convert(x, acc))
    dims = _red_dims(x, dim)
    if ord == math.inf:
        r = em.reduce(a, dims, "maximum", keepdim)
    elif ord == -math.inf:
        r = em.reduce(a, dims, "minimum", keepdim)
    elif ord == 2:
        r = em.unary("sqrt", em.reduce(em.binary("multiply", a, a), dims, "add", keepdim))
    elif ord == 1:
        r = em.reduce(a, dims, "add", keepdim)
    elif ord == 0:
        r = em.reduce(em.convert(em.compare("NE", a, em.const(0, acc)), acc), dims, "add", keepdim)
    else:
        p = em.const(float(ord), acc)
        r = em.binary("power", em.reduce(em.binary("power", a, p), dims, "add", keepdim), em.const(1.0 / ord, acc))
    return em.convert(r, out.et)


@lowers("argmax.default", "argmin.default")
def _argmax(em, out, x, dim=None, keepdim=False, _op=""):
    if dim is None:
        x = em.reshape(x, (math.prod(x.shape),))
        dim, keep = 0, False
    else:
        dim, keep = dim % max(x.rank, 1), keepdim
    m = em.reduce(x, [dim], "maximum" if "argmax" in _op else "minimum", keepdim=True)
    hit = em.compare("EQ", x, m)
    if x.et in FLOATS:  # NaN wins, as in PyTorch
        hit = em.binary("or", hit, em.compare("NE", x, x))
    idx = em.iota("i64", x.shape, dim)
    big = em.const(x.shape[dim], "i64", x.shape)
    r = em.reduce(em.select(hit, idx, big), [dim], "minimum", keep)
    return em.reshape(r, out.shape)


@lowers("repeat.default")
def _repeat(em, out, x, repeats):
    n = len(repeats)
    xs = (1,) * (n - x.rank) + x.shape
    x = em.reshape(x, xs)
    inter = [d for r, s in zip(repeats, xs) for d in (r, s)]
    b = em.broadcast(x, inter, [2 * i + 1 for i in range(n)])
    return em.reshape(b, out.shape)


@lowers("native_group_norm.default")
def _group_norm(em, out, x, weight, bias, n, c, hw, group, eps):
    xv = _f32(em, x)
    g = em.reshape(xv, (n, group, (c // group) * hw))
    cnt = em.const((c // group) * hw, "f32")
    mean = em.binary("divide", em.reduce(g, [2], "add", True), cnt)
    xc = em.binary("subtract", g, mean)
    var = em.binary("divide", em.reduce(em.binary("multiply", xc, xc), [2], "add", True), cnt)
    rstd = em.unary("rsqrt", em.binary("add", var, em.const(eps, "f32")))
    y = em.reshape(em.binary("multiply", xc, rstd), x.shape)
    if weight is not None:
        y = em.binary("multiply", y, em.broadcast(_f32(em, weight), x.shape, [1]))
    if bias is not None:
        y = em.binary("add", y, em.broadcast(_f32(em, bias), x.shape, [1]))
    return (em.convert(y, x.et), em.convert(em.reshape(mean, (n, group)), x.et),
            em.convert(em.reshape(rstd, (n, group)), x.et))


@lowers("max_pool2d_with_indices.default")
def _max_pool(em, out, x, kernel, stride=(), padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    """(values, int64 flat indices into each input plane), as PyTorch: the first maximum wins."""
    two = lambda v, dflt: list(v) * (2 // len(v)) if v else list(dflt)  # noqa: E731
    k, s, p, d = two(kernel, ()), two(stride, kernel), two(padding, (0, 0)), two(dilation, (1, 1))
    if ceil_mode or d != [1, 1]:
        raise Unlowerable("max_pool2d with ceil_mode or dilation")
    lead = x.rank - 2
    h, w = x.shape[-2:]
    idx = em.binary("add", em.binary("multiply", em.iota("i64", x.shape, lead), em.const(w, "i64")),
                    em.iota("i64", x.shape, lead + 1))
    ho, wo = (h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1
    oshape = x.shape[:lead] + (ho, wo)
    init_v, init_i = em.const(-math.inf if x.et in FLOATS else _int_min(x.et), x.et), em.const(h * w, "i64")
    av, ai, bv, bi, r = (em.fresh() for _ in range(5))
    st, it = f"tensor<{x.et}>", "tensor<i64>"
    gt, eq, lt, tie, take, nv, ni = (em.fresh() for _ in range(7))
    kind = "FLOAT" if x.et in FLOATS else "SIGNED"
    pad = [[0, 0]] * lead + [[p[0], p[0]], [p[1], p[1]]]
    vty, ity = TType(x.et, oshape).ty, TType("i64", oshape).ty
    em.lines += [
        f"{r}:2 = \"stablehlo.reduce_window\"({x.name}, {idx.name}, {init_v.name}, {init_i.name}) ({{",
        f"^bb0({av}: {st}, {ai}: {it}, {bv}: {st}, {bi}: {it}):",
        f"  {gt} = stablehlo.compare GT, {bv}, {av}, {kind} : ({st}, {st}) -> tensor<i1>",
        f"  {eq} = stablehlo.compare EQ, {bv}, {av}, {kind} : ({st}, {st}) -> tensor<i1>",
        f"  {lt} = stablehlo.compare LT, {bi}, {ai}, SIGNED : ({it}, {it}) -> tensor<i1>",
        f"  {tie} = stablehlo.and {eq}, {lt} : tensor<i1>",
        f"  {take} = stablehlo.or {gt}, {tie} : tensor<i1>",
        f"  {nv} = stablehlo.select {take}, {bv}, {av} : tensor<i1>, {st}",
        f"  {ni} = stablehlo.select {take}, {bi}, {ai} : tensor<i1>, {it}",
        f"  stablehlo.return {nv}, {ni} : {st}, {it}",
        f"}}) {{window_dimensions = {_arr([1] * lead + k)}, window_strides = {_arr([1] * lead + s)}, "
        f"padding = dense<{pad}> : tensor<{x.rank}x2xi64>}} : ({x.ty}, {idx.ty}, {st}, {it}) -> ({vty}, {ity})"]
    return V(f"{r}#0", x.et, oshape), V(f"{r}#1", "i64", oshape)


@lowers("max_pool2d_with_indices_backward.default")
def _max_pool_bwd(em, out, g, x, kernel, stride, padding, dilation, ceil_mode, indices):
    lead = x.shape[:-2]
    rows = math.prod(lead)
    plane = x.shape[-2] * x.shape[-1]
    n = g.shape[-2] * g.shape[-1]
    gv = em.reshape(em.convert(g, x.et), (rows, n))
    iv = em.reshape(em.convert(indices, "i64"), (rows, n, 1))
    row = em.reshape(em.iota("i64", (rows, n), 0), (rows, n, 1))
    pts = em.concat([row, iv], 2)
    r = em.scatter_points(em.const(0, x.et, (rows, plane)), pts, gv, "add")
    return em.reshape(r, x.shape)
