"""torch.nn.attention.flex_attention on tpu: eager and torch.compile, forward and backward.

Oracle: a float64 CPU attention written out here (scores, score_mod, mask, softmax; autograd for
the gradients): CPU flex_attention itself has no backward in torch 2.13. The forward is also
compared with CPU flex_attention where it runs.
"""

import math

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

import torch_tpu  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, H, L, E = 2, 2, 200, 16  # L not a multiple of the 128-row block: a partial last block


def _causal(b, h, q, kv):
    return q >= kv


def _sliding(b, h, q, kv):
    return (q >= kv) & (q - kv < 48)


_DOCS = torch.tensor([[0] * 70 + [1] * 90 + [2] * 40, [0] * 130 + [1] * 70])


def _doc_mask(docs):
    def document(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return document


def _bias(s, b, h, q, kv):
    return s + 0.05 * (q - kv) * (h + 1) - 0.1 * b


def _ref(q, k, v, mask_mod, score_mod=None, gqa=1, blocks=None):
    """Float64 attention; `blocks` (bool, (B, H, nq, nkv)) limits it to kept blocks of 128."""
    q, k, v = q.double(), k.double(), v.double()
    if gqa > 1:
        k, v = k.repeat_interleave(gqa, 1), v.repeat_interleave(gqa, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    Bq, Hq, Lq, S = s.shape
    bi = torch.arange(Bq).view(-1, 1, 1, 1)
    hi = torch.arange(Hq).view(1, -1, 1, 1)
    qi = torch.arange(Lq).view(1, 1, -1, 1)
    ki = torch.arange(S).view(1, 1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki)
    keep = mask_mod(bi, hi, qi, ki).expand_as(s)
    if blocks is not None:
        keep = keep & blocks.repeat_interleave(128, 2).repeat_interleave(128, 3)[..., :Lq, :S]
    s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def _inputs(dtype=torch.float32, hkv=H, ev=E, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g, dtype=dtype)
    k = torch.randn(B, hkv, L, E, generator=g, dtype=dtype)
    v = torch.randn(B, hkv, L, ev, generator=g, dtype=dtype)
    return q, k, v


def _check(q, k, v, mask_mod, score_mod=None, compiled=False, gqa=1, atol=2e-5, ref_mask=None):
    """tpu flex_attention (forward + backward) against the float64 oracle."""
    qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
    ref = _ref(qc, kc, vc, ref_mask or mask_mod, score_mod, gqa)
    go = torch.randn_like(ref)
    ref.backward(go)
    bm = create_block_mask(mask_mod, B, None, L, L, device="tpu")
    qt, kt, vt = (x.to("tpu").requires_grad_() for x in (q, k, v))
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    out = fn(qt, kt, vt, block_mask=bm, score_mod=score_mod, enable_gqa=gqa > 1)
    out.backward(go.to(out.dtype).to("tpu"))
    torch.testing.assert_close(out.cpu().double(), ref.detach(), atol=atol, rtol=atol)
    for t, c, name in ((qt, qc, "dq"), (kt, kc, "dk"), (vt, vc, "dv")):
        torch.testing.assert_close(
            t.grad.cpu().double(), c.grad.double(), atol=atol * 10, rtol=atol * 10, msg=lambda m, n=name: f"{n}: {m}"
        )
    return out


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mask", ["causal", "sliding", "document"])
def test_masks_forward_backward(mask, compiled):
    # the oracle evaluates the CPU copy of the document ids, the tpu mask its tpu copy
    mask_mod = {"causal": _causal, "sliding": _sliding, "document": _doc_mask(_DOCS.to("tpu"))}[mask]
    ref_mask = {"causal": _causal, "sliding": _sliding, "document": _doc_mask(_DOCS)}[mask]
    q, k, v = _inputs()
    out = _check(q, k, v, mask_mod, ref_mask=ref_mask, compiled=compiled)
    # the forward also equals CPU's own flex_attention
    cpu = flex_attention(q, k, v, block_mask=create_block_mask(ref_mask, B, None, L, L, device="cpu"))
    torch.testing.assert_close(out.detach().cpu(), cpu, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_score_mod_gqa_value_dim(compiled):
    q, k, v = _inputs(hkv=1, ev=8)  # 2 query heads share one kv head; value head dim 8
    _check(q, k, v, _causal, _bias, compiled=compiled, gqa=2)


def test_learnable_bias_gets_gradient():
    """A score_mod capturing a tensor that requires grad: its gradient equals the oracle's."""
    q, k, v = _inputs()
    bias = torch.randn(H, L, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    bc = bias.clone().requires_grad_()
    ref = _ref(q, k, v, _causal, lambda s, b, h, qi, ki: s + bc[h, ki])
    ref.sum().backward()
    bt = bias.float().to("tpu").requires_grad_()
    bm = create_block_mask(_causal, B, None, L, L, device="tpu")
    out = flex_attention(
        *(x.to("tpu") for x in (q, k, v)), block_mask=bm, score_mod=lambda s, b, h, qi, ki: s + bt[h, ki]
    )
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(bt.grad.cpu().double(), bc.grad, atol=1e-4, rtol=1e-4)


def test_bfloat16_within_cpu_tolerance():
    """bf16 inputs: tpu equals CPU flex_attention (forward) within bf16 tolerance."""
    q, k, v = _inputs(torch.bfloat16)
    cpu = flex_attention(q, k, v, block_mask=create_block_mask(_causal, B, None, L, L, device="cpu"))
    bm = create_block_mask(_causal, B, None, L, L, device="tpu")
    out = flex_attention(*(x.to("tpu") for x in (q, k, v)), block_mask=bm)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), cpu, atol=1.6e-2, rtol=1.6e-2)


def test_no_mask_and_lse():
    q, k, v = _inputs()
    out, aux = flex_attention(*(x.to("tpu") for x in (q, k, v)), return_aux=AuxRequest(lse=True, max_scores=True))
    lse = aux.lse
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(E)
    torch.testing.assert_close(out.cpu().double(), torch.softmax(s, -1) @ v.double(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.cpu().double(), torch.logsumexp(s, -1), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(aux.max_scores.cpu().double(), s.amax(-1), atol=2e-5, rtol=2e-5)


def test_block_sparsity_is_honoured():
    """A BlockMask whose kept blocks say more than its mask_mod (noop mask, hand-made block list):
    only listed blocks are computed, as the fused kernels do (the dense fallback would attend to
    every key)."""
    nq = nk = (L + 127) // 128
    kv_num = torch.tensor([[[1, 1]]], dtype=torch.int32).expand(B, H, nq).contiguous()
    kv_idx = torch.tensor([[[[0, 0], [0, 0]]]], dtype=torch.int32).expand(B, H, nq, nk).contiguous()
    bm = BlockMask.from_kv_blocks(kv_num.to("tpu"), kv_idx.to("tpu"), seq_lengths=(L, L))
    blocks = torch.zeros(B, H, nq, nk, dtype=torch.bool)
    blocks[..., 0] = True
    q, k, v = _inputs()
    out = flex_attention(*(x.to("tpu") for x in (q, k, v)), block_mask=bm)
    ref = _ref(q, k, v, lambda b, h, qi, ki: torch.ones((), dtype=torch.bool), blocks=blocks)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-5, rtol=2e-5)


def test_create_block_mask_compiled_on_tpu():
    """torch.compile(create_block_mask) (the default backend, as TorchTitan calls it) equals eager CPU."""
    bm = torch.compile(create_block_mask)(_sliding, B, H, L, L, device="tpu")
    cpu = create_block_mask(_sliding, B, H, L, L, device="cpu")
    assert bm.kv_num_blocks.device.type == "tpu"
    for a, c in (
        (bm.kv_num_blocks, cpu.kv_num_blocks),
        (bm.kv_indices, cpu.kv_indices),
        (bm.full_kv_num_blocks, cpu.full_kv_num_blocks),
    ):
        assert torch.equal(a.cpu(), c)


# ---------------------------------------------------------------- bad input


def test_mask_for_another_seq_len_is_rejected():
    q, k, v = (x.to("tpu") for x in _inputs())
    bm = create_block_mask(_causal, B, None, L + 128, L + 128, device="tpu")
    with pytest.raises(ValueError, match="block_mask was created for"):
        flex_attention(q, k, v, block_mask=bm)
    assert flex_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8]).shape == (B, H, 8, E)  # still works


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("bad", ["batch", "heads"])
def test_mask_for_another_batch_or_heads_is_rejected(bad, compiled):
    q, k, v = (x.to("tpu") for x in _inputs())
    mb, mh = (B + 1, None) if bad == "batch" else (B, H + 1)
    bm = create_block_mask(_causal, mb, mh, L, L, device="tpu")
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    word = "batch size" if bad == "batch" else "heads"
    with pytest.raises(ValueError, match=f"flex_attention: block_mask was created for .*{word}"):
        fn(q, k, v, block_mask=bm)
    good = create_block_mask(_causal, B, H, L, L, device="tpu")
    assert torch.isfinite(fn(q, k, v, block_mask=good).cpu()).all()


def test_mismatched_head_dims_are_rejected():
    q, k, v = (x.to("tpu") for x in _inputs())
    with pytest.raises(ValueError, match="same embedding dimension"):
        flex_attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="same number of heads"):
        flex_attention(q, k[:, :1], v[:, :1])


