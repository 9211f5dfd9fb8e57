"""Topology-aware device meshes: rank layouts whose mesh axes follow the slice's ICI rings,
and, across slices (multislice), put the slices on the axes named by ``dcn_mesh_shape``."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence

import torch

from .. import _C


def _rank_places(world_size: int, local_world_size: int | None = None) -> list[tuple[int, int, int]]:
    """(slice, chip id in the slice, host over all slices) of each rank; see :func:`rank_chips`."""
    topo = _C._topology()
    per_host = topo["chips_per_host"]
    hosts_per_slice = topo["num_hosts"]
    slices = topo["num_slices"]
    local = int(local_world_size or os.environ.get("LOCAL_WORLD_SIZE", 0) or per_host)
    if local > per_host:
        raise ValueError(f"{local} ranks per host, but a host of {topo['name']} has {per_host} chips")
    hosts = -(-world_size // local)
    if hosts > hosts_per_slice * slices:
        where = f"{slices} slices of {topo['name']} have" if slices > 1 else f"topology {topo['name']} has"
        raise ValueError(f"{world_size} ranks at {local} per host need {hosts} hosts; "
                         f"{where} {hosts_per_slice * slices}")
    places = []
    for r in range(world_size):
        host = r // local
        chip = _C._tpu_dist_host_chips(host % hosts_per_slice)[r % local]
        places.append((host // hosts_per_slice, chip, host))
    return places


def rank_chips(world_size: int, local_world_size: int | None = None) -> list[int]:
    """Chip id (in its slice) of each rank, for ranks launched one per chip and host by host.

    Rank ``r`` runs on host ``r // local_world_size`` as ``tpu:(r % local_world_size)``,
    which is that host's chip ``chips_of_host(host)[r % local_world_size]`` (ascending chip
    ids). Hosts are numbered slice by slice (``TORCH_TPU_SLICES``): host ``h`` is host
    ``h % hosts_per_slice`` of slice ``h // hosts_per_slice``. ``local_world_size`` defaults
    to ``LOCAL_WORLD_SIZE`` or the chips per host.

    Raises ValueError when the ranks do not fit the slices.
    """
    return [chip for _, chip, _ in _rank_places(world_size, local_world_size)]


def _shape_arg(value, name: str) -> tuple[int, ...]:
    """A mesh shape argument as a tuple of positive ints; TypeError/ValueError naming it."""
    if isinstance(value, int) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a tuple of ints, got {type(value).__name__} {value!r}")
    items = tuple(value)
    for s in items:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"{name} must be a tuple of ints, got {items!r}")
        if s < 1:
            raise ValueError(f"{name} {items} has an axis of size {s}; every axis needs at least 1")
    return items


def _whole_axes(mesh_shape: Sequence[int], extents: list[int]) -> list[list[tuple[int, int, int]]] | None:
    """Each mesh axis on whole physical axes (no physical axis split between mesh axes), or None.

    Mesh axes are placed innermost (last) first; each takes the fewest, lowest physical axes
    whose extents multiply to its size; backtracks when a later axis cannot be placed.
    """
    axes = [a for a in range(len(extents)) if extents[a] > 1]

    def place(i: int, free: frozenset[int]):
        if i < 0:
            return [] if not free else None
        m = mesh_shape[i]
        options = [()] if m == 1 else [c for k in range(1, len(free) + 1)
                                       for c in itertools.combinations(sorted(free), k)
                                       if math.prod(extents[a] for a in c) == m]
        for combo in options:
            rest = place(i - 1, free - set(combo))
            if rest is not None:
                return rest + [[(a, extents[a], 1) for a in combo]]
        return None

    return place(len(mesh_shape) - 1, frozenset(axes))


def _split_axes(mesh_shape: Sequence[int], extents: list[int]) -> list[list[tuple[int, int, int]]]:
    """For each mesh axis, the physical pieces (axis, factor, stride) it walks, splitting
    physical axes where needed.

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
            raise ValueError(f"mesh_shape {tuple(mesh_shape)} does not fit the torus: its axes do not factor "
                             f"onto the {'x'.join(map(str, extents))} box of chips the ranks occupy")
    return pieces


def _box_coords(mesh_shape: tuple[int, ...], extents: list[int], allow_split: bool) -> torch.Tensor:
    """Box coordinates (x, y, z) of each mesh position: int64 tensor of shape mesh_shape + (3,).

    Consecutive positions along a mesh axis are one ICI hop apart: an axis spanning several
    physical axes walks them as a snake.
    """
    pieces = _whole_axes(mesh_shape, extents)
    if pieces is None:
        if not allow_split:
            raise ValueError(f"mesh_shape {mesh_shape} needs a physical axis of the "
                             f"{'x'.join(map(str, extents))} box of chips split between mesh axes; "
                             "pass allow_split_physical_axes=True to allow it")
        pieces = _split_axes(mesh_shape, extents)
    out = torch.zeros(*mesh_shape, 3, dtype=torch.int64)
    for index in itertools.product(*[range(s) for s in mesh_shape]):
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
        out[index] = torch.tensor(xyz)
    return out


