"""Prices of ``jax_op`` calls for the cost model, and the ``runtime.stats()`` counters.

Private. A ``pallas_call`` with a ``cost_estimate`` is priced by it (FLOPs, bytes accessed);
one without is priced from its kernel body's jaxpr times the grid (FLOPs: 2·M·K·N per
``dot_general``, one per output element of other arithmetic; bytes: each block of its block
specs moved once per grid step, a whole-array (``memory_space=ANY``) operand once). JAX
outside any ``pallas_call`` is priced the same way as one grid step. The cost model then
turns FLOPs and bytes into the generation's device time (docs/design.md "Cost model").
"""

from __future__ import annotations

import atexit
import math
import threading
from typing import Any

import torch

from . import _jax

jax = _jax.jax()
from jax.extend import core as jex_core  # noqa: E402

_NO_FLOPS = {
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "convert_element_type", "transpose", "slice",
    "dynamic_slice", "dynamic_update_slice", "concatenate", "iota", "select_n", "copy", "copy_p", "get", "swap",
    "load", "store", "masked_load", "masked_store", "program_id", "num_programs", "pjit", "jit", "closed_call",
    "scan", "while", "cond", "run_scoped", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
    "semaphore_read", "device_id", "pad", "gather", "scatter", "rev", "bitcast_convert_type", "sharding_constraint",
    "shard_map", "pallas_call", "delay", "get_barrier_semaphore", "axis_index",
}
_TRANSCENDENTAL = {"exp", "exp2", "log", "log1p", "tanh", "logistic", "sin", "cos", "rsqrt", "sqrt", "pow", "erf",
                   "erf_inv", "atan2", "expm1"}


def _numel(aval) -> int:
    return math.prod(getattr(aval, "shape", ()) or (1,))


def _itemsize(aval) -> int:
    return getattr(getattr(aval, "dtype", None), "itemsize", 4)


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(x, jex_core.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jex_core.Jaxpr):
                yield x


class Cost:
    def __init__(self):
        self.flops = 0.0
        self.transcendentals = 0.0
        self.bytes_read = 0.0
        self.bytes_written = 0.0
        self.dot = (0, 0, 0, 0.0)  # (m, k, n, flops) of the largest product
        self.kernels = 0

    def add_dot(self, m, k, n, times):
        f = 2.0 * m * k * n * times
        self.flops += f
        if f > self.dot[3]:
            self.dot = (m, k, n, f)


def _body(jaxpr, cost: Cost, times: float) -> None:
    """FLOPs of a jaxpr run `times` times (loops: scan length; while: once per trip unknown -> 1)."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            _pallas(eqn, cost, times)
            continue
        if name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            a = eqn.invars[0].aval
            k = math.prod(a.shape[d] for d in lc) if lc else 1
            out = eqn.outvars[0].aval
            n_out = _numel(out)
            m = out.shape[-2] if len(out.shape) >= 2 else 1
            n = out.shape[-1] if len(out.shape) >= 1 else 1
            cost.add_dot(m, k, n, times * n_out / max(m * n, 1))
            continue
        inner = times * (eqn.params.get("length", 1) if name == "scan" else 1)
        for sub in _subjaxprs(eqn):
            _body(sub, cost, inner)
        if name in _NO_FLOPS:
            continue
        if name.startswith("reduce_") or name in ("argmax", "argmin", "cumsum", "cumprod", "cummax"):
            cost.flops += times * sum(_numel(v.aval) for v in eqn.invars if hasattr(v, "aval"))
            continue
        if eqn.outvars and hasattr(eqn.outvars[0], "aval"):
            n = times * _numel(eqn.outvars[0].aval)
            cost.flops += n
            if name in _TRANSCENDENTAL:
                cost.transcendentals += n


def _pallas(eqn, cost: Cost, times: float) -> None:
    cost.kernels += 1
    gm = eqn.params["grid_mapping"]
    steps = math.prod(int(g) for g in gm.grid) if gm.grid else 1
    est = eqn.params.get("cost_estimate")
    n_in = len(eqn.invars) - getattr(gm, "num_index_operands", 0)
    if est is not None:
        cost.flops += times * est.flops
        cost.transcendentals += times * est.transcendentals
        ins = sum(_numel(v.aval) * _itemsize(v.aval) for v in eqn.invars[-n_in:] if hasattr(v, "aval")) if n_in else 0
        total = times * est.bytes_accessed
        read = min(total, times * ins)
        cost.bytes_read += read
        cost.bytes_written += total - read
        return
    body = Cost()
    _body(eqn.params["jaxpr"], body, 1.0)
    cost.flops += times * steps * body.flops
    cost.transcendentals += times * steps * body.transcendentals
    if body.dot[3]:
        m, k, n, _ = body.dot
        cost.add_dot(m, k, n, times * steps * body.dot[3] / (2.0 * m * k * n))
        cost.flops -= times * steps * body.dot[3]  # add_dot counted them again
    mappings = list(gm.block_mappings)
    num_inputs = getattr(gm, "num_inputs", len(mappings))
    for i, bm in enumerate(mappings):
        aval = bm.array_aval
        block = [getattr(b, "block_size", b) for b in bm.block_shape]
        if any(b is None for b in block) or not block:
            moved = _numel(aval) * _itemsize(aval)  # whole array, moved once (or by DMAs in the body)
        else:
            per_step = math.prod(int(b) for b in block) * _itemsize(aval)
            moved = per_step * steps
        if i < num_inputs:
            cost.bytes_read += times * moved
        else:
            cost.bytes_written += times * moved


def check_blocks(jaxpr, op: str) -> None:
    """ValueError naming `op` for a pallas_call block shape that does not divide its array."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            kernel = eqn.params.get("name") or "pallas_call"
            for i, bm in enumerate(eqn.params["grid_mapping"].block_mappings):
                shape = tuple(bm.array_aval.shape)
                block = [getattr(b, "block_size", b) for b in bm.block_shape]
                if len(block) != len(shape):
                    continue
                for dim, b in zip(shape, block):
                    if isinstance(b, int) and b > 0 and dim % b:
                        raise ValueError(
                            f"{op}: block shape {tuple(block)} of {kernel}'s operand {i} does not divide the array's "
                            f"shape {shape}; use blocks that divide every dimension (or equal it)")
        for sub in _subjaxprs(eqn):
            check_blocks(sub, op)


