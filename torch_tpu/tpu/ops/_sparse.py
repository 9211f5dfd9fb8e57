"""SparseCore embedding ops as reference implementations on the TensorCore path.

A TPU's SparseCores run embedding lookups from a CSR-wrapped COO layout that the host
preprocesses (jax-tpu-embedding's and TorchRec's preprocessors): ``embedding_ids``,
``sample_ids`` and ``gains`` are parallel 1-D arrays, one entry per looked-up id, grouped in rows
(partitions) whose ends ``row_pointers`` holds; entries between one row's end and the next row's
(aligned) start, and after the last row's end, are padding and carry ``PAD_VALUE`` (2**31 - 1) as
ids. Here every op is a ``torch.library`` custom op in ``torch.ops.tpu`` (TorchRec calls them
there) built from index_select / index_add on the chip; the layout is validated on the host first
(a synchronization), so ids out of range raise at the call rather than reading past a table.

The reference semantics are one partition's: ``embedding_ids`` index the given table directly
and ``sample_ids`` the ``device_batch_size`` rows of the result. How a SparseCore mod-shards a
table over its cores and chips (ids local to a shard) is the preprocessor's business and is not
modelled; ``max_ids_per_partition`` / ``max_unique_ids_per_partition`` are checked per row as the
capacities they are on the chip.

:func:`sparse_gather`, :func:`sparse_gather_backward` and :func:`sparse_iota` take standard CSR
row pointers (``R + 1`` non-decreasing offsets, as ``torch.sparse_csr``'s ``crow_indices``):
row ``r`` is entries ``row_pointers[r] .. row_pointers[r + 1]``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

__all__ = [
    "PAD_VALUE", "sparse_dense_matmul", "sparse_dense_matmul_activation_unstack",
    "sparse_dense_matmul_grad_with_adagrad", "sparse_dense_matmul_grad_with_adam", "sparse_dense_matmul_grad_with_sgd",
    "sparse_dense_matmul_gradient_stack", "sparse_gather", "sparse_gather_backward", "sparse_iota", "sparse_map_row",
]

#: The id that marks a padding entry in the SparseCore layout (jax-tpu-embedding's and XLA's pad value).
PAD_VALUE = 2**31 - 1


def _tensor(op: str, name: str, t, dims: int | None = None, kind: str | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{op}: {name} must be {dims}-D, got shape {tuple(t.shape)}")
    if kind == "int" and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise TypeError(f"{op}: {name} must have an integer dtype, got {t.dtype}")
    if kind == "float" and not t.dtype.is_floating_point:
        raise TypeError(f"{op}: {name} must have a floating dtype, got {t.dtype}")


def _positive(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
    return int(value)


def _same_device(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != ref.device:
            raise ValueError(f"{op}: {name} is on {t.device}, {ref_name} on {ref.device}")


# ------------------------------------------------------------------ the SparseCore layout

def _check_coo(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size,
               max_ids_per_partition, max_unique_ids_per_partition) -> None:
    """Checks without tensor values (also run by the fake kernels)."""
    _tensor(op, "row_pointers", row_pointers, 1, "int")
    _tensor(op, "embedding_ids", embedding_ids, 1, "int")
    _tensor(op, "sample_ids", sample_ids, 1, "int")
    _tensor(op, "gains", gains, 1, "float")
    _tensor(op, "embedding_table", embedding_table, 2, "float")
    n = embedding_ids.shape[0]
    for name, t in (("sample_ids", sample_ids), ("gains", gains)):
        if t.shape[0] != n:
            raise ValueError(f"{op}: {name} has {t.shape[0]} entries, embedding_ids has {n}")
    _same_device(op, "embedding_table", embedding_table, row_pointers=row_pointers, embedding_ids=embedding_ids,
                 sample_ids=sample_ids, gains=gains)
    _positive(op, "device_batch_size", device_batch_size)
    _positive(op, "max_ids_per_partition", max_ids_per_partition)
    _positive(op, "max_unique_ids_per_partition", max_unique_ids_per_partition)


def _valid_entries(op, row_pointers, embedding_ids, sample_ids, table_rows, device_batch_size,
                   max_ids_per_partition, max_unique_ids_per_partition) -> torch.Tensor:
    """Positions (int64, host) of the real entries; ValueError for a bad layout or ids out of range."""
    rp = row_pointers.cpu().tolist()
    eids = embedding_ids.cpu().long()
    sids = sample_ids.cpu().long()
    n = eids.shape[0]
    for r in range(1, len(rp)):
        if rp[r] < rp[r - 1]:
            raise ValueError(f"{op}: row_pointers must be non-decreasing, got row_pointers[{r - 1}] = {rp[r - 1]} > "
                             f"row_pointers[{r}] = {rp[r]}")
    if rp and (rp[0] < 0 or rp[-1] > n):
        raise ValueError(f"{op}: row_pointers must lie in [0, {n}] (the length of embedding_ids), got "
                         f"{rp[0]} .. {rp[-1]}")
    real = (eids != PAD_VALUE) & (sids != PAD_VALUE)
    real[rp[-1] if rp else 0:] = False
    start = 0
    for r, end in enumerate(rp):
        seg = real[start:end]
        count = int(seg.sum())
        if count > max_ids_per_partition:
            raise ValueError(f"{op}: row {r} of row_pointers holds {count} ids, more than max_ids_per_partition = "
                             f"{max_ids_per_partition}")
        unique = int(eids[start:end][seg].unique().numel())
        if unique > max_unique_ids_per_partition:
            raise ValueError(f"{op}: row {r} of row_pointers holds {unique} distinct ids, more than "
                             f"max_unique_ids_per_partition = {max_unique_ids_per_partition}")
        start = end
    for name, ids, bound, what in (("embedding_ids", eids, table_rows, "embedding_table rows"),
                                   ("sample_ids", sids, device_batch_size, "device_batch_size")):
        bad = (real & ((ids < 0) | (ids >= bound))).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"{op}: {name}[{i}] = {int(ids[i])} is out of range for {what} = {bound} "
                             f"({bad.numel()} such entries; padding entries carry {PAD_VALUE})")
    return real.nonzero().flatten()


def _entries(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size,
             max_ids_per_partition, max_unique_ids_per_partition):
    """(embedding ids, sample ids, gains) of the real entries, on the table's device."""
    pos = _valid_entries(op, row_pointers, embedding_ids, sample_ids, embedding_table.shape[0], device_batch_size,
                         max_ids_per_partition, max_unique_ids_per_partition).to(embedding_table.device)
    return (embedding_ids.index_select(0, pos).long(), sample_ids.index_select(0, pos).long(),
            gains.index_select(0, pos))


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@torch.library.custom_op("tpu::sparse_dense_matmul", mutates_args=())
def _sdmm(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor,
          embedding_table: torch.Tensor, device_batch_size: int, max_ids_per_partition: int,
          max_unique_ids_per_partition: int) -> torch.Tensor:
    args = (row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size,
            max_ids_per_partition, max_unique_ids_per_partition)
    _check_coo("sparse_dense_matmul", *args)
    e, s, g = _entries("sparse_dense_matmul", *args)
    acc = _acc(embedding_table)
    rows = embedding_table.index_select(0, e).to(acc) * g.to(acc).unsqueeze(1)
    out = torch.zeros((device_batch_size, embedding_table.shape[1]), dtype=acc, device=embedding_table.device)
    return out.index_add_(0, s, rows).to(embedding_table.dtype)


