"""``max_pool{1,2,3}d`` and their backward without indices, as ``torch.library`` custom ops.

``torch.ops.tpu.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)`` and
``torch.ops.tpu.max_pool2d_backward(grad_output, input, ...)`` (likewise 1d and 3d). The
backward recomputes the argmax from ``input`` instead of keeping indices from the forward,
so the forward stores nothing but its output; gradients equal ``F.max_poolNd``'s autograd
(ties go to the first maximum, as ATen's kernels do).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["max_pool1d", "max_pool1d_backward", "max_pool2d", "max_pool2d_backward", "max_pool3d",
           "max_pool3d_backward"]

_FORWARD = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _norm(op: str, name: str, value: int | Sequence[int], n: int, allow_empty: bool = False) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n
    try:
        if isinstance(value, str) or any(isinstance(v, bool) for v in value):
            raise TypeError
        values = [operator.index(v) for v in value]
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int or a sequence of {n} ints, got {value!r}") from None
    if allow_empty and not values:
        return []
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ValueError(f"{op}: {name} must have 1 or {n} elements, got {len(values)} ({values})")
    return values


def _args(op: str, n: int, kernel_size, stride, padding, dilation):
    kernel_size = _norm(op, "kernel_size", kernel_size, n)
    stride = _norm(op, "stride", stride, n, allow_empty=True) or list(kernel_size)
    return kernel_size, stride, _norm(op, "padding", padding, n), _norm(op, "dilation", dilation, n)


def _check_input(op: str, n: int, input: torch.Tensor) -> None:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    if input.dim() not in (n + 1, n + 2):
        raise ValueError(f"{op}: input must be {n + 1}-D or {n + 2}-D (batch and channel dims, then {n} spatial), "
                         f"got shape {tuple(input.shape)}")


def _backward_impl(n: int, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode):
    """d input of max pooling: the argmax recomputed, then ATen's with-indices backward."""
    if n == 1:  # as a 2-D pool over a height of one
        k2, s2, p2, d2 = ([1, kernel_size[0]], [1, stride[0]], [0, padding[0]], [1, dilation[0]])
        grad = _backward_impl(2, grad_output.unsqueeze(-2), input.unsqueeze(-2), k2, s2, p2, d2, ceil_mode)
        return grad.squeeze(-2)
    with_indices = torch.ops.aten.max_pool2d_with_indices if n == 2 else torch.ops.aten.max_pool3d_with_indices
    backward = (torch.ops.aten.max_pool2d_with_indices_backward if n == 2
                else torch.ops.aten.max_pool3d_with_indices_backward)
    _, indices = with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)
    return backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices)


def _make(n: int):
    fwd_name, bwd_name = f"max_pool{n}d", f"max_pool{n}d_backward"

    @torch.library.custom_op(f"tpu::{fwd_name}", mutates_args=())
    def forward_op(input: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                   dilation: list[int], ceil_mode: bool) -> torch.Tensor:
        return _FORWARD[n](input, kernel_size, stride, padding, dilation, ceil_mode)

    @forward_op.register_fake
    def _(input, kernel_size, stride, padding, dilation, ceil_mode):
        return _FORWARD[n](input, kernel_size, stride, padding, dilation, ceil_mode)

    @torch.library.custom_op(f"tpu::{bwd_name}", mutates_args=())
    def backward_op(grad_output: torch.Tensor, input: torch.Tensor, kernel_size: list[int], stride: list[int],
                    padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
        return _backward_impl(n, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode)

    @backward_op.register_fake
    def _(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode):
        return torch.empty_like(input)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.args = inputs[1:]

    def backward(ctx, grad):
        (input,) = ctx.saved_tensors
        return (torch.ops.tpu.__getattr__(bwd_name)(grad.contiguous(), input, *ctx.args),) + (None,) * 5

    forward_op.register_autograd(backward, setup_context=setup)

    def pool(input: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int], ceil_mode: bool) -> torch.Tensor:
        _check_input(fwd_name, n, input)
        return forward_op(input, *_args(fwd_name, n, kernel_size, stride, padding, dilation), bool(ceil_mode))

    def pool_backward(grad_output: torch.Tensor, input: torch.Tensor, kernel_size: Sequence[int],
                      stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                      ceil_mode: bool) -> torch.Tensor:
        _check_input(bwd_name, n, input)
        if not isinstance(grad_output, torch.Tensor):
            raise TypeError(f"{bwd_name}: grad_output must be a Tensor, got {type(grad_output).__name__}")
        args = _args(bwd_name, n, kernel_size, stride, padding, dilation)
        want = _FORWARD[n](input.to("meta"), *args, bool(ceil_mode)).shape
        if grad_output.shape != want:
            raise ValueError(f"{bwd_name}: grad_output must have the pooled shape {tuple(want)}, "
                             f"got {tuple(grad_output.shape)}")
        return backward_op(grad_output, input, *args, bool(ceil_mode))

    spatial = ("L", "H, W", "D, H, W")[n - 1]
    pool.__name__ = pool.__qualname__ = fwd_name
    pool.__doc__ = f"""Max pooling over {n} spatial dim(s) without indices; equals ``F.{fwd_name}``.

    ``input``: ``[N, C, {spatial}]`` or ``[C, {spatial}]``. ``kernel_size``, ``stride``,
    ``padding``, ``dilation``: sequences of 1 or {n} ints (an int is accepted; an empty
    ``stride`` means ``kernel_size``). Differentiable: the backward is
    :func:`{bwd_name}`, which recomputes the argmax. Raises ValueError for a wrong input rank
    or argument length, and what ``F.{fwd_name}`` raises (e.g. padding above half the kernel).
    """
    pool_backward.__name__ = pool_backward.__qualname__ = bwd_name
    pool_backward.__doc__ = f"""Gradient of :func:`{fwd_name}` with respect to ``input``, without indices.

    ``grad_output`` has the pooled shape; returns ``input``'s shape, equal to the autograd
    gradient of ``F.{fwd_name}``. Raises ValueError if ``grad_output`` has another shape.
    """
    return pool, pool_backward


max_pool1d, max_pool1d_backward = _make(1)
max_pool2d, max_pool2d_backward = _make(2)
max_pool3d, max_pool3d_backward = _make(3)
