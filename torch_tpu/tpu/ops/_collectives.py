"""Collectives over ``tpu_dist`` in TorchTPU's shapes: gather/scatter along a dim, tagged
send/recv of tensor lists, and XLA's ragged all-to-all.

All of them are built on ``torch.distributed`` collectives of the group's backend, so over
``tpu_dist`` each one is validated, priced by the cost model and counted in
:func:`torch_tpu.runtime.stats` (``collectives``, ``collective_bytes``, ``ici_bytes``,
``ici_seconds``) like any other collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

__all__ = ["all_gather_dim", "ragged_all_to_all", "recv", "reduce_scatter_dim", "send"]

_REDUCE_OPS = ("sum", "avg", "max", "min", "product")


def _group(op: str, group) -> dist.ProcessGroup:
    if not dist.is_initialized():
        raise RuntimeError(f"{op}: torch.distributed is not initialized (call "
                           "dist.init_process_group('tpu_dist') first)")
    if group is None:
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{op}: group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
    return group


def _tensor(op: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    return t


def _dim(op: str, dim, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if ndim == 0 or not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim={dim} is out of range for a {ndim}-d input (expected in [{-ndim}, {ndim - 1}])"
                         if ndim else f"{op}: dim={dim}: a 0-d input has no dim to gather or scatter along")
    return dim % ndim


def _waited(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def all_gather_dim(input: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's ``input`` concatenated along ``dim`` in rank order.

    ``input``: the same shape on every rank; returns ``input.shape`` with ``dim`` multiplied by
    the group size. Differentiable (the gradient is a sum reduce-scatter along ``dim``).
    ``group``: a process group, default the world. Raises IndexError for ``dim`` out of
    range, TypeError for a non-tensor ``input`` or a bad ``group``, RuntimeError when
    torch.distributed is not initialized.
    """
    op = "all_gather_dim"
    pg = _group(op, group)
    d = _dim(op, dim, _tensor(op, "input", input).dim())
    return _waited(funcol.all_gather_single(input.contiguous(), d, pg))


def reduce_scatter_dim(input: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None,
                       reduce_op: str = "sum") -> torch.Tensor:
    """Reduce ``input`` over the group, then keep this rank's chunk along ``dim``.

    ``input.shape[dim]`` must be divisible by the group size ``W``; rank ``r`` gets chunk
    ``r`` of ``W`` equal chunks of the reduction. ``reduce_op``: ``"sum"``, ``"avg"``,
    ``"max"``, ``"min"`` or ``"product"`` (any case); differentiable for ``"sum"`` (the
    gradient is an all-gather along ``dim``). Raises IndexError for ``dim`` out of range,
    ValueError for an unknown ``reduce_op`` or a ``dim`` size not divisible by ``W``.
    """
    op = "reduce_scatter_dim"
    pg = _group(op, group)
    d = _dim(op, dim, _tensor(op, "input", input).dim())
    if not isinstance(reduce_op, str) or reduce_op.lower() not in _REDUCE_OPS:
        raise ValueError(f"{op}: reduce_op must be one of {', '.join(map(repr, _REDUCE_OPS))}, got {reduce_op!r}")
    world = pg.size()
    if input.shape[d] % world:
        raise ValueError(f"{op}: input.shape[dim={dim}] = {input.shape[d]} is not divisible by the group size {world}")
    return _waited(funcol.reduce_scatter_single(input.contiguous(), reduce_op.lower(), d, pg))


def _tensor_list(op: str, tensors) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{op}: tensors must be a sequence of Tensors, got a Tensor (wrap it in a list)")
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        _tensor(op, f"tensors[{i}]", t)
    return tensors


def _peer(op: str, name: str, peer, tag) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < world:
        raise ValueError(f"{op}: {name} must be a rank in [0, {world - 1}], got {peer!r}")
    if peer == rank:
        raise ValueError(f"{op}: {name}={peer} is this rank; send/recv need another rank")
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise TypeError(f"{op}: tag must be an int, got {type(tag).__name__}")


