"""The device-module functions of ``torch.tpu`` (mirroring ``torch.cuda`` where it makes sense).

Private: ``torch_tpu/tpu/__init__.py`` is the namespace and exports what is public here.
Each tpu device is one vTPU chip of this host. Memory figures are bytes; those
named ``physical`` count the TPU's tiled HBM layout (minor two dimensions
padded to (8,128) tiles for 32-bit types, (16,128) for 16-bit, (32,128) for
8-bit), ``logical`` the bytes tensors asked for.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from .. import _C
from ._utils import _device_index

_DeviceLike = torch.device | str | int | None


class _State:
    initialized = False  # torch.tpu._initialized (set by `import torch_tpu`, then by init())


def init() -> None:
    """Initialise the runtime (reads the topology); idempotent. Raises ValueError for a bad topology."""
    if _State.initialized:
        return
    # `import torch_tpu` registered the hooks already (they may be registered
    # only once); building the runtime is what remains.
    _C._device_count()
    _State.initialized = True


def _drain_at_exit() -> None:
    # Work still queued at exit runs now, while the interpreter and ATen are
    # whole; a failure is printed, since nobody is left to catch it. A forked
    # child has no stream workers (threads do not survive fork): nothing to wait for.
    if os.getpid() != _RUNTIME_PID:
        return
    try:
        count = _C._device_count()
    except Exception:
        return
    for index in range(count):
        try:
            _C._synchronize(index)
        except Exception as error:  # noqa: BLE001 - reported, then exit goes on
            print(f"torch_tpu: work queued on tpu:{index} failed at exit: {error}", file=sys.stderr)
    try:
        _C._settle_autograd_threads(count)  # see the binding: an abort at exit otherwise
    except Exception:  # noqa: BLE001 - best effort at exit
        pass


_RUNTIME_PID = os.getpid()
atexit.register(_drain_at_exit)


def is_initialized() -> bool:
    """True once the runtime is built (at import, unless the environment was invalid)."""
    return _State.initialized


def is_available() -> bool:
    """True when at least one vTPU chip is visible (always, unless TPU_VISIBLE_CHIPS is empty)."""
    try:
        return _C._device_count() > 0
    except Exception:
        return False


def _is_in_bad_fork() -> bool:
    """torch.manual_seed asks this; the vTPU runtime's worker threads do not survive fork,
    but no process state here becomes invalid before the first tpu op."""
    return False


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: bfloat16 is the MXU's native type on every TPU generation (no emulation needed,
    so ``including_emulation`` changes nothing)."""
    return True


def device_count() -> int:
    """Number of chips of this host visible to the process (TPU_VISIBLE_CHIPS restricts it)."""
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    """Select the current tpu. Raises IndexError for an index outside [0, device_count())."""
    _C._set_device(_device_index(device))


class device:
    """Context manager that selects a tpu device for its block (like ``torch.cuda.device``)."""

    def __init__(self, device: _DeviceLike):
        self.idx = _device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = current_device()
        if self.idx is not None and self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *args: Any) -> bool:
        set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that selects the tpu device of ``obj`` (a tensor or anything with
    ``.device``) for its block, like ``torch.cuda.device_of``; an object on another device
    type (a CPU tensor) leaves the current device as it is.

    Raises TypeError when ``obj`` has no ``device`` attribute.
    """

    def __init__(self, obj: Any):
        dev = getattr(obj, "device", None)
        if not isinstance(dev, torch.device):
            raise TypeError(f"torch.tpu.device_of: obj must be a tensor (or have a torch.device .device), "
                            f"got {type(obj).__name__}")
        super().__init__(dev.index if dev.type == "tpu" and dev.index is not None else -1)


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for all queued work of the chip; raises RuntimeError if queued work failed."""
    _C._synchronize(_device_index(device))


