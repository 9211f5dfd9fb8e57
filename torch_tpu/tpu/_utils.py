"""Device-argument parsing shared by torch.tpu functions."""


import torch


def _device_index(device: torch.device | str | int | None, optional: bool = False) -> int | None:
    """Index of a tpu device argument; None/"tpu" means the current device.

    Raises ValueError for a device of another type.
    """
    if device is None:
        return None if optional else torch.tpu.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        return torch.tpu.current_device() if device.index is None else device.index
    raise ValueError(f"expected a tpu device (torch.device, str or int), got {type(device).__name__}")


def _get_device_index(device, optional: bool = False, allow_cpu: bool = False) -> int:
    """What torch.serialization calls to validate a saved location such as 'tpu:7'."""
    if allow_cpu and isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu":
        return -1
    return _device_index(device, optional=optional)
