"""Topology-aware device meshes: rank layouts whose mesh axes follow the slice's ICI rings."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from .. import _C


def rank_chips(world_size: int, local_world_size: int | None = None) -> list[int]:
    """Global chip id of each rank, for ranks launched one per chip and host by host.

    Rank ``r`` runs on host ``r // local_world_size`` as ``tpu:(r % local_world_size)``,
    which is that host's chip ``chips_of_host(host)[r % local_world_size]`` (ascending chip
    ids). ``local_world_size`` defaults to ``LOCAL_WORLD_SIZE`` or the chips per host.

    Raises ValueError when the ranks do not fit the slice.
    """
    topo = _C._topology()
    per_host = topo["chips_per_host"]
    local = int(local_world_size or os.environ.get("LOCAL_WORLD_SIZE", 0) or per_host)
    if local > per_host:
        raise ValueError(f"{local} ranks per host, but a host of {topo['name']} has {per_host} chips")
    hosts = -(-world_size // local)
    if hosts > topo["num_hosts"]:
        raise ValueError(f"{world_size} ranks at {local} per host need {hosts} hosts; "
                         f"topology {topo['name']} has {topo['num_hosts']}")
    chips = []
    for r in range(world_size):
        chips.append(_C._tpu_dist_host_chips(r // local)[r % local])
    return chips


def _assign(mesh_shape: Sequence[int], extents: list[int]) -> list[list[tuple[int, int, int]]]:
    """For each mesh axis, the physical pieces (axis, factor, stride) it walks.

    Mesh axes are placed innermost (last) first, so the last axis, usually the one with the
    most traffic (tensor parallel), gets whole physical rings.
    """
    remaining = list(extents)
    used = [1] * len(extents)  # stride already taken on each physical axis
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in mesh_shape]
    for i in reversed(range(len(mesh_shape))):
        m = mesh_shape[i]
        if m == 1:
            continue
        whole = [a for a in range(len(extents)) if remaining[a] == m and used[a] == 1]
        part = [a for a in range(len(extents)) if remaining[a] > 1 and remaining[a] % m == 0]
        if whole or part:
            a = (whole or part)[0]
            pieces[i].append((a, m, used[a]))
            used[a] *= m
            remaining[a] //= m
            continue
        # Several physical axes together, walked as a snake: whole axes first, then a part
        # of one more.
        need = m
        for a in range(len(extents)):
            if need > 1 and remaining[a] > 1 and need % remaining[a] == 0:
                f = remaining[a]
                pieces[i].append((a, f, used[a]))
                used[a] *= f
                remaining[a] = 1
                need //= f
        for a in range(len(extents)):
            if need > 1 and remaining[a] > 1 and remaining[a] % need == 0:
                pieces[i].append((a, need, used[a]))
                used[a] *= need
                remaining[a] //= need
                need = 1
        if need != 1:
            raise ValueError(f"mesh shape {tuple(mesh_shape)} does not factor onto the chips' box "
                             f"{tuple(extents)}")
    return pieces


def topology_aware_mesh(mesh_shape: Sequence[int], world_size: int | None = None) -> torch.Tensor:
    """Rank layout for ``DeviceMesh`` whose axes follow physical ICI rings.

    Args:
        mesh_shape: sizes of the mesh axes, e.g. ``(2, 4)``; their product is the number of
            ranks (default world size: ``torch.distributed`` if initialised, else all chips).
        world_size: override the number of ranks.

    Returns:
        An int64 CPU tensor of shape ``mesh_shape`` holding ranks, the same on every rank. The
        last mesh axis gets whole torus rings first (place the axis with the most traffic, e.g.
        tensor parallel, last); an axis larger than any ring snakes through several physical
        axes so that consecutive ranks stay one ICI hop apart. Ranks map to chips as in
        :func:`rank_chips`.

    Raises:
        ValueError: the product of ``mesh_shape`` differs from the number of ranks, or the
            shape does not factor onto the box of chips the ranks occupy.

    Example::

        mesh = DeviceMesh("tpu", torch.tpu.topology_aware_mesh((2, 4)), mesh_dim_names=("dp", "tp"))
    """
    mesh_shape = tuple(int(s) for s in mesh_shape)
    if world_size is None:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else \
            _C._topology()["num_chips"]
    n = math.prod(mesh_shape)
    if n != world_size:
        raise ValueError(f"mesh shape {mesh_shape} has {n} positions for {world_size} ranks")
    chips = rank_chips(world_size)
    coords = [_C._tpu_dist_chip_coords(c) for c in chips]
    lo = [min(c[a] for c in coords) for a in range(3)]
    extents = [max(c[a] for c in coords) - lo[a] + 1 for a in range(3)]
    rank_at = {tuple(c[a] - lo[a] for a in range(3)): r for r, c in enumerate(coords)}
    if math.prod(extents) != n or len(rank_at) != n:
        # Ranks do not fill a box: keep the snake order of their chips.
        order = _C._tpu_dist_ring_order(chips)
        return torch.tensor(order, dtype=torch.int64).reshape(mesh_shape)
    pieces = _assign(mesh_shape, extents)
    out = torch.empty(mesh_shape, dtype=torch.int64)
    for index in (torch.cartesian_prod(*[torch.arange(s) for s in mesh_shape]).reshape(-1, len(mesh_shape))
                  if len(mesh_shape) > 1 else torch.arange(n).reshape(-1, 1)).tolist():
        xyz = [0, 0, 0]
        for axis, v in enumerate(index):
            factors = [f for _, f, _ in pieces[axis]]
            rest = v
            for j, (a, f, stride) in enumerate(pieces[axis]):
                d = rest % f
                rest //= f
                if (v // math.prod(factors[: j + 1])) % 2 == 1 and j + 1 < len(factors):
                    d = f - 1 - d  # snake: reverse every other row
                xyz[a] += d * stride
        out[tuple(index)] = rank_at[tuple(xyz)]
    return out


def init_topology_aware_device_mesh(mesh_shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None):
    """``DeviceMesh("tpu", topology_aware_mesh(mesh_shape), mesh_dim_names=...)`` (needs an
    initialised process group; see :func:`topology_aware_mesh`)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("tpu", topology_aware_mesh(mesh_shape),
                      mesh_dim_names=tuple(mesh_dim_names) if mesh_dim_names else None)
