"""Glue that lets libraries written for other devices run on tpu unchanged.

* :mod:`.flex_attention` -- ``torch.nn.attention.flex_attention`` on tpu tensors (eager and
  compiled, forward and backward), a blocked kernel registered for the HOPs' ``PrivateUse1`` key.

Installed at ``import torch_tpu`` (:func:`install`); nothing here imports an optional dependency.
"""

from . import flex_attention


def install() -> None:
    """Registers every piece of glue (idempotent)."""
    flex_attention.install()
