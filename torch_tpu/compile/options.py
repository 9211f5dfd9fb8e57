"""Compiler options of the tpu backend, from two sources:

* ``torch.compile(..., options={...})``: the keys of :data:`COMPILE_OPTIONS`, checked by
  :func:`parse_compile_options` into a :class:`CompileOptions` (per compiled function);
* ``torch.tpu.compiler.custom_compiler_options({...})``: XLA-style ``dict[str, str]`` flags in
  force for the compilations run inside the context (:func:`custom_compiler_options`). The
  names of :data:`CONTEXT_OPTIONS` change what the backend does; any other name is counted in
  ``compile_stats()["ignored_compiler_options"]`` and warned about once, never dropped silently.

:func:`effective` merges the two for one compilation: the context is read when a graph is
compiled (in Dynamo's first call of a shape), not when ``torch.compile`` is called.
"""

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

from . import stats
from .dynamic.config import DEFAULT_SPEC, BucketConfig, get_buckets, parse_buckets
from .errors import passthrough

# torch.compile's options= keys the tpu backend understands
COMPILE_OPTIONS = {
    "num_dynamic_buckets": "int >= 1: at most this many buckets per dynamic dimension "
                           "(bucket_size, 2*bucket_size, ...; without bucket_size the first ones of the "
                           "configured buckets); a larger size compiles exactly",
    "bucket_size": "int >= 1: buckets are multiples of it",
    "async_compile": "bool: build programs on a background thread; calls before a program is ready run "
                     "its graph op by op",
    "serializable": "bool: every program must be plain data (storable in the disk cache, loadable by "
                    "another process); one that is not raises instead of staying process-local",
    "debug_callback": "callable(graphs, stablehlo): called for every program with [the graph handed to "
                      "the pipeline, the ATen graph] and the program's StableHLO text",
    "name": "str: names the programs in logs, errors, StableHLO module names and dump files",
}

# custom_compiler_options names that change what the backend does
CONTEXT_OPTIONS = {
    "xla_dump_to": "a folder: programs compiled inside the context are written there as StableHLO "
                   "(like TORCH_TPU_DUMP_IR)",
    "xla_disable_hlo_passes": "comma-separated pass names: 'fusion' turns fusion off (every op a library "
                              "call, no fused region); other passes are recorded as ignored",
    "torch_tpu_compile_buckets": "a bucket specification, as TORCH_TPU_COMPILE_BUCKETS ('off' included)",
    "torch_tpu_compile_single_op_regions": "'1'/'true' or '0'/'false', as TORCH_TPU_COMPILE_SINGLE_OP_REGIONS",
}

