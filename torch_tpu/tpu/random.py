"""Random number generation on tpu: one generator per chip.

Default (``TORCH_TPU_RNG=philox``): counter-based Philox4x32-10, as PyTorch's CUDA
generator. The state is (seed, offset); ``get_rng_state`` returns 16 bytes (seed as
uint64, offset as int64), the layout ``torch.distributed.tensor``'s RNG tracker reads.
Element i of a random op depends only on (seed, offset + i), and an op of n elements
advances the offset by n rounded up to a multiple of 4, so a DTensor initialised by
shards equals the tensor initialised whole. Every chip's default generator starts
from the same seed (as CUDA's): the same seed on two chips gives the same stream.

``TORCH_TPU_RNG=cpu``: CPU PyTorch's mt19937 stream (the same numbers as CPU for the
same seed); the state is CPU's 5,056 bytes. Random ops run on the chip's stream;
seeding waits for queued work first, so a seed applies exactly to the ops issued
after it. See docs/random.md.
"""

from collections.abc import Iterable as _Iterable

import torch as _torch

from .. import _C
from ._utils import _device_index

__all__ = [
    "default_generators", "get_rng_state", "get_rng_state_all", "initial_seed", "manual_seed", "manual_seed_all",
    "seed", "seed_all", "set_rng_state", "set_rng_state_all",
]


class _DefaultGenerators:
    def __getitem__(self, i: int) -> _torch.Generator:
        return _C._default_generator(i)

    def __len__(self) -> int:
        return _torch.tpu.device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def _gen(device) -> _torch.Generator:
    return _C._default_generator(_device_index(device))


def _wait(gen: _torch.Generator) -> _torch.Generator:
    if _C._rng_kind() == "philox":
        return gen  # positions are reserved when ops are issued: nothing to wait for
    # The generator waits for its chip's queued work before it changes or
    # reads its state, but PyTorch's Generator bindings keep the GIL while they
    # wait: queued kernels that need the GIL (Python kernels of custom ops)
    # would deadlock. torch.tpu.synchronize releases the GIL; wait here first.
    _C._synchronize(gen.device.index)
    return gen


def manual_seed(seed: int) -> None:
    """Seed the current chip's generator (the offset returns to 0).

    A negative seed wraps modulo 2**64, as CPU PyTorch's ``manual_seed`` does.

    Raises:
        TypeError: ``seed`` is not an integer.
        ValueError: ``seed`` is outside [-2**63, 2**64).
    """
    _wait(_gen(None)).manual_seed(_check_seed(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every chip's generator (see :func:`manual_seed`)."""
    seed = _check_seed(seed)
    for g in default_generators:
        _wait(g).manual_seed(seed)


def _check_seed(seed) -> int:
    try:
        seed = int(seed)
    except (TypeError, ValueError):
        raise TypeError(f"torch.tpu.manual_seed: seed must be an integer, got {type(seed).__name__}") from None
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"torch.tpu.manual_seed: seed must be in [-2**63, 2**64), got {seed}")
    return seed


def seed() -> None:
    _wait(_gen(None)).seed()


def seed_all() -> None:
    for g in default_generators:
        _wait(g).seed()


def initial_seed() -> int:
    return _gen(None).initial_seed()


def get_rng_state(device="tpu") -> _torch.Tensor:
    """The chip generator's state as a CPU uint8 tensor.

    philox (default): 16 bytes, the seed (uint64) then the offset (int64), native byte
    order. ``TORCH_TPU_RNG=cpu``: CPU PyTorch's 5,056-byte mt19937 state.
    """
    return _wait(_gen(device)).get_state()


def _checked_state(new_state) -> _torch.Tensor:
    if not isinstance(new_state, _torch.Tensor):
        raise TypeError(
            f"torch.tpu.set_rng_state: new_state must be a torch.uint8 tensor, got {type(new_state).__name__}"
        )
    if new_state.dtype != _torch.uint8:
        raise TypeError(
            f"torch.tpu.set_rng_state: new_state must be a torch.uint8 tensor (as get_rng_state "
            f"returns), got {new_state.dtype}"
        )
    return new_state.cpu()


def set_rng_state(new_state: _torch.Tensor, device="tpu") -> None:
    """Restore a state from :func:`get_rng_state`.

    Raises:
        TypeError: ``new_state`` is not a uint8 tensor.
        ValueError: ``new_state`` has the wrong size (16 bytes with philox) or holds a negative offset.
    """
    _wait(_gen(device)).set_state(_checked_state(new_state))


def get_rng_state_all() -> list[_torch.Tensor]:
    return [_wait(g).get_state() for g in default_generators]


def set_rng_state_all(new_states: _Iterable[_torch.Tensor]) -> None:
    for g, state in zip(default_generators, new_states):
        _wait(g).set_state(_checked_state(state))
