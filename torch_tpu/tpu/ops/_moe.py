"""Mixture-of-experts matmuls over ragged row groups: ``ragged_dot`` and its weight gradient.

Both are ``torch.library`` custom ops (``torch.ops.tpu.ragged_dot``,
``torch.ops.tpu.ragged_dot_weight_grad``) with fake kernels and autograd, so they trace
under ``torch.compile(backend="tpu")`` as library calls. The implementation is composite:
one matmul per group over existing tpu ops (each priced by the cost model), so it runs on
any device; group sizes are read on the host (a synchronization when they live on tpu).
"""

from __future__ import annotations

import torch

__all__ = ["ragged_dot", "ragged_dot_weight_grad"]


def _check_shapes(op: str, lhs: torch.Tensor, other: torch.Tensor, other_name: str, group_sizes: torch.Tensor) -> None:
    """Shape, dtype and device checks that need no tensor values (run by the fake kernels too)."""
    for name, t in (("lhs", lhs), (other_name, other), ("group_sizes", group_sizes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if lhs.dim() != 2:
        raise ValueError(f"{op}: lhs must be 2-D [M, K], got shape {tuple(lhs.shape)}")
    if not lhs.dtype.is_floating_point:
        raise TypeError(f"{op}: lhs must have a floating dtype, got {lhs.dtype}")
    if other.dtype != lhs.dtype:
        raise TypeError(f"{op}: {other_name} dtype {other.dtype} differs from lhs dtype {lhs.dtype}")
    if other.device != lhs.device:
        raise ValueError(f"{op}: {other_name} is on {other.device}, lhs on {lhs.device}")
    if group_sizes.dim() != 1:
        raise ValueError(f"{op}: group_sizes must be 1-D [G], got shape {tuple(group_sizes.shape)}")
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise TypeError(f"{op}: group_sizes must have an integer dtype (int32 or int64), got {group_sizes.dtype}")


def _host_sizes(op: str, group_sizes: torch.Tensor, rows: int) -> list[int]:
    """group_sizes as host ints; raises ValueError for negative sizes or a sum other than ``rows``."""
    sizes = [int(s) for s in group_sizes.tolist()]
    negative = [i for i, s in enumerate(sizes) if s < 0]
    if negative:
        raise ValueError(f"{op}: group_sizes must be non-negative, got group_sizes[{negative[0]}] = "
                         f"{sizes[negative[0]]}")
    if sum(sizes) != rows:
        raise ValueError(f"{op}: group_sizes must sum to lhs.shape[0] = {rows}, got sum {sum(sizes)} ({sizes})")
    return sizes


def _check_ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> None:
    _check_shapes("ragged_dot", lhs, rhs, "rhs", group_sizes)
    if rhs.dim() != 3:
        raise ValueError(f"ragged_dot: rhs must be 3-D [G, K, N], got shape {tuple(rhs.shape)}")
    if rhs.shape[1] != lhs.shape[1]:
        raise ValueError(f"ragged_dot: contraction sizes differ: lhs.shape[1] = {lhs.shape[1]}, "
                         f"rhs.shape[1] = {rhs.shape[1]}")
    if group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(f"ragged_dot: group_sizes has {group_sizes.shape[0]} groups, rhs.shape[0] is {rhs.shape[0]}")


def _check_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> None:
    _check_shapes("ragged_dot_weight_grad", lhs, grad_output, "grad_output", group_sizes)
    if grad_output.dim() != 2 or grad_output.shape[0] != lhs.shape[0]:
        raise ValueError(f"ragged_dot_weight_grad: grad_output must be 2-D [M, N] with M = lhs.shape[0] = "
                         f"{lhs.shape[0]}, got shape {tuple(grad_output.shape)}")


@torch.library.custom_op("tpu::ragged_dot", mutates_args=())
def _ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    _check_ragged_dot(lhs, rhs, group_sizes)
    sizes = _host_sizes("ragged_dot", group_sizes, lhs.shape[0])
    if not sizes or lhs.shape[0] == 0:
        return lhs.new_zeros((lhs.shape[0], rhs.shape[2]))
    parts, start = [], 0
    for g, size in enumerate(sizes):
        parts.append(torch.mm(lhs[start:start + size], rhs[g]))
        start += size
    return torch.cat(parts)


@_ragged_dot.register_fake
def _(lhs, rhs, group_sizes):
    _check_ragged_dot(lhs, rhs, group_sizes)
    return lhs.new_empty((lhs.shape[0], rhs.shape[2]))


@torch.library.custom_op("tpu::ragged_dot_weight_grad", mutates_args=())
def _ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    _check_weight_grad(lhs, grad_output, group_sizes)
    sizes = _host_sizes("ragged_dot_weight_grad", group_sizes, lhs.shape[0])
    if not sizes:
        return lhs.new_zeros((0, lhs.shape[1], grad_output.shape[1]))
    parts, start = [], 0
    for size in sizes:
        parts.append(torch.mm(lhs[start:start + size].t(), grad_output[start:start + size]))
        start += size
    return torch.stack(parts)


@_ragged_dot_weight_grad.register_fake
def _(lhs, grad_output, group_sizes):
    _check_weight_grad(lhs, grad_output, group_sizes)
    return lhs.new_empty((group_sizes.shape[0], lhs.shape[1], grad_output.shape[1]))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _ragged_dot_backward(ctx, grad):
    lhs, rhs, group_sizes = ctx.saved_tensors
    grad_lhs = grad_rhs = None
    if ctx.needs_input_grad[0]:
        grad_lhs = torch.ops.tpu.ragged_dot(grad, rhs.transpose(1, 2), group_sizes)
    if ctx.needs_input_grad[1]:
        grad_rhs = torch.ops.tpu.ragged_dot_weight_grad(lhs, grad, group_sizes)
    return grad_lhs, grad_rhs, None


def _weight_grad_backward(ctx, grad):
    # out[g] = lhs_g^T @ go_g  =>  d lhs_g = go_g @ grad[g]^T,  d go_g = lhs_g @ grad[g]
    lhs, grad_output, group_sizes = ctx.saved_tensors
    grad_lhs = grad_go = None
    if ctx.needs_input_grad[0]:
        grad_lhs = torch.ops.tpu.ragged_dot(grad_output, grad.transpose(1, 2), group_sizes)
    if ctx.needs_input_grad[1]:
        grad_go = torch.ops.tpu.ragged_dot(lhs, grad, group_sizes)
    return grad_lhs, grad_go, None


_ragged_dot.register_autograd(_ragged_dot_backward, setup_context=_setup)
_ragged_dot_weight_grad.register_autograd(_weight_grad_backward, setup_context=_setup)


def _write_out(op: str, result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{op}: out must be a Tensor, got {type(out).__name__}")
    if out.shape != result.shape or out.dtype != result.dtype or out.device != result.device:
        raise ValueError(f"{op}: out must be {tuple(result.shape)} {result.dtype} on {result.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    return out.copy_(result)


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped matmul over ragged row groups (``jax.lax.ragged_dot``): ``[M, K] x [G, K, N] -> [M, N]``.

    Rows ``sum(group_sizes[:g]) .. sum(group_sizes[:g+1])`` of ``lhs`` are multiplied by
    ``rhs[g]``. ``group_sizes`` is a 1-D integer tensor (any device) of ``G`` non-negative sizes
    summing to ``M``. Differentiable in ``lhs`` and ``rhs`` (``ragged_dot`` of the gradient
    with ``rhs`` transposed, and :func:`ragged_dot_weight_grad`). With ``out``, the result is
    written there and ``out`` is returned (no autograd through ``out``).

    Raises TypeError for non-float ``lhs``, a ``rhs`` dtype other than ``lhs``'s or a
    non-integer ``group_sizes``; ValueError for wrong ranks, mismatched K (``lhs.shape[1]`` vs
    ``rhs.shape[1]``), a group count other than ``rhs.shape[0]``, negative sizes or sizes not
    summing to ``lhs.shape[0]``.
    """
    return _write_out("ragged_dot", torch.ops.tpu.ragged_dot(lhs, rhs, group_sizes), out)


def ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Gradient of :func:`ragged_dot` with respect to ``rhs``: ``[M, K], [M, N] -> [G, K, N]``.

    ``out[g] = lhs[rows of g].T @ grad_output[rows of g]`` (zeros for an empty group).
    Differentiable in both inputs. Errors as :func:`ragged_dot` (``grad_output`` must be
    ``[M, N]`` with ``lhs``'s dtype and device).
    """
    return torch.ops.tpu.ragged_dot_weight_grad(lhs, grad_output, group_sizes)
