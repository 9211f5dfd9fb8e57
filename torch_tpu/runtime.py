"""Runtime reports of the vTPU."""

from typing import Dict

from . import _C


def unsupported_on_tpu() -> Dict[str, Dict[str, int]]:
    """Operators this process ran with dtypes a real TPU has no units for.

    Returns ``{op: {dtype: calls}}``, e.g. ``{"aten::add.Tensor": {"Double": 3}}``.
    float64 and complex work on the vTPU for correctness; on a TPU they would be
    emulated (float64) or not run, so each use is counted here.
    """
    return _C._unsupported_on_tpu()


def reset_unsupported_on_tpu() -> None:
    """Clear the report of :func:`unsupported_on_tpu`."""
    _C._reset_unsupported_on_tpu()
