"""Byte counts as people read them (binary units: KiB = 1024 B), both ways.

No imports: torch.tpu, the demo and the estimator all format with it.
"""

from __future__ import annotations

import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_FACTOR = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE_RE = re.compile(r"\s*([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)")


def format_bytes(n: float | None, digits: int = 1) -> str:
    """``n`` bytes in the largest unit that keeps it under 1024 (up to TiB), e.g. ``1.5 MiB``;
    whole bytes below 1 KiB; ``?`` for None."""
    if n is None:
        return "?"
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in _UNITS[1:]:
        n /= 1024
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.{digits}f} {unit}"


def parse_bytes(text: str) -> int | None:
    """The byte count at the start of ``text`` such as ``64.00 MiB`` or ``512 bytes``; None if none."""
    m = _SIZE_RE.match(text)
    return int(float(m.group(1)) * _FACTOR[m.group(2)]) if m else None
