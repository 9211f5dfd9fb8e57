"""OpInfo conformance in the non-default eager modes: ``debug`` and ``defer_and_fuse``.

Issue 5: every eager mode gives CPU-equal results on the OpInfo float32 shard.
test_opinfo.py runs the CI shard in ``strict`` mode; this file runs its float32
forward cases (``opinfo_harness.ci_cases()``, same max_samples) in these
variants, and in the defer_and_fuse ones also its float32 gradient cases
(backward ops fuse too):

- ``debug``:                   every op synchronous, with bounds checks.
- ``defer_and_fuse``:          as users get it; a region holding one recorded op
                               runs ATen's kernel for it (docs/eager-modes.md, "Single ops"),
                               so lone ops test recording, flushing and aliasing.
- ``defer_and_fuse_compiled``: the same with ``TORCH_TPU_DEFER_SINGLE_OP_ATEN=0``
                               (``_C._defer_set_single_op_aten(False)``): every
                               region, one op or more, runs compiled fused
                               kernels, so every fusible op's lowering
                               (defer/lower.cc) and the executor's kernels are
                               compared with CPU.

Same skips (``opinfo_skips.SKIPS``), plus the variant-specific ones in
``opinfo_skips.MODE_SKIPS``, and the same comparison against CPU
(``opinfo_harness.run_case``). The mode is set around the whole case, globally
(``torch_tpu.set_eager_mode``: backward ops run on the autograd engine's tpu
thread, which a thread-local block does not reach) and with the thread-local
``torch_tpu.eager_mode``: the tpu side runs in it; the CPU oracle is unaffected (the modes live in the
PrivateUse1 kernels only; test_cpu_oracle_ignores_the_mode checks it). Leaving a ``defer_and_fuse`` block
flushes what it recorded, and run_case's synchronize and host reads flush
inside the block.
"""

import pytest
import torch

import torch_tpu
from helpers import opinfo_harness as H
from helpers.opinfo_skips import MODE_SKIPS, SKIPS

# variant: (eager mode, single-op regions run ATen's kernel, kinds run in float32)
VARIANTS = {
    "debug": ("debug", True, ("forward",)),
    "defer_and_fuse": ("defer_and_fuse", True, ("forward", "grad")),
    "defer_and_fuse_compiled": ("defer_and_fuse", False, ("forward", "grad")),
}
MODES = tuple(VARIANTS)
MODE_KINDS = {v: kinds for v, (_, _, kinds) in VARIANTS.items()}

_CI = [c for c in H.ci_cases() if c[1] == "float32" and H.applicable(H.OPS[c[0]], c[1], c[2]) is None]
CASES = [(mode, n, d, k, m) for mode in MODES for (n, d, k, m) in _CI if k in MODE_KINDS[mode]]

# As test_opinfo.py: a hanging case fails alone instead of stalling the job.
CASE_TIMEOUT_S = 120


def mode_skip_reason(mode: str, name: str, dtype: str, kind: str):
    return MODE_SKIPS.get((mode, name, dtype, kind)) or MODE_SKIPS.get((mode, name, "*", kind))


@pytest.mark.timeout(CASE_TIMEOUT_S, method="thread")
@pytest.mark.parametrize(
    "mode,name,dtype,kind,max_samples", CASES, ids=[f"{md}-{n}-{d}-{k}" for md, n, d, k, _ in CASES])
