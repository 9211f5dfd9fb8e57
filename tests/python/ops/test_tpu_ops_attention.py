"""torch.tpu.ops.splash_sdpa and F.scaled_dot_product_attention on tpu: blocked (flash) attention with
causal and local-window masks and grouped K/V heads, forward and backward against CPU PyTorch's SDPA
(an explicit boolean mask as the oracle); no T x T buffer in HBM; the math path where arguments need it;
bad input."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu
import torch_tpu.tpu.ops as ops
from helpers.devices import needs_v6e_8
from torch_tpu.tpu.ops import _attention

pytestmark = needs_v6e_8

DEV = "tpu"
MEM_DEV = "tpu:4"  # peak-memory figures: a chip no other test file uses


def _reference(q, k, v, *, is_causal, window, scale=None):
    """CPU SDPA with the mask spelled out: j <= i (causal), i - j < W and, if not causal, j - i < W."""
    i = torch.arange(q.shape[-2]).unsqueeze(1)
    j = torch.arange(k.shape[-2]).unsqueeze(0)
    keep = torch.ones(i.shape[0], j.shape[1], dtype=torch.bool)
    if is_causal:
        keep &= j <= i
    if window is not None:
        keep &= (i - j < window) & ((j <= i) if is_causal else (j - i < window))
    groups = q.shape[-3] // k.shape[-3]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)


def _leaves(*ts, device=None, dtype=None):
    return [t.detach().to(device=device, dtype=dtype).requires_grad_(True) for t in ts]


CASES = [  # (B, Hq, Hkv, T, S, D, is_causal, window, block_q)
    (1, 2, 2, 37, 37, 16, True, None, 512),
    (2, 2, 2, 33, 33, 8, False, None, 512),
    (1, 2, 2, 50, 50, 16, True, 7, 16),  # several query blocks, window shorter than a block
    (1, 2, 2, 45, 45, 8, False, 9, 16),  # two-sided window
    (1, 4, 2, 40, 40, 8, True, None, 512),  # GQA
    (2, 4, 1, 48, 48, 8, True, 20, 16),  # MQA + window longer than a block
    (1, 2, 2, 24, 40, 8, False, None, 512),  # more keys than queries
    (1, 2, 2, 20, 20, 8, True, 64, 8),  # window wider than the sequence: plain causal
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_splash_sdpa_forward_backward_match_cpu(case):
    B, Hq, Hkv, T, S, D, causal, window, block_q = case
    g = torch.Generator().manual_seed(sum(case[:6]))
    q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((Hq, T), (Hkv, S), (Hkv, S)))
    grad = torch.randn(B, Hq, T, D, generator=g)
    qc, kc, vc = _leaves(q, k, v)
    ref = _reference(qc, kc, vc, is_causal=causal, window=window)
    ref.backward(grad)
    qt, kt, vt = _leaves(q, k, v, device=DEV)
    out = ops.splash_sdpa(qt, kt, vt, is_causal=causal, local_window_size=window, enable_gqa=Hq != Hkv,
                          block_q=block_q)
    assert out.device.type == "tpu" and out.shape == (B, Hq, T, D)
    out.backward(grad.to(DEV))
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=2e-5, rtol=1e-4)
    for ours, theirs in ((qt, qc), (kt, kc), (vt, vc)):
        torch.testing.assert_close(ours.grad.cpu(), theirs.grad, atol=5e-5, rtol=1e-4)


def test_splash_sdpa_bfloat16_scale_and_unbatched():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 30, 16, generator=g) for _ in range(3))
    qc, kc, vc = _leaves(q, k, v, dtype=torch.bfloat16)
    ref = _reference(qc.float(), kc.float(), vc.float(), is_causal=True, window=5, scale=0.3)
    qt, kt, vt = _leaves(q, k, v, device=DEV, dtype=torch.bfloat16)
    out = ops.splash_sdpa(qt, kt, vt, scale=0.3, local_window_size=5, block_q=8)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 30, 16)
    torch.testing.assert_close(out.float().cpu(), ref, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(qt.grad.float().cpu(), qc.grad.float(), atol=5e-2, rtol=5e-2)


def _peak_bytes(fn) -> int:
    torch.tpu.synchronize(MEM_DEV)
    base = torch.tpu.memory_allocated(MEM_DEV)
    torch.tpu.reset_peak_memory_stats(MEM_DEV)
    fn()
    torch.tpu.synchronize(MEM_DEV)
    return torch.tpu.max_memory_allocated(MEM_DEV) - base


def _fwd_bwd_peaks(T: int, window) -> tuple[int, int, int]:
    """Peak HBM bytes above the inputs of forward + backward: splash_sdpa, SDPA on tpu, SDPA forced to math."""
    g = torch.Generator().manual_seed(T)
    q, k, v = _leaves(*(torch.randn(1, 1, T, 128, generator=g) for _ in range(3)), device=MEM_DEV)

    def splash():
        ops.splash_sdpa(q, k, v, local_window_size=window, block_q=256).sum().backward()

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    def math():
        with sdpa_kernel([SDPBackend.MATH]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    with torch.tpu.device(MEM_DEV):
        return _peak_bytes(splash), _peak_bytes(sdpa), _peak_bytes(math)


@pytest.mark.parametrize("window", [None, 128])
def test_no_t_by_t_buffer_in_hbm_forward_and_backward(window):
    """Physical HBM bytes (the allocator's peak) grow linearly in T for the blocked kernel and stay
    below one T x T float32 score matrix; the math path (the oracle) holds several of them."""
    small, large = _fwd_bwd_peaks(1024, window), _fwd_bwd_peaks(2048, window)
    for T, (_, _, math) in ((1024, small), (2048, large)):
        assert math > 2 * T * T * 4, (T, math)
    flash, sdpa, _ = large
    assert flash < 0.75 * 2048 * 2048 * 4 and sdpa < 0.75 * 2048 * 2048 * 4, large
    assert large[0] <= 2.5 * small[0] and large[1] <= 2.5 * small[1], (small, large)  # linear (quadratic: 4x)
    assert large[2] >= 3.5 * small[2], (small, large)


def test_sdpa_on_tpu_takes_flash_where_arguments_allow_and_math_otherwise():
    flash, math = int(SDPBackend.FLASH_ATTENTION), int(SDPBackend.MATH)
    q = torch.randn(1, 2, 16, 8, device=DEV)
    kv = torch.randn(1, 1, 16, 8, device=DEV)
    assert torch._fused_sdp_choice(q, q, q, is_causal=True) == flash
    assert torch._fused_sdp_choice(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool, device=DEV)) == flash
    assert torch._fused_sdp_choice(q, q, q, dropout_p=0.1) == math
    assert torch._fused_sdp_choice(q, kv, kv, enable_gqa=True) == math
    assert torch._fused_sdp_choice(q.double().float()[..., ::2], q[..., ::2], q[..., ::2]) == math  # strided head dim
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch._fused_sdp_choice(q, q, q) == math
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        assert torch._fused_sdp_choice(q, q, q) == math  # one bf16 pass: the math path's MXU numerics
        assert torch._fused_sdp_choice(q.bfloat16(), q.bfloat16(), q.bfloat16()) == flash


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_sdpa_flash_path_matches_cpu_forward_and_backward(mask):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 21, 8, generator=g) for _ in range(3))
    kw = {"none": {}, "causal": {"is_causal": True}, "bool": {"attn_mask": torch.rand(21, 21, generator=g) > 0.2},
          "float": {"attn_mask": torch.randn(2, 1, 21, 21, generator=g)}}[mask]
    if mask == "bool":
        kw["attn_mask"].fill_diagonal_(True)
    qc, kc, vc = _leaves(q, k, v)
    ref = F.scaled_dot_product_attention(qc, kc, vc, **kw)
    ref.sum().backward()
    qt, kt, vt = _leaves(q, k, v, device=DEV)
    out = F.scaled_dot_product_attention(qt, kt, vt, **{n: (t.to(DEV) if isinstance(t, torch.Tensor) else t)
                                                        for n, t in kw.items()})
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=2e-5, rtol=1e-4)
    for ours, theirs in ((qt, qc), (kt, kc), (vt, vc)):
        torch.testing.assert_close(ours.grad.cpu(), theirs.grad, atol=5e-5, rtol=1e-4)


def test_splash_sdpa_and_sdpa_compile_forward_and_backward():
    """splash_sdpa is a library call in compiled graphs; SDPA there keeps the math path (torch.compile
    decomposes the flash op's forward into math, whose second output its backward cannot use)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=g) for _ in range(3))
    for f in (lambda q, k, v: ops.splash_sdpa(q, k, v, local_window_size=6, block_q=8) * 2,
              lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2):
        eager = _leaves(q, k, v, device=DEV)
        f(*eager).sum().backward()
        compiled = _leaves(q, k, v, device=DEV)
        out = torch.compile(f, backend="tpu", fullgraph=True)(*compiled)
        out.sum().backward()
        torch.testing.assert_close(out.detach().cpu(), f(*eager).detach().cpu())
        for a, b in zip(compiled, eager):
            torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), atol=1e-5, rtol=1e-5)


