"""JAX for ``torch.tpu.pallas``: imported here only (never by ``import torch`` or
``import torch_tpu``), with one JAX CPU device per tpu chip, and Pallas's TPU interpret mode.

Private. :func:`jax` returns the module; :func:`interpret` is the context every kernel of a
registered op is traced and run under.
"""

from __future__ import annotations

import contextlib
import os

EXTRA_HINT = "pip install 'torch_tpu[pallas]' (the pinned jax[cpu] release; see docs/pallas.md)"

try:
    import jax as _jax_module
    import jax.numpy  # noqa: F401
    from jax.experimental import pallas as _pl  # noqa: F401
    from jax.experimental.pallas import tpu as _pltpu
except ImportError as e:  # pragma: no cover - exercised in a subprocess without jax
    raise ImportError(f"torch.tpu.pallas needs JAX, which is not installed ({e}): {EXTRA_HINT}") from e


def _chips() -> int:
    import torch

    return torch.tpu.device_count()


def _configure_devices() -> str | None:
    """Asks JAX for one CPU device per chip; returns why it could not (JAX already started)."""
    want = _chips()
    try:
        current = _jax_module.config.jax_num_cpu_devices
        if current < want:
            _jax_module.config.update("jax_num_cpu_devices", want)
    except Exception as e:  # noqa: BLE001  (JAX raises RuntimeError once its backends exist)
        return str(e)
    return None


_platforms_note = None
if "JAX_PLATFORMS" not in os.environ:
    try:
        _jax_module.config.update("jax_platforms", "cpu")  # the vTPU's kernels run on JAX's CPU backend
    except Exception:  # noqa: BLE001  (already initialised: whatever the user chose stays)
        pass
_device_note = _configure_devices()


def jax():
    """The JAX module, configured."""
    return _jax_module


def cpu_devices() -> list:
    """JAX's CPU devices (one per chip unless JAX was started before torch.tpu.pallas)."""
    return _jax_module.devices("cpu")


def check_device_count(need: int, what: str) -> None:
    """RuntimeError naming `what` if JAX has fewer CPU devices than `need` chips."""
    have = len(cpu_devices())
    if have >= need:
        return
    raise RuntimeError(
        f"{what}: the mesh needs {need} JAX devices (one per tpu chip) but JAX has {have} CPU device(s): "
        "JAX was initialised before torch.tpu.pallas could set its device count. Import torch.tpu.pallas "
        f"before using JAX, or set jax.config.update('jax_num_cpu_devices', {_chips()}) (or XLA_FLAGS="
        f"--xla_force_host_platform_device_count={_chips()}) right after importing JAX"
        + (f" ({_device_note})" if _device_note else ""))


def _params():
    race = os.environ.get("TORCH_TPU_PALLAS_DETECT_RACES", "0") not in ("", "0")
    return _pltpu.InterpretParams(detect_races=race)


@contextlib.contextmanager
def interpret():
    """Every ``pallas_call`` traced inside runs in Pallas's TPU interpret mode (TPU semantics
    on the CPU: grid order, block specs, VMEM/SMEM scratch, DMA semaphores, remote copies);
    ``TORCH_TPU_PALLAS_DETECT_RACES=1`` turns on its race detector."""
    with _pltpu.force_tpu_interpret_mode(_params()):
        yield


# Process-wide as well: callers that build their pallas_call ahead of time, outside any
# registered op (Helion's launcher does), read the setting when they build it. JAX has only
# its CPU backend here, where a pallas_call runs in interpret mode or not at all.
_pltpu.set_tpu_interpret_mode(_params())


def races_found() -> bool:
    """Whether the race detector (TORCH_TPU_PALLAS_DETECT_RACES=1) saw a data race."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return bool(ipc.races is not None and ipc.races.races_found)