def test_other_devices_keep_pytorchs_check():
    """The device check lets tpu through and nothing else: a meta tensor still gets PyTorch's error."""
    q = torch.empty(1, 1, 8, 8, device="meta")
    with pytest.raises(ValueError, match="FlexAttention is only supported on"):
        flex_attention(q, q, q)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autocast_bfloat16(compiled):
    """Under torch.autocast("tpu", bfloat16) q, k, v are cast to bf16 (as CPU/CUDA autocast do):
    the output equals CPU flex_attention on bf16 inputs; gradients come back in float32."""
    q, k, v = _inputs()
    cpu = flex_attention(
        *(x.bfloat16() for x in (q, k, v)), block_mask=create_block_mask(_causal, B, None, L, L, device="cpu")
    )
    qt, kt, vt = (x.to("tpu").requires_grad_() for x in (q, k, v))
    bm = create_block_mask(_causal, B, None, L, L, device="tpu")
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = fn(qt, kt, vt, block_mask=bm)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), cpu, atol=1.6e-2, rtol=1.6e-2)
    out.float().sum().backward()
    qc = q.clone().requires_grad_()
    _ref(qc, k, v, _causal).sum().backward()
    assert qt.grad.dtype == torch.float32
    torch.testing.assert_close(qt.grad.cpu().double(), qc.grad.double(), atol=5e-2, rtol=5e-2)


def test_compiled_gradients_keep_the_query_layout():
    """Projections of shape (B, L, H*D) viewed as (B, L, H, D) and transposed for flex_attention (as
    TorchTitan's attention does), compiled with the backward: the gradients have the strides
    PyTorch's fake kernel promises, so the compiled backward's views of them hold."""
    b, n, h, d = 2, 64, 4, 16
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(b, n, h * d, generator=g) for _ in range(3)]
    bm = create_block_mask(_causal, b, None, n, n, device="tpu")

    def heads(t):
        return t.view(b, n, h, d).transpose(1, 2)

    def block(x, y, z):
        return flex_attention(heads(x), heads(y), heads(z), block_mask=bm).transpose(1, 2)

    ts = [x.to("tpu").requires_grad_() for x in xs]
    torch.compile(block, backend="tpu")(*ts).sum().backward()
    cs = [x.double().requires_grad_() for x in xs]
    _ref(*(heads(c) for c in cs), _causal).sum().backward()
    for t, c in zip(ts, cs):
        torch.testing.assert_close(t.grad.cpu().double(), c.grad, atol=1e-4, rtol=1e-4)
