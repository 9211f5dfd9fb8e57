"""OpInfo conformance: PyTorch's op_db sample inputs on tpu, checked against CPU.

By default a bounded CI shard runs (``opinfo_harness.ci_cases``, ~3600 cases,
about 2.5 minutes on 2 cores): every op in forward, float32 (or int64/bool when
it has no float32), on its first 3 samples; and the first sample of every other
case: gradients in float32 for every op with autograd (~540), non-contiguous
inputs and out= in float32, forward in bfloat16, int64 and bool.

``TORCH_TPU_CONFORMANCE=full`` runs the whole matrix over every sample: dtypes
float32, bfloat16, int64, bool x kinds forward, grad (float32), noncontig, out.
``scripts/conformance.py`` (``make conformance``) runs the same cases in
crash- and hang-isolated workers and prints passed/failed/skipped per dtype and
kind.

Skipped cases and their reasons live in one file: tests/python/helpers/opinfo_skips.py.
"""

import os

import pytest
import torch

import torch_tpu  # noqa: F401
from helpers import opinfo_harness as H
from helpers.opinfo_skips import SKIPS

FULL = os.environ.get("TORCH_TPU_CONFORMANCE", "") == "full"
CASES = H.full_cases() if FULL else H.ci_cases()
# Only cases that exist (dtype supported by the op, out= variant, autograd).
CASES = [c for c in CASES if H.applicable(H.OPS[c[0]], c[1], c[2]) is None]

# A hanging case fails alone instead of stalling the job (pytest-timeout).
CASE_TIMEOUT_S = 600 if FULL else 120


@pytest.mark.timeout(CASE_TIMEOUT_S, method="thread")
@pytest.mark.parametrize(
    "name,dtype,kind,max_samples", CASES, ids=[f"{n}-{d}-{k}" for n, d, k, _ in CASES])
def test_opinfo(name, dtype, kind, max_samples):
    reason = H.skip_reason(SKIPS, name, dtype, kind)
    if reason:
        pytest.skip(reason)
    r = H.run_case(name, dtype, kind, max_samples or None)
    if r.status == "n/a":
        pytest.skip(r.detail)
    assert r.status == "passed", f"{name} {dtype} {kind}: {r.detail}"


def test_skip_file_is_well_formed():
    """Every skip names an existing op/variant, a known dtype and kind, and gives a reason."""
    for key, reason in SKIPS.items():
        assert isinstance(key, tuple) and len(key) == 3, key
        name, dtype, kind = key
        assert name in H.OPS, f"{key}: no OpInfo named {name!r}"
        assert dtype == "*" or dtype in H.DTYPES, f"{key}: unknown dtype {dtype!r}"
        assert kind in H.KINDS, f"{key}: unknown kind {kind!r}"
        assert isinstance(reason, str) and len(reason.strip()) > 10, f"{key}: give a reason"
        dtypes = list(H.DTYPES) if dtype == "*" else [dtype]
        assert any(H.applicable(H.OPS[name], d, kind) is None for d in dtypes), \
            f"{key}: the case does not exist ({H.applicable(H.OPS[name], dtypes[0], kind)}): drop the skip"


def test_ci_shard_covers_every_op():
    """The CI shard runs every op in forward (float32, else its first supported of int64/bool)
    and gradients for at least 150 ops."""
    ci = H.ci_cases()
    forward = {n for n, _, k, _ in ci if k == "forward"}
    missing = [n for n, op in H.OPS.items() if n not in forward and
               any(H.applicable(op, d, "forward") is None for d in H.DTYPES)]
    assert not missing, missing
    grads = {n for n, _, k, _ in ci if k == "grad"}
    assert len(grads) >= 150, len(grads)


def test_tpu_is_the_device_under_test():
    assert torch.device(H.DEVICE).type == "tpu"
    x = torch.ones(2, device=H.DEVICE)
    assert (x + x).device.type == "tpu"
