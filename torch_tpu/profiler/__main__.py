"""``python -m torch_tpu.profiler capture --port P --duration-ms N --out DIR``: capture a running job.

The job called ``torch.tpu.profiler.start_server(P)``; this asks it to profile all its threads
for N ms and writes the trace to
``DIR/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<job host>_<job worker>.pt.trace.json`` (``.gz``
with ``--gzip``), printing the path. Exit status: 0 written, 1 the server is not running or
refused (its message is printed) or the trace could not be written, 2 bad arguments
(``--out`` an existing file included).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from .config import trace_file_path
from .server import MAX_DURATION_MS


def _duration(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int (milliseconds), got {text!r}") from None
    if not 1 <= value <= MAX_DURATION_MS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_DURATION_MS}, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 1 and 65535, got {value}")
    return value


def _safe_name(name: str | None) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu.profiler", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cap = commands.add_parser("capture", help="capture a job that called torch.tpu.profiler.start_server(port)")
    cap.add_argument("--port", type=_port, required=True, help="the port the job's server listens on")
    cap.add_argument("--host", default="127.0.0.1", help="the job's address (default 127.0.0.1)")
    cap.add_argument("--duration-ms", type=_duration, required=True, help="how long to profile, in ms")
    cap.add_argument("--out", required=True, help="the run directory the trace is written under")
    cap.add_argument("--host-tracer-level", type=int, default=2, help="0..3 (TpuProfilerConfig's; default 2)")
    cap.add_argument("--device-tracer-level", type=int, default=1, help="0..1 (default 1)")
    cap.add_argument("--python-tracer-level", type=int, default=0, help="0..1 (default 0)")
    cap.add_argument("--gzip", action="store_true", help="write .pt.trace.json.gz")
    cap.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait beyond the duration (default 300)"
    )
    return parser


def capture(args: argparse.Namespace) -> int:
    """Runs the ``capture`` command; returns the exit status."""
    query = urllib.parse.urlencode({
        "duration_ms": args.duration_ms,
        "host_tracer_level": args.host_tracer_level,
        "device_tracer_level": args.device_tracer_level,
        "python_tracer_level": args.python_tracer_level,
    })
    url = f"http://{args.host}:{args.port}/capture?{query}"
    where = f"{args.host}:{args.port}"
    try:
        with urllib.request.urlopen(url, timeout=args.duration_ms / 1000 + args.timeout) as response:
            body = response.read()
            host = response.headers.get("X-TorchTPU-Host")
            worker = response.headers.get("X-TorchTPU-Worker")
    except urllib.error.HTTPError as error:
        try:
            message = json.loads(error.read())["error"]
        except Exception:  # noqa: BLE001 - not our server's JSON: show the status line
            message = f"{error.code} {error.reason}"
        print(f"torch_tpu.profiler capture: the server at {where} refused: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        print(
            f"torch_tpu.profiler capture: no profiler server at {where} ({reason}); "
            f"the job must call torch.tpu.profiler.start_server({args.port})",
            file=sys.stderr,
        )
        return 1
    if not all(_safe_name(name) for name in (host, worker)):
        print(f"torch_tpu.profiler capture: {where} is not a torch_tpu profiler server", file=sys.stderr)
        return 1
    try:
        path = trace_file_path(args.out, worker, host=host, gzip=args.gzip)
        with open(path, "wb") as f:
            f.write(gzip.compress(body) if args.gzip else body)
    except OSError as error:
        print(f"torch_tpu.profiler capture: cannot write the trace under {args.out}: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2 for bad arguments, through argparse)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"argument --out: {args.out!r} exists and is not a directory")
    return capture(args)


if __name__ == "__main__":
    sys.exit(main())
