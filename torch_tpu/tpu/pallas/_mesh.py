"""JAX meshes over the tpu chips (one JAX CPU device per chip). Private."""

from __future__ import annotations

import math
from collections.abc import Sequence

from . import _jax

jax = _jax.jax()


def get_pallas_mesh(axis_names: Sequence[str] | str, mesh_shape: Sequence[int] | None = None,
                    process_group=None) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` over this process's tpu chips, for ``jax_op(..., mesh=)``.

    JAX device ``i`` stands for chip ``tpu:i``; the mesh lays the chips out row-major in
    ``mesh_shape``. Kernels under it may use remote DMAs and semaphores between devices
    (``pltpu.make_async_remote_copy``), run by Pallas's TPU interpret mode.

    Args:
        axis_names: one name per mesh dimension ("x" or ("x", "y")).
        mesh_shape: chips per dimension; default: all chips along one axis (needs one name).
        process_group: the group whose chips form the mesh; only a group of one process
            (or None) is supported: the chips this process drives.

    Raises:
        ValueError: names and shape of different lengths, a shape that does not multiply to
            at most the chip count, duplicate names.
        NotImplementedError: a process group spanning several processes (one process per
            chip): each process's JAX sees only its own chips (docs/pallas.md).
        RuntimeError: JAX was started before torch.tpu.pallas with fewer devices than chips.
    """
    import torch

    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"get_pallas_mesh: axis_names must be distinct non-empty strings, got {axis_names!r}")
    chips = torch.tpu.device_count()
    if process_group is not None:
        import torch.distributed as dist

        if dist.get_world_size(process_group) > 1:
            raise NotImplementedError(
                f"get_pallas_mesh: process_group spans {dist.get_world_size(process_group)} processes; a Pallas "
                "mesh covers the chips of one process (JAX on the vTPU runs in-process: one process driving all "
                "chips of the mesh works, one process per chip does not). Build the mesh in a single process "
                "over its chips (process_group=None)")
    if mesh_shape is None:
        if len(names) != 1:
            raise ValueError(f"get_pallas_mesh: mesh_shape is needed for {len(names)} axis names {names}")
        shape = (chips,)
    else:
        shape = tuple(int(s) for s in mesh_shape)
    if len(shape) != len(names) or any(s < 1 for s in shape):
        raise ValueError(f"get_pallas_mesh: mesh_shape {tuple(mesh_shape)} needs one positive size per axis name "
                         f"{names}")
    need = math.prod(shape)
    if need > chips:
        raise ValueError(f"get_pallas_mesh: mesh_shape {shape} needs {need} chips, this process has {chips}")
    _jax.check_device_count(need, "get_pallas_mesh")
    devices = _jax.cpu_devices()[:need]
    import numpy as np

    return jax.sharding.Mesh(np.array(devices).reshape(shape), names)


def get_default_pallas_mesh() -> jax.sharding.Mesh:
    """All chips of this process along one axis named "x" (``get_pallas_mesh("x")``)."""
    return get_pallas_mesh("x")
