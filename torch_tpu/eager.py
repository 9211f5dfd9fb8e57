"""Eager execution modes of the tpu device.

* ``"strict"`` (default): every op is queued on the chip's stream; the Python
  thread does not wait; errors in queued work are raised at the next
  synchronizing call, naming the op.
* ``"debug"``: every op runs synchronously; index ops (``index_select``,
  ``gather``, ``scatter``, ``embedding``, ``index``, ``index_put_``, ``take``)
  check bounds and raise ``IndexError`` naming the op, the offending index and
  the size; with ``TORCH_TPU_CHECK_FINITE=1`` (or :func:`set_check_finite`) the
  first op whose output holds NaN/Inf raises. Errors name the op, its argument
  shapes and dtypes, and the Python source line. ``TORCH_TPU_LAUNCH_BLOCKING=1``
  selects it at start.
* ``"defer_and_fuse"``: fusible ops (elementwise, comparisons, ``where``,
  ``clamp``, activations and their backward ops, ``sum``/``mean``/``amax``/
  ``amin`` reductions, softmax, dtype casts) are recorded into the chip's
  pending region instead of running; the region is compiled once per structure
  into fused kernels and queued when something flushes it: an op that reads or
  writes its tensors strictly, a host read (``.item()``, ``.cpu()``,
  ``print``), a synchronize or stream/event use, ``TORCH_TPU_DEFER_MAX_OPS``
  recorded ops (256), or leaving the mode. Results nobody holds at the flush
  never get HBM. ``TORCH_TPU_DEFER_AND_FUSE=1`` selects it at start;
  :mod:`torch_tpu.debug` reports what was fused.
"""

import contextlib
from collections.abc import Iterator

from . import _C
from .tpu import EagerMode

MODES = ("strict", "debug", "defer_and_fuse")


def _check(mode: str) -> str:
    if isinstance(mode, EagerMode):  # TorchTPU's enum: its values are these names
        return mode.value
    if mode not in MODES:
        raise ValueError(f"unknown eager mode {mode!r}; valid modes: {', '.join(MODES)}")
    return mode


def set_eager_mode(mode: str) -> None:
    """Set the process-wide eager mode (a name of ``MODES``, or a ``torch.tpu.EagerMode``).
    Raises ValueError for an unknown mode.

    Leaving ``"defer_and_fuse"`` issues the work it has recorded.
    """
    mode = _check(mode)
    _C._defer_flush()
    _C._set_eager_mode(mode)


def get_eager_mode() -> str:
    """The eager mode of the calling thread (a thread-local ``eager_mode`` block wins)."""
    return _C._effective_eager_mode()


@contextlib.contextmanager
def eager_mode(mode: str) -> Iterator[None]:
    """Use ``mode`` (a name of ``MODES``, or a ``torch.tpu.EagerMode``) on this thread inside
    the block (wins over the global mode). Raises ValueError for an unknown mode.

    Work recorded by ``"defer_and_fuse"`` inside the block is issued when it ends.
    """
    mode = _check(mode)
    previous = _C._get_thread_eager_mode()
    _C._set_thread_eager_mode(mode)
    try:
        yield
    finally:
        _C._set_thread_eager_mode(previous)
        if mode == "defer_and_fuse":
            _C._defer_flush()


def set_check_finite(enabled: bool) -> None:
    """In debug mode, raise at the first op whose floating output holds NaN or Inf."""
    _C._set_check_finite(bool(enabled))

