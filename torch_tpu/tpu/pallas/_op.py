"""``jax_op``: a JAX function (usually calling ``pl.pallas_call``) as a PyTorch custom op.

Private; ``torch.tpu.pallas`` exports :func:`jax_op`.

How a call runs: the op is a ``torch.library`` custom op whose only kernel is the CPU one
(JAX on the host) plus a fake kernel from ``jax.eval_shape``. On tpu tensors the dispatcher
reaches torch_tpu's PrivateUse1 fallback, as for any op without a dedicated kernel: output
shapes come from the fake kernel, outputs are allocated in the chip's HBM (physical bytes,
OOM as usual), and the work is queued on the chip's current stream, where the CPU kernel
runs over host aliases of the HBM buffers. The CPU kernel hands those buffers to JAX by
DLPack (no copy: a vTPU chip's HBM is host memory), runs the jitted function with every
``pallas_call`` in TPU interpret mode, and returns JAX's outputs, which the fallback copies
once into the HBM outputs (counted as ``pallas_output_copies`` in ``runtime.stats()``).
"""

from __future__ import annotations

import inspect
import re
import threading
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._library.custom_ops import CustomOpDef

from torch_tpu import _C

from . import _cost, _jax

jax = _jax.jax()
jnp = jax.numpy

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")

_TORCH_TO_JAX = {
    torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16,
    torch.int32: jnp.int32, torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8,
    torch.bool: jnp.bool_, torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
}
_JAX_TO_TORCH = {jnp.dtype(v): k for k, v in _TORCH_TO_JAX.items()}
if jax.config.jax_enable_x64:  # only then does JAX keep 64-bit values
    _TORCH_TO_JAX.update({torch.float64: jnp.float64, torch.int64: jnp.int64})
    _JAX_TO_TORCH.update({jnp.dtype(jnp.float64): torch.float64, jnp.dtype(jnp.int64): torch.int64})


def _is_array_type(tp) -> bool:
    return tp is jax.Array or tp is jnp.ndarray or getattr(tp, "__name__", None) == "Array" and \
        getattr(tp, "__module__", "").startswith("jax")