_SINGLE_OP_ENV = "TORCH_TPU_COMPILE_SINGLE_OP_REGIONS"


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Everything one compilation is told, from ``torch.compile``'s options and the
    ``custom_compiler_options`` context (``None``: not given; the environment / defaults apply)."""

    num_dynamic_buckets: int | None = None
    bucket_size: int | None = None
    async_compile: bool = False
    serializable: bool = False
    debug_callback: Callable | None = None
    name: str | None = None
    # from custom_compiler_options
    dump_dir: str | None = None
    fuse: bool = True
    single_op_regions: bool | None = None
    buckets: BucketConfig | None = None

    def bucket_config(self) -> BucketConfig | None:
        """The buckets of this compilation, or ``None``: the configuration in force at each
        call (``set_buckets`` / ``TORCH_TPU_COMPILE_BUCKETS``)."""
        n, size = self.num_dynamic_buckets, self.bucket_size
        if n is None and size is None:
            return self.buckets
        if size is not None:
            if n is None:
                return BucketConfig((), size)
            return BucketConfig(tuple(size * (i + 1) for i in range(n)), None)
        base = self.buckets or get_buckets()
        if not base.enabled:  # bucketing off, yet a number of buckets asked for: the default ones
            base = parse_buckets(DEFAULT_SPEC)
        sizes = list(base.sizes[:n])
        while len(sizes) < n and base.step is not None:
            last = sizes[-1] if sizes else 0
            sizes.append((last // base.step + 1) * base.step)
        return BucketConfig(tuple(sizes), None)

    def single_op_regions_on(self) -> bool:
        if self.single_op_regions is not None:
            return self.single_op_regions
        return os.environ.get(_SINGLE_OP_ENV, "0") == "1"

    def variant(self) -> str:
        """The settings that change a program built from the same graph (part of its cache key)."""
        return f"fuse={int(self.fuse)},single_op_regions={int(self.single_op_regions_on())}"

    def dump_folder(self) -> str | None:
        return self.dump_dir or os.environ.get("TORCH_TPU_DUMP_IR") or None


def _option_error(exc_type: type, where: str, msg: str) -> BaseException:
    return passthrough(exc_type, f"{where}: {msg}")


def _positive_int(where: str, key: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _option_error(TypeError, where, f"option {key!r} must be an int >= 1, got {v!r} ({type(v).__name__})")
    if v < 1:
        raise _option_error(ValueError, where, f"option {key!r} must be >= 1, got {v}")
    return v


def parse_compile_options(options, where: str = "torch.compile(backend='tpu')") -> CompileOptions:
    """Check ``torch.compile``'s ``options`` for the tpu backend.

    Args:
        options: ``None`` or a dict whose keys are among :data:`COMPILE_OPTIONS`.
        where: how errors name the call.

    Returns:
        The :class:`CompileOptions` (the context's settings not merged yet, see :func:`effective`).

    Raises:
        TypeError: ``options`` is not a dict, or a value of the wrong type (naming the option).
        ValueError: an unknown option (naming it and listing the valid ones), or a value out of range.
    """
    if options is None:
        return CompileOptions()
    if not isinstance(options, dict):
        raise _option_error(TypeError, where, f"options must be a dict, got {type(options).__name__}")
    fields: dict[str, Any] = {}
    for key, v in options.items():
        if key not in COMPILE_OPTIONS:
            raise _option_error(ValueError, where, f"unknown option {key!r}; valid options: "
                                + ", ".join(COMPILE_OPTIONS))
        if key in ("num_dynamic_buckets", "bucket_size"):
            fields[key] = _positive_int(where, key, v)
        elif key in ("async_compile", "serializable"):
            if not isinstance(v, bool):
                raise _option_error(TypeError, where, f"option {key!r} must be a bool, got {v!r}")
            fields[key] = v
        elif key == "debug_callback":
            if v is not None and not callable(v):
                raise _option_error(TypeError, where, f"option 'debug_callback' must be callable, got "
                                    f"{type(v).__name__}")
            fields[key] = v
        else:  # name
            if v is not None and (not isinstance(v, str) or not v):
                raise _option_error(TypeError, where, f"option 'name' must be a non-empty str, got {v!r}")
            fields[key] = v
    return CompileOptions(**fields)


# ---------------------------------------------------------------- custom_compiler_options

# the understood settings in force in this thread / context: CompileOptions field -> value
_context: contextvars.ContextVar[tuple] = contextvars.ContextVar("torch_tpu_compiler_options", default=())

_WHERE = "custom_compiler_options"
_TRUE, _FALSE = ("1", "true"), ("0", "false")


def _check_context_options(options) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(settings: CompileOptions field -> value, ignored: [(name, why)]) for ``options``.

    Raises TypeError / ValueError naming the option for bad input (nothing is recorded then)."""
    if not isinstance(options, dict):
        raise TypeError(f"{_WHERE}: options must be a dict[str, str], got {type(options).__name__}")
    settings: dict[str, Any] = {}
    ignored: list[tuple[str, str]] = []
    for key, v in options.items():
        if not isinstance(key, str):
            raise TypeError(f"{_WHERE}: option names must be str, got {key!r} ({type(key).__name__})")
        if not isinstance(v, str):
            raise TypeError(f"{_WHERE}: option {key!r} must have a str value, got {v!r} ({type(v).__name__})")
        if key == "xla_dump_to":
            if not v.strip():
                raise ValueError(f"{_WHERE}: option 'xla_dump_to' needs a folder, got {v!r}")
            settings["dump_dir"] = v
        elif key == "xla_disable_hlo_passes":
            passes = [p.strip() for p in v.split(",") if p.strip()]
            settings["fuse"] = "fusion" not in passes
            ignored += [(f"xla_disable_hlo_passes={p}", "the tpu backend has no such pass to disable")
                        for p in passes if p != "fusion"]
        elif key == "torch_tpu_compile_buckets":
            try:
                settings["buckets"] = parse_buckets(v)
            except ValueError as e:
                raise ValueError(f"{_WHERE}: option 'torch_tpu_compile_buckets': {e}") from None
        elif key == "torch_tpu_compile_single_op_regions":
            if v.strip().lower() not in _TRUE + _FALSE:
                raise ValueError(f"{_WHERE}: option 'torch_tpu_compile_single_op_regions' must be one of "
                                 f"'0', '1', 'true', 'false', got {v!r}")
            settings["single_op_regions"] = v.strip().lower() in _TRUE
        elif key.startswith("torch_tpu_"):
            raise ValueError(f"{_WHERE}: unknown option {key!r}; the torch_tpu_* options are "
                             + ", ".join(k for k in CONTEXT_OPTIONS if k.startswith("torch_tpu_")))
        else:
            ignored.append((key, "no counterpart in the tpu backend (the options applied are "
                                 + ", ".join(CONTEXT_OPTIONS) + ")"))
    return settings, ignored


@contextlib.contextmanager
def custom_compiler_options(options: dict[str, str]) -> Iterator[None]:
    """See :func:`torch_tpu.tpu.compiler.custom_compiler_options`."""
    settings, ignored = _check_context_options(options)
    for name, why in ignored:
        stats.note_ignored_option(name, why, stacklevel=3)  # past contextlib's __enter__: the with statement
    merged = {**dict(_context.get()), **settings}
    token = _context.set(tuple(merged.items()))
    try:
        yield
    finally:
        _context.reset(token)


def effective(options: CompileOptions | None = None) -> CompileOptions:
    """``options`` (a compiled function's) with the settings of the ``custom_compiler_options``
    contexts in force in this thread."""
    options = options or CompileOptions()
    ctx = dict(_context.get())
    return dataclasses.replace(options, **ctx) if ctx else options
