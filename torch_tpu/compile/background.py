"""Compiling on background threads.

* ``torch.compile(..., backend="tpu", options={"async_compile": True})``: the graph compiler
  hands each program build to :func:`submit` (one compile thread, builds in order); until the
  program is ready, calls run its graph op by op.
* :func:`async_compile` / :func:`resolve_compilations`: compile a ``torch.compile``'d function
  for several input shapes ahead of time, on a thread of its own, while the caller goes on.

Both give a :class:`CompileArtifact`; an artifact that failed stays *unresolved* until its error
has been raised to the caller once (by :meth:`CompileArtifact.wait`, by
:func:`resolve_compilations`, or by a call of the program whose build failed).
"""

import concurrent.futures
import contextvars
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

_lock = threading.Lock()
_unresolved: list["CompileArtifact"] = []  # pending, or failed and not reported yet
_pool: concurrent.futures.ThreadPoolExecutor | None = None


class CompileArtifact:
    """A compilation running in the background (from :func:`async_compile`, or one program
    build of ``options={"async_compile": True}``).

    Attributes:
        description: what is compiled, for messages (``"async_compile(step, 3 warmup inputs)"``).
    """

    def __init__(self, description: str, future: concurrent.futures.Future):
        self.description = description
        self._future = future
        with _lock:
            _unresolved.append(self)
        future.add_done_callback(self._settled)

    def _settled(self, future) -> None:
        if future.exception() is None:
            self._forget()

    def _forget(self) -> None:
        with _lock:
            if self in _unresolved:
                _unresolved.remove(self)

    def done(self) -> bool:
        """True once the compilation finished (successfully or not)."""
        return self._future.done()

    @property
    def error(self) -> BaseException | None:
        """The exception the compilation raised, or None (also while it runs)."""
        return self._future.exception() if self._future.done() else None

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the compilation finished; raise its exception if it failed.

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
            The compilation's own exception (its type kept), when it failed.
        """
        try:
            err = self._future.exception(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self.description}: still compiling after {timeout} s") from None
        if err is not None:
            self._forget()
            raise err

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self.error is not None else "done"
        return f"<CompileArtifact {self.description}: {state}>"


def submit(work: Callable[[], Any], description: str) -> CompileArtifact:
    """Run ``work`` on the compile thread (one thread, in submission order) in a copy of the
    caller's context (``custom_compiler_options`` included); its handle."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch_tpu-compile")
        pool = _pool
    return CompileArtifact(description, pool.submit(contextvars.copy_context().run, work))


def _is_compiled(fn) -> bool:
    """Whether ``fn`` came out of ``torch.compile`` (a function, an OptimizedModule, or a module
    compiled in place by ``nn.Module.compile()``)."""
    if getattr(fn, "_torchdynamo_orig_callable", None) is not None:
        return True
    if isinstance(fn, torch.nn.Module):
        if type(fn).__name__ == "OptimizedModule" or getattr(fn, "_compiled_call_impl", None) is not None:
            return True
    return False


def _normalize_inputs(warmup_inputs) -> list[tuple[tuple, dict]]:
    if isinstance(warmup_inputs, (torch.Tensor, str, bytes)) or not isinstance(warmup_inputs, Sequence):
        raise TypeError("async_compile: warmup_inputs must be a sequence with one entry per shape to compile "
                        "(a tuple of positional arguments, a dict of keyword arguments, or a single tensor), "
                        f"got {type(warmup_inputs).__name__}")
    if len(warmup_inputs) == 0:
        raise ValueError("async_compile: warmup_inputs is empty; give one entry per input shape to compile")
    out = []
    for i, item in enumerate(warmup_inputs):
        if isinstance(item, torch.Tensor):
            out.append(((item,), {}))
        elif isinstance(item, (tuple, list)):
            out.append((tuple(item), {}))
        elif isinstance(item, dict) and all(isinstance(k, str) for k in item):
            out.append(((), dict(item)))
        else:
            raise TypeError(f"async_compile: warmup_inputs[{i}] must be a tuple of positional arguments, a dict of "
                            f"keyword arguments or a tensor, got {type(item).__name__}")
    return out


def _describe(args: tuple, kwargs: dict) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)} on {v.device}"
        return type(v).__name__

    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def _synchronize(out) -> None:
    """Wait for the tpu work behind ``out`` (errors in queued work surface here)."""
    devices = set()

    def visit(v):
        if isinstance(v, torch.Tensor):
            if v.device.type == "tpu":
                devices.add(v.device.index or 0)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)

    visit(out)
    for d in sorted(devices):
        torch.tpu.synchronize(d)