def _point_to_point(op: str, issue, tensors, peer_name: str, peer, tag) -> list[torch.Tensor]:
    """Issues ``issue(t, peer, tag=tag)`` (isend/irecv) for every tensor, then waits for all."""
    _group(op, None)
    tensors = _tensor_list(op, tensors)
    _peer(op, peer_name, peer, tag)
    for work in [issue(t, peer, tag=tag) for t in tensors]:
        work.wait()
    return tensors


def send(tensors: Sequence[torch.Tensor], dst: int, tag: int) -> Any:
    """Send each tensor of ``tensors``, in order, to global rank ``dst`` with ``tag``.

    Matched by a :func:`recv` on ``dst`` with the same ``tag``, tensor count, shapes and
    dtypes (tpu_dist raises naming both sides otherwise). Returns None once every tensor is
    handed to the transport (the sends are issued together, then waited for, like
    ``dist.send``). Raises ValueError for a ``dst`` outside the world or equal to this rank,
    TypeError for a non-int ``tag`` or a non-tensor element.
    """
    _point_to_point("send", dist.isend, tensors, "dst", dst, tag)
    return None


def recv(tensors: Sequence[torch.Tensor], src: int, tag: int) -> Any:
    """Receive into each tensor of ``tensors``, in order, from global rank ``src`` with ``tag``.

    The tensors are filled in place and returned as a list. Errors as :func:`send`.
    """
    return _point_to_point("recv", dist.irecv, tensors, "src", src, tag)


def _resolve_group_name(op: str, name) -> dist.ProcessGroup:
    _group(op, None)
    if name is None:
        return dist.group.WORLD
    if isinstance(name, dist.ProcessGroup):
        return name
    if not isinstance(name, str):
        raise TypeError(f"{op}: process_group_name must be a str (a group's group_name), got {type(name).__name__}")
    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except Exception:  # noqa: BLE001 - c10d raises several types for an unknown name
        raise ValueError(f"{op}: process_group_name={name!r} names no process group (use group.group_name; "
                         f"the world is {dist.group.WORLD.group_name!r})") from None


_INDEX_NAMES = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