@_sdmm.register_fake
def _(row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size, max_ids_per_partition,
      max_unique_ids_per_partition):
    _check_coo("sparse_dense_matmul", row_pointers, embedding_ids, sample_ids, gains, embedding_table,
               device_batch_size, max_ids_per_partition, max_unique_ids_per_partition)
    return embedding_table.new_empty((device_batch_size, embedding_table.shape[1]))


def _table_grad(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad,
                device_batch_size, max_ids_per_partition, max_unique_ids_per_partition):
    """(touched rows [U] int64, their summed gradient [U, D] in float32/64) on the table's device."""
    _check_coo(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size,
               max_ids_per_partition, max_unique_ids_per_partition)
    _tensor(op, "activations_grad", activations_grad, 2, "float")
    if tuple(activations_grad.shape) != (device_batch_size, embedding_table.shape[1]):
        raise ValueError(f"{op}: activations_grad must be [device_batch_size, dim] = "
                         f"[{device_batch_size}, {embedding_table.shape[1]}], got {tuple(activations_grad.shape)}")
    _same_device(op, "embedding_table", embedding_table, activations_grad=activations_grad)
    e, s, g = _entries(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size,
                       max_ids_per_partition, max_unique_ids_per_partition)
    acc = _acc(embedding_table)
    touched, slot = torch.unique(e, return_inverse=True)
    contrib = activations_grad.index_select(0, s).to(acc) * g.to(acc).unsqueeze(1)
    grad = torch.zeros((touched.shape[0], embedding_table.shape[1]), dtype=acc, device=embedding_table.device)
    return touched, grad.index_add_(0, slot, contrib)


