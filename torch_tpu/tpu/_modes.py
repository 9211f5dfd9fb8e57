"""TorchTPU's mode API of ``torch.tpu``: ``EagerMode`` / ``eager_mode`` / ``set_eager_mode``,
``Precision`` / ``precision``, ``allow_excess_precision``.

Private: ``torch_tpu/tpu/__init__.py`` exports the public names (``eager_mode`` and
``allow_excess_precision`` are properties of the module object). The string API of
:mod:`torch_tpu.eager` stays; ``EagerMode`` members carry its mode names as values.
"""

from __future__ import annotations

import enum
import sys
import threading
import warnings

import torch

from .. import _C


class EagerMode(enum.Enum):
    """Eager execution modes of the tpu device (TorchTPU's names; the values are torch_tpu's
    mode names, see :mod:`torch_tpu.eager` and docs/eager-modes.md)."""

    DEFER_AND_FUSE = "defer_and_fuse"  # fusible ops recorded and run as fused regions
    DEFER_NEVER = "strict"  # every op queued on the chip's stream (the default)
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"  # every op synchronous, checked, errors at the op


class Precision(enum.Enum):
    """Precision of float32 matmuls and convolutions (XLA's ``dot_general`` precision). The
    values are the matching names of ``torch.set_float32_matmul_precision``."""

    DEFAULT = "medium"  # one bf16 MXU pass: inputs rounded to bf16, fp32 accumulation
    HIGH = "high"  # three bf16 passes (bf16_3x)
    HIGHEST = "highest"  # full float32 (six bf16 passes on a TPU)


def _members(cls: type[enum.Enum]) -> str:
    return ", ".join(m.name for m in cls)


def _check_enum(value: object, cls: type[enum.Enum], where: str, arg: str) -> enum.Enum:
    """``value`` if it is a member of ``cls``, else TypeError naming ``where``'s argument ``arg``."""
    if isinstance(value, cls):
        return value
    raise TypeError(f"{where}: {arg} must be a torch.tpu.{cls.__name__} ({_members(cls)}), "
                    f"got {type(value).__name__} {value!r}")


def _in_compiled_region(depth: int) -> bool:
    """True while Dynamo traces the caller, or when the caller (``depth`` frames up) is code
    Dynamo compiled: after a graph break the rest of a compiled function runs as Dynamo's
    rewritten bytecode, or in a resume function, where ``is_compiling()`` is False."""
    if torch.compiler.is_compiling():
        return True
    code = sys._getframe(depth + 1).f_code
    if code.co_name.startswith("torch_dynamo_resume_in_"):
        return True
    dynamo_utils = sys.modules.get("torch._dynamo.utils")  # not loaded: nothing was compiled
    return dynamo_utils is not None and code in dynamo_utils.orig_code_map


def _eager_mode_name(mode: object, where: str) -> str:
    return _check_enum(mode, EagerMode, where, "mode").value


def get_eager_mode() -> EagerMode:
    """``torch.tpu.eager_mode`` (read): the calling thread's effective mode."""
    return EagerMode(_C._effective_eager_mode())


def assign_eager_mode(mode: EagerMode, where: str = "torch.tpu.eager_mode") -> None:
    """``torch.tpu.eager_mode = mode``: the mode reading it returns afterwards. That is the
    process-wide mode (as ``torch_tpu.set_eager_mode``), or, inside a thread-local
    ``torch_tpu.eager_mode(...)`` block of the calling thread, that block's mode. Leaving
    ``DEFER_AND_FUSE`` issues the work it recorded."""
    name = _eager_mode_name(mode, where)
    if _in_compiled_region(2):
        raise RuntimeError(f"{where}: the eager mode cannot change inside a compiled region "
                           "(torch.compile); change it around the compiled call")
    _C._defer_flush()
    if _C._get_thread_eager_mode() is not None:
        _C._set_thread_eager_mode(name)
    else:
        _C._set_eager_mode(name)


