"""Counters of ``torch.compile(backend="tpu")`` and the Dynamo events that feed them.

One dict holds every counter: the backend's (:func:`compile_stats`) and the bucketing
layer's (:func:`bucket_stats`); each function reports and resets its own keys. Graph
breaks and guard-failure reasons come from Dynamo, which offers no hook for them:
:func:`note_dynamo_events` reads Dynamo's counters, :func:`hook_recompile_reasons`
wraps the function that computes the reasons.
"""

import collections
import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

log = logging.getLogger("torch_tpu.compile")

_lock = threading.Lock()


def _fresh_compile() -> dict[str, Any]:
    return {
        "compilations": 0,
        "cache_hits_memory": 0,
        "cache_hits_disk": 0,
        "compile_seconds": 0.0,
        "graphs": 0,
        "regions": 0,
        "library_calls": collections.Counter(),
        "host_scalar_ops": collections.Counter(),
        "recompile_reasons": [],
        "graph_breaks": 0,
        "graph_break_reasons": [],
        "corrupt_cache_entries": 0,
        "programs_run": 0,
        "ignored_compiler_options": collections.Counter(),
        "routed_from_inductor": 0,
        "left_to_inductor": 0,
        "async_builds": 0,
        "custom_calls": collections.Counter(),
        "xla_programs": 0,
        "xla_fallbacks": [],
    }


def _fresh_bucketing() -> dict[str, Any]:
    return {"bucket_compilations": 0, "exact_compilations": 0, "calls": 0, "padded_calls": 0, "reasons": []}


_stats: dict[str, Any] = {**_fresh_compile(), **_fresh_bucketing()}


def add(key: str, value=1) -> None:
    with _lock:
        _stats[key] += value


def append(key: str, value) -> None:
    with _lock:
        _stats[key].append(value)


def count_library_ops(names) -> None:
    with _lock:
        _stats["library_calls"].update(names)


def count(key: str, names) -> None:
    """Add `names` to the Counter ``key``."""
    with _lock:
        _stats[key].update(names)


_warned_options: set[str] = set()


def note_ignored_option(name: str, why: str, stacklevel: int = 2) -> None:
    """A compiler option given to us that changes nothing here: counted in
    ``compile_stats()["ignored_compiler_options"]``, warned about once per name per process."""
    with _lock:
        _stats["ignored_compiler_options"][name] += 1
        first = name not in _warned_options
        _warned_options.add(name)
    if first:
        warnings.warn(f"torch_tpu: compiler option {name!r} is ignored: {why} (counted in "
                      f"torch_tpu.compile_stats()['ignored_compiler_options'])", UserWarning,
                      stacklevel=stacklevel + 1)
    log.info("compiler option %r ignored: %s", name, why)


def note_bucketing(kind: str | None, reason: str) -> None:
    """A bucketing decision: counts ``kind`` (a key of :func:`bucket_stats`, or None) and
    records ``reason`` in both ``bucket_stats()["reasons"]`` and ``recompile_reasons``."""
    with _lock:
        if kind is not None:
            _stats[kind] += 1
        _stats["reasons"].append(reason)
        _stats["recompile_reasons"].append(reason)
    log.info("%s", reason)


def _snapshot(keys) -> dict[str, Any]:
    """The counters named by ``keys``, with Counters and lists copied (callers may keep them)."""
    with _lock:
        out = {}
        for k in keys:
            v = _stats[k]
            out[k] = dict(v) if isinstance(v, collections.Counter) else list(v) if isinstance(v, list) else v
        return out


