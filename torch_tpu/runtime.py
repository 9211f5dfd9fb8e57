"""Runtime reports of the vTPU."""


from . import _C


def unsupported_on_tpu() -> dict[str, dict[str, int]]:
    """Operators this process ran with dtypes a real TPU has no units for.

    Returns ``{op: {dtype: calls}}``, e.g. ``{"aten::add.Tensor": {"Double": 3}}``.
    float64 and complex work on the vTPU for correctness; on a TPU they would be
    emulated (float64) or not run, so each use is counted here.
    """
    return _C._unsupported_on_tpu()


def reset_unsupported_on_tpu() -> None:
    """Clear the report of :func:`unsupported_on_tpu`."""
    _C._reset_unsupported_on_tpu()


def _index(device) -> int:
    import torch

    from .tpu._utils import _device_index

    return _device_index(device) if device is not None else torch.tpu.current_device()


def stats(device=None) -> dict[str, object]:
    """Execution counters of a chip since start or :func:`reset_stats`.

    Keys: ``ops`` (ops issued), ``flops`` (torch.utils.flop_counter conventions),
    ``bytes_read`` / ``bytes_written`` (HBM, physical bytes), ``host_seconds``
    (measured time the chip's stream workers spent computing on this host),
    ``device_seconds`` (the cost model's *estimate* for this chip's generation)
    split into ``mxu_seconds``, ``vpu_seconds``, ``hbm_seconds`` and
    ``overhead_seconds``, ``device_seconds_by_generation`` (the same estimate
    for v4, v5e, v5p, v6e, tpu7x), ``emulated_ops`` (float64/complex) and
    ``generation``. Work still queued is counted when issued; call
    ``torch.tpu.synchronize()`` first for settled ``host_seconds``.

    Collectives (tpu_dist) add, apart from ``device_seconds``: ``collectives`` (count,
    including sends), ``collective_bytes`` (bytes of the buffers they were called with),
    ``ici_bytes`` (bytes this chip sends over ICI by the ring formulas: 2(n-1)/n x bytes for
    all_reduce, (n-1)/n x bytes of the n-rank buffer for all_gather/reduce_scatter),
    ``ici_seconds`` (estimated: ici_bytes / (links x the generation's per-link bandwidth) plus
    1 us per ring step), ``ici_seconds_by_generation``, ``dcn_bytes`` and ``dcn_seconds``
    (between hosts). They are recorded when the collective runs.

    ``torch.tpu.pallas`` ops (``jax_op``) add ``pallas_calls`` (calls issued on this chip),
    ``pallas_kernels`` (the ``pallas_call`` kernels they ran), ``pallas_output_copies`` and
    ``pallas_output_copy_bytes`` (outputs copied once from JAX's buffers into HBM); all 0
    while the module is not loaded (it is never imported by this function).
    """
    import sys

    index = _index(device)
    out = _C._stats(index)
    out.update(_C._collective_stats(index))
    pallas = sys.modules.get("torch_tpu.tpu.pallas._cost")
    keys = ("pallas_calls", "pallas_kernels", "pallas_output_copies", "pallas_output_copy_bytes")
    out.update(dict.fromkeys(keys, 0))
    if pallas is not None:
        with pallas.counters.lock:
            out.update(pallas.counters.by_chip.get(index, {}))
    return out


def reset_stats(device=None) -> None:
    """Zero the counters of :func:`stats` for a chip."""
    import sys

    index = _index(device)
    _C._reset_stats(index)
    pallas = sys.modules.get("torch_tpu.tpu.pallas._cost")
    if pallas is not None:
        with pallas.counters.lock:
            pallas.counters.by_chip.pop(index, None)


def generations() -> list[dict[str, object]]:
    """The generation table (v4, v5e, v5p, v6e, tpu7x): peak bf16 FLOP/s, HBM bytes and
    bandwidth (bytes/s), VMEM, MXU size and count, TensorCores, ICI links and per-link
    bandwidth (bytes/s), torus dimensions, chips per host. Sources are in csrc/vtpu/spec.cc."""
    return _C._generations()