class set_eager_mode:
    """``with torch.tpu.set_eager_mode(mode):`` runs the block in ``mode`` and restores the
    previous mode on exit (TorchTPU's context manager; it is not a setter: assign
    ``torch.tpu.eager_mode`` for that). The mode set is the one ``torch.tpu.eager_mode = mode``
    sets: process-wide (so backward ops issued in the block, which run on the autograd
    engine's tpu thread, follow it too), or the calling thread's inside a thread-local
    ``torch_tpu.eager_mode(...)`` block. Work recorded in ``DEFER_AND_FUSE`` is issued when
    the mode changes and on exit.

    Args:
        mode: a :class:`torch.tpu.EagerMode`.

    Raises:
        TypeError: ``mode`` is not an ``EagerMode`` (a str such as ``"strict"`` belongs to
            ``torch_tpu.set_eager_mode``).
        RuntimeError: called inside a compiled region (a ``torch.compile``d function).
    """

    def __init__(self, mode: EagerMode):
        self._name = _eager_mode_name(mode, "torch.tpu.set_eager_mode")
        if _in_compiled_region(1):
            raise RuntimeError("torch.tpu.set_eager_mode: the eager mode cannot change inside a compiled "
                               "region (torch.compile); enter it around the compiled call")
        self._saved = threading.local()  # per thread: (thread-local mode, process-wide mode) stack
        self._entered = False

    def __enter__(self) -> None:
        self._entered = True
        self._saved.__dict__.setdefault("stack", []).append((_C._get_thread_eager_mode(), _C._get_eager_mode()))
        assign_eager_mode(EagerMode(self._name), "torch.tpu.set_eager_mode")

    def __exit__(self, *exc: object) -> bool:
        thread_mode, global_mode = self._saved.stack.pop()
        _C._defer_flush()
        if thread_mode is not None:
            _C._set_thread_eager_mode(thread_mode)
        else:
            _C._set_eager_mode(global_mode)
        return False

    def __del__(self) -> None:
        if getattr(self, "_entered", True) is False:
            warnings.warn("torch.tpu.set_eager_mode(...) is a context manager and changed nothing: "
                          "use `with torch.tpu.set_eager_mode(mode):`, or assign torch.tpu.eager_mode",
                          UserWarning, stacklevel=2)


class precision:
    """``with torch.tpu.precision(mode):`` float32 matmuls and (forward) convolutions issued
    inside the block use ``mode`` (XLA's meaning: ``DEFAULT`` one bf16 MXU pass, ``HIGH``
    three, ``HIGHEST`` full float32), overriding ``torch.get_float32_matmul_precision()``
    locally; the previous precision comes back on exit, and no global setting changes.
    Convolution gradients run in full float32 whatever the precision (docs/limits.md).

    The override is thread-local: other Python threads keep following the global setting.
    It travels with PyTorch's thread-local state, so the backward pass of a
    ``loss.backward()`` called inside the block (run by the autograd engine's tpu thread)
    follows it as well. Work queued on a chip's stream keeps the precision of the call that
    queued it. A ``torch.compile``d function called inside the block follows it too (its
    matmuls read the precision when the program runs).

    Args:
        mode: a :class:`torch.tpu.Precision`.

    Raises:
        TypeError: ``mode`` is not a ``Precision`` (``"high"``, ``"fast"``, an int).
    """

    def __init__(self, mode: Precision):
        self._name = _check_enum(mode, Precision, "torch.tpu.precision", "mode").value
        self._saved = threading.local()  # one object may be entered on several threads at once

    def __enter__(self) -> None:
        stack = self._saved.__dict__.setdefault("stack", [])
        stack.append(_C._matmul_precision_override())
        _C._set_matmul_precision_override(self._name)

    def __exit__(self, *exc: object) -> bool:
        _C._set_matmul_precision_override(self._saved.stack.pop())
        return False


class _ExcessPrecision:
    allowed = True


def get_allow_excess_precision() -> bool:
    return _ExcessPrecision.allowed


def set_allow_excess_precision(value: bool) -> None:
    """``torch.tpu.allow_excess_precision = value`` (bool; TypeError otherwise). A stored flag:
    on the vTPU it changes no result (docs/design.md "Numerics")."""
    if not isinstance(value, bool):
        raise TypeError(f"torch.tpu.allow_excess_precision: value must be a bool, got {type(value).__name__} "
                        f"{value!r}")
    _ExcessPrecision.allowed = value
