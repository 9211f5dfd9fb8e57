"""The demo's errors: what it reports as one clean message (no traceback) and an exit code."""

from __future__ import annotations

import re

import torch

from .._units import format_bytes, parse_bytes


class DemoError(Exception):
    """An error the demo reports as one clean message (no traceback) and a non-zero exit."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class CheckpointError(DemoError):
    pass


def clean_error_text(err: BaseException) -> str:
    """An exception's message without the C++ stack trace that c10 errors carry."""
    return str(err).strip().split("\nException raised from")[0].strip()


def oom_message(err: BaseException, what: str) -> str:
    """A clear message for an out-of-HBM error: how much the run needed, how much the chip has."""
    text = clean_error_text(err)
    props = torch.tpu.get_device_properties()
    capacity = props.total_memory
    spec_hbm = torch.tpu.topology()["spec"]["hbm_bytes"]
    m_req = re.search(r"tried to allocate ([\d.]+ \w+)", text)
    m_used = re.search(r"capacity [\d.]+ \w+, ([\d.]+ \w+) allocated", text)
    req = parse_bytes(m_req.group(1)) if m_req else None
    used = parse_bytes(m_used.group(1)) if m_used else None
    if req is not None:
        needed = (f"at least {format_bytes(req + (used or 0))} of HBM ({format_bytes(used or 0)} in use + "
                  f"{format_bytes(req)} requested)")
    else:
        needed = "more HBM than the chip has"
    cap = f"{props.name} has {format_bytes(capacity)} per chip"
    if capacity != spec_hbm:
        cap += f" (TORCH_TPU_HBM_BYTES; the generation's spec is {format_bytes(spec_hbm)})"
    return (f"out of HBM: {what} needed {needed}; {cap}. Use a smaller --model-size, --batch-size or "
            f"--seq-len, or a --topology whose generation has more HBM.\n  runtime: {text.splitlines()[0]}")
