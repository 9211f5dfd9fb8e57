"""``JaxCallable`` and ``jax_placeholder`` as Helion's Pallas launcher uses them.

A ``JaxCallable`` wraps a jitted JAX function (a ``pallas_call``) so that calling it with
torch tensors runs it as a PyTorch op: each distinct input signature becomes one
:func:`torch.tpu.pallas.jax_op` (queued on the chip's stream, Pallas TPU interpret mode).
Outputs named in ``input_output_aliases`` ({input position: output position}) are written
back into those input tensors, as on a TPU where the kernel writes the donated buffer.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from torch_tpu.tpu.pallas import _jax
from torch_tpu.tpu.pallas._mesh import get_default_pallas_mesh
from torch_tpu.tpu.pallas._op import _TORCH_TO_JAX, jax_op

jax = _jax.jax()

__all__ = ["JaxCallable", "get_default_pallas_mesh", "jax_placeholder"]

_ids = itertools.count()


def jax_placeholder(t: torch.Tensor) -> jax.ShapeDtypeStruct:
    """The ``jax.ShapeDtypeStruct`` of a tensor (shape and dtype), e.g. a kernel's out_shape.

    Raises TypeError for a dtype JAX on the vTPU does not take (64-bit, complex)."""
    dt = _TORCH_TO_JAX.get(t.dtype)
    if dt is None:
        raise TypeError(f"jax_placeholder: {t.dtype} has no JAX dtype on the vTPU (TPUs have no 64-bit or complex "
                        "units)")
    return jax.ShapeDtypeStruct(tuple(t.shape), dt)


def _get_kernel_invocation_key(trace_key: str, args: tuple, kwargs: dict | None, static_argnums) -> tuple:
    """The key of one call: trace key, the tensors' shapes and dtypes, the static values."""
    static = set(static_argnums or ())
    parts = []
    for i, a in enumerate(args):
        if i in static or not isinstance(a, torch.Tensor):
            parts.append(("static", a if _hashable(a) else repr(a)))
        else:
            parts.append((tuple(a.shape), str(a.dtype)))
    kw = tuple(sorted((k, v if _hashable(v) else repr(v)) for k, v in (kwargs or {}).items()))
    return (trace_key, tuple(parts), kw)


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


class _Kernel:
    """One registered op for one call signature of a JaxCallable."""

    def __init__(self, owner: JaxCallable, key: tuple, args: tuple, kwargs: dict):
        self.owner = owner
        static = set(owner.static_argnums or ())
        self.tensor_positions = [i for i, a in enumerate(args) if i not in static and isinstance(a, torch.Tensor)]
        fixed = {i: a for i, a in enumerate(args) if i not in self.tensor_positions}
        n_args = len(args)
        jit_fn = owner.jit_fn
        mesh, specs = owner.mesh, owner.input_partition_specs
        positions = self.tensor_positions

        def run(inputs: list[jax.Array]) -> list[jax.Array]:
            if mesh is not None:  # the function is shard_mapped over it already: place the inputs
                inputs = [_place(a, mesh, specs[k] if specs is not None else None) for k, a in enumerate(inputs)]
            return jax.tree_util.tree_leaves(_flat_call(jit_fn, fixed, positions, n_args, inputs, kwargs))

        run.__name__ = owner.name
        self.name = f"torch_tpu_jax_callable::{_sanitize(owner.name)}_{next(_ids)}"
        self.op = jax_op(self.name, run)
        with _jax.interpret():
            structs = [jax.ShapeDtypeStruct(tuple(args[i].shape), _TORCH_TO_JAX[args[i].dtype])
                       for i in positions]
            shapes = jax.eval_shape(lambda *xs: _flat_call(jit_fn, fixed, positions, n_args, xs, kwargs), *structs)
        leaves, self.out_tree = jax.tree_util.tree_flatten(shapes)
        self.output_shapes = leaves
        self.fingerprint = f"{self.name}:{abs(hash(key)):x}"

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = self.op(list(tensors))
        return list(out)