class _Counters:
    """Per-chip counters of jax_op calls, read by ``torch_tpu.runtime.stats()``."""

    KEYS = ("pallas_calls", "pallas_kernels", "pallas_output_copies", "pallas_output_copy_bytes")

    def __init__(self):
        self.lock = threading.Lock()
        self.by_chip: dict[int, dict[str, int]] = {}

    def add(self, chip: int, **counts: int) -> None:
        with self.lock:
            d = self.by_chip.setdefault(chip, dict.fromkeys(self.KEYS, 0))
            for k, v in counts.items():
                d[k] += v


counters = _Counters()


def register(name: str, spec) -> None:
    """Prices every call of op `name` (issued on tpu tensors) and counts it."""
    from torch_tpu import _C

    cache: dict[Any, Cost] = {}
    lock = threading.Lock()

    def price(args: tuple, results: list) -> dict | None:
        values = {n: args[i] for i, (n, _) in enumerate(spec.params) if i < len(args)}
        arrays = {n: values.get(n) for n in spec.arrays}
        statics = {n: values.get(n) for n in spec.statics}
        tensors = [t for t in _flat(arrays.values()) if isinstance(t, torch.Tensor)]
        key = (tuple((tuple(t.shape), t.dtype) for t in tensors), tuple(_hashable(v) for v in statics.values()))
        with lock:
            cost = cache.get(key)
        if cost is None:
            cost = Cost()
            structs = spec.structs(arrays)
            with _jax.interpret():
                closed = jax.make_jaxpr(spec.runner(statics))(*structs)
            _body(closed.jaxpr, cost, 1.0)
            with lock:
                cache[key] = cost
        chip = next((t.device.index for t in tensors if t.device.type == "tpu"), None)
        if chip is not None:
            counters.add(chip, pallas_calls=1, pallas_kernels=cost.kernels, pallas_output_copies=len(results),
                         pallas_output_copy_bytes=sum(r.numel() * r.element_size() for r in results))
        out = {"flops": cost.flops, "bytes_read": cost.bytes_read, "bytes_written": cost.bytes_written}
        if not cost.kernels:  # plain JAX: the tensors' HBM traffic
            out["bytes_read"] = float(sum(_C._physical_bytes(list(t.shape), t.element_size()) for t in tensors))
            out["bytes_written"] = float(sum(_C._physical_bytes(list(r.shape), r.element_size()) for r in results))
        m, k, n, f = cost.dot
        if f and f >= 0.5 * cost.flops:
            out.update(mxu=True, m=m, k=k, n=n)
        return out

    _C._set_custom_op_cost(name, price)
    _priced.append(name)


_priced: list[str] = []


@atexit.register
def _unregister_all() -> None:
    """Drops the Python price callbacks while the interpreter still runs (the C++ table
    outlives it otherwise)."""
    from torch_tpu import _C

    while _priced:
        _C._set_custom_op_cost(_priced.pop(), None)


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from v
        else:
            yield v


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v