def test_opinfo_mode(mode, name, dtype, kind, max_samples):
    reason = H.skip_reason(SKIPS, name, dtype, kind) or mode_skip_reason(mode, name, dtype, kind)
    if reason:
        pytest.skip(reason)
    eager, single_op_aten, _ = VARIANTS[mode]
    previous = torch_tpu._C._defer_single_op_aten(), torch_tpu._C._get_eager_mode()
    torch_tpu._C._defer_set_single_op_aten(single_op_aten)
    # The global mode too: backward ops run on the autograd engine's tpu thread, which
    # does not see this thread's eager_mode block.
    torch_tpu.set_eager_mode(eager)
    try:
        with torch_tpu.eager_mode(eager):
            assert torch_tpu.get_eager_mode() == eager
            r = H.run_case(name, dtype, kind, max_samples or None)
    finally:
        torch_tpu.set_eager_mode(previous[1])
        torch_tpu._C._defer_set_single_op_aten(previous[0])
    if r.status == "n/a":
        pytest.skip(r.detail)
    assert r.status == "passed", f"[{mode}] {name} {dtype} {kind}: {r.detail}"


def test_mode_skips_are_well_formed():
    """Every mode skip names a mode this file runs, an existing op, a known dtype and a kind
    run in that mode, gives a reason, and is not already skipped in every mode (SKIPS)."""
    for key, reason in MODE_SKIPS.items():
        assert isinstance(key, tuple) and len(key) == 4, key
        mode, name, dtype, kind = key
        assert mode in MODES, f"{key}: unknown mode {mode!r}"
        assert name in H.OPS, f"{key}: no OpInfo named {name!r}"
        assert dtype == "*" or dtype in H.DTYPES, f"{key}: unknown dtype {dtype!r}"
        assert kind in MODE_KINDS[mode], f"{key}: {kind!r} cases do not run in {mode}"
        assert isinstance(reason, str) and len(reason.strip()) > 10, f"{key}: give a reason"
        dtypes = list(H.DTYPES) if dtype == "*" else [dtype]
        assert any(H.applicable(H.OPS[name], d, kind) is None for d in dtypes), \
            f"{key}: the case does not exist: drop the skip"
        assert not any(H.skip_reason(SKIPS, name, d, kind) for d in dtypes), \
            f"{key}: already skipped in every mode (SKIPS): drop the mode skip"


def test_cpu_oracle_ignores_the_mode():
    """CPU results are the same inside a tpu eager mode: only tpu tensors see the modes."""
    torch.manual_seed(0)
    x = torch.randn(5, 7)
    ref = (torch.nn.functional.gelu(x) * 2 + x.exp()).softmax(-1).sum(0)
    for mode in ("debug", "defer_and_fuse"):
        with torch_tpu.eager_mode(mode):
            got = (torch.nn.functional.gelu(x) * 2 + x.exp()).softmax(-1).sum(0)
        assert got.device.type == "cpu"
        assert torch.equal(got, ref), mode


def test_a_wrong_tpu_result_fails_the_case(monkeypatch):
    """The comparison is live in every mode: a tpu result off by 1e-3 fails."""
    real = H._call

    def off(op, s, **extra):
        out = real(op, s, **extra)
        if isinstance(out, torch.Tensor) and out.device.type == H.DEVICE:
            return out + 1e-3
        return out

    monkeypatch.setattr(H, "_call", off)
    for mode in ("debug", "defer_and_fuse"):
        with torch_tpu.eager_mode(mode):
            r = H.run_case("add", "float32", "forward", 1)
        assert r.status == "failed" and "Mismatch" in r.detail, (mode, r)


def test_compiled_variant_compiles_single_ops():
    """defer_and_fuse_compiled runs lone ops through compiled kernels, defer_and_fuse through ATen's."""
    x = torch.randn(4, 8, device="tpu")
    for single_op_aten in (True, False):
        previous = torch_tpu._C._defer_single_op_aten()
        torch_tpu._C._defer_set_single_op_aten(single_op_aten)
        try:
            before = torch_tpu.debug.region_stats()["single_op_regions"]
            with torch_tpu.eager_mode("defer_and_fuse"):
                y = torch.tanh(x).cpu()
            after = torch_tpu.debug.region_stats()["single_op_regions"]
        finally:
            torch_tpu._C._defer_set_single_op_aten(previous)
        assert (after - before == 1) == single_op_aten
        torch.testing.assert_close(y, torch.tanh(x.cpu()))
