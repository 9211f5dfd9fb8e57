"""Dynamo's device interface for ``tpu``: how Dynamo (and anything built on
``torch._dynamo.device_interface``) reaches the tpu device module.

The interface subclasses Dynamo's ``DeviceInterface``, so its class is built at the
first use (:func:`interface_class`, or the module attribute ``TpuInterface``): importing
Dynamo at module level would cost ~1.5 s at ``import torch``, and would run the
backend's Dynamo import hook while this module is half imported.
"""

import functools
from typing import Any

import torch


@functools.cache
def interface_class() -> type:
    """The ``TpuInterface`` class (built once)."""
    from torch._dynamo import device_interface as _di

    class TpuInterface(_di.DeviceInterface):
        """``torch.tpu`` seen through Dynamo's ``DeviceInterface``."""

        class device:  # noqa: N801 (PyTorch's spelling)
            def __new__(cls, device):
                return torch.tpu.device(device)

        class Event(torch.Event):
            def __new__(cls, *args: Any, **kwargs: Any):
                return torch.tpu.Event(*args, **kwargs)

        class Stream(torch.Stream):
            def __new__(cls, *args: Any, **kwargs: Any):
                return torch.tpu.Stream(*args, **kwargs)

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                torch.tpu.set_device(device)

            @staticmethod
            def current_device() -> int:
                return torch.tpu.current_device()

            @staticmethod
            def get_device_properties(device=None):
                return torch.tpu.get_device_properties(device)

        @staticmethod
        def current_device() -> int:
            return torch.tpu.current_device()

        @staticmethod
        def set_device(device) -> None:
            torch.tpu.set_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            prev = torch.tpu.current_device()
            if device >= 0 and device != prev:
                torch.tpu.set_device(device)
            return prev

        exchange_device = maybe_exchange_device

        @staticmethod
        def device_count() -> int:
            return torch.tpu.device_count()

        @staticmethod
        def is_available() -> bool:
            return torch.tpu.is_available()

        @staticmethod
        def stream(stream):
            return torch.tpu.stream(stream)

        @staticmethod
        def current_stream():
            return torch.tpu.current_stream()

        @staticmethod
        def set_stream(stream) -> None:
            torch.tpu.set_stream(stream)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            torch.tpu.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                              device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return torch.tpu.current_stream(device_idx).stream_id

        @staticmethod
        def synchronize(device=None) -> None:
            torch.tpu.synchronize(device)

        @classmethod
        def get_device_properties(cls, device=None):
            return torch.tpu.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device=None):
            return torch.tpu.get_device_properties(device).generation

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return True  # float64 and complex run (the cost model marks them emulated)

        @staticmethod
        def memory_allocated(device=None) -> int:
            return torch.tpu.memory_allocated(device)

        @staticmethod
        def is_triton_capable(device=None) -> bool:
            return False

    TpuInterface.__qualname__ = "TpuInterface"  # reachable as this module's attribute (pickle, repr)
    return TpuInterface


def __getattr__(name: str):
    if name == "TpuInterface":
        return interface_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Make ``tpu`` resolve to ``TpuInterface`` (after Dynamo's own defaults,
    which would otherwise replace it on first use)."""
    from torch._dynamo import device_interface as _di

    tpu_interface = interface_class()
    if not _di._device_initialized:
        _di.init_device_reg()
    _di.register_interface_for_device("tpu", tpu_interface)
    for i in range(torch.tpu.device_count()):
        _di.register_interface_for_device(f"tpu:{i}", tpu_interface)
