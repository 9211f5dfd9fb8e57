"""torch.profiler on tpu: device tracks in *estimated TPU time*.

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])``
records the tpu ops it sees through a Kineto activity profiler that torch_tpu registers
with PyTorch's PrivateUse1 profiler registry (``csrc/runtime/profiler.cc``). Each op priced
by the cost model becomes a device event linked to the host op that issued it, so
``prof.key_averages()`` has device time per op (``self_device_time_total``,
``device_time_total``; the table's "Self TPU" / "TPU total" columns) and the exported
Chrome/Perfetto trace (``prof.export_chrome_trace``) holds, besides the host timeline,
one process per chip used, named ``"tpu:N (estimated <gen> time)"``, with tracks:

- ``ops (estimated <gen> time)``: one slice per op (named ``tpu::<op>``), lasting the cost
  model's estimate for the generation; an op starts when issued or when the chip's previous
  op ends, whichever is later. ``args`` carry the estimate in µs, FLOPs, HBM bytes and the
  vTPU's measured run on host cores (``vTPU queued us``: from issue to start on the chip's
  stream worker; ``vTPU measured us``: its duration).
- ``record_function ranges``: each ``torch.profiler.record_function`` range, from the first
  device op issued inside it, lasting the sum of those ops' estimated times (its device time).
- ``collectives (estimated ICI/DCN time)``: tpu_dist collectives, from the ring formulas.
- ``HBM allocated (bytes)``: a counter (``"ph": "C"``) of the chip's allocated physical bytes
  (what ``torch.tpu.memory_allocated`` returns) after each allocation and free.

Durations are estimates for one generation, never host measurements: the generation is
the topology's (``TORCH_TPU_TOPOLOGY``) unless :func:`set_generation` or
``TORCH_TPU_PROFILER_GENERATION`` names another. It is read when the trace is processed
(when the profiler stops). Hardware numbers and their sources: ``csrc/vtpu/spec.cc``.

When no profiler with ``ProfilerActivity.PrivateUse1`` runs, nothing is recorded: each hook
site costs one atomic load.

TorchTPU's names, also ``torch.tpu.profiler``'s: :class:`TpuProfilerConfig` (``config.py``:
``experimental_config`` with tracer levels and ``run_dir`` in the TensorBoard layout) and
:func:`start_server` / :func:`stop_server` (``server.py``: on-demand capture by
``python -m torch_tpu.profiler capture``, ``__main__.py``). See docs/profiler.md.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

from .. import _C
from .config import TpuProfilerConfig, generation_scope
from .server import start_server, stop_server

__all__ = [
    "set_generation",
    "get_generation",
    "trace",
    "recorder_stats",
    "GENERATIONS",
    "TpuProfilerConfig",
    "start_server",
    "stop_server",
]

#: Generations the device tracks can be estimated for (the table in ``csrc/vtpu/spec.cc``).
GENERATIONS = tuple(g["generation"] for g in _C._generations())


def set_generation(generation: str | None) -> None:
    """Chooses the TPU generation whose estimated time the device tracks show.

    Args:
        generation: ``"v4"``, ``"v5e"``, ``"v5p"``, ``"v6e"`` or ``"tpu7x"``; ``None`` (or
            ``""``) goes back to ``TORCH_TPU_PROFILER_GENERATION`` if set, else the
            topology's generation.

    Raises:
        ValueError: unknown generation (the message lists the valid ones).

    Applies to traces processed from now on, including a profiler still running.
    """
    if generation is not None and not isinstance(generation, str):
        raise TypeError(f"set_generation: expected a generation name (str) or None, got {type(generation).__name__}")
    _C._profiler_set_generation(generation or "")


def get_generation() -> str:
    """The generation the device tracks are estimated for, e.g. ``"v6e"``.

    Raises:
        ValueError: ``TORCH_TPU_PROFILER_GENERATION`` names an unknown generation.
    """
    return _C._profiler_generation()


def recorder_stats() -> dict:
    """State of the device-event recorder, for tests and diagnostics.

    Returns a dict: ``recording`` (bool: hooks installed, i.e. a profiler with
    ``ProfilerActivity.PrivateUse1`` is running), ``ops`` and ``collectives`` (device events
    of the current or last session), ``hbm_samples``, ``ranges`` (record_function ranges
    entered), ``session`` (sessions started in this process).
    """
    return dict(_C._profiler_stats())


@contextlib.contextmanager
def trace(
    dir_name: str,
    *,
    worker_name: str | None = None,
    generation: str | None = None,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
) -> Iterator[profile]:
    """Profiles the ``with`` block into a TensorBoard profile directory.

    Writes ``dir_name/<worker_name>.<time_ns>.pt.trace.json`` (the layout of
    ``torch.profiler.tensorboard_trace_handler``; ``worker_name`` defaults to
    ``<hostname>_<pid>``) with the host timeline and the tpu device tracks described in
    this module's docstring. Yields the ``torch.profiler.profile`` object, so
    ``key_averages()`` works after the block.

    Args:
        dir_name: the directory (created if missing).
        worker_name: file name prefix; one per process in a multi-process job.
        generation: estimate the device tracks for this generation instead of the current
            one (see :func:`set_generation`); restored afterwards.
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.

    Raises:
        ValueError: unknown ``generation``.
    """
    with generation_scope(generation):
        if worker_name is None:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        handler = tensorboard_trace_handler(dir_name, worker_name=worker_name)
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
            on_trace_ready=handler,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
        ) as prof:
            yield prof
