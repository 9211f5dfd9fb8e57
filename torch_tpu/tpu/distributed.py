"""``torch.tpu.distributed``: TorchTPU's distributed helpers on the vTPU.

- :func:`topology_aware_mesh`: the rank layout for ``DeviceMesh("tpu", mesh=...)`` on one
  slice or on several slices joined over DCN (``TORCH_TPU_SLICES``).
- :func:`spmd_safe`: marks a function as run identically on every rank; tpu_dist then
  compares the shapes of its collectives across ranks too, and across hosts.
- :func:`set_tpu_launch_env`: the environment torchrun / ``mp.spawn`` workers need, set in
  the launching process.
- ``window_num_stripes``, ``window_stripe_chunk_mb``: TorchTPU's striping tunables of
  one-sided window transfers (read and assign); recorded, without effect on the vTPU.

See docs/distributed.md.
"""

import functools as _functools
import os as _os
import socket as _socket
import sys as _sys
import types as _types
from collections.abc import Callable as _Callable
from typing import Any as _Any
from typing import TypeVar as _TypeVar

import torch as _torch

from .. import _C

_F = _TypeVar("_F", bound=_Callable[..., _Any])


def topology_aware_mesh(mesh_shape: tuple[int, ...], *, dcn_mesh_shape: tuple[int, ...] | None = None,
                        allow_split_physical_axes: bool = False,
                        contiguous_submeshes: bool = False) -> _torch.Tensor:
    """Int64 tensor of global ranks with shape ``mesh_shape`` for ``DeviceMesh("tpu", mesh=...)``.

    The ranks are those of the initialised process group (else one per chip of every slice),
    launched host by host (rank ``r`` on ``tpu:LOCAL_RANK``). Mesh axes follow the ICI rings
    of each slice, the last axis first; ``dcn_mesh_shape`` gives the slices per mesh axis
    (product = slices, ``TORCH_TPU_SLICES``; default: the slices on the leading axes), so axis
    ``a`` is ``dcn_mesh_shape[a]`` blocks of one slice each. With
    ``allow_split_physical_axes=False`` (TorchTPU's default) every mesh axis must take whole
    physical torus axes; ``contiguous_submeshes=True`` makes each host's ranks one block.

    Raises:
        TypeError: a shape is not a tuple of ints.
        ValueError: the product of ``mesh_shape`` is not the number of ranks, the shape does
            not fit the torus, ``dcn_mesh_shape`` has the wrong length, does not divide
            ``mesh_shape`` or does not multiply to the number of slices, or a physical axis
            would have to be split while ``allow_split_physical_axes`` is False (each message
            names the argument).

    ``torch.tpu.topology_aware_mesh`` (ours, also taking ``world_size``) allows splitting by
    default.
    """
    from ..distributed.mesh import topology_aware_mesh as _impl

    return _impl(mesh_shape, dcn_mesh_shape=dcn_mesh_shape, allow_split_physical_axes=allow_split_physical_axes,
                 contiguous_submeshes=contiguous_submeshes)


def spmd_safe(func: _F) -> _F:
    """Decorator: ``func`` runs identically on every rank (SPMD).

    Eagerly, the call issues the work queued by ``defer_and_fuse`` before and after ``func``
    (nothing outside fuses into its regions) and, while ``func`` runs, turns on tpu_dist's
    spmd check for the collectives the calling thread issues: ranks must agree on the shapes
    of the tensors too (not only on op, dtype, element count, reduce op and root, which are
    always compared within a host), and groups spanning hosts compare every rank's
    descriptor over DCN before data moves. A disagreement raises the same RuntimeError on
    every rank, listing each rank's collective; the group stays usable. Every rank must call
    the collective inside ``spmd_safe`` (across hosts, a rank outside it makes the others
    time out). Nesting is allowed; the previous setting returns on exit, also on errors.
    Inside ``torch.compile`` it calls ``func`` unchanged.

    Example::

        @torch.tpu.distributed.spmd_safe
        def step(x):
            dist.all_reduce(x)
            return x
    """

    @_functools.wraps(func)
    def wrapper(*args: _Any, **kwargs: _Any) -> _Any:
        if _torch.compiler.is_compiling():
            return func(*args, **kwargs)
        _C._defer_flush()
        previous = _C._tpu_dist_set_spmd_check(True)
        try:
            result = func(*args, **kwargs)
            _C._defer_flush()
        finally:
            _C._tpu_dist_set_spmd_check(previous)
        return result

    return wrapper  # type: ignore[return-value]


def _count(value, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name}={value}: must be at least 1")
    return value