def _interleave(outer: torch.Tensor, inner: torch.Tensor, nd: int, combine) -> torch.Tensor:
    """Blocks along each of the first ``nd`` axes: position p of an axis is block
    ``p // inner_size`` of ``outer`` and position ``p % inner_size`` of ``inner``; ``combine``
    joins the two values (trailing axes beyond ``nd``, e.g. coordinates, broadcast)."""
    o_shape, i_shape = outer.shape[:nd], inner.shape[:nd]
    o = outer.reshape([d for s in o_shape for d in (s, 1)] + list(outer.shape[nd:]))
    i = inner.reshape([d for s in i_shape for d in (1, s)] + list(inner.shape[nd:]))
    joined = combine(o, i)
    return joined.reshape([a * b for a, b in zip(o_shape, i_shape)] + list(joined.shape[2 * nd:]))


def _factor_inner(shape: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """Sizes per axis whose product is ``count``, dividing ``shape``, filled from the last axis."""
    inner, left = [1] * len(shape), count
    for a in reversed(range(len(shape))):
        g = math.gcd(left, shape[a])
        inner[a], left = g, left // g
    return tuple(inner) if left == 1 else None


def _slice_layout(mesh_shape: tuple[int, ...], chips: list[int], hosts: list[int], allow_split: bool,
                  contiguous: bool) -> torch.Tensor:
    """Layout of one slice's ranks (0 .. len(chips) - 1) on ICI, shape mesh_shape."""
    n = len(chips)
    coords = [_C._tpu_dist_chip_coords(c) for c in chips]
    lo = [min(c[a] for c in coords) for a in range(3)]
    extents = [max(c[a] for c in coords) - lo[a] + 1 for a in range(3)]
    rel = [tuple(c[a] - lo[a] for a in range(3)) for c in coords]
    rank_at = {xyz: r for r, xyz in enumerate(rel)}
    multi_host = len(set(hosts)) > 1
    if math.prod(extents) != n or len(rank_at) != n:
        if contiguous and multi_host:
            raise ValueError("contiguous_submeshes=True needs the ranks of each slice to fill a box of chips; "
                             f"chips {sorted(chips)} do not")
        # Ranks do not fill a box: keep the snake order of their chips.
        return torch.tensor(_C._tpu_dist_ring_order(chips), dtype=torch.int64).reshape(mesh_shape)
    if contiguous and multi_host:
        # Each host's ranks must be one block of a grid of equal blocks: then the mesh is a
        # grid of hosts (outer) times the chips of a host (inner).
        local = [r for r in range(n) if hosts[r] == hosts[0]]
        inner_ext = [max(rel[r][a] for r in local) - min(rel[r][a] for r in local) + 1 for a in range(3)]
        blocks = {}
        for r in range(n):
            blocks.setdefault(tuple(rel[r][a] // inner_ext[a] for a in range(3)), set()).add(hosts[r])
        inner_shape = _factor_inner(mesh_shape, len(local))
        if math.prod(inner_ext) != len(local) or any(e % i for e, i in zip(extents, inner_ext)) \
                or any(len(h) != 1 for h in blocks.values()) or len(blocks) != len(set(hosts)) \
                or inner_shape is None:
            raise ValueError(f"contiguous_submeshes=True: mesh_shape {mesh_shape} cannot hold each host's "
                             f"{len(local)} ranks as one block")
        outer_shape = tuple(m // i for m, i in zip(mesh_shape, inner_shape))
        try:
            inner = _box_coords(inner_shape, inner_ext, allow_split)
            outer = _box_coords(outer_shape, [e // i for e, i in zip(extents, inner_ext)], allow_split)
        except ValueError as e:
            raise ValueError(f"contiguous_submeshes=True: {e}") from None
        xyz = _interleave(outer, inner, len(mesh_shape), lambda o, i: o * torch.tensor(inner_ext) + i)
    else:
        xyz = _box_coords(mesh_shape, extents, allow_split)
    flat = [rank_at[tuple(p)] for p in xyz.reshape(-1, 3).tolist()]
    return torch.tensor(flat, dtype=torch.int64).reshape(mesh_shape)


def _default_dcn(mesh_shape: tuple[int, ...], slices: int) -> tuple[int, ...]:
    """Slices on the leading mesh axes (data parallelism outermost), as far as they divide."""
    dcn, left = [], slices
    for m in mesh_shape:
        g = math.gcd(left, m)
        dcn.append(g)
        left //= g
    if left != 1:
        raise ValueError(f"mesh_shape {mesh_shape} cannot place {slices} slices on its axes; pass dcn_mesh_shape")
    return tuple(dcn)


def topology_aware_mesh(mesh_shape: Sequence[int], world_size: int | None = None, *,
                        dcn_mesh_shape: Sequence[int] | None = None, allow_split_physical_axes: bool = True,
                        contiguous_submeshes: bool = False) -> torch.Tensor:
    """Rank layout for ``DeviceMesh`` whose axes follow physical ICI rings, slices joined over DCN.

    Args:
        mesh_shape: sizes of the mesh axes, e.g. ``(2, 4)``; their product is the number of
            ranks (default world size: ``torch.distributed`` if initialised, else all chips of
            all slices).
        world_size: override the number of ranks.
        dcn_mesh_shape: slices per mesh axis (multislice, ``TORCH_TPU_SLICES``): same length as
            ``mesh_shape``, each entry dividing it, product = the slices the ranks span. Axis
            ``a`` then holds ``dcn_mesh_shape[a]`` blocks of ``mesh_shape[a] //
            dcn_mesh_shape[a]`` positions, one block per slice, and each slice's ranks are laid
            out on ICI with the per-slice shape. Default: the slices go on the leading axes
            (``(slices, 1, ...)`` when the first axis allows).
        allow_split_physical_axes: allow a physical torus axis to be split between mesh axes
            (e.g. ``(2, 2, 2)`` on a 2x4 slice). False raises ValueError when that is needed.
        contiguous_submeshes: lay out each host's ranks as one contiguous block of the mesh
            (host-local mesh axes innermost); ValueError when the shape cannot.

    Returns:
        An int64 CPU tensor of shape ``mesh_shape`` holding ranks, the same on every rank. The
        last mesh axis gets whole torus rings first (place the axis with the most traffic, e.g.
        tensor parallel, last); an axis larger than any ring snakes through several physical
        axes so that consecutive ranks stay one ICI hop apart. Ranks map to chips as in
        :func:`rank_chips` (slice by slice).

    Raises:
        TypeError: a shape is not a tuple of ints.
        ValueError: the product of ``mesh_shape`` differs from the number of ranks, the shape
            does not fit the torus of the ranks' chips, or ``dcn_mesh_shape`` /
            ``allow_split_physical_axes`` / ``contiguous_submeshes`` cannot be met (the message
            names the argument).

    Example::

        mesh = DeviceMesh("tpu", torch.tpu.topology_aware_mesh((2, 4)), mesh_dim_names=("dp", "tp"))
    """
    mesh_shape = _shape_arg(mesh_shape, "mesh_shape")
    if world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
        else:
            topo = _C._topology()
            world_size = topo["num_chips"] * topo["num_slices"]
    n = math.prod(mesh_shape)
    if n != world_size:
        raise ValueError(f"mesh_shape {mesh_shape} has {n} positions for {world_size} ranks")
    places = _rank_places(world_size)
    slices = sorted({s for s, _, _ in places})
    if dcn_mesh_shape is None:
        dcn = _default_dcn(mesh_shape, len(slices))
    else:
        dcn = _shape_arg(dcn_mesh_shape, "dcn_mesh_shape")
        if len(dcn) != len(mesh_shape):
            raise ValueError(f"dcn_mesh_shape {dcn} has {len(dcn)} axes; mesh_shape {mesh_shape} has "
                             f"{len(mesh_shape)}")
        if math.prod(dcn) != len(slices):
            raise ValueError(f"dcn_mesh_shape {dcn} places {math.prod(dcn)} slices; the {world_size} ranks span "
                             f"{len(slices)} (TORCH_TPU_SLICES={_C._topology()['num_slices']})")
        for a, (m, d) in enumerate(zip(mesh_shape, dcn)):
            if m % d:
                raise ValueError(f"dcn_mesh_shape[{a}]={d} does not divide mesh_shape[{a}]={m}")
    per_slice = world_size // len(slices)
    if any(places[r][0] != slices[r // per_slice] for r in range(world_size)):
        raise ValueError(f"the {world_size} ranks do not fill their {len(slices)} slices evenly")
    ici_shape = tuple(m // d for m, d in zip(mesh_shape, dcn))
    first = places[:per_slice]
    for k in range(1, len(slices)):
        if [c for _, c, _ in places[k * per_slice:(k + 1) * per_slice]] != [c for _, c, _ in first]:
            raise ValueError(f"the ranks of slice {slices[k]} run on other chips than those of slice {slices[0]}")
    local = _slice_layout(ici_shape, [c for _, c, _ in first], [h for _, _, h in first],
                          bool(allow_split_physical_axes), bool(contiguous_submeshes))
    if len(slices) == 1:
        return local
    slice_ids = torch.arange(len(slices), dtype=torch.int64).reshape(dcn)
    return _interleave(slice_ids, local, len(mesh_shape), lambda s, r: s * per_slice + r)


def init_topology_aware_device_mesh(mesh_shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None):
    """``DeviceMesh("tpu", topology_aware_mesh(mesh_shape), mesh_dim_names=...)`` (needs an
    initialised process group; see :func:`topology_aware_mesh`)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("tpu", topology_aware_mesh(mesh_shape),
                      mesh_dim_names=tuple(mesh_dim_names) if mesh_dim_names else None)
