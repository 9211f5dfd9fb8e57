"""``torch.tpu.ops``: TorchTPU's extra operators (names and signatures of TorchTPU 0.2).

MoE matmuls (:func:`ragged_dot`, :func:`ragged_dot_weight_grad`; ``torch._grouped_mm``
works on tpu through ATen's composite kernel), collectives over ``tpu_dist``
(:func:`all_gather_dim`, :func:`reduce_scatter_dim`, :func:`send`, :func:`recv`,
:func:`ragged_all_to_all`), :func:`optimization_barrier`, max pooling without indices
(:func:`max_pool2d` and friends) and jagged NestedTensor alignment
(:func:`align_jagged_to_multiple`, :func:`strip_jagged_padding`), blocked attention
(:func:`splash_sdpa`) and the SparseCore embedding ops as TensorCore reference implementations
(:func:`sparse_dense_matmul` and friends; :func:`sparse_map_row` raises NotImplementedError).
The custom ops live in the
``torch.ops.tpu`` namespace with fake kernels, so they trace under ``torch.compile``.
Listed in docs/tpu-api.md.
"""

from __future__ import annotations

from .._namespace import NotAvailableError
from ._attention import splash_sdpa
from ._barrier import optimization_barrier
from ._collectives import all_gather_dim, ragged_all_to_all, recv, reduce_scatter_dim, send
from ._jagged import align_jagged_to_multiple, strip_jagged_padding
from ._moe import ragged_dot, ragged_dot_weight_grad
from ._pool import (
    max_pool1d,
    max_pool1d_backward,
    max_pool2d,
    max_pool2d_backward,
    max_pool3d,
    max_pool3d_backward,
)
from ._sparse import (
    sparse_dense_matmul,
    sparse_dense_matmul_activation_unstack,
    sparse_dense_matmul_grad_with_adagrad,
    sparse_dense_matmul_grad_with_adam,
    sparse_dense_matmul_grad_with_sgd,
    sparse_dense_matmul_gradient_stack,
    sparse_gather,
    sparse_gather_backward,
    sparse_iota,
    sparse_map_row,
)

__all__ = [
    "align_jagged_to_multiple", "all_gather_dim", "max_pool1d", "max_pool1d_backward", "max_pool2d",
    "max_pool2d_backward", "max_pool3d", "max_pool3d_backward", "optimization_barrier", "ragged_all_to_all",
    "ragged_dot", "ragged_dot_weight_grad", "recv", "reduce_scatter_dim", "send", "sparse_dense_matmul",
    "sparse_dense_matmul_activation_unstack", "sparse_dense_matmul_grad_with_adagrad",
    "sparse_dense_matmul_grad_with_adam", "sparse_dense_matmul_grad_with_sgd", "sparse_dense_matmul_gradient_stack",
    "sparse_gather", "sparse_gather_backward", "sparse_iota", "sparse_map_row", "splash_sdpa", "strip_jagged_padding",
]

#: TorchTPU 0.2 members not built here yet, with what is missing (none left).
NOT_YET: dict[str, str] = {}


# The namespace's error for a TorchTPU name this build lacks (an AttributeError too: hasattr() is False).
MissingOpError = NotAvailableError


def __getattr__(name: str):
    if name in NOT_YET:
        raise MissingOpError(f"torch.tpu.ops.{name} is not implemented in torch_tpu: {NOT_YET[name]}")
    raise AttributeError(f"module 'torch.tpu.ops' has no attribute {name!r}")