def _free_port() -> int:
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Set, in the launching process, the environment its workers (torchrun, ``mp.spawn``) need.

    Call it before starting ``nproc_per_node`` workers on this host (default: every chip the
    process sees) out of ``nnodes`` hosts (default 1). Worker ``i`` then runs on ``tpu:i``
    (``LOCAL_RANK``). It sets ``TPU_VISIBLE_CHIPS`` (this host's first ``nproc_per_node``
    chips), ``TORCH_TPU_TOPOLOGY`` and ``TORCH_TPU_SLICES`` (the runtime's, so that every
    worker sees the same slices), ``TORCH_TPU_HOST_ID`` (with several hosts), ``WORLD_SIZE``
    (``nnodes * nproc_per_node``) and ``LOCAL_WORLD_SIZE``, and where unset ``MASTER_ADDR``
    (``127.0.0.1``), ``MASTER_PORT`` (a free port; 29500 with several hosts, which must
    agree) and ``OMP_NUM_THREADS=1`` (several workers share the host's cores). This
    process's own runtime keeps what it read at start.

    Raises:
        TypeError: a count is not an int.
        ValueError: a count below 1, ``nproc_per_node`` above the chips this host offers, or
            ``nnodes`` above the hosts of the slices.
    """
    topo = _C._topology()
    hosts = topo["num_hosts"] * topo["num_slices"]
    nnodes = _count(nnodes, "nnodes", 1)
    if nnodes > hosts:
        raise ValueError(f"nnodes={nnodes}: {topo['num_slices']} slice(s) of {topo['name']} have {hosts} host(s)")
    visible = _os.environ.get("TPU_VISIBLE_CHIPS")
    if visible is not None:
        chips = [int(c) for c in visible.split(",") if c.strip()]
    else:
        chips = list(_C._tpu_dist_host_chips(topo["host"] % topo["num_hosts"]))
    if not chips:
        raise ValueError("set_tpu_launch_env: this process sees no chip (TPU_VISIBLE_CHIPS is empty)")
    nproc_per_node = _count(nproc_per_node, "nproc_per_node", len(chips))
    if nproc_per_node > len(chips):
        raise ValueError(f"nproc_per_node={nproc_per_node}: this host offers {len(chips)} chip(s) "
                         f"({'TPU_VISIBLE_CHIPS' if visible is not None else topo['name']})")
    env = _os.environ
    env["TPU_VISIBLE_CHIPS"] = ",".join(str(c) for c in chips[:nproc_per_node])
    env["TORCH_TPU_TOPOLOGY"] = topo["name"]
    env["TORCH_TPU_SLICES"] = str(topo["num_slices"])
    if nnodes > 1 or topo["host"] != 0:
        env["TORCH_TPU_HOST_ID"] = str(topo["host"])
    env["WORLD_SIZE"] = str(nnodes * nproc_per_node)
    env["LOCAL_WORLD_SIZE"] = str(nproc_per_node)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(29500 if nnodes > 1 else _free_port()))
    if nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"expected {name} to be > 0, got {value}")
    return value


# TorchTPU's defaults: at most 4 concurrent DMA stripes of at least 8 MiB per window transfer.
_window = {"num_stripes": 4, "stripe_chunk_mb": 8}


class _DistributedModule(_types.ModuleType):
    @property
    def window_num_stripes(self) -> int:
        """Maximum concurrent stripes of a one-sided window peer transfer (TorchTPU's tunable;
        default 4). Recorded only: the vTPU has no DMA engines to stripe over."""
        return _window["num_stripes"]

    @window_num_stripes.setter
    def window_num_stripes(self, value: int) -> None:
        _window["num_stripes"] = _positive(value, "window_num_stripes")

    @property
    def window_stripe_chunk_mb(self) -> int:
        """Minimum MiB per stripe of a window peer transfer (TorchTPU's tunable; default 8).
        Recorded only, as ``window_num_stripes``."""
        return _window["stripe_chunk_mb"]

    @window_stripe_chunk_mb.setter
    def window_stripe_chunk_mb(self, value: int) -> None:
        _window["stripe_chunk_mb"] = _positive(value, "window_stripe_chunk_mb")


_sys.modules[__name__].__class__ = _DistributedModule
# `torch.tpu` is this package under another name: `import torch.tpu.distributed` must find
# this module, not load a second copy whose relative imports resolve against `torch`.
_sys.modules.setdefault("torch.tpu.distributed", _sys.modules[__name__])

__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh",  # noqa: F822 (module properties:)
           "window_num_stripes", "window_stripe_chunk_mb"]
