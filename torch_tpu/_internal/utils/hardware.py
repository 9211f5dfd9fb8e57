"""``torch_tpu._internal.utils.hardware``: what Helion's Pallas launcher asks about the chip."""

__all__ = ["get_tpu_device_name"]


def get_tpu_device_name() -> str:
    """The current tpu's device name, the string ``torch.tpu.get_device_name()`` returns
    (``"TPU v6e"``, ``"TPU v5p"``, ``"TPU7x"``, ... by ``TORCH_TPU_TOPOLOGY``). Raises as
    ``torch.tpu.get_device_name`` does (ValueError for a bad topology)."""
    from ...tpu import get_device_name

    return get_device_name()
