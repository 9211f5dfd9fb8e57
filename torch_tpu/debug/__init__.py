"""Introspection of ``defer_and_fuse`` (see :mod:`torch_tpu.eager`).

``region_stats()`` counts what the recorder did since the process started (or
since ``reset_region_stats()``); ``TORCH_TPU_DUMP_IR=DIR`` additionally writes
every newly compiled region to ``DIR/region_NNNN_<hash>.mlir`` as StableHLO
text, preceded by the recorded ATen ops (with their Python source lines) and
the fusion plan as comments. ``python -m torch_tpu.debug --fusible-ops`` prints
:func:`fusible_ops`.
"""

import torch

from .. import _C

__all__ = ["region_stats", "reset_region_stats", "flush", "pending_ops", "fusible_ops"]


def region_stats() -> dict[str, int | dict[str, int]]:
    """Counters of ``defer_and_fuse``, all processes' chips together.

    Keys:

    * ``ops_recorded``: ATen ops recorded into regions; ``ops_fused``: those in
      regions that were flushed; ``ops_pending``: those still waiting.
    * ``regions_flushed``: regions that reached a flush; ``regions_run``: of
      those, regions with live results (compiled or taken from the cache and
      queued on the chip); ``regions_compiled``: compile-cache misses;
      ``cache_hits``: compile-cache hits; ``cache_entries``: compiled regions
      the process-wide cache holds.
    * ``kernels_launched``: fused kernels queued; ``regions_split``: regions whose
      kernels ran in cache-sized row chunks, spread over the host threads (results of at least
      ``TORCH_TPU_DEFER_SPLIT_ELEMENTS`` elements); ``regions_in_parts``: regions
      that could not be split whole (results of different lengths) and ran as
      independent parts, each split when it can, over the host threads;
      ``regions_replayed``: regions whose results all reached HBM (saved for
      backward, read by a strict op: fusing them saves no memory traffic), run
      op by op with ATen's kernels instead of compiled ones;
      ``single_op_regions``: of those, regions of one op.
    * ``outputs_materialized`` / ``outputs_dead``: region results given HBM at
      the flush / dropped because nothing but the region held them.
    * ``hbm_bytes_avoided``: physical (tiled) HBM bytes of the dropped
      results, i.e. intermediates never allocated; ``hbm_bytes_allocated``:
      physical bytes allocated for live results at flushes.
    * ``fallbacks``: ops with a lowering that ran strictly anyway (a dtype,
      layout or argument the lowering does not handle).
    * ``rng_vectorized``: whether fused dropout/bernoulli masks are drawn with
      the vectorized mt19937 (it reproduced ATen's ``bernoulli_`` on this
      machine) or with ATen's kernel (e.g. ATen's MKL path on Intel CPUs);
      the values are the same either way.
    * ``flush_reasons``: regions flushed because a strictly run op read or
      wrote their memory (``conflict``), a synchronization or host read
      (``sync``), other stream or event use (``stream``), the size cap
      (``size_cap``, ``TORCH_TPU_DEFER_MAX_OPS``), a repeating op sequence
      reaching a point where the size cap flushed before (``repeat``: training
      loops get the same regions every iteration), a view the IR cannot express
      (``view``), or a mode change, stream switch or :func:`flush` (``other``).
    """
    return _C._defer_region_stats()


def reset_region_stats() -> None:
    """Zero the counters of :func:`region_stats` (the compile cache is kept)."""
    _C._defer_reset_region_stats()


def flush() -> None:
    """Compile and queue every pending region now (does not wait for the chip).

    Raises ``torch.OutOfMemoryError`` naming the recorded op whose result does
    not fit in HBM (the region then stays pending).
    """
    _C._defer_flush()


def pending_ops() -> int:
    """ATen ops recorded and not yet flushed, all chips together."""
    return int(_C._defer_pending_ops())


def fusible_ops() -> list[str]:
    """The ATen operators ``defer_and_fuse`` records into regions, sorted (``"aten::add.Tensor"``).

    Read from the lowering table itself (``csrc/defer/lower.cc``), in-place variants
    included; labels the table knows that are not operators of this PyTorch are left out.
    ``native_dropout`` fuses too: its tpu kernel is written in terms of ``bernoulli.p`` and
    ``mul``. An op listed here still runs strictly for arguments its lowering does not take
    (a dtype, a layout, a view the IR cannot express); ``region_stats()["fallbacks"]`` counts those.
    """
    ops = []
    for label in _C._defer_fusible_ops():
        name, _, overload = label.partition(".")
        try:
            torch._C._get_schema(name, overload)
        except RuntimeError:
            continue
        ops.append(label)
    return ops