def _qkv(*shapes, dtype=torch.float32, device=DEV):
    return [torch.zeros(s, dtype=dtype, device=device) for s in shapes]


BAD = [
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 8), (1, 2, 8, 16))), ValueError, "k head dim 8 differs"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 4))), ValueError, "v head dim 4 differs"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16)), torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16,
                                                                               device=DEV)),
     TypeError, "v dtype torch.bfloat16 differs from q dtype torch.float32"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16)), torch.zeros(1, 2, 8, 16)), ValueError,
     "v is on cpu, q on tpu"),
    (lambda: ops.splash_sdpa(*_qkv((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))), ValueError, "enable_gqa=True"),
    (lambda: ops.splash_sdpa(*_qkv((1, 3, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), enable_gqa=True), ValueError,
     "multiple of k's 2 heads"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 9, 16), (1, 2, 8, 16))), ValueError, "k has 9 keys"),
    (lambda: ops.splash_sdpa(*_qkv((2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))), ValueError, "k has 4 dimensions"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), local_window_size=0), ValueError,
     "local_window_size must be a positive int or None, got 0"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), local_window_size=2.5), ValueError,
     "local_window_size"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), block_q=-1), ValueError, "block_q"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), q_layout="ROW"), ValueError,
     "q_layout must be one of"),
    (lambda: ops.splash_sdpa(*_qkv((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), dtype=torch.int32)), TypeError,
     "q must be float32"),
]


