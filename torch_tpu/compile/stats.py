"""Counters of ``torch.compile(backend="tpu")``, see :func:`compile_stats`."""

import collections
import sys
import threading
from typing import Any, Dict

_lock = threading.Lock()


def _fresh() -> Dict[str, Any]:
    return {
        "compilations": 0,
        "cache_hits_memory": 0,
        "cache_hits_disk": 0,
        "compile_seconds": 0.0,
        "graphs": 0,
        "regions": 0,
        "library_calls": collections.Counter(),
        "recompile_reasons": [],
        "graph_breaks": 0,
        "graph_break_reasons": [],
        "corrupt_cache_entries": 0,
        "programs_run": 0,
    }


_stats = _fresh()


def add(key: str, value=1) -> None:
    with _lock:
        _stats[key] += value


def append(key: str, value) -> None:
    with _lock:
        _stats[key].append(value)


def count_library_ops(names) -> None:
    with _lock:
        _stats["library_calls"].update(names)


def compile_stats() -> Dict[str, Any]:
    """Counters of ``torch.compile(backend="tpu")`` since the process started (or
    :func:`reset_compile_stats`).

    Keys:

    * ``compilations``: programs built from an FX graph (lowering, fusion, planning);
      ``cache_hits_memory`` / ``cache_hits_disk``: programs taken from the in-process
      cache / loaded from ``TORCH_TPU_CACHE_DIR`` instead.
    * ``compile_seconds``: wall seconds spent in those compilations and loads (not in
      Dynamo or AOTAutograd tracing).
    * ``graphs``: graphs handed to the backend (forward, backward and inference
      graphs count separately); ``regions``: fused IR regions in the programs built
      or loaded.
    * ``library_calls``: ``{"aten::mm": n, ...}``, the ATen ops the programs run as
      library calls (not lowered to the IR), counted once per op in each program.
    * ``recompile_reasons``: Dynamo's guard-failure reasons, one string per recompilation.
    * ``graph_breaks`` / ``graph_break_reasons``: Dynamo graph breaks (count and reasons).
    * ``corrupt_cache_entries``: disk entries found truncated or corrupted (rebuilt).
    * ``programs_run``: program executions.
    """
    if "torch._dynamo" in sys.modules:
        from .backend import _note_dynamo_events

        _note_dynamo_events()
    with _lock:
        out = dict(_stats)
        out["library_calls"] = dict(_stats["library_calls"])
        out["recompile_reasons"] = list(_stats["recompile_reasons"])
        out["graph_break_reasons"] = list(_stats["graph_break_reasons"])
        return out


def reset_compile_stats() -> None:
    """Zero every counter of :func:`compile_stats` (cached programs are kept)."""
    global _stats
    with _lock:
        _stats = _fresh()


