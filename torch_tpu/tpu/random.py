"""Random number generation on tpu: one generator per chip.

Random ops run on the chip's stream; seeding waits for queued work first, so
a seed applies exactly to the ops issued after it.
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
    # The generator waits for its chip's queued work before it changes or
    # reads its state, but PyTorch's Generator bindings keep the GIL while they
    # wait: queued kernels that need the GIL (Python kernels of custom ops)
    # would deadlock. torch.tpu.synchronize releases the GIL; wait here first.
    _C._synchronize(gen.device.index)
    return gen


def manual_seed(seed: int) -> None:
    """Seed the current chip's generator."""
    _wait(_gen(None)).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        _wait(g).manual_seed(int(seed))


def seed() -> None:
    _wait(_gen(None)).seed()


def seed_all() -> None:
    for g in default_generators:
        _wait(g).seed()


def initial_seed() -> int:
    return _gen(None).initial_seed()


def get_rng_state(device="tpu") -> _torch.Tensor:
    """The generator state as a CPU uint8 tensor."""
    return _wait(_gen(device)).get_state()


def set_rng_state(new_state: _torch.Tensor, device="tpu") -> None:
    _wait(_gen(device)).set_state(new_state.cpu())


def get_rng_state_all() -> list[_torch.Tensor]:
    return [_wait(g).get_state() for g in default_generators]


def set_rng_state_all(new_states: _Iterable[_torch.Tensor]) -> None:
    for g, state in zip(default_generators, new_states):
        _wait(g).set_state(state.cpu())