def async_compile(fn: Callable, warmup_inputs: Sequence) -> CompileArtifact:
    """Compile ``fn`` for each shape of ``warmup_inputs`` ahead of time, on a background thread.

    A new thread calls ``fn`` once per entry of ``warmup_inputs``, in order, with the caller's
    grad mode, current tpu device and ``torch.tpu.compiler.custom_compiler_options``; Dynamo and
    the tpu backend compile what each call needs (the programs land in ``fn``'s Dynamo cache and
    in the program cache), the outputs are discarded once their tpu work finished. Later calls of
    ``fn`` with those shapes compile nothing. The warmup calls *run* ``fn``: give it inputs whose
    use is harmless (an inference function; for a training step, state whose update you accept).

    Args:
        fn: a ``torch.compile``'d function or module (any backend).
        warmup_inputs: one entry per shape: a tuple (or list) of positional arguments, a dict of
            keyword arguments, or a single tensor.

    Returns:
        A :class:`CompileArtifact`; :func:`resolve_compilations` waits for it.

    Raises:
        TypeError: ``fn`` is not callable or not compiled (``torch.compile(fn)`` first), or
            ``warmup_inputs`` / one of its entries has the wrong type.
        ValueError: ``warmup_inputs`` is empty.
    """
    if not callable(fn):
        raise TypeError(f"async_compile: fn must be callable, got {type(fn).__name__}")
    if not _is_compiled(fn):
        raise TypeError(f"async_compile: fn ({getattr(fn, '__name__', type(fn).__name__)}) is not compiled; "
                        "pass torch.compile(fn) (its Dynamo cache is what the warmups fill)")
    calls = _normalize_inputs(warmup_inputs)
    grad = torch.is_grad_enabled()
    device = torch.tpu.current_device() if torch.tpu.is_available() else None
    ctx = contextvars.copy_context()
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()

    def warm() -> None:
        try:
            if device is not None:
                torch.tpu.set_device(device)
            with torch.set_grad_enabled(grad):
                for i, (args, kwargs) in enumerate(calls):
                    try:
                        _synchronize(fn(*args, **kwargs))
                    except BaseException as e:
                        e.add_note(f"torch_tpu.async_compile: while compiling warmup_inputs[{i}] "
                                   f"({_describe(args, kwargs)})")
                        raise
        except BaseException as e:  # noqa: BLE001 (handed to the caller through the artifact)
            future.set_exception(e)
        else:
            future.set_result(None)

    name = getattr(fn, "__name__", None) or type(getattr(fn, "_orig_mod", fn)).__name__
    art = CompileArtifact(f"async_compile({name}, {len(calls)} warmup input{'s' if len(calls) != 1 else ''})",
                          future)
    threading.Thread(target=ctx.run, args=(warm,), name="torch_tpu-async-compile").start()
    return art


def resolve_compilations(artifacts: CompileArtifact | Iterable[CompileArtifact] | None = None, *,
                         timeout: float | None = None) -> None:
    """Wait for background compilations and raise the first error among them.

    Args:
        artifacts: a :class:`CompileArtifact` or an iterable of them (from :func:`async_compile`);
            ``None``: every background compilation not resolved yet (the ``async_compile``
            option's program builds included).
        timeout: seconds to wait in all (``None``: as long as it takes).

    Raises:
        TypeError: an entry of ``artifacts`` is not a :class:`CompileArtifact`, or ``timeout``
            is not a number.
        ValueError: ``timeout`` is negative (or NaN).
        TimeoutError: a compilation still runs after ``timeout`` seconds.
        The first failed compilation's own exception (its type kept, with a note naming the
        warmup input), once all of them finished.
    """
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError("resolve_compilations: timeout must be None or a number of seconds, "
                            f"got {type(timeout).__name__}")
        if not timeout >= 0:
            raise ValueError(f"resolve_compilations: timeout must be >= 0, got {timeout}")
    if artifacts is None:
        with _lock:
            items = list(_unresolved)
    elif isinstance(artifacts, CompileArtifact):
        items = [artifacts]
    else:
        try:
            items = list(artifacts)
        except TypeError:
            raise TypeError("resolve_compilations: artifacts must be a CompileArtifact, an iterable of them or "
                            f"None, got {type(artifacts).__name__}") from None
        for i, a in enumerate(items):
            if not isinstance(a, CompileArtifact):
                raise TypeError(f"resolve_compilations: artifacts[{i}] is a {type(a).__name__}, not a "
                                "CompileArtifact (async_compile returns them)")
    done, pending = concurrent.futures.wait([a._future for a in items], timeout=timeout)
    if pending:
        names = ", ".join(a.description for a in items if a._future in pending)
        raise TimeoutError(f"resolve_compilations: {len(pending)} compilation(s) still running after {timeout} s: "
                           f"{names}")
    for a in items:
        a.wait()
