"""``optimization_barrier``: values pass through unchanged; compiled programs do not fuse across it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["optimization_barrier"]


@torch.library.custom_op("tpu::optimization_barrier", mutates_args=())
def _barrier(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in inputs]


@_barrier.register_fake
def _(inputs):
    return [torch.empty_like(t) for t in inputs]


def _setup(ctx, inputs, output):
    pass


def _backward(ctx, grads):
    return ([g if g is None else torch.ops.tpu.optimization_barrier([g])[0] for g in grads],)


_barrier.register_autograd(_backward, setup_context=_setup)


def optimization_barrier(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Identity on a sequence of tensors that the compiler may not move work across (XLA's barrier).

    Returns a list of tensors equal to ``inputs``. In eager mode these are the input tensors
    themselves (nothing runs). Under ``torch.compile`` the call is the opaque custom op
    ``torch.ops.tpu.optimization_barrier`` (its outputs are copies), so the tpu backend keeps
    it as a library call and no fused region spans it: work before it is not fused with,
    reordered into or recomputed after work that uses its outputs. Gradients pass through
    (through a barrier of their own). Raises TypeError for a non-tensor element.
    """
    if isinstance(inputs, torch.Tensor):
        raise TypeError("optimization_barrier: inputs must be a sequence of Tensors, got a Tensor (wrap it in a list)")
    inputs = list(inputs)
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"optimization_barrier: inputs[{i}] must be a Tensor, got {type(t).__name__}")
    if torch.compiler.is_compiling():
        return list(torch.ops.tpu.optimization_barrier(inputs))
    return inputs
