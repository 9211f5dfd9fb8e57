"""An autouse fixture for compile tests: import it into a test module (``from helpers.compile_state import fresh``)."""

import os

import pytest
import torch

import torch_tpu
from torch_tpu.compile import cache as program_cache


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test: its own cache folder, no programs from earlier tests, zeroed counters."""
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    program_cache.clear_memory_cache()
    torch_tpu.reset_compile_stats()
    if os.environ.get("TORCH_TPU_XLA_CHECK"):  # every program run: also through XLA:CPU, values compared
        from helpers.xla_check import compare, recording

        with recording() as seen:
            yield
        customs = compare(seen)
        log = os.environ.get("TORCH_TPU_XLA_CHECK_LOG")  # a file: one line per test
        if log:
            with open(log, "a") as f:
                f.write(f"{len(seen)} programs, custom calls: {sorted(set(customs))}\n")
    else:
        yield
    torch._dynamo.reset()