@pytest.mark.parametrize("call,exc,match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_splash_sdpa_bad_input_raises_at_the_call(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
    q = torch.ones(1, 1, 4, 8, device=DEV)  # the process keeps working
    torch.testing.assert_close(ops.splash_sdpa(q, q, q).cpu(), torch.ones(1, 1, 4, 8))


def test_unknown_implementation_raises():
    q = torch.zeros(1, 1, 4, 8, device=DEV)
    with pytest.raises(ValueError, match="implementation must be one of"):
        with _attention.implementation("cuda"):
            pass
    assert ops.splash_sdpa(q, q, q).shape == (1, 1, 4, 8)


@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_splash_sdpa_and_sdpa_in_other_eager_modes(mode):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 20, 8, generator=g) for _ in range(3))
    qc, kc, vc = _leaves(q, k, v)
    ref = _reference(qc, kc, vc, is_causal=True, window=4)
    ref.sum().backward()
    qt, kt, vt = _leaves(q, k, v, device=DEV)
    with torch_tpu.eager_mode(mode):
        out = ops.splash_sdpa(qt * 1.0, kt, vt, local_window_size=4, block_q=8)
        out.sum().backward()
        plain = F.scaled_dot_product_attention(qt.detach() + 0.0, kt.detach(), vt.detach(), is_causal=True)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(qt.grad.cpu(), qc.grad, atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(plain.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=2e-5,
                               rtol=1e-4)