def ragged_all_to_all(operand: torch.Tensor, output: torch.Tensor, input_offsets: torch.Tensor,
                      send_sizes: torch.Tensor, output_offsets: torch.Tensor, recv_sizes: torch.Tensor,
                      process_group_name: str, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """XLA's ragged all-to-all (``jax.lax.ragged_all_to_all``) over a process group of ``W`` ranks.

    Rank ``i`` sends ``operand[input_offsets[j] : input_offsets[j] + send_sizes[j]]`` (rows of
    the leading dim) to rank ``j``, which writes them at rows ``output_offsets[j] ...`` of its
    result: ``output_offsets`` are offsets in the *receiver's* buffer, as in XLA.
    ``recv_sizes[j]`` is the row count this rank receives from rank ``j`` (it must equal rank
    ``j``'s ``send_sizes[this rank]``). The four index tensors are 1-D integer tensors of ``W``
    entries (any device). The result starts as a copy of ``output`` (``[R, ...]``, trailing
    dims as ``operand``'s); rows nobody writes keep ``output``'s values. With ``out``
    (``output``'s shape, dtype and device, may be ``output`` itself) the result is written
    there and returned; otherwise ``output`` is left unchanged. ``process_group_name``: a
    group's ``group_name`` (``dist.group.WORLD.group_name`` for the world; None means the
    world). Not differentiable.

    Cost: one all-gather of the ``W x W`` size table (every rank checks every pair, so a bad
    argument on one rank raises on all of them, before data moves) and one
    ``all_to_all_single`` of the rows. Raises ValueError for an unknown group name, a
    negative offset or size, ``input_offsets[j] + send_sizes[j]`` past ``operand``'s rows,
    ``output_offsets[j] + send_sizes[j]`` past rank ``j``'s ``output`` rows, or
    ``recv_sizes`` that disagree with the senders' ``send_sizes``; TypeError for dtypes.
    """
    op = "ragged_all_to_all"
    pg = _resolve_group_name(op, process_group_name)
    world, rank = pg.size(), pg.rank()
    _tensor(op, "operand", operand)
    _tensor(op, "output", output)
    if operand.dim() == 0 or output.dim() != operand.dim() or output.shape[1:] != operand.shape[1:]:
        raise ValueError(f"{op}: output must have operand's trailing dims: operand {tuple(operand.shape)}, "
                         f"output {tuple(output.shape)}")
    if output.dtype != operand.dtype or output.device != operand.device:
        raise TypeError(f"{op}: output is {output.dtype} on {output.device}, operand {operand.dtype} on "
                        f"{operand.device}; they must match")
    if out is not None:
        _tensor(op, "out", out)
        if out.shape != output.shape or out.dtype != output.dtype or out.device != output.device:
            raise ValueError(f"{op}: out must be {tuple(output.shape)} {output.dtype} on {output.device}, "
                             f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    index = {}
    for name, t in zip(_INDEX_NAMES, (input_offsets, send_sizes, output_offsets, recv_sizes)):
        _tensor(op, name, t)
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"{op}: {name} must have an integer dtype, got {t.dtype}")
        if t.dim() != 1 or t.shape[0] != world:
            raise ValueError(f"{op}: {name} must be 1-D with one entry per rank ({world}), got shape {tuple(t.shape)}")
        index[name] = [int(v) for v in t.tolist()]
    io, ss, oo, rs = (index[n] for n in _INDEX_NAMES)

    error = None  # this rank's own argument error, raised after every rank has seen the flags
    for name, values in index.items():
        bad = [j for j, v in enumerate(values) if v < 0]
        if bad and error is None:
            error = f"{name}[{bad[0]}] = {values[bad[0]]} is negative"
    for j in range(world):
        if error is None and io[j] + ss[j] > operand.shape[0]:
            error = (f"input_offsets[{j}] + send_sizes[{j}] = {io[j]} + {ss[j]} = {io[j] + ss[j]} is past "
                     f"operand's {operand.shape[0]} rows")

    # Every rank publishes, per peer j: (output offset at j, rows sent to j, rows expected from j,
    # its own output rows, error flag); all ranks then check every pair alike.
    row = [[oo[j], ss[j], rs[j], output.shape[0], int(error is not None)] for j in range(world)]
    mine = torch.tensor(row, dtype=torch.int64).to(operand.device)
    table = torch.empty((world, world, 5), dtype=torch.int64, device=operand.device)
    dist.all_gather_into_tensor(table, mine, group=pg)
    t = table.tolist()
    if error is not None:
        raise ValueError(f"{op}: {error}")
    failed = [i for i in range(world) if t[i][0][4]]
    if failed:
        raise ValueError(f"{op}: rank {failed[0]} of the group got invalid arguments (its error names them)")
    for i in range(world):
        for j in range(world):
            sent, expected, offset, rows_j = t[i][j][1], t[j][i][2], t[i][j][0], t[j][0][3]
            if sent != expected:
                raise ValueError(f"{op}: rank {i} sends {sent} rows to rank {j} (send_sizes[{j}]) but rank {j} "
                                 f"expects {expected} (recv_sizes[{i}])")
            if offset + sent > rows_j:
                raise ValueError(f"{op}: rank {i}'s output_offsets[{j}] + send_sizes[{j}] = {offset} + {sent} is "
                                 f"past rank {j}'s output rows ({rows_j})")

    result = output.clone() if out is None else (out if out is output else out.copy_(output))
    pieces = [operand[io[j]:io[j] + ss[j]] for j in range(world)]
    send_buf = torch.cat(pieces) if pieces else operand[:0]
    recv_buf = torch.empty((sum(rs), *operand.shape[1:]), dtype=operand.dtype, device=operand.device)
    dist.all_to_all_single(recv_buf, send_buf.contiguous(), output_split_sizes=rs, input_split_sizes=ss, group=pg)
    start = 0
    for i in range(world):
        if rs[i]:
            offset = t[i][rank][0]
            result[offset:offset + rs[i]] = recv_buf[start:start + rs[i]]
        start += rs[i]
    return result
