"""Every skipped case of the OpInfo conformance suite, with its reason: one dict.

Keys: (op, dtype, kind). op is the OpInfo name, or ``name.variant_test_name``;
dtype is float32 / bfloat16 / int64 / bool, or '*' for every dtype the op
supports; kind is forward, grad, noncontig or out (see opinfo_harness.py).

Reasons starting with "BUG:" are defects of the backend's C++ (csrc/): CI
skips them so it stays green, and each names its cause, with the fallback.cc
mechanism behind it. Remove an entry once its bug is fixed: test_opinfo.py
then runs the case again (``python scripts/conformance.py --no-skips --ops OP``
shows whether it passes). The other reasons are limits of the comparison or
of the backend by design.

Tolerance widenings for numerics are not here: see TOLERANCE_OVERRIDES in
opinfo_harness.py.
"""

# ---- by design / outside the backend --------------------------------------

SPARSE = ("sparse layouts are not supported on tpu (docs/limits.md): the op raises "
          "NotImplementedError by design")
CPU_FFT_OUT = ("PyTorch CPU bug, not ours: fft_ihfft2/fft_ihfftn with out= and a single transformed dim "
               "(dim=0, s=(8)) leave out partly unwritten on CPU too (CPU out= differs from CPU "
               "functional by ~1e35); tpu runs the same kernel")

# ---- backend bugs (csrc/), grouped by cause ---------------------------------

SKIPS: dict[tuple[str, str, str], str] = {
    # SPARSE
    ('sparse.mm.reduce', '*', 'forward'): SPARSE,
    ('sparse.mm.reduce', '*', 'noncontig'): SPARSE,
    ('sparse.mm.reduce', 'float32', 'grad'): SPARSE,
    ('sparse.sampled_addmm', 'float32', 'forward'): SPARSE,
    ('sparse.sampled_addmm', 'float32', 'grad'): SPARSE,
    ('sparse.sampled_addmm', 'float32', 'noncontig'): SPARSE,
    ('to_sparse', '*', 'forward'): SPARSE,
    ('to_sparse', '*', 'noncontig'): SPARSE,
    ('to_sparse', 'float32', 'grad'): SPARSE,
    # CPU_FFT_OUT
    ('fft.ihfft2', '*', 'out'): CPU_FFT_OUT,
    ('fft.ihfftn', '*', 'out'): CPU_FFT_OUT,
    # BUG_DTYPE_VIEW
    # BUG_CONJ
    # BUG_OUT_RESIZE
    # BUG_OUT_RESTRIDE
    # BUG_BN_OUT_NONCONTIG (float32; bfloat16 fails first on its meta/CPU dtype mismatch)
    # BUG_MODE_OUT
}

# ---- mode-specific skips (tests/python/modes/test_opinfo_modes.py) ----------------
#
# Cases skipped in one non-default eager mode only (debug, defer_and_fuse):
# keys (mode, op, dtype, kind). Only genuine, documented limits of a mode
# belong here; a wrong result is a bug to fix in csrc/aten/.

# Keys (variant, op, dtype, kind); the variants are test_opinfo_modes.py's: debug,
# defer_and_fuse, defer_and_fuse_compiled (defer_and_fuse with single-op regions
# compiled too, TORCH_TPU_DEFER_SINGLE_OP_ATEN=0).

ILL_CONDITIONED_CTC = (
    "ctc_loss's gradient amplifies 1-ulp differences of its log-probabilities ~40x: the compiled "
    "log_softmax (executor exp/log polynomials, another summation order; README 'Numerics' of "
    "defer_and_fuse) is within 2 float32 ulp of CPU's, yet the grad then differs by up to 7.4e-5 "
    "(atol 1e-5); CPU's own grad moves by 3.5e-5 when its log_softmax is instead rounded from float64. "
    "With ATen's kernel for the lone log_softmax (defer_and_fuse) the case passes")

MODE_SKIPS: dict[tuple[str, str, str, str], str] = {
    ("defer_and_fuse_compiled", "nn.functional.ctc_loss", "float32", "grad"): ILL_CONDITIONED_CTC,
}
