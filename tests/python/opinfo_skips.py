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

SPARSE = ("sparse layouts are not supported on tpu (README, Known limits): the op raises "
          "NotImplementedError by design")
LENIENT_GN = ("tpu runs native_group_norm's CompositeExplicitAutograd decomposition (math_group_norm), "
              "which accepts non-contiguous input that CPU's kernel rejects with 'Expected "
              "X.is_contiguous(memory_format)'; tpu is more lenient, its results are right")
CPU_FFT_OUT = ("PyTorch CPU bug, not ours: fft_ihfft2/fft_ihfftn with out= and a single transformed dim "
               "(dim=0, s=(8)) leave out partly unwritten on CPU too (CPU out= differs from CPU "
               "functional by ~1e35); tpu runs the same kernel")

# ---- backend bugs (csrc/), grouped by cause ---------------------------------

BUG_DTYPE_VIEW = (
    "BUG: dtype-changing views through the fallback keep the input's dtype. fallback.cc tpu_result() "
    "builds view returns with aliased.as_strided(m.sizes, m.strides, m.offset), ignoring m.dtype: "
    "view_as_complex(f32[5,2]) returns f32[5] (expected complex64[5]); view_as_real(complex64[n]) "
    "gives a complex64 tensor of sizes [n,2] -> 'setStorage: ... out of bounds' (hit by complex "
    "backward, fft backward, stft(return_complex=False), .real/.imag)")
BUG_CONJ = (
    "BUG: any copy of a conj-bit tensor (z.conj() with z complex on tpu, then .cpu()/clone/"
    "resolve_conj) recurses between the Conjugate fallback (MathOpFallback clones the input) and "
    "tpu _copy_from until the stack overflows: SIGSEGV. Same for neg-bit tensors (_neg_view). "
    "ops_copy.cc registers _copy_from for PrivateUse1 only; it needs Conjugate/Negative "
    "fallthroughs for _copy_from(_and_resize) and to resolve the bits in the host copy")
BUG_META_OUT = (
    "BUG: the fallback trusts the meta kernel's output dtypes/shapes, which differ from the CPU kernel "
    "here: native_batch_norm(bf16, training) meta says save_mean/save_invstd float32, CPU makes bf16; "
    "native_batch_norm(training=False) meta says save_mean (C,), CPU makes (0,). The queued "
    "native_batch_norm.out call then fails ('expected scalar type BFloat16 but found Float') or the "
    "result has the wrong shape. layer_norm/instance_norm/batch_norm reach native_batch_norm through "
    "their decompositions")
BUG_OUT_RESIZE = (
    "BUG: the fallback runs the op's .out overload on host aliases of meta-sized HBM outputs, and this "
    "CPU .out kernel resizes its out (huber_loss/binary_cross_entropy use out as scratch of the "
    "input's shape before reducing; _embedding_bag(_forward_only) sizes offset2bag/bag_size/"
    "max_indices differently from meta) -> 'Trying to resize storage that is not resizable' "
    "raised at the next sync")
BUG_OUT_RESTRIDE = (
    "BUG: silent wrong values. For a channels_last-strided input (strides (6,1,6,2)) the meta kernel "
    "gives a contiguous output but the CPU max_unpool2d.out kernel restrides its out (same numel, so no "
    "storage resize) to the input's memory format and writes channels_last; the tpu tensor keeps "
    "the meta strides, so values land in the wrong places. The out= path never checks the host "
    "alias's sizes/strides after the kernel")
BUG_BN_OUT_NONCONTIG = (
    "BUG: silent wrong values for non-contiguous input. The fallback substitutes native_batch_norm.out "
    "for native_batch_norm, and that CPU .out kernel (batch_norm_cpu_out) mishandles non-contiguous "
    "input (reproducible on CPU alone: functional vs .out differ by ~6); the functional CPU kernel "
    "is right. Don't substitute .out for this op (or make inputs contiguous first)")
