"""Queued tpu work computes with the global settings of its call.

ATen's CPU kernels, which the vTPU runs on each chip's worker thread, read some process-wide
settings when they run: the default dtype (integer inputs promoted to float: ``int / int``,
``sin(int)``), the deterministic-algorithms flag and the float32 matmul precision. Work is queued,
so it may run after the caller changed one of them. Changing one through torch's setter therefore
first waits for every chip's queued work (without raising its errors: they stay for the next
synchronization), so that work runs with the value current when it was issued. Setting the value
directly through ``torch._C`` bypasses this (docs/eager-modes.md).
"""

import functools

import torch

from . import _C

# (module, name) of each setter of a setting that CPU kernels read at run time.
_SETTERS = (
    (torch, "set_default_dtype"),
    (torch, "set_default_tensor_type"),
    (torch, "use_deterministic_algorithms"),
    (torch, "set_deterministic_debug_mode"),
    (torch, "set_float32_matmul_precision"),
    # what every torch.backends.*.fp32_precision assignment calls (looked up at each call)
    (torch._C, "_set_fp32_precision_setter"),
)


def _draining(setter):
    @functools.wraps(setter)
    def wrapper(*args, **kwargs):
        _C._wait_all_chips_idle()
        return setter(*args, **kwargs)

    wrapper.__wrapped_by_torch_tpu__ = True
    return wrapper


def install() -> None:
    """Wraps each setter in `_SETTERS` once (idempotent)."""
    for module, name in _SETTERS:
        setter = getattr(module, name, None)
        if setter is None or getattr(setter, "__wrapped_by_torch_tpu__", False):
            continue
        setattr(module, name, _draining(setter))
