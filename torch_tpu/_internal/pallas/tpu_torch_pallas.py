"""``register_custom_kernel`` / ``lookup_custom_kernel`` / ``call_custom_kernel``: the kernel
registry Helion (after a first ``JaxCallable`` call) and PyTorch's Inductor Pallas code
generator call.

Kernels known here are those a :class:`~torch_tpu._internal.pallas.pallas.JaxCallable` built
(a JAX function that runs in Pallas's TPU interpret mode). A serialized Mosaic module (what
``register_custom_kernel`` receives from Inductor) is compiled TPU machine code's input: the
vTPU cannot run it, and registering one raises NotImplementedError.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_kernels: dict[tuple[str, str], object] = {}

__all__ = ["call_custom_kernel", "lookup_custom_kernel", "register_custom_kernel"]


def lookup_custom_kernel(name: str, key: str) -> bool:
    """Whether kernel `name` with key (fingerprint) `key` is registered."""
    return (name, key) in _kernels


def register_custom_kernel(name: str, key: str, serialized_mlir_module: bytes | None = None, *args, **kwargs):
    """Always raises NotImplementedError: a serialized Mosaic (MLIR) module is code for a TPU's
    compiler, which the vTPU does not have; write the kernel in JAX and register it with
    ``torch.tpu.pallas.jax_op`` (or Helion's JaxCallable path) instead."""
    raise NotImplementedError(
        f"tpu_torch_pallas.register_custom_kernel({name!r}): a serialized Mosaic module cannot run on the vTPU "
        "(it is input to a real TPU's compiler). Register the kernel's JAX function with torch.tpu.pallas.jax_op, "
        "which runs it in Pallas's TPU interpret mode; torch.compile(backend='tpu') does not use Inductor's Pallas "
        "code generator")


def call_custom_kernel(name: str, mlir_fingerprint: str, inputs: Sequence[torch.Tensor] = (), output_shapes=None,
                       donate_argnums=None, device_assignment=None, input_output_aliases=None) -> list[torch.Tensor]:
    """Runs registered kernel (name, fingerprint) on `inputs`; returns its outputs (fresh tensors:
    the caller copies aliased ones back, as Helion and Inductor do).

    Raises KeyError naming the kernel when it is not registered (NotImplementedError if it is
    not because a Mosaic module was all that was offered)."""
    kernel = _kernels.get((name, mlir_fingerprint))
    if kernel is None:
        raise KeyError(f"tpu_torch_pallas.call_custom_kernel: no kernel {name!r} with key {mlir_fingerprint!r} is "
                       "registered (kernels come from a JaxCallable's first call; Mosaic modules cannot run on the "
                       "vTPU)")
    return kernel(list(inputs))
