"""``TpuProfilerConfig``: TorchTPU's profiler configuration, passed as ``experimental_config``.

``torch.profiler.profile(experimental_config=TpuProfilerConfig(...))`` passes PyTorch's type
check because the class subclasses ``torch._C._profiler._ExperimentalConfig`` (PyTorch's
C++ side receives the base part). What the tracer levels and ``run_dir`` change happens in
Python, at two seams of ``torch.profiler.profiler._KinetoProfile`` (the base of
``torch.profiler.profile``) that the first ``TpuProfilerConfig`` installs, and that do nothing
for any other ``experimental_config``:

- ``__init__``: the levels decide the host (``ProfilerActivity.CPU``) and tpu
  (``ProfilerActivity.PrivateUse1``) entries of ``activities``, and turn on ``with_stack`` /
  ``record_shapes`` (see :class:`TpuProfilerConfig`);
- ``stop_trace``: the trace is processed under ``experimental_options["generation"]`` if given,
  then written under ``run_dir`` in the TensorBoard layout.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import socket
import warnings
from collections.abc import Iterator, Mapping

from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity

from .. import _C

__all__ = ["TpuProfilerConfig", "trace_file_path"]

#: What an ``experimental_options`` value may be.
_ExperimentalValue = bool | int | float | str

#: Known ``experimental_options`` keys and the types their values must have.
EXPERIMENTAL_OPTIONS: dict[str, type] = {
    "gzip": bool,
    "generation": str,
    "profile_all_threads": bool,
    "capture_overload_names": bool,
    "record_python_gc_info": bool,
}
# Options handed to ``_ExperimentalConfig.__init__`` unchanged.
_BASE_OPTIONS = ("profile_all_threads", "capture_overload_names", "record_python_gc_info")

# Tracer levels: the highest each accepts (the lowest is 0).
_MAX_LEVEL = {"host_tracer_level": 3, "device_tracer_level": 1, "python_tracer_level": 1}

# Kineto activity types kept on the host at host_tracer_level 1, and for the Python tracer.
_USER_ANNOTATION = "USER_ANNOTATION"
_PYTHON_FUNCTION = "PYTHON_FUNCTION"


@contextlib.contextmanager
def generation_scope(generation: str | None) -> Iterator[None]:
    """Estimates device tracks for ``generation`` inside the block (``None``: no change)."""
    if generation is None:
        yield
        return
    if not isinstance(generation, str):
        raise TypeError(f"generation: expected a generation name (str) or None, got {type(generation).__name__}")
    previous = _C._profiler_generation_setting()
    _C._profiler_set_generation(generation)  # ValueError for an unknown generation
    try:
        yield
    finally:
        _C._profiler_set_generation(previous)


def _check_level(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"TpuProfilerConfig: {name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _MAX_LEVEL[name]:
        raise ValueError(f"TpuProfilerConfig: {name} must be between 0 and {_MAX_LEVEL[name]}, got {value}")
    return value


def _check_worker_rank(worker_rank: object) -> str | None:
    if worker_rank is None:
        return None
    if isinstance(worker_rank, bool) or not isinstance(worker_rank, (str, int)):
        raise TypeError(f"TpuProfilerConfig: worker_rank must be a str or None, got {type(worker_rank).__name__}")
    text = str(worker_rank)
    if not text or "/" in text or os.sep in text or text in (".", ".."):
        raise ValueError(f"TpuProfilerConfig: worker_rank {worker_rank!r} cannot be part of a file name")
    return text


def _check_run_dir(run_dir: object) -> str | None:
    if run_dir is None:
        return None
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"TpuProfilerConfig: run_dir must be a str or os.PathLike, got {type(run_dir).__name__}")
    path = os.fspath(run_dir)
    if not isinstance(path, str) or not path:
        raise ValueError(f"TpuProfilerConfig: run_dir must be a non-empty path, got {run_dir!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"TpuProfilerConfig: run_dir {path!r} exists and is not a directory")
    return path


def _check_options(options: object, check: bool) -> dict:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"TpuProfilerConfig: experimental_options must be a mapping, got {type(options).__name__}")
    result = {}
    unknown = []
    for key, value in options.items():
        if not isinstance(key, str):
            raise TypeError(f"TpuProfilerConfig: experimental_options keys must be str, got {key!r}")
        if key not in EXPERIMENTAL_OPTIONS:
            unknown.append(key)
            continue
        expected = EXPERIMENTAL_OPTIONS[key]
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise TypeError(
                f"TpuProfilerConfig: experimental_options[{key!r}] must be a {expected.__name__}, "
                f"got {type(value).__name__}"
            )
        result[key] = value
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        known = ", ".join(repr(k) for k in EXPERIMENTAL_OPTIONS)
        if check:
            raise ValueError(
                f"TpuProfilerConfig: unknown experimental_options {names} (known: {known}; "
                "pass check_experimental_options=False to ignore unknown options)"
            )
        warnings.warn(
            f"TpuProfilerConfig: experimental_options {names} have no effect on the vTPU and are ignored",
            stacklevel=3,
        )
    if "generation" in result:
        generations = tuple(g["generation"] for g in _C._generations())
        if result["generation"] not in generations:
            raise ValueError(
                f"TpuProfilerConfig: experimental_options['generation'] {result['generation']!r} is not one of "
                f"{', '.join(generations)}"
            )
    return result


class TpuProfilerConfig(_ExperimentalConfig):
    """What ``torch.profiler.profile`` records on tpu, and where the trace goes.

    Pass it as ``experimental_config``::

        with torch.profiler.profile(experimental_config=TpuProfilerConfig(run_dir="runs/prof")):
            train_step()

    The levels decide the host and tpu activities whatever ``activities`` says (other
    activities in it are kept):

    - ``host_tracer_level``: ``0`` no host (CPU) events; ``1`` only ``record_function`` ranges
      and ``ProfilerStep#N`` (user annotations, no ``aten::`` ops); ``2`` (default) every host
      op; ``3`` every host op with its input shapes (``record_shapes=True``).
    - ``device_tracer_level``: ``0`` no tpu device tracks; ``1`` (default) the device tracks of
      ``torch_tpu.profiler`` (``ProfilerActivity.PrivateUse1``: ops in estimated TPU time,
      ``record_function`` ranges, collectives, the HBM counter).
    - ``python_tracer_level``: ``0`` (default) no Python function events (``with_stack`` as
      passed); ``1`` Python function events (``with_stack=True``), also at host level 0 or 1.

    Args:
        host_tracer_level, device_tracer_level, python_tracer_level: ints in 0..3, 0..1, 0..1.
        run_dir: when set, each trace the profiler stops on (each cycle of a schedule) is written
            to ``<run_dir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>_<worker>.pt.trace.json``
            (``.json.gz`` with ``experimental_options={"gzip": True}``); see
            :func:`trace_file_path`. ``on_trace_ready`` still runs afterwards.
        worker_rank: the ``<worker>`` part of the file name (default: the process id).
        experimental_options: ``gzip`` (bool), ``generation`` (str: the generation the device
            tracks are estimated for while this profiler's traces are processed),
            ``profile_all_threads`` (bool: record ops issued by every thread, not only the
            one that started the profiler), ``capture_overload_names``, ``record_python_gc_info``
            (bools, PyTorch's ``_ExperimentalConfig`` options).
        check_experimental_options: unknown ``experimental_options`` keys raise ``ValueError``
            when True; when False they are ignored with a warning.

    Raises:
        TypeError: an argument of the wrong type (the message names it).
        ValueError: a level out of range, an unusable ``run_dir`` or ``worker_rank``, unknown
            ``experimental_options`` (named), an unknown generation, or all three levels 0.
    """

    def __init__(
        self,
        *,
        host_tracer_level: int = 2,
        device_tracer_level: int = 1,
        python_tracer_level: int = 0,
        run_dir: os.PathLike[str] | str | None = None,
        worker_rank: str | None = None,
        experimental_options: Mapping[str, _ExperimentalValue] | None = None,
        check_experimental_options: bool = True,
    ) -> None:
        levels = {
            "host_tracer_level": host_tracer_level,
            "device_tracer_level": device_tracer_level,
            "python_tracer_level": python_tracer_level,
        }
        for name, value in levels.items():
            _check_level(name, value)
        if not any(levels.values()):
            raise ValueError(
                "TpuProfilerConfig: host_tracer_level, device_tracer_level and python_tracer_level are all 0: "
                "nothing would be traced"
            )
        if not isinstance(check_experimental_options, bool):
            raise TypeError(
                "TpuProfilerConfig: check_experimental_options must be a bool, "
                f"got {type(check_experimental_options).__name__}"
            )
        options = _check_options(experimental_options, check_experimental_options)
        super().__init__(**{k: options[k] for k in _BASE_OPTIONS if k in options})
        self._host = host_tracer_level
        self._device = device_tracer_level
        self._python = python_tracer_level
        self._run_dir = _check_run_dir(run_dir)
        self._worker_rank = _check_worker_rank(worker_rank)
        self._options = options
        self._check = check_experimental_options
        _install_seams()

    host_tracer_level = property(lambda self: self._host, doc="0..3, see the class docstring.")
    device_tracer_level = property(lambda self: self._device, doc="0..1, see the class docstring.")
    python_tracer_level = property(lambda self: self._python, doc="0..1, see the class docstring.")
    run_dir = property(lambda self: self._run_dir, doc="Where traces are written (a str), or None.")
    worker_rank = property(lambda self: self._worker_rank, doc="The file name's worker part (a str), or None.")

    @property
    def experimental_options(self) -> dict:
        """The known experimental options given (a copy)."""
        return dict(self._options)

    def _kwargs(self) -> dict:
        return {
            "host_tracer_level": self._host,
            "device_tracer_level": self._device,
            "python_tracer_level": self._python,
            "run_dir": self._run_dir,
            "worker_rank": self._worker_rank,
            "experimental_options": dict(self._options),
            "check_experimental_options": self._check,
        }

    def __copy__(self) -> TpuProfilerConfig:
        # PyTorch copies the config to turn trace_only off; the copy must be whole.
        other = TpuProfilerConfig(**self._kwargs())
        other.trace_only = self.trace_only
        other.custom_profiler_config = self.custom_profiler_config
        return other

    def __deepcopy__(self, memo: dict) -> TpuProfilerConfig:
        return self.__copy__()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs().items())
        return f"TpuProfilerConfig({args})"

    def _profile_kwargs(self, kwargs: dict) -> dict:
        """``_KinetoProfile.__init__``'s keyword arguments with the levels applied."""
        from torch.profiler.profiler import _parse_activities, supported_activities

        kwargs = dict(kwargs)
        activities = kwargs.get("activities")
        if activities is None:
            chosen, filters = set(supported_activities()), {}
        else:
            chosen, filters = _parse_activities(activities)
        tpu = ProfilerActivity.PrivateUse1
        cpu = ProfilerActivity.CPU
        result: list = []
        for activity in sorted(chosen - {cpu, tpu}, key=lambda a: int(a)):
            result.append({activity: sorted(filters[activity])} if activity in filters else activity)
        python = self._python >= 1
        if self._host >= 2:
            result.append(cpu)
        elif self._host == 1:
            result.append({cpu: [_USER_ANNOTATION] + ([_PYTHON_FUNCTION] if python else [])})
        elif python:
            result.append({cpu: [_PYTHON_FUNCTION]})
        if self._device >= 1:
            result.append(tpu)
        kwargs["activities"] = result
        if self._host >= 3:
            kwargs["record_shapes"] = True
        if python:
            kwargs["with_stack"] = True
        return kwargs

    def _write(self, prof) -> str:
        path = trace_file_path(self._run_dir, self._worker_rank, gzip=self._options.get("gzip", False))
        prof.export_chrome_trace(path)
        return path


def trace_file_path(run_dir: str, worker: str | None = None, *, host: str | None = None, gzip: bool = False) -> str:
    """A new trace file's path in the TensorBoard layout, its directory created.

    ``<run_dir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>_<worker>.pt.trace.json[.gz]``:
    the run directory TensorBoard's profile plugin lists (one per capture, named by local
    time), and a file name PyTorch's TensorBoard plugin reads (``<host>_<pid>``, as
    ``torch.profiler.tensorboard_trace_handler`` names it). ``worker`` defaults to the process
    id, ``host`` to this machine's host name. When that file exists already (two traces in one
    second), the run directory gets a ``_1``, ``_2``, ... suffix.
    """
    if worker is None:
        worker = str(os.getpid())
    stamp = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S")
    name = f"{host or socket.gethostname()}_{worker}.pt.trace.json" + (".gz" if gzip else "")
    base = os.path.join(run_dir, "plugins", "profile")
    run, n = stamp, 0
    while os.path.exists(os.path.join(base, run, name)):
        n += 1
        run = f"{stamp}_{n}"
    os.makedirs(os.path.join(base, run), exist_ok=True)
    return os.path.join(base, run, name)


_installed = False
_capture_owner = None  # the profiler of the on-demand capture in flight (server.py), or None


@contextlib.contextmanager
def exclusive_profiler(prof) -> Iterator[None]:
    """While the block runs, any other ``torch.profiler`` profile that starts raises RuntimeError.

    For the capture server: Kineto runs one session per process, and a second one started on
    another thread while a capture runs crashes the process.
    """
    global _capture_owner
    _install_seams()
    _capture_owner = prof
    try:
        yield
    finally:
        _capture_owner = None


def _install_seams() -> None:
    """Wraps ``_KinetoProfile.__init__``, ``prepare_trace`` and ``stop_trace`` once.

    The wrappers do nothing for another ``experimental_config``, except that ``prepare_trace``
    raises while an on-demand capture runs (:func:`exclusive_profiler`).
    """
    global _installed
    if _installed:
        return
    from torch.profiler.profiler import _KinetoProfile

    original_init = _KinetoProfile.__init__
    original_prepare = _KinetoProfile.prepare_trace
    original_stop = _KinetoProfile.stop_trace

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        config = kwargs.get("experimental_config")
        if isinstance(config, TpuProfilerConfig):
            kwargs = config._profile_kwargs(kwargs)
        original_init(self, *args, **kwargs)

    @functools.wraps(original_prepare)
    def prepare_trace(self):
        owner = _capture_owner
        if owner is not None and owner is not self:
            raise RuntimeError(
                "torch.profiler: a torch.tpu.profiler capture (start_server) is running in this process, and "
                "Kineto runs one profiling session at a time: start this profiler after the capture ends"
            )
        original_prepare(self)

    @functools.wraps(original_stop)
    def stop_trace(self):
        config = getattr(self, "experimental_config", None)
        if not isinstance(config, TpuProfilerConfig):
            return original_stop(self)
        with generation_scope(config._options.get("generation")):
            original_stop(self)
        if config.run_dir is not None:
            config._write(self)

    _KinetoProfile.__init__ = __init__
    _KinetoProfile.prepare_trace = prepare_trace
    _KinetoProfile.stop_trace = stop_trace
    _installed = True