BUG_MODE_OUT = (
    "BUG: torch.mode(x, out=(values, indices)) on tpu raises 'mode only supports CPU, CUDA and XPU "
    "device type': mode.values is CompositeExplicitAutograd (mode_out checks the device type), so "
    "it never reaches the fallback; register mode.values for PrivateUse1 to the fallback (as done "
    "for convolution)")

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
    # LENIENT_GN
    ('native_group_norm', '*', 'noncontig'): LENIENT_GN,
    # CPU_FFT_OUT
    ('fft.ihfft2', '*', 'out'): CPU_FFT_OUT,
    ('fft.ihfftn', '*', 'out'): CPU_FFT_OUT,
    # BUG_DTYPE_VIEW
    ('cdouble', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('cfloat', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('chalf', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('complex', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.fft', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.fft2', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.fftn', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.ifft2', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.ifftn', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.ihfft2', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.ihfftn', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.irfft', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.irfft2', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.irfftn', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.rfft', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.rfft2', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('fft.rfftn', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('linalg.eig', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('stft', 'float32', 'forward'): BUG_DTYPE_VIEW,
    ('stft', 'float32', 'grad'): BUG_DTYPE_VIEW,
    ('stft', 'float32', 'noncontig'): BUG_DTYPE_VIEW,
    ('view_as_complex', 'float32', 'forward'): BUG_DTYPE_VIEW,
    ('view_as_complex', 'float32', 'grad'): BUG_DTYPE_VIEW,
    # BUG_CONJ
    ('fft.hfft', '*', 'forward'): BUG_CONJ,
    ('fft.hfft', '*', 'noncontig'): BUG_CONJ,
    ('fft.hfft', '*', 'out'): BUG_CONJ,
    ('fft.hfft', 'float32', 'grad'): BUG_CONJ,
    ('fft.hfft2', '*', 'forward'): BUG_CONJ,
    ('fft.hfft2', '*', 'noncontig'): BUG_CONJ,
    ('fft.hfft2', '*', 'out'): BUG_CONJ,
    ('fft.hfft2', 'float32', 'grad'): BUG_CONJ,
    ('fft.hfftn', '*', 'forward'): BUG_CONJ,
    ('fft.hfftn', '*', 'noncontig'): BUG_CONJ,
    ('fft.hfftn', '*', 'out'): BUG_CONJ,
    ('fft.hfftn', 'float32', 'grad'): BUG_CONJ,
    ('fft.ifft', '*', 'forward'): BUG_CONJ,
    ('fft.ifft', '*', 'noncontig'): BUG_CONJ,
    ('fft.ifft', 'float32', 'grad'): BUG_CONJ,
    ('fft.ihfft', '*', 'forward'): BUG_CONJ,
    ('fft.ihfft', '*', 'noncontig'): BUG_CONJ,
    ('fft.ihfft', 'float32', 'grad'): BUG_CONJ,
    ('fft.ihfft2', '*', 'forward'): BUG_CONJ,
    ('fft.ihfft2', '*', 'noncontig'): BUG_CONJ,
    ('fft.ihfftn', '*', 'forward'): BUG_CONJ,
    ('fft.ihfftn', '*', 'noncontig'): BUG_CONJ,
    ('linalg.eigvals', 'float32', 'grad'): BUG_CONJ,
    ('polar', 'float32', 'grad'): BUG_CONJ,
    # BUG_META_OUT
    ('_batch_norm_with_update', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('_batch_norm_with_update', 'bfloat16', 'forward'): BUG_META_OUT,
    ('_native_batch_norm_legit', '*', 'forward'): BUG_META_OUT,
    ('_native_batch_norm_legit', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('native_batch_norm', '*', 'forward'): BUG_META_OUT,
    ('native_batch_norm', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('native_batch_norm', '*', 'out'): BUG_META_OUT,
    ('native_layer_norm', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('native_layer_norm', 'bfloat16', 'forward'): BUG_META_OUT,
    ('nn.functional.batch_norm', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('nn.functional.batch_norm', 'bfloat16', 'forward'): BUG_META_OUT,
    ('nn.functional.instance_norm', 'bfloat16', 'forward'): BUG_META_OUT,
    ('nn.functional.instance_norm', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('nn.functional.layer_norm', 'bfloat16', 'noncontig'): BUG_META_OUT,
    ('nn.functional.layer_norm', 'bfloat16', 'forward'): BUG_META_OUT,
    # BUG_OUT_RESIZE
    ('nn.functional.binary_cross_entropy', '*', 'forward'): BUG_OUT_RESIZE,
    ('nn.functional.binary_cross_entropy', '*', 'noncontig'): BUG_OUT_RESIZE,
    ('nn.functional.binary_cross_entropy', 'float32', 'grad'): BUG_OUT_RESIZE,
    ('nn.functional.embedding_bag', '*', 'forward'): BUG_OUT_RESIZE,
    ('nn.functional.embedding_bag', '*', 'noncontig'): BUG_OUT_RESIZE,
    ('nn.functional.embedding_bag', 'float32', 'grad'): BUG_OUT_RESIZE,
    ('nn.functional.huber_loss', '*', 'forward'): BUG_OUT_RESIZE,
    ('nn.functional.huber_loss', '*', 'noncontig'): BUG_OUT_RESIZE,
    ('nn.functional.huber_loss', 'float32', 'grad'): BUG_OUT_RESIZE,
    # BUG_OUT_RESTRIDE
    ('nn.functional.max_unpool2d', '*', 'forward'): BUG_OUT_RESTRIDE,
    ('nn.functional.max_unpool2d', '*', 'noncontig'): BUG_OUT_RESTRIDE,
    ('nn.functional.max_unpool2d.grad', '*', 'forward'): BUG_OUT_RESTRIDE,
    ('nn.functional.max_unpool2d.grad', '*', 'noncontig'): BUG_OUT_RESTRIDE,
    # BUG_BN_OUT_NONCONTIG (float32; in bfloat16 BUG_META_OUT fails first)
    ('_batch_norm_with_update', 'float32', 'noncontig'): BUG_BN_OUT_NONCONTIG,
    ('_native_batch_norm_legit', 'float32', 'noncontig'): BUG_BN_OUT_NONCONTIG,
    ('native_batch_norm', 'float32', 'noncontig'): BUG_BN_OUT_NONCONTIG,
    ('native_layer_norm', 'float32', 'noncontig'): BUG_BN_OUT_NONCONTIG,
    ('nn.functional.batch_norm', 'float32', 'noncontig'): BUG_BN_OUT_NONCONTIG,
    ('nn.functional.layer_norm', 'float32', 'noncontig'): BUG_BN_OUT_NONCONTIG,
    # BUG_MODE_OUT
    ('mode', '*', 'out'): BUG_MODE_OUT,
}
