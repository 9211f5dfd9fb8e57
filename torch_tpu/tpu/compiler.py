"""``torch.tpu.compiler``: compiler flags for ``torch.compile`` on tpu."""

from ..compile.options import custom_compiler_options as _custom_compiler_options


def custom_compiler_options(options: dict[str, str]):
    """Context manager: compiler flags (XLA-style ``name -> value`` strings) for the programs
    ``torch.compile`` builds inside it (a graph compiles at the first call of a shape, so the
    call, not ``torch.compile(...)``, must be inside). Nested contexts merge, the inner one
    winning per name; the previous flags come back on exit.

    Flags that change what the tpu backend does:

    * ``xla_dump_to``: a folder; each program is written there as StableHLO text
      (``program_<kind>_<key>.mlir``, as ``TORCH_TPU_DUMP_IR`` does).
    * ``xla_disable_hlo_passes``: comma-separated pass names; ``fusion`` turns fusion off (every
      op runs as its own library call, no fused region). Other pass names are recorded as
      ignored (``"xla_disable_hlo_passes=<pass>"``).
    * ``torch_tpu_compile_buckets``: bucket sizes of dynamic dimensions, the syntax of
      ``TORCH_TPU_COMPILE_BUCKETS`` (``"16,32,+32"``, ``"off"``).
    * ``torch_tpu_compile_single_op_regions``: ``"1"``/``"true"`` or ``"0"``/``"false"``, as
      ``TORCH_TPU_COMPILE_SINGLE_OP_REGIONS``.

    Any other flag (``xla_tpu_enable_latency_hiding_scheduler``, ...) has no counterpart on
    the vTPU: it is counted in ``torch_tpu.compile_stats()["ignored_compiler_options"]`` (once
    per entry of the context) and warned about once per name (``UserWarning``).

    Args:
        options: ``dict[str, str]``.

    Raises:
        TypeError: ``options`` is not a dict, or a name or value is not a str (naming it).
        ValueError: a bad value for a flag listed above, or an unknown ``torch_tpu_*`` name
            (naming the flag).
    """
    return _custom_compiler_options(options)


__all__ = ["custom_compiler_options"]
