"""The default-topology marker and the chips that some test files own (the split: conftest.py's docstring)."""

import pytest
import torch

MEMORY_DEVICE = 5
OOM_DEVICE = 6


def _default_environment():
    try:
        return (torch.tpu.is_available() and torch.tpu.device_count() == 8
                and torch.tpu.topology()["name"] == "v6e-8")
    except Exception:  # noqa: BLE001  (a bad topology makes device_count raise)
        return False


# Most tests assume the default slice (v6e-8, 8 visible chips, 32 GiB of HBM per chip);
# under another environment they are skipped rather than failed.
needs_v6e_8 = pytest.mark.skipif(
    not _default_environment(),
    reason="expects the default topology v6e-8 with 8 visible chips: unset TORCH_TPU_TOPOLOGY, "
           "TPU_ACCELERATOR_TYPE, TPU_VISIBLE_CHIPS and TORCH_TPU_HBM_BYTES")