def _classify(tp) -> tuple[str, Any]:
    """(kind, torch annotation) of a parameter annotation: kind 'array', 'optional_array',
    'array_list' or 'static'."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_array_type(tp):
        return "array", torch.Tensor
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and _is_array_type(rest[0]):
            return "optional_array", torch.Tensor | None
        if len(rest) == 1:
            kind, inner = _classify(rest[0])
            if kind == "static":
                return "static", inner | None
    if origin in (list, tuple, Sequence):
        elems = [a for a in args if a is not Ellipsis]
        if elems and all(_is_array_type(a) for a in elems):
            return "array_list", list[torch.Tensor]
        if elems and len(set(elems)) == 1 and elems[0] in (int, float, bool):
            return "static", list[elems[0]]
    if tp in (int, float, bool, str):
        return "static", tp
    if tp is torch.dtype:
        return "static", tp
    raise TypeError(f"unsupported annotation {tp!r}: use jax.Array (or jax.Array | None, list[jax.Array]) for "
                    "arrays and int, float, bool, str, list[int], list[float] or list[bool] for static arguments")


def _returns(tp) -> tuple[str, Any]:
    """(kind, torch return annotation) of a return annotation: 'single', 'tuple', 'list'."""
    if _is_array_type(tp):
        return "single", torch.Tensor
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and args and Ellipsis not in args and all(_is_array_type(a) for a in args):
        return "tuple", tuple[(torch.Tensor,) * len(args)]
    if origin in (list, tuple) and args and _is_array_type(args[0]):
        return "list", list[torch.Tensor]
    raise TypeError(f"unsupported return annotation {tp!r}: use jax.Array, tuple[jax.Array, ...] with a fixed "
                    "count, or list[jax.Array]")


class _Spec:
    """What a registered JAX function takes and returns, and how to run it."""

    def __init__(self, name: str, fn: Callable[..., Any], donate_argnums, mesh, in_specs, out_specs):
        self.name, self.fn = name, fn
        self.sig = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # noqa: BLE001  (unresolvable forward references: the raw annotations)
            hints = {k: p.annotation for k, p in self.sig.parameters.items()}
            hints["return"] = self.sig.return_annotation
        self.params: list[tuple[str, str]] = []  # (name, kind) in order
        torch_params = []
        for p in self.sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"jax_op({name!r}): {fn.__name__} takes *{p.name}; list its arguments one by one")
            tp = hints.get(p.name, inspect.Parameter.empty)
            if tp is inspect.Parameter.empty:
                raise TypeError(
                    f"jax_op({name!r}): parameter {p.name!r} of {fn.__name__} has no annotation; annotate arrays as "
                    "jax.Array and static arguments with their Python type (int, float, bool, str, list[int], ...)")
            try:
                kind, ttp = _classify(tp)
            except TypeError as e:
                raise TypeError(f"jax_op({name!r}): parameter {p.name!r} of {fn.__name__}: {e}") from None
            self.params.append((p.name, kind))
            torch_params.append(p.replace(annotation=ttp))
        if not any(k != "static" for _, k in self.params):
            raise TypeError(f"jax_op({name!r}): {fn.__name__} takes no jax.Array parameter; an op needs at least "
                            "one array (its device decides where the op runs)")
        ret = hints.get("return", inspect.Parameter.empty)
        if ret is inspect.Parameter.empty or ret is inspect.Signature.empty:
            raise TypeError(f"jax_op({name!r}): {fn.__name__} has no return annotation; annotate it as jax.Array, "
                            "tuple[jax.Array, ...] or list[jax.Array]")
        try:
            self.ret_kind, tret = _returns(ret)
            self.n_outputs = len(typing.get_args(tret)) if self.ret_kind == "tuple" else None
        except TypeError as e:
            raise TypeError(f"jax_op({name!r}): {fn.__name__}: {e}") from None
        self.arrays = [n for n, k in self.params if k != "static"]
        self.statics = [n for n, k in self.params if k == "static"]
        positions = {n: i for i, (n, _) in enumerate(self.params)}
        self.donate = tuple(sorted(set(donate_argnums or ())))
        for i in self.donate:
            if not isinstance(i, int) or not 0 <= i < len(self.params) or self.params[i][1] == "static":
                raise ValueError(f"jax_op({name!r}): donate_argnums entry {i!r} is not the position of an array "
                                 f"parameter of {fn.__name__} (arrays at {[positions[n] for n in self.arrays]})")
        self.mesh = mesh
        self.in_specs, self.out_specs = in_specs, out_specs
        if mesh is not None:
            self._check_mesh()
        proto = lambda *a, **k: None  # noqa: E731  (only its signature matters)
        proto.__signature__ = self.sig.replace(parameters=torch_params, return_annotation=tret)
        proto.__name__ = fn.__name__
        self.schema = torch.library.infer_schema(proto, mutates_args=())
        self._jitted: dict[Any, Callable] = {}
        self._validated: set = set()
        self._lock = threading.Lock()

    def _check_mesh(self) -> None:
        mesh = self.mesh
        if not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(f"jax_op({self.name!r}): mesh must be a jax.sharding.Mesh (torch.tpu.pallas."
                            f"get_pallas_mesh), got {type(mesh).__name__}")
        for what, specs, count in (("input_partition_specs", self.in_specs, len(self.arrays)),
                                   ("output_partition_specs", self.out_specs, None)):
            if specs is None:
                continue
            if not isinstance(specs, (tuple, list)) or (count is not None and len(specs) != count):
                raise ValueError(f"jax_op({self.name!r}): {what} needs one tuple of axis names per array "
                                 f"{'argument' if count is not None else 'output'}"
                                 + (f" ({count})" if count is not None else "") + f", got {specs!r}")
            for spec in specs:
                for axis in spec if isinstance(spec, (tuple, list)) else (spec,):
                    names = axis if isinstance(axis, (tuple, list)) else (axis,)
                    for a in names:
                        if a is not None and a not in mesh.axis_names:
                            raise ValueError(f"jax_op({self.name!r}): {what} names axis {a!r}, not one of the "
                                             f"mesh's axes {mesh.axis_names}")

    # -- running -------------------------------------------------------------------------

    def split(self, args, kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        return {n: values[n] for n in self.arrays}, {n: values[n] for n in self.statics}

    def runner(self, statics: dict[str, Any]) -> Callable:
        """The jitted function of the arrays (in parameter order) for these static values."""
        key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in statics.items())
        with self._lock:
            fn = self._jitted.get(key)
        if fn is not None:
            return fn
        sig = self.sig

        def body(*arrays):
            values = dict(zip(self.arrays, arrays))
            values.update(statics)
            args, kwargs = [], {}
            for p in sig.parameters.values():
                if p.kind == p.KEYWORD_ONLY:
                    kwargs[p.name] = values[p.name]
                else:
                    args.append(values[p.name])
            return self.fn(*args, **kwargs)

        if self.mesh is not None:
            P = jax.sharding.PartitionSpec
            in_specs = tuple(P(*s) for s in self.in_specs) if self.in_specs is not None else \
                tuple(P() for _ in self.arrays)
            if self.out_specs is None:
                out_specs = P()
            elif self.ret_kind == "single":
                out_specs = P(*self.out_specs[0])
            else:
                out_specs = tuple(P(*s) for s in self.out_specs)
                out_specs = list(out_specs) if self.ret_kind == "list" else out_specs
            body = jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        fn = jax.jit(body)
        with self._lock:
            self._jitted[key] = fn
        return fn

    def describe(self, arrays: dict[str, Any]) -> str:
        parts = []
        for n, v in arrays.items():
            if isinstance(v, torch.Tensor):
                parts.append(f"{n}: {str(v.dtype).removeprefix('torch.')}{list(v.shape)}")
            elif isinstance(v, (list, tuple)):
                parts.append(f"{n}: [{', '.join(str(list(t.shape)) for t in v)}]")
            else:
                parts.append(f"{n}: {v!r}")
        return ", ".join(parts)

    def jax_dtype(self, arg: str, t: torch.Tensor):
        dt = _TORCH_TO_JAX.get(t.dtype)
        if dt is None:
            names = sorted(str(d).removeprefix("torch.") for d in _TORCH_TO_JAX)
            raise TypeError(f"{self.name}: argument {arg!r} is {t.dtype}, which JAX on the vTPU does not take "
                            "(TPUs have no 64-bit or complex units; JAX keeps 64-bit values only with "
                            f"jax_enable_x64); use one of {names}")
        return dt

    def structs(self, arrays: dict[str, Any]) -> list:
        """ShapeDtypeStructs of the array arguments (None / lists kept)."""
        def one(n, t):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.name}: argument {n!r} must be a Tensor, got {type(t).__name__}")
            return jax.ShapeDtypeStruct(tuple(t.shape), self.jax_dtype(n, t))
        out = []
        for n, v in arrays.items():
            if v is None:
                out.append(None)
            elif isinstance(v, (list, tuple)):
                out.append([one(f"{n}[{i}]", t) for i, t in enumerate(v)])
            else:
                out.append(one(n, v))
        return out

    def rejected(self, arrays, statics, e: Exception) -> Exception:
        """The error for arguments the JAX function rejects, naming the op and the arguments."""
        what = self.describe(arrays) + "".join(f", {k}={v!r}" for k, v in statics.items())
        msg = f"{self.name}: the JAX function {self.fn.__name__} rejected its arguments ({what}): {e}"
        cls = TypeError if isinstance(e, TypeError) else ValueError
        return cls(msg.replace("NotImplementedError", "NotImplemented"))  # the fallback reads that as "no meta"

    def validate(self, arrays, statics) -> None:
        """The checks of :meth:`eval_shape`, once per shapes, dtypes and static values."""
        key = (tuple((n, tuple(t.shape), t.dtype) for n, t in _named_tensors(arrays)),
               tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in statics.items()))
        if key in self._validated:
            return
        self.eval_shape(arrays, statics)
        with self._lock:
            self._validated.add(key)

    def eval_shape(self, arrays, statics):
        structs = self.structs(arrays)
        if self.mesh is not None:
            _jax.check_device_count(self.mesh.devices.size, self.name)
        try:
            with _jax.interpret():
                closed, out = jax.make_jaxpr(self.runner(statics), return_shape=True)(*structs)
        except Exception as e:  # noqa: BLE001
            raise self.rejected(arrays, statics, e) from e
        _cost.check_blocks(closed.jaxpr, self.name)
        return out, structs

    def pack(self, flat: list):
        if self.ret_kind == "single":
            if len(flat) != 1:
                raise TypeError(f"{self.name}: {self.fn.__name__} is annotated to return one jax.Array but returned "
                                f"{len(flat)}")
            return flat[0]
        return tuple(flat) if self.ret_kind == "tuple" else list(flat)

    def flat_outputs(self, out) -> list:
        if self.ret_kind == "single":
            if isinstance(out, (tuple, list)):
                raise TypeError(f"{self.name}: {self.fn.__name__} is annotated to return one jax.Array but returned "
                                f"a {type(out).__name__} of {len(out)}")
            return [out]
        if not isinstance(out, (tuple, list)):
            raise TypeError(f"{self.name}: {self.fn.__name__} is annotated to return several arrays but returned "
                            f"one {type(out).__name__}")
        return list(out)

    def fake(self, *args, **kwargs):
        arrays, statics = self.split(args, kwargs)
        out, _ = self.eval_shape(arrays, statics)
        like = next(_tensors(arrays))
        outs = []
        for s in self.flat_outputs(out):
            dt = _JAX_TO_TORCH.get(jnp.dtype(s.dtype))
            if dt is None:
                raise TypeError(f"{self.name}: {self.fn.__name__} returns {s.dtype}, which has no torch dtype here")
            outs.append(like.new_empty(tuple(s.shape), dtype=dt))
        if self.ret_kind == "tuple" and len(outs) != self.n_outputs:
            raise TypeError(f"{self.name}: {self.fn.__name__} returned {len(outs)} arrays, its annotation says "
                            f"{self.n_outputs}")
        return self.pack(outs)

    def cpu_kernel(self, *args, **kwargs):
        """Runs the JAX function on host tensors (on a chip's stream: host aliases of HBM)."""
        arrays, statics = self.split(args, kwargs)
        self.validate(arrays, statics)  # the fake kernel's checks (a failed one runs this at once)
        if self.mesh is not None:
            _jax.check_device_count(self.mesh.devices.size, self.name)
        jax_args = [None if v is None else [self.to_jax(t, i) for t in v] if isinstance(v, (list, tuple))
                    else self.to_jax(v, i) for i, v in enumerate(arrays.values())]
        try:
            with _jax.interpret():
                out = self.runner(statics)(*jax_args)
                flat = self.flat_outputs(out)
                for o in flat:
                    o.block_until_ready()
        except Exception as e:  # noqa: BLE001
            if isinstance(e, (TypeError, ValueError)) and not isinstance(e, jax.errors.JaxRuntimeError):
                raise self.rejected(arrays, statics, e) from e
            raise RuntimeError(f"{self.name}: the JAX function {self.fn.__name__} failed: {_short(e)}") from e
        inputs = list(_tensors(arrays))
        return self.pack([self.to_torch(o, inputs) for o in flat])

    def to_jax(self, t: torch.Tensor, position: int):
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.device.type != "cpu":
            t = t.cpu()  # a CPU-only caller path (the tpu path arrives as host aliases)
        a = jax.dlpack.from_dlpack(t)  # zero copy when 16-byte aligned, else JAX copies
        if self.mesh is not None:
            spec = self.in_specs[position] if self.in_specs is not None else ()
            a = jax.device_put(a, jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec)))
        return a

    def to_torch(self, a, inputs: list[torch.Tensor]) -> torch.Tensor:
        if len(a.sharding.device_set) > 1 or not a.is_fully_addressable:
            a = jax.device_put(a, _jax.cpu_devices()[0])
        t = torch.from_dlpack(a)
        lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        for x in inputs:  # a function returning an input unchanged: outputs must not alias inputs
            xlo = x.data_ptr()
            if xlo < hi and lo < xlo + x.numel() * x.element_size():
                return t.clone()
        return t


