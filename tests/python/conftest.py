"""Shared fixtures of the torch_tpu Python tests.

Tests marked ``needs_v6e_8`` run in this process on the default topology
(v6e-8: eight chips, tpu:0..tpu:7) and are skipped under another environment;
anything that needs a particular environment runs in a subprocess through the
``run_python`` fixture, which starts from a clean one. Device indices are split by topic so that
memory figures of one test file are not disturbed by another:

- tpu:0..tpu:3  general work (copies, streams, random, autograd)
- tpu:5         test_memory.py only (it asserts absolute figures there)
- tpu:6         test_errors.py's out-of-memory checks

The marker and the device numbers live in helpers/devices.py, with the other shared helpers.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torch_tpu

# Environment variables that change what the backend sees; subprocesses start
# without them unless a test sets them explicitly.
_BACKEND_ENV_PREFIXES = ("TORCH_TPU_", "TPU_")
_BACKEND_ENV_NAMES = ("TORCH_DEVICE_BACKEND_AUTOLOAD",)

@pytest.fixture(autouse=True)
def _clean_device_state():
    """Each test starts on tpu:0 with its default stream and leaves no queued error behind."""
    if not torch.tpu.is_available():
        yield
        return
    torch.tpu.set_device(0)
    yield
    torch.tpu.set_device(0)
    for i in range(torch.tpu.device_count()):
        torch.accelerator.set_stream(torch.tpu.default_stream(i))
    # A test that leaves a sticky error behind fails here rather than in the next test.
    for i in range(torch.tpu.device_count()):
        torch.tpu.synchronize(i)


def _clean_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_BACKEND_ENV_PREFIXES) and k not in _BACKEND_ENV_NAMES}
    env.update(extra or {})
    return env


class _Result:
    def __init__(self, proc):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    def json(self):
        """The last stdout line, parsed as JSON (scripts end with print(json.dumps(...)))."""
        assert self.returncode == 0, f"subprocess failed ({self.returncode}):\n{self.stderr[-4000:]}"
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert lines, f"subprocess printed nothing; stderr:\n{self.stderr[-4000:]}"
        return json.loads(lines[-1])


@pytest.fixture
def run_python():
    """run_python(code, env={...}) runs `code` in a fresh interpreter; returns a result with
    returncode, stdout, stderr and json() (the last stdout line parsed)."""

    def run(code, env=None, timeout=120):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_clean_env(env),
                              capture_output=True, text=True, timeout=timeout)
        return _Result(proc)

    return run


# --- a gate: an op whose kernel waits until the test opens it ----------------
#
# `tpu_test::gated(x)` returns x + 1, but its kernel (run on the chip's stream
# worker) first waits for the gate. While the gate is closed, everything queued
# behind it on the same stream cannot run: this makes asynchrony and ordering
# observable without timing assumptions. The wait times out after
# GATE_TIMEOUT_S so that a broken implementation fails instead of hanging.

GATE_TIMEOUT_S = 10.0


class Gate:
    def __init__(self):
        self.event = threading.Event()
        self.log = []  # one entry per kernel run: True if it ran after the gate opened

    def open(self):
        self.event.set()

    def open_after(self, seconds):
        timer = threading.Timer(seconds, self.event.set)
        timer.daemon = True
        timer.start()
        return timer

    def __call__(self, x):
        return torch.ops.tpu_test.gated(x)


_current_gate = [None]
_lib = torch.library.Library("tpu_test", "DEF")
_lib.define("gated(Tensor x) -> Tensor")


def _gated_cpu(x):
    gate = _current_gate[0]
    opened = gate.event.wait(GATE_TIMEOUT_S)
    gate.log.append(opened)
    return x + 1


def _gated_meta(x):
    return torch.empty_like(x)


_lib.impl("gated", _gated_cpu, "CPU")
_lib.impl("gated", _gated_meta, "Meta")


@pytest.fixture
def strict_mode():
    """Run the test in the "strict" eager mode (ops queued on the stream), whatever the global mode."""
    import torch_tpu

    with torch_tpu.eager_mode("strict"):
        yield


@pytest.fixture
def gate(strict_mode):
    g = Gate()
    _current_gate[0] = g
    # Queueing is what these tests check: a first call of a signature would wait for the gate.
    validating = torch_tpu._C._validate_first_call()
    torch_tpu._C._set_validate_first_call(False)
    try:
        yield g
    finally:
        torch_tpu._C._set_validate_first_call(validating)
        g.open()  # never leave a stream blocked
    for i in range(torch.tpu.device_count()):
        torch.tpu.synchronize(i)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """About 40 small standard-library files: enough text, quick to read (the demo tests,
    single- and multi-chip)."""
    import shutil

    from torch_tpu.demo import data

    src = data.default_corpus()
    files = [f for f in data.list_source_files(src) if "/" not in f and os.path.getsize(os.path.join(src, f)) < 40_000]
    root = tmp_path_factory.mktemp("corpus")
    for f in files[:40]:
        shutil.copy(os.path.join(src, f), root / f)
    return str(root)