def compile_stats() -> dict[str, Any]:
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
    * ``host_scalar_ops``: ``{"aten::pow.Scalar": n, ...}``, the 0-dim CPU tensor ops the programs
      evaluate as Python floats in their ``scalars`` step instead (an optimizer's bias corrections).
    * ``recompile_reasons``: Dynamo's guard-failure reasons, one string per recompilation.
    * ``graph_breaks`` / ``graph_break_reasons``: Dynamo graph breaks (count and reasons).
    * ``corrupt_cache_entries``: disk entries found truncated or corrupted (rebuilt).
    * ``programs_run``: program executions.
    * ``ignored_compiler_options``: ``{name: n}``, compiler options handed to us that change
      nothing here: ``torch.tpu.compiler.custom_compiler_options`` names we cannot apply
      (counted once per entry of the context), Inductor options of a ``torch.compile`` whose
      graph went to the tpu backend (counted once per graph). Each is warned about once.
    * ``routed_from_inductor``: graphs ``torch.compile``'s default backend (Inductor, or
      ``backend="inductor"``) handed to the tpu backend because they hold tpu tensors;
      ``left_to_inductor``: graphs it left to Inductor (no tpu tensor).
    * ``async_builds``: programs built on the background thread (``options={"async_compile": True}``).
    * ``custom_calls``: ``{"aten::flip.default": n, ...}``, the ops that stayed a
      ``stablehlo.custom_call`` when the programs built or loaded were lowered to StableHLO
      (every other library call is lowered to StableHLO ops), once per op in each program.
    * ``xla_programs``: programs run by XLA (``TORCH_TPU_EXECUTOR=xla`` / ``auto``);
      ``xla_fallbacks``: one string per program the XLA executor left to ours, with the reason.
    """
    if "torch._dynamo" in sys.modules:
        note_dynamo_events()
    return _snapshot(_fresh_compile())


def reset_compile_stats() -> None:
    """Zero every counter of :func:`compile_stats` (cached programs are kept).

    Graph breaks Dynamo filed before the reset stay uncounted: its counters are read lazily,
    so they are marked as seen here (logged, not counted)."""
    if "torch._dynamo.utils" in sys.modules:  # nothing to read before Dynamo is imported
        note_dynamo_events()
    with _lock:
        _stats.update(_fresh_compile())


def bucket_stats() -> dict[str, Any]:
    """Counters of the bucketing layer since the process started (or
    :func:`reset_bucket_stats`).

    Keys: ``bucket_compilations`` (programs compiled for a bucket of padded shapes),
    ``exact_compilations`` (programs compiled for one exact shape: bucketing not possible
    for that graph or size), ``calls`` / ``padded_calls`` (calls of bucketed functions, and
    those whose inputs needed padding), ``reasons`` (one string per compilation, saying why;
    also appended to ``torch_tpu.compile_stats()["recompile_reasons"]``).
    """
    return _snapshot(_fresh_bucketing())


def reset_bucket_stats() -> None:
    """Zero the counters of :func:`bucket_stats` (compiled programs are kept)."""
    with _lock:
        _stats.update(_fresh_bucketing())


# ---------------------------------------------------------------- Dynamo events

_seen_breaks: dict[Any, int] = {}  # Dynamo's graph-break counters at the last look


def note_dynamo_events() -> None:
    """Log and count graph breaks Dynamo reported since the last look."""
    try:
        from torch._dynamo.utils import counters  # not at module level: importing Dynamo costs ~1.5 s
    except Exception:  # noqa: BLE001
        return
    # Dynamo files graph breaks under "graph_break" or, for unsupported code such as
    # data-dependent branching, under "unimplemented"
    items = list(counters["graph_break"].items()) + list(counters["unimplemented"].items())
    for reason, n in items:
        prev = _seen_breaks.get(reason, 0)
        if n < prev:  # torch._dynamo.reset() cleared Dynamo's counters
            prev = 0
        if n > prev:
            lines = [ln.strip() for ln in str(reason).strip().splitlines()]
            short = lines[0] if lines else "unknown reason"
            where = next((ln.lstrip("# ") for ln in lines if ln.startswith("# File ")), None)
            if where:
                short += f" ({where})"
            log.warning("graph break: %s (Python runs between the compiled graphs there)", short)
            append("graph_break_reasons", short)
            add("graph_breaks", n - prev)
            _seen_breaks[reason] = n


def hook_recompile_reasons(tpu_backend: Callable) -> None:
    """Record Dynamo's guard-failure reasons for frames compiled with ``tpu_backend``.

    Dynamo computes them in ``convert_frame`` (through
    ``guards.get_and_maybe_log_recompilation_reasons``) but offers no hook, so that
    function is wrapped where ``convert_frame`` looks it up.
    """
    from torch._dynamo import convert_frame  # called once Dynamo is imported

    orig = getattr(convert_frame, "get_and_maybe_log_recompilation_reasons", None)
    if orig is None or getattr(orig, "_torch_tpu_wrapped", False):
        return

    def wrapped(cache_entries, frame, backend, *args, **kwargs):
        reasons = orig(cache_entries, frame, backend, *args, **kwargs)
        fn = getattr(backend, "compiler_fn", backend)  # torch.compile's wrapper holds the backend
        if fn is tpu_backend or getattr(fn, "_torch_tpu_routed_graphs", False):  # or sent graphs to it
            code = getattr(frame, "f_code", None)
            where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})" if code else "a frame"
            reason = f"{where}: " + ("; ".join(r.strip() for r in reasons) if reasons else "unknown guard failure")
            append("recompile_reasons", reason)
            log.info("recompiling %s", reason)
        return reasons

    wrapped._torch_tpu_wrapped = True
    convert_frame.get_and_maybe_log_recompilation_reasons = wrapped