def _short(e: Exception) -> str:
    """A JAX runtime error without the Python traceback of the callback that raised it:
    its first line and the exception's own last line."""
    lines = [ln for ln in str(e).split("\n\nAt:")[0].strip().splitlines() if ln.strip()]
    if len(lines) <= 2:
        return " ".join(lines)
    return f"{lines[0].split('Traceback')[0].strip()} ... {lines[-1].strip()}"


def _named_tensors(arrays: dict[str, Any]):
    for n, v in arrays.items():
        if isinstance(v, torch.Tensor):
            yield n, v
        elif isinstance(v, (list, tuple)):
            yield from ((f"{n}[{i}]", t) for i, t in enumerate(v) if isinstance(t, torch.Tensor))


def _tensors(arrays: dict[str, Any]):
    for v in arrays.values():
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


class JaxOpDef(CustomOpDef):
    """The op :func:`jax_op` registers: a ``torch.library`` ``CustomOpDef`` (``register_fake``,
    ``register_autograd``, ``register_kernel`` work as for any custom op) that also marks the
    tensors it was given at ``donate_argnums`` as donated after an eager call."""

    _tpu_spec: _Spec

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        spec = self._tpu_spec
        if spec.donate and not torch.compiler.is_compiling():
            arrays, _ = spec.split(args, kwargs)
            for i in spec.donate:
                value = arrays.get(spec.params[i][0])
                for t in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                        _C._mark_donated(t, spec.name)
        return out


