"""Bucket sizes of dynamic dimensions: :class:`BucketConfig`, its text form
(``TORCH_TPU_COMPILE_BUCKETS``) and the configuration in force."""

import os
import threading
from dataclasses import dataclass

from ..errors import passthrough

ENV_VAR = "TORCH_TPU_COMPILE_BUCKETS"
DEFAULT_SPEC = "1,2,4,8,16,32,64,128,+128"


@dataclass(frozen=True)
class BucketConfig:
    """Bucket sizes for dynamic dimensions.

    Attributes:
        sizes: ascending bucket sizes (elements along the dimension).
        step: past ``sizes[-1]``, sizes round up to a multiple of ``step``; ``None``: a size
            past the largest bucket is compiled exactly (with a recorded reason).
        enabled: ``False`` (spec ``"off"``): every dynamic shape is compiled exactly.
    """

    sizes: tuple[int, ...]
    step: int | None
    enabled: bool = True

    def bucket(self, n: int) -> int | None:
        """The bucket for a dimension of true size ``n``, or ``None`` when ``n`` has none
        (bucketing off, or past the largest size with no step)."""
        if not self.enabled:
            return None
        for s in self.sizes:
            if n <= s:
                return s
        if self.step is None:
            return None
        return -(-n // self.step) * self.step

    def spec(self) -> str:
        if not self.enabled:
            return "off"
        return ",".join([str(s) for s in self.sizes] + ([f"+{self.step}"] if self.step else []))


def _config_error(msg: str) -> ValueError:
    """A ValueError that torch.compile lets through to the caller as it is."""
    return passthrough(ValueError, msg)


def parse_buckets(spec) -> BucketConfig:
    """Parse a bucket specification.

    Args:
        spec: ``"off"``; or a string of ascending positive integers separated by commas,
            optionally ending with ``+N`` (past the last size, round up to a multiple of
            ``N``), e.g. ``"1,2,4,8,16,32,64,128,+128"`` (the default); or a sequence of
            ints (same meaning, ``"+N"`` allowed as the last item).

    Returns:
        The :class:`BucketConfig`.

    Raises:
        ValueError: empty spec, a non-integer or non-positive size, sizes not strictly
            ascending, or ``+N`` anywhere but last.
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() in ("off", "none", "0"):
            return BucketConfig((), None, enabled=False)
        items = [t.strip() for t in text.split(",")]
    else:
        items = [str(t).strip() for t in spec]
    if not items or items == [""]:
        raise _config_error(f"{ENV_VAR}: empty bucket specification {spec!r}; expected e.g. "
                         f"'{DEFAULT_SPEC}' or 'off'")
    sizes: list[int] = []
    step = None
    for i, t in enumerate(items):
        is_step = t.startswith("+")
        body = t[1:] if is_step else t
        try:
            v = int(body)
        except ValueError:
            raise _config_error(f"{ENV_VAR}: bucket {t!r} in {spec!r} is not an integer; expected "
                             f"ascending sizes like '{DEFAULT_SPEC}' or 'off'") from None
        if v <= 0:
            raise _config_error(f"{ENV_VAR}: bucket {t!r} in {spec!r} must be positive")
        if is_step:
            if i != len(items) - 1:
                raise _config_error(f"{ENV_VAR}: step {t!r} in {spec!r} must be the last item")
            step = v
        else:
            if sizes and v <= sizes[-1]:
                raise _config_error(f"{ENV_VAR}: bucket sizes in {spec!r} must be strictly "
                                 f"ascending ({v} after {sizes[-1]})")
            sizes.append(v)
    if not sizes and step is None:
        raise _config_error(f"{ENV_VAR}: no bucket sizes in {spec!r}")
    return BucketConfig(tuple(sizes), step)


_config_lock = threading.Lock()
_config: BucketConfig | None = None


def get_buckets() -> BucketConfig:
    """The bucket configuration in force: the last :func:`set_buckets`, else
    ``TORCH_TPU_COMPILE_BUCKETS``, else the default (powers of two up to 128, then
    multiples of 128).

    Raises:
        ValueError: ``TORCH_TPU_COMPILE_BUCKETS`` does not parse (see :func:`parse_buckets`).
    """
    global _config
    with _config_lock:
        if _config is None:
            _config = parse_buckets(os.environ.get(ENV_VAR) or DEFAULT_SPEC)
        return _config


def set_buckets(spec=None) -> BucketConfig:
    """Set the buckets dynamic dimensions are padded to (``None``: back to the environment
    variable / default). Takes effect at the next call of a compiled function: a new size
    outside the buckets already compiled compiles a new program.

    Args:
        spec: see :func:`parse_buckets`; ``None`` re-reads ``TORCH_TPU_COMPILE_BUCKETS``.

    Returns:
        The new :class:`BucketConfig`.

    Raises:
        ValueError: ``spec`` (or the environment variable) does not parse.
    """
    global _config
    cfg = parse_buckets(os.environ.get(ENV_VAR) or DEFAULT_SPEC) if spec is None else parse_buckets(spec)
    with _config_lock:
        _config = cfg
    return cfg