def _place(a, mesh, spec):
    P = jax.sharding.PartitionSpec
    spec = spec if isinstance(spec, P) else P(*(spec or ()))
    return jax.device_put(a, jax.sharding.NamedSharding(mesh, spec))


def _flat_call(jit_fn, fixed, positions, n_args, xs, kwargs):
    full = [None] * n_args
    for i, v in fixed.items():
        full[i] = v
    for p, a in zip(positions, xs):
        full[p] = a
    return jit_fn(*full, **kwargs)


def _sanitize(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)) or "kernel"
    return out if not out[0].isdigit() else f"k{out}"


class JaxCallable:
    """A jitted JAX function called with torch tensors (Helion's Pallas launcher subclasses it).

    Args:
        name: the kernel's name (ops are named ``torch_tpu_jax_callable::<name>_<n>``).
        jit_fn: the (jitted) JAX function; tensor arguments become arrays.
        trace_key: what identifies the function across instances (with the shapes: the key).
        static_argnums: positions passed through as Python values.
        mesh, input_partition_specs: for a function already ``shard_map``-ped over ``mesh``:
            the inputs are placed on it by these specs.
        input_output_aliases: {input position among the tensors: output position}: that output
            is copied back into that input tensor (the tensor is also what is returned there).
        donate_argnums: kept for callers that read it (the bridge copies, it does not donate).

    Attributes read by Helion: ``output_shapes`` ({key: (shapes, out_tree)}),
    ``kernel_key_to_mlir_fingerprint`` ({key: fingerprint for call_custom_kernel}),
    ``trace_key``, ``static_argnums``, ``input_output_aliases``, ``mesh``, ``donate_argnums``.
    """

    def __init__(self, name: str = "jax_callable", jit_fn=None, trace_key: str | None = None, *,
                 static_argnums=None, mesh=None, input_partition_specs=None, output_partition_specs=None,
                 input_output_aliases: dict[int, int] | None = None, donate_argnums=None, **_ignored: Any):
        if jit_fn is None or not callable(jit_fn):
            raise TypeError(f"JaxCallable({name!r}): jit_fn must be a JAX function")
        self.name = name
        self.jit_fn = jit_fn
        self.trace_key = trace_key if trace_key is not None else f"{name}_{id(jit_fn)}"
        self.static_argnums = tuple(static_argnums) if static_argnums is not None else ()
        self.mesh = mesh
        self.input_partition_specs = input_partition_specs
        self.output_partition_specs = output_partition_specs
        self.input_output_aliases = dict(input_output_aliases or {})
        self.donate_argnums = tuple(donate_argnums) if donate_argnums is not None else \
            tuple(self.input_output_aliases)
        self.output_shapes: dict[tuple, tuple] = {}
        self.kernel_key_to_mlir_fingerprint: dict[tuple, str] = {}
        self._kernels: dict[tuple, _Kernel] = {}
        self._lock = threading.Lock()

    def kernel(self, args: tuple, kwargs: dict) -> tuple[tuple, _Kernel]:
        key = _get_kernel_invocation_key(self.trace_key, args, kwargs, self.static_argnums)
        with self._lock:
            k = self._kernels.get(key)
        if k is None:
            k = _Kernel(self, key, args, kwargs)
            with self._lock:
                self._kernels[key] = k
                self.output_shapes[key] = (k.output_shapes, k.out_tree)
                self.kernel_key_to_mlir_fingerprint[key] = k.fingerprint
            from . import tpu_torch_pallas

            tpu_torch_pallas._kernels[(self.name, k.fingerprint)] = k
        return key, k

    def __call__(self, *args, **kwargs):
        _, k = self.kernel(args, kwargs)
        tensors = [args[i] for i in k.tensor_positions]
        results = k([t.contiguous() for t in tensors])
        for i, o in self.input_output_aliases.items():
            tensors[i].copy_(results[o])
            results[o] = tensors[i]
        return k.out_tree.unflatten(results)