class _TPUKind(type):
    """isinstance(x, torch.tpu.Stream) is True for any torch.Stream on tpu (same for Event)."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls._base) and obj.device.type == "tpu"


class Stream(metaclass=_TPUKind):
    """A tpu stream: an in-order work queue of a chip, run by its own worker thread.

    Returns a ``torch.Stream`` (PyTorch's generic stream type checks exact types). As with
    ``torch.cuda.Stream``, ``stream_id=``, ``device_index=``, ``device_type=`` (``kwargs``)
    name an existing stream instead of creating one.
    """

    _base = torch.Stream

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any) -> torch.Stream:
        if kwargs:
            return torch.Stream(**kwargs)
        return torch.Stream(device=torch.device("tpu", _device_index(device)), priority=priority)


class Event(metaclass=_TPUKind):
    """A marker in a tpu stream: ``record``, ``query``, ``synchronize``, ``wait``,
    ``elapsed_time`` (milliseconds of host time between two events with timing).

    Returns a ``torch.Event``.
    """

    _base = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                external: bool = False):
        if external:
            raise ValueError("torch.tpu.Event: external=True (an event recorded into CUDA graph captures) "
                             "has no tpu counterpart")
        return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device: _DeviceLike = None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("tpu", _device_index(device)))


def default_stream(device: _DeviceLike = None) -> torch.Stream:
    """The chip's default stream (id 0), where work goes unless a stream context says otherwise."""
    return torch.Stream(stream_id=0, device_index=_device_index(device), device_type=_C._DEVICE_TYPE)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(stream: torch.Stream | None):
    """Make ``stream`` the current stream of its device inside the block (None: no change)."""
    if stream is None:
        yield
        return
    prev_device = current_device()
    prev = current_stream(stream.device_index)
    set_device(stream.device_index)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(prev)
        set_device(prev_device)


@dataclass(frozen=True)
class _TPUDeviceProperties:
    name: str
    generation: str
    total_memory: int  # HBM bytes (capacity the allocator enforces)
    coords: tuple  # (x, y, z) of the chip in the slice
    global_id: int  # chip id in the slice
    host: int
    topology: str
    peak_bf16_flops: float  # FLOP/s
    hbm_bandwidth: float  # bytes/s
    vmem_bytes: int
    mxu_size: int
    tensorcores_per_chip: int
    ici_links: int
    ici_link_bandwidth: float  # bytes/s per link
    multi_processor_count: int  # TensorCores (what torch.cuda calls SMs)


def get_device_properties(device: _DeviceLike = None) -> _TPUDeviceProperties:
    idx = _device_index(device)
    info = _C._chip_info(idx)
    topo = _C._topology()
    spec = topo["spec"]
    return _TPUDeviceProperties(
        name=spec["device_name"], generation=spec["generation"], total_memory=info["hbm_bytes"],
        coords=info["coords"], global_id=info["global_id"], host=info["host"], topology=topo["name"],
        peak_bf16_flops=spec["peak_bf16_flops"], hbm_bandwidth=spec["hbm_bandwidth"],
        vmem_bytes=spec["vmem_bytes"], mxu_size=spec["mxu_size"],
        tensorcores_per_chip=spec["tensorcores_per_chip"], ici_links=spec["ici_links"],
        ici_link_bandwidth=spec["ici_link_bandwidth"],
        multi_processor_count=spec["tensorcores_per_chip"])


def get_device_name(device: _DeviceLike = None) -> str:
    """E.g. ``"TPU v6e"``, ``"TPU v5p"``, ``"TPU7x"``."""
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None) -> dict:
    return {"generation": get_device_properties(device).generation}


def get_amp_supported_dtype() -> list:
    """Autocast dtypes on tpu: bfloat16 (the MXU's native type) and float16."""
    return [torch.bfloat16, torch.float16]


def topology() -> dict:
    """The slice this process belongs to: name, shape (x, y, z), chips, hosts, wraparound, chip spec."""
    return _C._topology()


def topology_aware_mesh(mesh_shape, world_size=None):
    """Rank layout (int64 tensor of shape ``mesh_shape``, same on every rank) whose mesh axes
    follow the slice's ICI rings; pass it to ``DeviceMesh("tpu", ...)``. See
    :func:`torch_tpu.distributed.topology_aware_mesh` (raises ValueError for a shape that does
    not match the ranks)."""
    from ..distributed.mesh import topology_aware_mesh as _impl

    return _impl(mesh_shape, world_size)

