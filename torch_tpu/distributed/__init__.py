"""``tpu_dist``: the torch.distributed backend of torch_tpu.

One process per chip. ``import torch`` (or ``import torch_tpu``) registers the
backend as ``"tpu_dist"`` (alias ``"tpu"``) for the devices ``tpu`` and ``cpu``,
so ``Backend.default_device_backend_map["tpu"] == "tpu_dist"`` and all of these
work::

    dist.init_process_group("tpu_dist")
    dist.init_process_group(device_id=torch.device("tpu", local_rank))
    init_device_mesh("tpu", (2, 4))

Collectives between the processes of a host travel through POSIX shared memory
(the model's ICI) with ring algorithms ordered along the torus rings of the
chips the ranks run on (see ``csrc/distributed``). Each collective adds its
estimated ICI time to :func:`torch_tpu.runtime.stats` (``ici_seconds``,
``ici_bytes``, ``collective_bytes``, ``collectives``).

Failures never hang: a rank whose process dies makes every other rank raise
``torch.distributed.DistBackendError`` naming it within a fraction of a second;
a rank that stalls makes the others raise after the group's timeout (the one
passed to ``init_process_group``/``new_group``; when none is passed, 60 s;
``TORCH_TPU_DIST_TIMEOUT`` in seconds overrides both). Ranks calling different
collectives, or the same one with different sizes, dtypes, reduce ops or roots,
all raise the same ``RuntimeError`` before any data moves.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from .. import _C
from .mesh import init_topology_aware_device_mesh, rank_chips, topology_aware_mesh  # noqa: F401

BACKEND_NAME = "tpu_dist"
ALIASES = ("tpu",)
#: Collective timeout when init_process_group/new_group got PyTorch's default (30 min).
DEFAULT_TIMEOUT = timedelta(seconds=60)


def _timeout_seconds(timeout) -> float:
    """The group's collective timeout in seconds (see module docstring)."""
    env = os.environ.get("TORCH_TPU_DIST_TIMEOUT")
    if env:
        try:
            value = float(env)
        except ValueError:
            raise ValueError(f"TORCH_TPU_DIST_TIMEOUT={env!r}: expected seconds (a number)") from None
        if value <= 0:
            raise ValueError(f"TORCH_TPU_DIST_TIMEOUT={env!r}: must be positive")
        return value
    if timeout is None or timeout == dist.constants.default_pg_timeout:
        return DEFAULT_TIMEOUT.total_seconds()
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def host_id() -> int:
    """This process's host, counted over all slices (``TORCH_TPU_SLICES``): ``TORCH_TPU_HOST_ID``
    (default 0), as the runtime reads it."""
    return int(os.environ.get("TORCH_TPU_HOST_ID", "0") or 0)


def _create_backend(dist_opts, pg_opts=None):
    """Creator passed to ``Backend.register_backend`` (extended API).

    ``dist_opts`` is a ``torch._C._distributed_c10d._DistributedBackendOptions``:
    store (a PrefixStore unique to the group), group_rank, group_size, timeout,
    group_id and global_ranks_in_group. Rendezvous happens here: the ranks publish
    their hosts; those of one host create shared-memory segments and map each
    other's. A group spanning hosts also gets two gloo groups for the part that
    crosses hosts (TCP, the slice's DCN): one per local index across hosts, and
    one over all ranks for collectives without a hierarchical form.
    """
    store, rank, size = dist_opts.store, dist_opts.group_rank, dist_opts.group_size
    timeout = _timeout_seconds(dist_opts.timeout)
    hosts = [host_id()] * size
    if size > 1:
        store.set(f"tpu_dist/host/{rank}", str(hosts[rank]))
        hosts = [int(store.get(f"tpu_dist/host/{r}")) for r in range(size)]
    cross = flat = None
    if len(set(hosts)) > 1:
        from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

        ids = sorted(set(hosts))
        per_host = [hosts.count(h) for h in ids]
        local_index = [r for r in range(size) if hosts[r] == hosts[rank]].index(rank)
        gloo_timeout = timedelta(seconds=timeout)
        if len(set(per_host)) == 1:
            cross = ProcessGroupGloo(PrefixStore(f"tpu_dist/cross{local_index}/", store), ids.index(hosts[rank]),
                                     len(ids), gloo_timeout)
        flat = ProcessGroupGloo(PrefixStore("tpu_dist/flat/", store), rank, size, gloo_timeout)
    return _C._tpu_dist_create(store, rank, size, timeout, str(dist_opts.group_id),
                               list(dist_opts.global_ranks_in_group), hosts, cross, flat)


def _register() -> None:
    if not dist.is_available():
        return
    for name in (BACKEND_NAME,) + ALIASES:
        if name.upper() in dist.Backend._plugins:
            continue
        dist.Backend.register_backend(name, _create_backend, extended_api=True, devices=["tpu", "cpu"])


def is_tpu_dist(group=None) -> bool:
    """True when ``group`` (default: the world) runs on tpu_dist."""
    backend = dist.get_backend(group)
    return str(backend) in (BACKEND_NAME,) + ALIASES


def leftover_segments() -> list[str]:
    """Names of tpu_dist shared-memory segments present in /dev/shm on this host.

    Segments are unlinked as soon as every rank of a group has mapped them, so
    this is empty outside group creation; names whose creator died are removed
    by :func:`remove_stale_segments` (also run at each process's first group).
    """
    names = _C._tpu_dist_segments()
    return names.split(",") if names else []


def remove_stale_segments() -> int:
    """Unlink tpu_dist segments whose creating process is gone; returns how many."""
    return _C._tpu_dist_remove_stale_segments()


_register()

__all__ = [
    "BACKEND_NAME",
    "DEFAULT_TIMEOUT",
    "init_topology_aware_device_mesh",
    "is_tpu_dist",
    "leftover_segments",
    "rank_chips",
    "remove_stale_segments",
    "topology_aware_mesh",
]
