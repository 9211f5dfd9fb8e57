"""Small public helpers other frameworks call (Ray Train's device manager)."""

import torch


def tpu_device() -> torch.device:
    """Initialise the backend and return this process's device, ``tpu:<current index>``."""
    from . import _loader

    _loader.load()
    return torch.device("tpu", torch.tpu.current_device())