_registered: dict[str, JaxOpDef] = {}


def jax_op(name: str, fn: None = None, /, *, donate_argnums: Sequence[int] | None = None,
           mesh: jax.sharding.Mesh | None = None, input_partition_specs: tuple[tuple[str, ...], ...] | None = None,
           output_partition_specs: tuple[tuple[str, ...], ...] | None = None) -> Callable[[Callable[..., Any]],
                                                                                       CustomOpDef]:
    """Registers a JAX function as the PyTorch custom op ``name`` ("namespace::op").

    Use as a decorator (``@jax_op("mylib::add")``) or a call (``jax_op("mylib::add", fn)``).
    The function's annotations split its parameters: ``jax.Array`` (also ``jax.Array | None``
    and ``list[jax.Array]``) become tensor arguments, ``int``, ``float``, ``bool``, ``str``,
    ``list[int]``, ... static ones (each distinct value traces once); the return annotation
    (``jax.Array``, ``tuple[jax.Array, ...]``, ``list[jax.Array]``) gives the outputs. Returns a
    ``torch.library`` ``CustomOpDef`` with a fake kernel from ``jax.eval_shape``, so it works in
    every eager mode (a flush point of ``defer_and_fuse``), in ``torch.compile`` programs (a
    library call), under ``torch.export``, and with ``.register_autograd``.

    On tpu tensors the call is queued on the chip's current stream (the caller does not wait);
    inputs reach JAX by DLPack without copies, outputs are copied once into HBM. Every
    ``pallas_call`` the function reaches runs in Pallas's TPU interpret mode (no
    ``interpret=`` needed). Each call is priced by the cost model from the kernels'
    ``cost_estimate`` or their jaxpr and grid (docs/pallas.md).

    Args:
        name: "namespace::op" (identifiers), not registered before.
        fn: the JAX function; omitted for the decorator form.
        donate_argnums: positions of array parameters whose tensors the op consumes: after an
            eager call they hold no values, and reading them raises RuntimeError naming the op.
        mesh: a JAX mesh (:func:`get_pallas_mesh`): the function then runs under ``shard_map``
            over it, one JAX device per chip; tensors are the global arrays.
        input_partition_specs: one tuple of mesh axis names (or None) per dimension, per array
            parameter (default: replicated).
        output_partition_specs: the same per output (default: replicated).

    Raises:
        ValueError: a malformed name, a name already registered, bad donate_argnums or specs.
        TypeError: a parameter or return without a supported annotation.
        ImportError: JAX is not installed (the ``torch_tpu[pallas]`` extra).
    """

    def register(f: Callable[..., Any]) -> CustomOpDef:
        return _register(name, f, donate_argnums, mesh, input_partition_specs, output_partition_specs)

    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"jax_op: op name {name!r} must be 'namespace::name' (identifiers), e.g. 'mylib::add'")
    if fn is None:
        return register
    return register(fn)


def _register(name, fn, donate_argnums, mesh, in_specs, out_specs) -> JaxOpDef:
    if not callable(fn):
        raise TypeError(f"jax_op({name!r}): fn must be a JAX function, got {type(fn).__name__}")
    if name in _registered:
        raise ValueError(f"jax_op({name!r}): an op of this name is already registered in this process")
    spec = _Spec(name, fn, donate_argnums, mesh, in_specs, out_specs)
    ns, opname = name.split("::")

    def cpu_kernel(*args, **kwargs):
        return spec.cpu_kernel(*args, **kwargs)

    cpu_kernel.__signature__ = inspect.signature(fn)
    op = JaxOpDef(ns, opname, spec.schema, cpu_kernel)
    op._tpu_spec = spec
    op.register_kernel("cpu")(cpu_kernel)
    op.register_fake(spec.fake)
    _cost.register(name, spec)
    _registered[name] = op
    return op
