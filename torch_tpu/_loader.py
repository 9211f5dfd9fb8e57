"""Backend initialisation hook used by Ray's device manager."""


def load():
    """Initialise the tpu backend (idempotent). Returns the ``torch_tpu`` module."""
    import torch_tpu

    torch_tpu.tpu.init()
    return torch_tpu
