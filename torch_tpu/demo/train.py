"""The single-chip demo: the loop of loop.py on ``tpu``, with ``torch.save`` checkpoints.

A checkpoint is one file ``<out>/ckpt-<step>.pt`` (model and optimizer state on the host, the
model's shapes and the run's settings), written atomically; ``<out>/latest`` names the newest.
"""

from __future__ import annotations

import argparse
import os
import re

import torch

from . import loop
from .errors import CheckpointError, DemoError, clean_error_text

CHECKPOINT_VERSION = 1
_CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
LATEST = "latest"  # text file in --out naming the newest checkpoint


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def checkpoint_path(out: str, step: int) -> str:
    return os.path.join(out, f"ckpt-{step:07d}.pt")


def list_checkpoints(out: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` of the ``ckpt-<step>.pt`` files in ``out``, newest first."""
    if not os.path.isdir(out):
        return []
    found = []
    for name in os.listdir(out):
        m = _CKPT_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(out, name)))
    return sorted(found, reverse=True)


def _atomic_write(path: str, write) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(out: str, state: dict, keep: list[str]) -> str:
    """Write ``state`` to ``out/ckpt-<step>.pt`` atomically (temporary file, then ``os.replace``),
    point ``out/latest`` at it, and delete other checkpoints except those in ``keep``.
    Returns the new path."""
    os.makedirs(out, exist_ok=True)
    path = checkpoint_path(out, state["step"])
    _atomic_write(path, lambda f: torch.save(state, f))
    _atomic_write(os.path.join(out, LATEST), lambda f: f.write((os.path.basename(path) + "\n").encode()))
    keep_set = {os.path.abspath(p) for p in keep} | {os.path.abspath(path)}
    for _, p in list_checkpoints(out):
        if os.path.abspath(p) not in keep_set:
            os.remove(p)
    return path


def _load_one(path: str) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    missing = [k for k in ("version", "step", "model", "optimizer", "model_config", "run") if k not in state]
    if missing:
        raise ValueError(f"not a demo checkpoint (missing {', '.join(missing)})")
    if state["version"] != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {state['version']}, this demo reads {CHECKPOINT_VERSION}")
    return state


def load_latest_checkpoint(out: str, log=print) -> tuple[dict, str] | None:
    """The newest loadable checkpoint of ``out`` as ``(state, path)``; None if ``out`` has none.

    Tries the file named by ``out/latest`` first, then the others newest first. A
    checkpoint that fails to load (truncated, corrupted) is renamed ``*.corrupt`` so
    that it is never picked or counted again, and the next older one is used.
    Raises CheckpointError when checkpoints exist but none loads.
    """
    candidates = [p for _, p in list_checkpoints(out)]
    latest = os.path.join(out, LATEST)
    if os.path.exists(latest):
        with open(latest) as f:
            named = os.path.join(out, f.read().strip())
        if named in candidates:
            candidates.remove(named)
            candidates.insert(0, named)
    failures = []
    for path in candidates:
        try:
            return _load_one(path), path
        except Exception as e:  # noqa: BLE001  (any unreadable file is skipped the same way)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failures.append(f"{os.path.basename(path)}: {reason}")
            os.replace(path, path + ".corrupt")
            log(f"warning: checkpoint {path} is corrupted or truncated ({reason}); "
                f"kept as {os.path.basename(path)}.corrupt, trying an older one")
    if failures:
        raise CheckpointError(f"--resume: no usable checkpoint in {out}: " + "; ".join(failures))
    return None


class SingleChip(loop.Job):
    """The job on one chip: ``torch.save`` checkpoints, ``--mode compile`` honoured."""

    compiles = True

    def __init__(self, device: torch.device, topo: dict):
        super().__init__(device, topo)
        self.lineage: list[str] = []  # checkpoints of this run kept on disk (the previous one survives a save)

    def find_checkpoint(self, out: str) -> tuple[dict, str] | None:
        return load_latest_checkpoint(out, log=self.log)

    def load(self, resumed: tuple[dict, str], model, opt) -> None:
        state, path = resumed
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        self.lineage = [path]

    def fresh_start(self, out: str) -> None:
        if list_checkpoints(out):
            self.log(f"note: starting a new run in {out}; its older checkpoints are replaced as this run saves "
                     f"(pass --resume to continue them)")

    def save(self, out: str, step: int, model, opt, meta: dict) -> str:
        state = {"version": CHECKPOINT_VERSION, "step": step, "model": _to_cpu(model.state_dict()),
                 "optimizer": _to_cpu(opt.state_dict()), **meta}
        path = save_checkpoint(out, state, keep=self.lineage[-(loop.KEEP_CHECKPOINTS - 1):])
        self.lineage.append(path)
        return path


def run(args: argparse.Namespace) -> int:
    """Train on ``tpu`` as ``args`` says (see loop.train); returns the exit code."""
    device = torch.device("tpu")
    try:
        torch.tpu.init()
        topo = torch.tpu.topology()
    except (ValueError, RuntimeError) as e:
        raise DemoError(f"cannot start the tpu runtime: {clean_error_text(e)}", exit_code=2) from None
    return loop.train(args, SingleChip(device, topo))
