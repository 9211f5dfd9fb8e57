"""HBM memory statistics of tpu devices, with ``torch.cuda``'s key names, and the
statistics of pinned host memory (``host_memory_stats``).

``allocated``/``reserved``/``active`` figures are *physical* bytes: what the
tensors occupy in the TPU's tiled layout. ``requested_bytes`` and
``logical_bytes`` are the bytes the tensors asked for.
"""

from collections import OrderedDict as _OrderedDict
from typing import Any as _Any

from .. import _C
from .._units import format_bytes as _format_bytes
from ._utils import _device_index

__all__ = [
    "empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "reset_peak_memory_stats",
]


def _raw(device) -> dict[str, int]:
    return _C._memory_stats(_device_index(device))


def memory_stats(device=None) -> dict[str, _Any]:
    """CUDA-style keys (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``,
    ``num_alloc_retries``, ``num_ooms``, ...) plus ``physical_bytes.*``,
    ``logical_bytes.*``, ``capacity_bytes`` and ``largest_free_block``."""
    s = _raw(device)
    out = _OrderedDict()
    for key, cur, peak in [
        ("allocated_bytes", s["allocated_bytes"], s["allocated_bytes_peak"]),
        ("active_bytes", s["allocated_bytes"], s["allocated_bytes_peak"]),
        ("reserved_bytes", s["reserved_bytes"], s["reserved_bytes_peak"]),
        ("requested_bytes", s["logical_bytes"], s["logical_bytes_peak"]),
        ("physical_bytes", s["allocated_bytes"], s["allocated_bytes_peak"]),
        ("logical_bytes", s["logical_bytes"], s["logical_bytes_peak"]),
    ]:
        out[f"{key}.all.current"] = cur
        out[f"{key}.all.peak"] = peak
    out["allocation.all.current"] = s["active_blocks"]
    out["allocation.all.allocated"] = s["num_allocs"]
    out["allocation.all.freed"] = s["num_frees"]
    out["active.all.current"] = s["active_blocks"]
    out["segment.all.current"] = s["segments"]
    out["num_alloc_retries"] = s["num_alloc_retries"]
    out["num_ooms"] = s["num_ooms"]
    out["capacity_bytes"] = s["capacity_bytes"]
    out["largest_free_block"] = s["largest_free_block"]
    return out


def memory_allocated(device=None) -> int:
    """Physical HBM bytes held by live tensors on the device."""
    return _raw(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return _raw(device)["allocated_bytes_peak"]


def memory_reserved(device=None) -> int:
    """Physical HBM bytes reserved by the caching allocator (live + cached)."""
    return _raw(device)["reserved_bytes"]


def max_memory_reserved(device=None) -> int:
    return _raw(device)["reserved_bytes_peak"]


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_device_index(device))


def empty_cache() -> None:
    """Release cached HBM segments that hold no tensor."""
    _C._empty_cache()


def mem_get_info(device=None):
    """(free, total) HBM bytes: capacity minus reserved, and capacity."""
    s = _raw(device)
    return s["capacity_bytes"] - s["reserved_bytes"], s["capacity_bytes"]


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of the device's memory statistics."""
    idx = _device_index(device)
    s = _raw(idx)
    rows = [
        ("Allocated (physical)", s["allocated_bytes"], s["allocated_bytes_peak"]),
        ("Requested (logical)", s["logical_bytes"], s["logical_bytes_peak"]),
        ("Reserved", s["reserved_bytes"], s["reserved_bytes_peak"]),
    ]
    lines = [f"tpu:{idx} HBM memory summary (capacity {_format_bytes(s['capacity_bytes'], 2)})",
             f"{'':24}{'current':>14}{'peak':>14}"]
    lines += [f"{name:24}{_format_bytes(cur, 2):>14}{_format_bytes(peak, 2):>14}" for name, cur, peak in rows]
    lines.append(f"{'Largest free block':24}{_format_bytes(s['largest_free_block'], 2):>14}")
    lines.append(f"allocations {s['num_allocs']}, frees {s['num_frees']}, segments {s['segments']}, "
                 f"alloc retries {s['num_alloc_retries']}, OOMs {s['num_ooms']}")
    return "\n".join(lines)


def host_memory_stats_as_nested_dict() -> dict[str, _Any]:
    """:func:`host_memory_stats` as a nested dict (``{"allocations": {"current": ...}, ...}``)."""
    return _C._host_memory_stats()


def host_memory_stats() -> dict[str, _Any]:
    """Statistics of pinned host memory, ``torch.cuda.host_memory_stats``'s keys (flat, sorted).

    Pinned tensors (``pin_memory()``, ``torch.empty(..., pin_memory=True)``, DataLoader's
    ``pin_memory=True``) come from a caching host allocator: each request is rounded up to a
    power of two bytes, and a freed block stays cached until
    ``torch.accelerator.empty_host_cache()`` returns it to the system.

    - ``allocations.{current,peak,allocated,freed}``: blocks the allocator holds (in use + cached).
    - ``allocated_bytes.*``: their bytes (rounded sizes).
    - ``active_requests.*`` / ``active_bytes.*``: blocks (bytes) held by live tensors.
    - ``num_host_alloc`` / ``num_host_free``: blocks taken from / returned to the system.
    - ``host_alloc_time.*`` / ``host_free_time.*`` (``total,max,min,count,avg``): microseconds
      spent taking / returning them.

    Peaks of ``active_*`` are summed over size buckets, as CUDA's are (an upper estimate).
    """
    out = []

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out.append((prefix, obj))

    walk("", host_memory_stats_as_nested_dict())
    return _OrderedDict(sorted(out))


def reset_peak_host_memory_stats() -> None:
    """Reset the ``peak`` figures of :func:`host_memory_stats` to the current ones."""
    _C._reset_peak_host_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Reset the ``allocated`` / ``freed`` totals and time counters of :func:`host_memory_stats`."""
    _C._reset_accumulated_host_memory_stats()
