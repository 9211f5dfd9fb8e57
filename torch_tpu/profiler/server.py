"""On-demand capture of a running job: ``start_server(port)`` in the job, a client outside it.

The server is an HTTP server (stdlib ``http.server``) on a thread of the job, bound to
127.0.0.1 unless told otherwise. ``GET /capture?duration_ms=N`` (optional
``host_tracer_level``, ``device_tracer_level``, ``python_tracer_level``) runs
``torch.profiler.profile`` on the request's thread for N ms with a
:class:`~torch_tpu.profiler.config.TpuProfilerConfig` whose ``profile_all_threads`` option
is on, so the ops every thread of the job issues meanwhile are recorded, and answers with the
Chrome/Perfetto trace (JSON) and the headers ``X-TorchTPU-Host`` / ``X-TorchTPU-Worker`` that
name the file in the TensorBoard layout. ``GET /`` answers ``{"host", "worker", "pid"}``.
Errors are JSON ``{"error": message}``: 400 bad parameters, 409 a profiler already running in
the job, 404 an unknown path, 500 a failed capture.

The client is ``python -m torch_tpu.profiler capture --port P --duration-ms N --out DIR``
(:mod:`torch_tpu.profiler.__main__`).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time

from .config import TpuProfilerConfig, exclusive_profiler

__all__ = ["start_server", "stop_server", "server_address", "capture_trace", "MAX_DURATION_MS"]

#: The longest capture one request may ask for (10 minutes).
MAX_DURATION_MS = 600_000

_state_lock = threading.Lock()  # guards _server
_server = None  # (HTTPServer, serving thread, worker name) while running
_capture_lock = threading.Lock()  # one capture at a time


def _check_duration(duration_ms: object) -> int:
    if isinstance(duration_ms, bool) or not isinstance(duration_ms, int):
        raise TypeError(f"duration_ms must be an int (milliseconds), got {type(duration_ms).__name__}")
    if not 1 <= duration_ms <= MAX_DURATION_MS:
        raise ValueError(f"duration_ms must be between 1 and {MAX_DURATION_MS}, got {duration_ms}")
    return duration_ms


def capture_trace(
    duration_ms: int,
    *,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    python_tracer_level: int = 0,
) -> bytes:
    """Profiles every thread of this process for ``duration_ms`` ms; returns the trace (JSON bytes).

    What the server runs for each request; callable directly from any thread (after a first
    profile on the thread that imported torch, as :func:`start_server` runs one, or Kineto
    prints "External init callback must run in same thread"). The levels are
    :class:`TpuProfilerConfig`'s.

    Raises:
        TypeError, ValueError: a bad duration (1..``MAX_DURATION_MS`` ms) or level.
        RuntimeError: another capture, or another ``torch.profiler`` session, is running.
    """
    import torch.profiler

    duration_ms = _check_duration(duration_ms)
    config = TpuProfilerConfig(
        host_tracer_level=host_tracer_level,
        device_tracer_level=device_tracer_level,
        python_tracer_level=python_tracer_level,
        experimental_options={"profile_all_threads": True},
    )
    # The trace is all a capture returns: skip building Python event objects (PyTorch
    # turns this off again itself when the Python tracer is on).
    config.trace_only = python_tracer_level == 0
    if not _capture_lock.acquire(blocking=False):
        raise RuntimeError("a capture is already running in this process")
    try:
        if torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled():
            raise RuntimeError("a torch.profiler session is already running in this process")
        prof = torch.profiler.profile(experimental_config=config)
        with tempfile.TemporaryDirectory(prefix="torch_tpu_capture_") as tmp:
            with exclusive_profiler(prof), prof:
                time.sleep(duration_ms / 1000)
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path, "rb") as f:
                return f.read()
    finally:
        _capture_lock.release()


def _make_server(host: str, port: int, worker: str):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass  # a job's stderr is not the place for access logs

        def _reply(self, status: int, body: bytes, content_type: str = "application/json", headers=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str):
            self._reply(status, json.dumps({"error": message}).encode())

        def do_GET(self):  # noqa: N802 - http.server's name
            url = urlsplit(self.path)
            if url.path == "/":
                info = {"host": socket.gethostname(), "worker": worker, "pid": os.getpid()}
                self._reply(200, json.dumps(info).encode())
                return
            if url.path != "/capture":
                self._error(404, f"unknown path {url.path!r}; use /capture?duration_ms=N")
                return
            query = parse_qs(url.query)
            args = {}
            names = ("duration_ms", "host_tracer_level", "device_tracer_level", "python_tracer_level")
            unknown = sorted(set(query) - set(names))
            if unknown:
                self._error(400, f"unknown parameter(s) {', '.join(unknown)}")
                return
            if "duration_ms" not in query:
                self._error(400, "duration_ms is required")
                return
            for name in names:
                if name in query:
                    text = query[name][-1]
                    try:
                        args[name] = int(text)
                    except ValueError:
                        self._error(400, f"{name} must be an int, got {text!r}")
                        return
            try:
                body = capture_trace(args.pop("duration_ms"), **args)
            except (TypeError, ValueError) as error:
                self._error(400, str(error))
                return
            except RuntimeError as error:
                self._error(409, str(error))
                return
            except Exception as error:  # noqa: BLE001 - reported to the client, the job goes on
                self._error(500, f"capture failed: {type(error).__name__}: {error}")
                return
            headers = (("X-TorchTPU-Host", socket.gethostname()), ("X-TorchTPU-Worker", worker))
            self._reply(200, body, headers=headers)

    class Server(ThreadingHTTPServer):
        daemon_threads = False  # a capture in flight finishes before stop_server or exit returns
        block_on_close = True

    return Server((host, port), Handler)


def _warm_up_profiler() -> None:
    # An empty profile on the caller's thread (normally the one that imported torch) before any
    # capture runs on the server's: Kineto initialises its client on the first profile, only on
    # the thread that registered it ("External init callback must run in same thread as
    # registerClient" otherwise), and torch.profiler imports torch._inductor when it starts,
    # which on a capture thread could meet an import on one of the job's threads.
    import torch.profiler

    if torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled():
        return  # a profile runs already (Kineto is initialised), and a second one would end it
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass


def start_server(port: int, *, host: str = "127.0.0.1", worker_rank: str | None = None) -> int:
    """Starts the capture server on a thread of this process; returns the port it listens on.

    Args:
        port: TCP port, 0..65535 (0: a free one, returned).
        host: the address to bind (default 127.0.0.1: this machine only; ``"0.0.0.0"`` for any).
        worker_rank: the ``<worker>`` part of captured traces' file names (default: the pid).

    Raises:
        TypeError, ValueError: a bad ``port``, ``host`` or ``worker_rank``.
        RuntimeError: a server is already running (``stop_server()`` first).
        OSError: ``port`` is in use (or cannot be bound) on ``host``.

    Runs an empty CPU profile on the calling thread first (see ``_warm_up_profiler``).
    """
    global _server
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"start_server: port must be an int, got {type(port).__name__}")
    if not 0 <= port <= 65535:
        raise ValueError(f"start_server: port must be between 0 and 65535, got {port}")
    if not isinstance(host, str) or not host:
        raise TypeError(f"start_server: host must be a non-empty str, got {host!r}")
    if worker_rank is not None and (isinstance(worker_rank, bool) or not isinstance(worker_rank, (str, int))):
        raise TypeError(f"start_server: worker_rank must be a str or None, got {type(worker_rank).__name__}")
    worker = str(os.getpid()) if worker_rank is None else str(worker_rank)
    if not worker or "/" in worker or os.sep in worker or worker in (".", ".."):
        raise ValueError(f"start_server: worker_rank {worker_rank!r} cannot be part of a file name")
    _warm_up_profiler()

    with _state_lock:
        if _server is not None:
            raise RuntimeError(
                f"start_server: a profiler server is already running on port {_server[0].server_address[1]}; "
                "call stop_server() first"
            )
        try:
            server = _make_server(host, port, worker)
        except OSError as error:
            raise OSError(error.errno, f"start_server: cannot listen on {host}:{port}: {error.strerror}") from error
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="torch_tpu profiler server", daemon=True
        )
        thread.start()
        _server = (server, thread, worker)
        return server.server_address[1]


def stop_server() -> None:
    """Stops the server :func:`start_server` started (waiting for a capture in flight).

    Raises:
        RuntimeError: no server is running.
    """
    global _server
    with _state_lock:
        if _server is None:
            raise RuntimeError("stop_server: no profiler server is running (start_server(port) starts one)")
        server, thread, _ = _server
        _server = None
    server.shutdown()
    server.server_close()
    thread.join()


def server_address() -> tuple[str, int] | None:
    """``(host, port)`` of the running server, or None."""
    with _state_lock:
        return None if _server is None else tuple(_server[0].server_address[:2])
