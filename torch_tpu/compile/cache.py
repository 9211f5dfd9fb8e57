"""Program cache of ``torch.compile(backend="tpu")``: in memory and on disk.

Key: SHA-256 of the FX graph's code (after AOTAutograd, DCE and CSE), the
metadata of its inputs (shapes, strides, dtypes, devices), the values of its
tensor constants, the chip (generation, HBM capacity), the torch_tpu and torch
versions, the description format (``FORMAT_VERSION``), the IR's op set and the
extension library's build (a rebuilt ``_C`` may lower differently).

Disk entries live in ``TORCH_TPU_CACHE_DIR`` (default ``~/.cache/torch_tpu``)
as ``programs/<key>.json``: a header line with the SHA-256 of the body, then the
program description as JSON (plain data: IR op records, ATen op names and
arguments; no pickled code). Writes go to a temporary file in the same folder
and ``os.replace`` it, so concurrent writers of one key leave one whole entry.
A truncated or corrupted entry (checksum mismatch, bad JSON) is reported once
as a warning, removed and rebuilt.
"""

import hashlib
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import _C
from .._version import __version__
from . import stats

log = logging.getLogger("torch_tpu.compile")

# Version of the program description format: part of every key, and checked on each disk entry.
FORMAT_VERSION = 5  # 5: roots join their first reader's region (programs partitioned anew)


class Uncacheable(Exception):
    """A program that cannot be described by plain data, so has no key (it still runs)."""


_memory: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()
_warned_corrupt = False


def cache_dir() -> str:
    """The folder of disk entries: ``$TORCH_TPU_CACHE_DIR/programs`` (default
    ``~/.cache/torch_tpu/programs``)."""
    base = os.environ.get("TORCH_TPU_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_tpu")
    return os.path.join(base, "programs")


def _disabled() -> bool:
    return os.environ.get("TORCH_TPU_CACHE_DIR", None) == ""


_static_part: str | None = None


def _static_key() -> str:
    """Versions, IR op set and the extension's build: same for every program of a process."""
    global _static_part
    if _static_part is None:
        try:
            st = os.stat(_C.__file__)
            build = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            build = "?"
        _static_part = "|".join([f"format={FORMAT_VERSION}", f"torch_tpu={__version__}", f"torch={torch.__version__}",
                                 f"ir={_C._compile.ir_signature()}", f"build={build}"])
    return _static_part


def _meta(x) -> str:
    if isinstance(x, torch.Tensor):
        return (f"T({x.dtype},{tuple(x.shape)},{tuple(x.stride())},{x.storage_offset()},{x.device},"
                f"{x.requires_grad})")
    return f"{type(x).__name__}({x!r})"


def program_key(gm: torch.fx.GraphModule, example_inputs: Sequence, variant: str = "") -> str:
    """The cache key of the program for `gm` with these inputs (hex SHA-256); `variant`: the
    settings that change the program built from the same graph (fusion on/off, ...)."""
    h = hashlib.sha256()
    h.update(_static_key().encode())
    h.update(f"variant={variant}".encode())
    devices = set()
    for x in example_inputs:
        h.update(_meta(x).encode())
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            devices.add(x.device.index or 0)
    for d in sorted(devices) or [0]:
        p = torch.tpu.get_device_properties(d)
        h.update(f"chip{d}={p.generation}:{p.total_memory}".encode())
    h.update(gm.code.encode())
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor):
                h.update(_meta(obj).encode())
                with unset_fake_temporarily():  # the compiler runs under AOTAutograd's fake mode
                    h.update(obj.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            else:
                raise Uncacheable(f"graph attribute {n.target} of type {type(obj).__name__}")
    return h.hexdigest()


def memory_get(key: str) -> dict[str, Any] | None:
    with _lock:
        return _memory.get(key)


def memory_put(key: str, desc: dict[str, Any]) -> None:
    with _lock:
        _memory[key] = desc


def clear_memory_cache() -> None:
    """Forget programs cached in this process (disk entries stay)."""
    with _lock:
        _memory.clear()


def _path(key: str) -> str:
    return os.path.join(cache_dir(), key + ".json")


def disk_get(key: str) -> dict[str, Any] | None:
    """The description stored for `key`, or None (absent, or corrupted: then removed)."""
    if _disabled():
        return None
    path = _path(key)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("program cache: cannot read %s: %s", path, e)
        return None
    try:
        header, _, body = data.partition(b"\n")
        meta = json.loads(header)
        if hashlib.sha256(body).hexdigest() != meta.get("sha256"):
            raise ValueError("checksum mismatch (truncated or corrupted)")
        desc = json.loads(body)
        if not isinstance(meta, dict) or not isinstance(desc, dict):
            raise ValueError("not a program description")
        if desc.get("format") != meta.get("format"):
            raise ValueError("format mismatch")
        return desc
    except (ValueError, json.JSONDecodeError, UnicodeDecodeError) as e:
        _report_corrupt(path, e)
        try:
            os.remove(path)
        except OSError:
            pass
        return None


def report_corrupt_entry(key: str, e: Exception) -> None:
    """An entry whose checksum holds but whose body is not a valid program: report it
    once, remove it (the caller rebuilds and writes it again)."""
    path = _path(key)
    _report_corrupt(path, e)
    try:
        os.remove(path)
    except OSError:
        pass


def _report_corrupt(path: str, e: Exception) -> None:
    global _warned_corrupt
    stats.add("corrupt_cache_entries")
    msg = f"torch_tpu program cache: entry {path} is corrupted ({e}); it is rebuilt"
    if not _warned_corrupt:
        _warned_corrupt = True
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    log.warning(msg)


def disk_put(key: str, desc: dict[str, Any]) -> None:
    """Store `desc` atomically (temporary file + os.replace); errors only log."""
    if _disabled():
        return
    folder = cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        body = json.dumps(desc, separators=(",", ":")).encode()
        header = json.dumps({"sha256": hashlib.sha256(body).hexdigest(), "format": desc.get("format")}).encode()
        fd, tmp = tempfile.mkstemp(prefix=key[:16] + ".", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header + b"\n" + body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, _path(key))
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        log.warning("program cache: cannot write to %s: %s", folder, e)