def _check_scalar(op: str, name: str, t) -> None:
    _tensor(op, name, t, kind="float")
    if t.numel() != 1:
        raise ValueError(f"{op}: {name} must hold one value, got shape {tuple(t.shape)}")


def _check_slot(op: str, name: str, slot, table: torch.Tensor) -> None:
    _tensor(op, name, slot, 2, "float")
    if slot.shape != table.shape:
        raise ValueError(f"{op}: {name} must have embedding_table's shape {tuple(table.shape)}, got "
                         f"{tuple(slot.shape)}")
    _same_device(op, "embedding_table", table, **{name: slot})


def _scatter_rows(base: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return base.clone().index_copy_(0, rows, values.to(base.dtype))


@torch.library.custom_op("tpu::sparse_dense_matmul_grad_with_sgd", mutates_args=())
def _sdmm_sgd(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor,
              embedding_table: torch.Tensor, activations_grad: torch.Tensor, learning_rate: torch.Tensor,
              device_batch_size: int, max_ids_per_partition: int, max_unique_ids_per_partition: int,
              computation_name: str) -> torch.Tensor:
    op = "sparse_dense_matmul_grad_with_sgd"
    _check_scalar(op, "learning_rate", learning_rate)
    rows, grad = _table_grad(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad,
                             device_batch_size, max_ids_per_partition, max_unique_ids_per_partition)
    lr = learning_rate.to(embedding_table.device, grad.dtype).reshape(())
    new = embedding_table.index_select(0, rows).to(grad.dtype) - lr * grad
    return _scatter_rows(embedding_table, rows, new)


@_sdmm_sgd.register_fake
def _(row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad, learning_rate,
      device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name):
    return torch.empty_like(embedding_table)


@torch.library.custom_op("tpu::sparse_dense_matmul_grad_with_adagrad", mutates_args=())
def _sdmm_adagrad(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor,
                  gains: torch.Tensor, embedding_table: torch.Tensor, accumulator: torch.Tensor,
                  activations_grad: torch.Tensor, learning_rate: torch.Tensor, epsilon: float, device_batch_size: int,
                  max_ids_per_partition: int, max_unique_ids_per_partition: int,
                  computation_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    op = "sparse_dense_matmul_grad_with_adagrad"
    _check_scalar(op, "learning_rate", learning_rate)
    _check_slot(op, "accumulator", accumulator, embedding_table)
    rows, grad = _table_grad(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad,
                             device_batch_size, max_ids_per_partition, max_unique_ids_per_partition)
    lr = learning_rate.to(embedding_table.device, grad.dtype).reshape(())
    acc = accumulator.index_select(0, rows).to(grad.dtype) + grad * grad
    new = embedding_table.index_select(0, rows).to(grad.dtype) - lr * grad / (acc.sqrt() + epsilon)
    return _scatter_rows(embedding_table, rows, new), _scatter_rows(accumulator, rows, acc)


@_sdmm_adagrad.register_fake
def _(row_pointers, embedding_ids, sample_ids, gains, embedding_table, accumulator, activations_grad, learning_rate,
      epsilon, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name):
    return torch.empty_like(embedding_table), torch.empty_like(accumulator)


@torch.library.custom_op("tpu::sparse_dense_matmul_grad_with_adam", mutates_args=())
def _sdmm_adam(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor,
               embedding_table: torch.Tensor, momentum: torch.Tensor, velocity: torch.Tensor,
               activations_grad: torch.Tensor, alpha_t: torch.Tensor, beta_1: float, beta_2: float, epsilon: float,
               device_batch_size: int, max_ids_per_partition: int, max_unique_ids_per_partition: int,
               computation_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "sparse_dense_matmul_grad_with_adam"
    _check_scalar(op, "alpha_t", alpha_t)
    _check_slot(op, "momentum", momentum, embedding_table)
    _check_slot(op, "velocity", velocity, embedding_table)
    rows, grad = _table_grad(op, row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad,
                             device_batch_size, max_ids_per_partition, max_unique_ids_per_partition)
    alpha = alpha_t.to(embedding_table.device, grad.dtype).reshape(())
    m = momentum.index_select(0, rows).to(grad.dtype)
    v = velocity.index_select(0, rows).to(grad.dtype)
    m = m + (1 - beta_1) * (grad - m)
    v = v + (1 - beta_2) * (grad * grad - v)
    new = embedding_table.index_select(0, rows).to(grad.dtype) - alpha * m / (v.sqrt() + epsilon)
    return (_scatter_rows(embedding_table, rows, new), _scatter_rows(momentum, rows, m),
            _scatter_rows(velocity, rows, v))


@_sdmm_adam.register_fake
def _(row_pointers, embedding_ids, sample_ids, gains, embedding_table, momentum, velocity, activations_grad, alpha_t,
      beta_1, beta_2, epsilon, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition,
      computation_name):
    return torch.empty_like(embedding_table), torch.empty_like(momentum), torch.empty_like(velocity)


def _sdmm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.sizes = inputs[5:]


def _sdmm_backward(ctx, grad):
    """d embedding_table: the summed gains x activation gradients of each looked-up row (other inputs: none)."""
    row_pointers, embedding_ids, sample_ids, gains, table = ctx.saved_tensors
    grad_table = None
    if ctx.needs_input_grad[4]:
        rows, g = _table_grad("sparse_dense_matmul", row_pointers, embedding_ids, sample_ids, gains, table,
                              grad.contiguous(), *ctx.sizes)
        grad_table = torch.zeros(table.shape, dtype=g.dtype, device=table.device).index_copy_(0, rows, g)
        grad_table = grad_table.to(table.dtype)
    return None, None, None, None, grad_table, None, None, None


_sdmm.register_autograd(_sdmm_backward, setup_context=_sdmm_setup)


# ------------------------------------------------------------------ feature stacking

def _check_unstack(op, stacked, batch_sizes, dims):
    _tensor(op, "stacked_activations", stacked, 2)
    batch_sizes, dims = list(batch_sizes), list(dims)
    if len(batch_sizes) != len(dims):
        raise ValueError(f"{op}: per_feature_batch_sizes has {len(batch_sizes)} entries, per_feature_dims {len(dims)}")
    for name, seq in (("per_feature_batch_sizes", batch_sizes), ("per_feature_dims", dims)):
        for i, x in enumerate(seq):
            _positive(op, f"{name}[{i}]", x)
    if sum(batch_sizes) > stacked.shape[0]:
        raise ValueError(f"{op}: per_feature_batch_sizes sum to {sum(batch_sizes)}, more than the "
                         f"{stacked.shape[0]} rows of stacked_activations")
    wide = [i for i, d in enumerate(dims) if d > stacked.shape[1]]
    if wide:
        raise ValueError(f"{op}: per_feature_dims[{wide[0]}] = {dims[wide[0]]} is wider than stacked_activations' "
                         f"{stacked.shape[1]} columns")
    return batch_sizes, dims


@torch.library.custom_op("tpu::sparse_dense_matmul_activation_unstack", mutates_args=())
def _unstack(stacked_activations: torch.Tensor, per_feature_batch_sizes: list[int],
             per_feature_dims: list[int]) -> list[torch.Tensor]:
    sizes, dims = _check_unstack("sparse_dense_matmul_activation_unstack", stacked_activations,
                                 per_feature_batch_sizes, per_feature_dims)
    out, start = [], 0
    for b, d in zip(sizes, dims):
        out.append(stacked_activations[start:start + b, :d].clone())
        start += b
    return out


@_unstack.register_fake
def _(stacked_activations, per_feature_batch_sizes, per_feature_dims):
    sizes, dims = _check_unstack("sparse_dense_matmul_activation_unstack", stacked_activations,
                                 per_feature_batch_sizes, per_feature_dims)
    return [stacked_activations.new_empty((b, d)) for b, d in zip(sizes, dims)]


def _check_stack(op, grads, stacked_batch_size, stacked_feature_dim):
    if isinstance(grads, torch.Tensor) or not isinstance(grads, Sequence) or not grads:
        raise TypeError(f"{op}: unstacked_gradients must be a non-empty sequence of 2-D tensors")
    for i, g in enumerate(grads):
        _tensor(op, f"unstacked_gradients[{i}]", g, 2, "float")
        if g.dtype != grads[0].dtype or g.device != grads[0].device:
            raise ValueError(f"{op}: unstacked_gradients[{i}] is {g.dtype} on {g.device}, unstacked_gradients[0] "
                             f"{grads[0].dtype} on {grads[0].device}")
    _positive(op, "stacked_batch_size", stacked_batch_size)
    _positive(op, "stacked_feature_dim", stacked_feature_dim)
    rows = sum(g.shape[0] for g in grads)
    if rows > stacked_batch_size:
        raise ValueError(f"{op}: unstacked_gradients hold {rows} rows, more than stacked_batch_size = "
                         f"{stacked_batch_size}")
    wide = [i for i, g in enumerate(grads) if g.shape[1] > stacked_feature_dim]
    if wide:
        raise ValueError(f"{op}: unstacked_gradients[{wide[0]}] has {grads[wide[0]].shape[1]} columns, more than "
                         f"stacked_feature_dim = {stacked_feature_dim}")


@torch.library.custom_op("tpu::sparse_dense_matmul_gradient_stack", mutates_args=())
def _stack(unstacked_gradients: list[torch.Tensor], stacked_batch_size: int,
           stacked_feature_dim: int) -> torch.Tensor:
    _check_stack("sparse_dense_matmul_gradient_stack", unstacked_gradients, stacked_batch_size, stacked_feature_dim)
    first = unstacked_gradients[0]
    out = first.new_zeros((stacked_batch_size, stacked_feature_dim))
    start = 0
    for g in unstacked_gradients:
        out[start:start + g.shape[0], :g.shape[1]] = g
        start += g.shape[0]
    return out


@_stack.register_fake
def _(unstacked_gradients, stacked_batch_size, stacked_feature_dim):
    _check_stack("sparse_dense_matmul_gradient_stack", unstacked_gradients, stacked_batch_size, stacked_feature_dim)
    return unstacked_gradients[0].new_empty((stacked_batch_size, stacked_feature_dim))


# ------------------------------------------------------------------ CSR gather and iota

def _csr_rows(op: str, row_pointers: torch.Tensor, length: int, length_name: str,
              max_non_zeroes_per_row: int) -> list[int]:
    _tensor(op, "row_pointers", row_pointers, 1, "int")
    _positive(op, "max_non_zeroes_per_row", max_non_zeroes_per_row)
    rp = row_pointers.cpu().tolist()
    if not rp:
        raise ValueError(f"{op}: row_pointers needs at least one entry (R + 1 offsets for R rows)")
    for r in range(1, len(rp)):
        if rp[r] < rp[r - 1]:
            raise ValueError(f"{op}: row_pointers must be non-decreasing, got row_pointers[{r - 1}] = {rp[r - 1]} > "
                             f"row_pointers[{r}] = {rp[r]}")
        if rp[r] - rp[r - 1] > max_non_zeroes_per_row:
            raise ValueError(f"{op}: row {r - 1} has {rp[r] - rp[r - 1]} entries, more than max_non_zeroes_per_row = "
                             f"{max_non_zeroes_per_row}")
    if rp[0] < 0 or rp[-1] > length:
        raise ValueError(f"{op}: row_pointers must lie in [0, {length}] ({length_name}), got {rp[0]} .. {rp[-1]}")
    return rp


def _check_gather(row_pointers, indices, operand, max_non_zeroes_per_row) -> None:
    op = "sparse_gather"
    _tensor(op, "indices", indices, 1, "int")
    _tensor(op, "operand", operand)
    if operand.dim() < 1:
        raise ValueError(f"{op}: operand must have at least one dimension")
    _tensor(op, "row_pointers", row_pointers, 1, "int")
    _positive(op, "max_non_zeroes_per_row", max_non_zeroes_per_row)
    _same_device(op, "operand", operand, indices=indices, row_pointers=row_pointers)


def _check_indices(op: str, indices: torch.Tensor, lo: int, hi: int, rows: int, what: str) -> None:
    ids = indices[lo:hi].cpu().long()
    bad = ((ids < 0) | (ids >= rows)).nonzero()
    if bad.numel():
        i = lo + int(bad[0])
        raise ValueError(f"{op}: indices[{i}] = {int(indices[i])} is out of range for {what} with {rows} rows")


@torch.library.custom_op("tpu::sparse_gather", mutates_args=())
def _gather(row_pointers: torch.Tensor, indices: torch.Tensor, operand: torch.Tensor,
            max_non_zeroes_per_row: int) -> torch.Tensor:
    _check_gather(row_pointers, indices, operand, max_non_zeroes_per_row)
    rp = _csr_rows("sparse_gather", row_pointers, indices.shape[0], "the length of indices", max_non_zeroes_per_row)
    lo, hi = rp[0], rp[-1]
    _check_indices("sparse_gather", indices, lo, hi, operand.shape[0], "operand")
    out = operand.new_zeros((indices.shape[0], *operand.shape[1:]))
    out[lo:hi] = operand.index_select(0, indices[lo:hi].long())
    return out


@_gather.register_fake
def _(row_pointers, indices, operand, max_non_zeroes_per_row):
    _check_gather(row_pointers, indices, operand, max_non_zeroes_per_row)
    return operand.new_empty((indices.shape[0], *operand.shape[1:]))


def _check_gather_backward(grad_output, indices, grad_operand) -> None:
    op = "sparse_gather_backward"
    _tensor(op, "indices", indices, 1, "int")
    _tensor(op, "grad_operand", grad_operand, kind="float")
    _tensor(op, "grad_output", grad_output, kind="float")
    want = (indices.shape[0], *grad_operand.shape[1:])
    if tuple(grad_output.shape) != want:
        raise ValueError(f"{op}: grad_output must be [len(indices), *grad_operand.shape[1:]] = {want}, got "
                         f"{tuple(grad_output.shape)}")
    if grad_output.dtype != grad_operand.dtype:
        raise TypeError(f"{op}: grad_output dtype {grad_output.dtype} differs from grad_operand dtype "
                        f"{grad_operand.dtype}")
    _same_device(op, "grad_operand", grad_operand, grad_output=grad_output, indices=indices)


@torch.library.custom_op("tpu::sparse_gather_backward", mutates_args=())
def _gather_backward(grad_output: torch.Tensor, indices: torch.Tensor, grad_operand: torch.Tensor) -> torch.Tensor:
    _check_gather_backward(grad_output, indices, grad_operand)
    _check_indices("sparse_gather_backward", indices, 0, indices.shape[0], grad_operand.shape[0], "grad_operand")
    return grad_operand.index_add(0, indices.long(), grad_output)


@_gather_backward.register_fake
def _(grad_output, indices, grad_operand):
    _check_gather_backward(grad_output, indices, grad_operand)
    return torch.empty_like(grad_operand)


def _gather_setup(ctx, inputs, output):
    row_pointers, indices, operand, _ = inputs
    ctx.save_for_backward(row_pointers, indices)
    ctx.operand_shape = operand.shape


def _gather_grad(ctx, grad):
    row_pointers, indices = ctx.saved_tensors
    rp = row_pointers.cpu().tolist()
    lo, hi = rp[0], rp[-1]  # only the real entries carry gradient
    zeros = grad.new_zeros(ctx.operand_shape)
    return None, None, torch.ops.tpu.sparse_gather_backward(grad[lo:hi].contiguous(), indices[lo:hi], zeros), None


_gather.register_autograd(_gather_grad, setup_context=_gather_setup)


@torch.library.custom_op("tpu::sparse_iota", mutates_args=())
def _iota(row_pointers: torch.Tensor, max_non_zeroes: int, max_non_zeroes_per_row: int) -> torch.Tensor:
    _positive("sparse_iota", "max_non_zeroes", max_non_zeroes)
    rp = _csr_rows("sparse_iota", row_pointers, max_non_zeroes, "max_non_zeroes", max_non_zeroes_per_row)
    pos = torch.arange(max_non_zeroes, dtype=torch.int64)
    starts = torch.zeros(max_non_zeroes, dtype=torch.int64)
    for r in range(len(rp) - 1):
        starts[rp[r]:rp[r + 1]] = rp[r]
    out = torch.where((pos >= rp[0]) & (pos < rp[-1]), pos - starts, 0)
    return out.to(row_pointers.dtype).to(row_pointers.device)


@_iota.register_fake
def _(row_pointers, max_non_zeroes, max_non_zeroes_per_row):
    _tensor("sparse_iota", "row_pointers", row_pointers, 1, "int")
    _positive("sparse_iota", "max_non_zeroes", max_non_zeroes)
    return row_pointers.new_empty((max_non_zeroes,))


# ------------------------------------------------------------------ public functions (TorchTPU's signatures)

def sparse_dense_matmul(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor,
                        gains: torch.Tensor, embedding_table: torch.Tensor, device_batch_size: int,
                        max_ids_per_partition: int, max_unique_ids_per_partition: int) -> torch.Tensor:
    """Embedding lookup with combining: ``out[sample_ids[i]] += gains[i] * embedding_table[embedding_ids[i]]``.

    Over the real entries of the SparseCore layout (module docstring: rows end at
    ``row_pointers``, padding carries ``PAD_VALUE``). ``embedding_table`` is ``[V, D]`` (float),
    the ids and ``row_pointers`` 1-D integer, ``gains`` 1-D float of the ids' length; the result
    is ``[device_batch_size, D]`` in the table's dtype (float32 accumulation), equal to the dense
    ``A @ embedding_table`` with ``A[s, e] = sum of gains``. Differentiable in ``embedding_table``.
    Raises TypeError / ValueError naming the argument for wrong dtypes, ranks, lengths or devices,
    row pointers that decrease or point past the ids, a row holding more than
    ``max_ids_per_partition`` ids (``max_unique_ids_per_partition`` distinct ones), and ids out of
    range (``embedding_ids`` vs the table's rows, ``sample_ids`` vs ``device_batch_size``).
    """
    return torch.ops.tpu.sparse_dense_matmul(row_pointers, embedding_ids, sample_ids, gains, embedding_table,
                                             device_batch_size, max_ids_per_partition, max_unique_ids_per_partition)


def sparse_dense_matmul_grad_with_sgd(row_pointers: torch.Tensor, embedding_ids: torch.Tensor,
                                      sample_ids: torch.Tensor, gains: torch.Tensor, embedding_table: torch.Tensor,
                                      activations_grad: torch.Tensor, learning_rate: torch.Tensor,
                                      device_batch_size: int, max_ids_per_partition: int,
                                      max_unique_ids_per_partition: int, computation_name: str) -> torch.Tensor:
    """The backward of :func:`sparse_dense_matmul` fused with an SGD step; returns the updated table.

    ``g[e] = sum of gains[i] * activations_grad[sample_ids[i]]`` over entries with that id; each
    looked-up row becomes ``table[e] - learning_rate * g[e]`` (``learning_rate`` a one-element
    tensor); other rows are unchanged. ``activations_grad`` is ``[device_batch_size, D]``;
    ``computation_name`` names the SparseCore program and is unused here. Errors as
    :func:`sparse_dense_matmul`, plus shape checks of ``activations_grad`` and ``learning_rate``.
    """
    return torch.ops.tpu.sparse_dense_matmul_grad_with_sgd(
        row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad, learning_rate,
        device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name)


def sparse_dense_matmul_grad_with_adagrad(row_pointers: torch.Tensor, embedding_ids: torch.Tensor,
                                          sample_ids: torch.Tensor, gains: torch.Tensor,
                                          embedding_table: torch.Tensor, accumulator: torch.Tensor,
                                          activations_grad: torch.Tensor, learning_rate: torch.Tensor,
                                          epsilon: float, device_batch_size: int, max_ids_per_partition: int,
                                          max_unique_ids_per_partition: int,
                                          computation_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of :func:`sparse_dense_matmul` fused with Adagrad; returns (table, accumulator) updated.

    For each looked-up row ``e`` with summed gradient ``g`` (as in the SGD op):
    ``acc[e] += g**2`` and ``table[e] -= learning_rate * g / (sqrt(acc[e]) + epsilon)``
    (torch.optim.Adagrad's form); rows not looked up keep their values. ``accumulator`` has the
    table's shape. Errors as :func:`sparse_dense_matmul_grad_with_sgd`.
    """
    return torch.ops.tpu.sparse_dense_matmul_grad_with_adagrad(
        row_pointers, embedding_ids, sample_ids, gains, embedding_table, accumulator, activations_grad, learning_rate,
        epsilon, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name)


def sparse_dense_matmul_grad_with_adam(row_pointers: torch.Tensor, embedding_ids: torch.Tensor,
                                       sample_ids: torch.Tensor, gains: torch.Tensor, embedding_table: torch.Tensor,
                                       momentum: torch.Tensor, velocity: torch.Tensor, activations_grad: torch.Tensor,
                                       alpha_t: torch.Tensor, beta_1: float, beta_2: float, epsilon: float,
                                       device_batch_size: int, max_ids_per_partition: int,
                                       max_unique_ids_per_partition: int,
                                       computation_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`sparse_dense_matmul` fused with (lazy) Adam; returns (table, momentum, velocity).

    For each looked-up row with summed gradient ``g``: ``m += (1 - beta_1) * (g - m)``,
    ``v += (1 - beta_2) * (g**2 - v)``, ``table -= alpha_t * m / (sqrt(v) + epsilon)``, where
    ``alpha_t`` (a one-element tensor) is the bias-corrected step size the caller computes, as on
    the SparseCore; rows not looked up keep table and moments. Errors as the SGD op.
    """
    return torch.ops.tpu.sparse_dense_matmul_grad_with_adam(
        row_pointers, embedding_ids, sample_ids, gains, embedding_table, momentum, velocity, activations_grad,
        alpha_t, beta_1, beta_2, epsilon, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition,
        computation_name)


def sparse_dense_matmul_activation_unstack(stacked_activations: torch.Tensor, per_feature_batch_sizes: Sequence[int],
                                           per_feature_dims: Sequence[int]) -> list[torch.Tensor]:
    """Splits a stacked lookup result into per-feature activations.

    Features that share a table are stacked along the batch: feature ``f`` is rows
    ``sum(per_feature_batch_sizes[:f]) ..`` (``per_feature_batch_sizes[f]`` of them) and its first
    ``per_feature_dims[f]`` columns (narrower tables are padded to the stacked width). Returns new
    tensors ``[B_f, D_f]``. ValueError when the lists differ in length, hold a non-positive size,
    need more rows or columns than ``stacked_activations`` has.
    """
    return torch.ops.tpu.sparse_dense_matmul_activation_unstack(stacked_activations, list(per_feature_batch_sizes),
                                                                list(per_feature_dims))


def sparse_dense_matmul_gradient_stack(unstacked_gradients: Sequence[torch.Tensor], stacked_batch_size: int,
                                       stacked_feature_dim: int) -> torch.Tensor:
    """The inverse of :func:`sparse_dense_matmul_activation_unstack` for gradients.

    Returns ``[stacked_batch_size, stacked_feature_dim]``: gradient ``f`` in its rows and first
    columns, zeros elsewhere. ValueError / TypeError for an empty list, tensors that are not 2-D
    floats of one dtype and device, or more rows / columns than the stacked shape.
    """
    return torch.ops.tpu.sparse_dense_matmul_gradient_stack(list(unstacked_gradients), stacked_batch_size,
                                                            stacked_feature_dim)


def sparse_gather(row_pointers: torch.Tensor, indices: torch.Tensor, operand: torch.Tensor,
                  max_non_zeroes_per_row: int) -> torch.Tensor:
    """CSR gather: ``out[j] = operand[indices[j]]`` for the entries ``j`` inside the rows, zero elsewhere.

    ``row_pointers`` are standard CSR offsets (``R + 1``, non-decreasing, within
    ``len(indices)``); entries outside ``row_pointers[0] .. row_pointers[-1]`` are padding.
    Result ``[len(indices), *operand.shape[1:]]``; differentiable in ``operand`` (through
    :func:`sparse_gather_backward`). ValueError naming the argument for a row longer than
    ``max_non_zeroes_per_row``, decreasing or out-of-bounds row pointers and indices out of range
    for ``operand``'s rows.
    """
    return torch.ops.tpu.sparse_gather(row_pointers, indices, operand, max_non_zeroes_per_row)


def sparse_gather_backward(grad_output: torch.Tensor, indices: torch.Tensor,
                           grad_operand: torch.Tensor) -> torch.Tensor:
    """``grad_operand`` plus ``grad_output[j]`` scattered into row ``indices[j]`` for every ``j`` (a new tensor).

    ``grad_output`` is ``[len(indices), *grad_operand.shape[1:]]`` in ``grad_operand``'s dtype;
    every index must be a row of ``grad_operand`` (ValueError naming it otherwise).
    """
    return torch.ops.tpu.sparse_gather_backward(grad_output, indices, grad_operand)


def sparse_iota(row_pointers: torch.Tensor, max_non_zeroes: int, max_non_zeroes_per_row: int) -> torch.Tensor:
    """Each entry's position within its CSR row: ``out[j] = j - row_pointers[r]`` for ``j`` in row ``r``.

    Result ``[max_non_zeroes]`` in ``row_pointers``' dtype, 0 outside the rows. ValueError when
    ``row_pointers[-1]`` exceeds ``max_non_zeroes``, a row is longer than
    ``max_non_zeroes_per_row`` or the offsets decrease.
    """
    return torch.ops.tpu.sparse_iota(row_pointers, max_non_zeroes, max_non_zeroes_per_row)


def sparse_map_row(csr_tensors: Sequence[torch.Tensor], csr_lengths: Sequence[int], dense_args: Sequence[torch.Tensor],
                   body_mlir: str, dummy_outputs: Sequence[torch.Tensor], max_non_zeroes_per_row: int, pad_value: int,
                   max_pad_per_row: int, wait_threshold: float, result_row_pointer_op_index: int) -> list[torch.Tensor]:
    """Not available: raises NotImplementedError.

    TorchTPU runs ``body_mlir`` (an MLIR function compiled for the SparseCore) over each CSR row;
    the vTPU does not model SparseCores and has no compiler for that MLIR, so there is nothing
    faithful to run it on. Express the row function in PyTorch ops over the tensors instead.
    """
    raise NotImplementedError("torch.tpu.ops.sparse_map_row: body_mlir is an MLIR function for the SparseCore, "
                              "which the vTPU does not model (no SparseCore and no compiler for its MLIR); write "
                              "the row function with PyTorch ops instead")
