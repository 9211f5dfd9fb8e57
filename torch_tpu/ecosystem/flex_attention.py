"""``torch.nn.attention.flex_attention`` on tpu tensors: a blocked kernel that honours the block mask.

PyTorch 2.13 runs ``flex_attention`` through two higher-order operators (HOPs),
``flex_attention`` and ``flex_attention_backward`` (``torch/_higher_order_ops/flex_attention.py``).
Their dense implementation (``CompositeExplicitAutograd``) materialises the whole
``B x H x L x S`` score matrix and applies ``mask_mod`` everywhere. :func:`install` registers
this module's kernels for the ``PrivateUse1`` dispatch key of both HOPs (``py_impl``, the
registration path PyTorch gives backends), so every route reaches them:

* eager ``flex_attention(q, k, v, ...)``: the HOP's autograd function calls the forward HOP
  below autograd (our forward) and, in ``backward``, the backward HOP (our backward);
* ``torch.compile(flex_attention, backend="tpu")`` (or the default backend, which routes tpu
  graphs to ``"tpu"``): AOTAutograd leaves the two HOPs in the forward and backward graphs and
  the tpu backend runs each as a library call on the chip's tensors, which dispatches here.

The kernel walks the query in blocks of the mask's ``Q_BLOCK_SIZE`` rows. For one query block it
gathers only the key/value blocks the mask lists (``kv_indices`` / ``full_kv_indices``): fully
masked blocks are skipped, ``mask_mod`` is evaluated on partial blocks only, and the largest
score buffer is ``B x H x Q_BLOCK_SIZE x (kept KV blocks x KV_BLOCK_SIZE)``, never ``L x S``
for a sparse mask. The backward recomputes each block's scores from the saved log-sum-exp (as
flash attention does) and takes the block's gradients with autograd, so ``score_mod``'s
captured tensors (a learnable bias) get gradients too. Scores and softmax are computed in
float32 (float64 for float64 inputs), as the dense implementation does.

One documented patch is unavoidable: ``torch.nn.attention.flex_attention._validate_device``
rejects every device outside a hard-coded set (``{"cuda", "cpu", "xpu", "hpu", "mps"}``) before
any dispatch happens; :func:`install` wraps it to let ``tpu`` through (every other device keeps
the original check and message).
"""

import math

import torch
from torch._C import DispatchKey
from torch._higher_order_ops.flex_attention import _permute_strides

_LN2 = math.log(2.0)
# BlockMask.as_tuple() (torch 2.13): q_len, kv_len, kv_num_blocks, kv_indices,
# full_kv_num_blocks, full_kv_indices, ..., Q_BLOCK_SIZE, KV_BLOCK_SIZE, mask_mod.
_KV_NUM, _KV_IDX, _FULL_NUM, _FULL_IDX = 2, 3, 4, 5


def _working_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _flat_vmap(fn, tensors: list[torch.Tensor], buffers: tuple):
    """``fn`` (written on scalars) applied elementwise over broadcast `tensors`, one vmap level."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    flat = [t.expand(shape).reshape(-1) for t in tensors]
    in_dims = (0,) * len(flat) + (None,) * len(buffers)
    with TransformGetItemToIndex():
        out = torch.vmap(fn, in_dims=in_dims)(*flat, *buffers)
    return out.reshape(shape)


def _is_identity(score_mod) -> bool:
    """Whether `score_mod` returns its score unchanged (PyTorch's default, or its traced graph)."""
    from torch.nn.attention.flex_attention import _identity

    if score_mod is _identity:
        return True
    if not isinstance(score_mod, torch.fx.GraphModule):
        return False
    nodes = list(score_mod.graph.nodes)
    ph = [n for n in nodes if n.op == "placeholder"]
    if not ph or len(nodes) != len(ph) + 1 or nodes[-1].op != "output":
        return False
    ret = nodes[-1].args[0]
    if isinstance(ret, (tuple, list)) and len(ret) == 1:
        ret = ret[0]
    return ret is ph[0]


def _check_mask(block_mask: tuple, query: torch.Tensor, key: torch.Tensor) -> None:
    """The block mask's batch and head dims must broadcast to the query's."""
    kv_num = block_mask[_KV_NUM]
    B, Hq = query.shape[0], query.shape[1]
    Bm, Hm = kv_num.shape[0], kv_num.shape[1]
    if Bm not in (1, B):
        raise ValueError(
            f"flex_attention: block_mask was created for batch size B={Bm}, but query has batch size {B}; "
            f"create the block mask with B={B} (or B=None to broadcast)"
        )
    if Hm not in (1, Hq):
        raise ValueError(
            f"flex_attention: block_mask was created for H={Hm} heads, but query has {Hq} heads; "
            f"create the block mask with H={Hq} (or H=None to broadcast)"
        )


class _Plan:
    """Host-side block structure of one call: per query block, the key columns to visit."""

    def __init__(self, block_mask: tuple, B: int, Hq: int, Lq: int, Lkv: int, device: torch.device):
        self.q_block = int(min(block_mask[-3], Lq))
        self.kv_block = int(min(block_mask[-2], Lkv))
        kv_num = block_mask[_KV_NUM].cpu()
        kv_idx = block_mask[_KV_IDX].cpu()
        full_num = block_mask[_FULL_NUM]
        full_idx = block_mask[_FULL_IDX]
        if full_num is not None:
            full_num, full_idx = full_num.cpu(), full_idx.cpu()
        self.B, self.Hq, self.Lq, self.Lkv, self.device = B, Hq, Lq, Lkv, device
        self.kv_num, self.kv_idx, self.full_num, self.full_idx = kv_num, kv_idx, full_num, full_idx

    def blocks(self):
        """Yields (q0, q1, cols, valid, partial) per query block with at least one kept key block.

        cols: int64 (Bm, Hm, C) key positions; valid: bool, the column exists (C is padded to the
        widest (b, h) and clipped to the key length); partial: bool, mask_mod must be evaluated.
        """
        n_q = (self.Lq + self.q_block - 1) // self.q_block
        kvb = self.kv_block
        ar = torch.arange(kvb)
        for m in range(n_q):
            q0, q1 = m * self.q_block, min((m + 1) * self.q_block, self.Lq)
            mq = min(m, self.kv_num.shape[2] - 1)
            num_p = self.kv_num[:, :, mq].long()
            num_f = self.full_num[:, :, mq].long() if self.full_num is not None else torch.zeros_like(num_p)
            width = int((num_p + num_f).max())
            if width == 0:
                yield q0, q1, None, None, None
                continue
            Bm, Hm = num_p.shape
            blk = torch.zeros(Bm, Hm, width, dtype=torch.long)
            is_part = torch.zeros(Bm, Hm, width, dtype=torch.bool)
            ok = torch.zeros(Bm, Hm, width, dtype=torch.bool)
            pos = torch.arange(width)
            wp = int(num_p.max())
            if wp:
                blk[:, :, :wp] = self.kv_idx[:, :, mq, :wp].long()
            in_p = pos[None, None, :] < num_p[:, :, None]
            is_part |= in_p
            ok |= in_p
            if self.full_num is not None and int(num_f.max()):
                # full blocks go after each (b, h)'s partial ones
                j = (pos[None, None, :] - num_p[:, :, None]).clamp(min=0)
                in_f = (~in_p) & (j < num_f[:, :, None])
                fidx = torch.gather(self.full_idx[:, :, mq, :].long(), 2, j.clamp(max=self.full_idx.shape[-1] - 1))
                blk = torch.where(in_f, fidx, blk)
                ok |= in_f
            cols = (blk[..., None] * kvb + ar).reshape(Bm, Hm, width * kvb)
            valid = (ok[..., None] & (cols.view(Bm, Hm, width, kvb) < self.Lkv)).reshape(Bm, Hm, -1)
            partial = is_part[..., None].expand(Bm, Hm, width, kvb).reshape(Bm, Hm, -1)
            dev = self.device
            yield q0, q1, cols.clamp(max=self.Lkv - 1).to(dev), valid.to(dev), partial.to(dev)


def _expand_kv(t: torch.Tensor, B: int, Hq: int) -> torch.Tensor:
    """(Bkv, Hkv, S, D) -> (B, Hq, S, D): broadcast batch, repeat heads for GQA."""
    t = t.expand(B, *t.shape[1:])
    g = Hq // t.shape[1]
    return t.repeat_interleave(g, dim=1) if g > 1 else t


def _gather_cols(t: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """t: (B, H, S, D), cols: (Bm, Hm, C) -> (B, H, C, D)."""
    B, H, _, D = t.shape
    idx = cols.expand(B, H, cols.shape[-1])[..., None].expand(B, H, cols.shape[-1], D)
    return torch.gather(t, 2, idx)


def _block_scores(q_blk, k_cols, q0, q1, cols, valid, partial, score_mod, mask_mod, scale, sbuf, mbuf):
    """Post-mod scores of one query block over its gathered columns, -inf where masked."""
    wd = _working_dtype(q_blk)
    B, H = q_blk.shape[0], q_blk.shape[1]
    s = (q_blk.to(wd) @ k_cols.to(wd).transpose(-2, -1)) * scale
    dev = s.device
    b = torch.arange(B, device=dev, dtype=torch.int32).view(B, 1, 1, 1)
    h = torch.arange(H, device=dev, dtype=torch.int32).view(1, H, 1, 1)
    qi = torch.arange(q0, q1, device=dev, dtype=torch.int32).view(1, 1, -1, 1)
    ki = cols.to(torch.int32).unsqueeze(2)
    if not _is_identity(score_mod):
        s = _flat_vmap(score_mod, [s, b, h, qi, ki], sbuf).to(wd)
    keep = valid.unsqueeze(2)
    if bool(partial.any()):
        mm = _flat_vmap(mask_mod, [b, h, qi, ki], mbuf)
        keep = keep & (~partial.unsqueeze(2) | mm)
    return torch.where(keep, s, torch.tensor(-math.inf, dtype=wd, device=dev))


def flex_forward(
    query,
    key,
    value,
    score_mod,
    block_mask,
    scale,
    kernel_options,
    score_mod_other_buffers=(),
    mask_mod_other_buffers=(),
):
    """Forward HOP kernel: (out (B, Hq, L, Ev), lse (B, Hq, L), max (B, Hq, L)), stats in log2 units.

    Raises:
        ValueError: the block mask's batch or head count does not broadcast to the query's.
    """

    _check_mask(block_mask, query, key)
    B, Hq, Lq, _ = query.shape
    Lkv, Ev = value.shape[2], value.shape[3]
    wd = _working_dtype(query)
    k = _expand_kv(key, B, Hq)
    v = _expand_kv(value, B, Hq)
    out = query.new_zeros(B, Hq, Lq, Ev)
    lse = torch.full((B, Hq, Lq), -math.inf, dtype=wd, device=query.device)
    mx = torch.full((B, Hq, Lq), -math.inf, dtype=wd, device=query.device)
    plan = _Plan(block_mask, B, Hq, Lq, Lkv, query.device)
    mask_mod = block_mask[-1]
    for q0, q1, cols, valid, partial in plan.blocks():
        if cols is None:
            continue  # every key block masked: output 0, lse -inf (as the dense kernel)
        z = _block_scores(
            query[:, :, q0:q1],
            _gather_cols(k, cols),
            q0,
            q1,
            cols,
            valid,
            partial,
            score_mod,
            mask_mod,
            scale,
            score_mod_other_buffers,
            mask_mod_other_buffers,
        )
        row_max = z.amax(-1)
        row_lse = torch.logsumexp(z, -1)
        dead = torch.isinf(row_lse) & (row_lse < 0)
        p = torch.exp(z - torch.where(dead, 0.0, row_lse).unsqueeze(-1))
        out[:, :, q0:q1] = p.to(query.dtype) @ _gather_cols(v, cols).to(query.dtype)
        lse[:, :, q0:q1] = row_lse
        mx[:, :, q0:q1] = row_max
    return _permute_strides(out, query.stride()), lse / _LN2, mx / _LN2


class _autograd_on:
    """Grad mode on with the autograd keys back in the dispatch TLS: the HOP's autograd wrapper
    runs the backward HOP below autograd (``_AutoDispatchBelowAutograd``), and the blocked
    backward differentiates its own per-block recomputation."""

    def __enter__(self):
        ex = torch._C._dispatch_tls_local_exclude_set()
        ex = ex.remove(DispatchKey.AutogradFunctionality).remove(DispatchKey.ADInplaceOrView)
        self._guard = torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), ex)
        self._grad = torch.enable_grad()
        self._guard.__enter__()
        self._grad.__enter__()

    def __exit__(self, *exc):
        self._grad.__exit__(*exc)
        self._guard.__exit__(*exc)
        return False


def flex_backward(
    query,
    key,
    value,
    out,
    logsumexp,
    grad_out,
    grad_logsumexp,
    fw_graph,
    joint_graph,
    block_mask,
    scale,
    kernel_options,
    score_mod_other_buffers=(),
    mask_mod_other_buffers=(),
):
    """Backward HOP kernel: (dq, dk, dv, grads of score_mod's captured tensors or None).

    Per query block: recompute the block's probabilities from the saved log-sum-exp
    ``p = exp(z - lse)`` and differentiate ``<dO, p V> + <dlse - delta, rowsum(p)>`` (``delta =
    rowsum(dO * O)``): its gradient is exactly the softmax-attention gradient of that block.
    """
    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise ValueError(
            f"flex_attention backward: query, key and value must share a dtype, got query.dtype={query.dtype}, "
            f"key.dtype={key.dtype}, value.dtype={value.dtype}"
        )
    _check_mask(block_mask, query, key)
    B, Hq, Lq, _ = query.shape
    Lkv = value.shape[2]
    wd = _working_dtype(query)
    lse = logsumexp.to(wd) * _LN2
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    glse = grad_logsumexp.to(wd) / _LN2 if grad_logsumexp is not None else torch.zeros_like(lse)
    delta = (out.to(wd) * grad_out.to(wd)).sum(-1)
    dq = torch.zeros_like(query, memory_format=torch.contiguous_format)
    kf = key.detach().requires_grad_()
    vf = value.detach().requires_grad_()
    sbuf = tuple(
        b.detach().requires_grad_() if isinstance(b, torch.Tensor) and b.requires_grad else b
        for b in score_mod_other_buffers
    )
    grad_bufs = [i for i, b in enumerate(score_mod_other_buffers) if isinstance(b, torch.Tensor) and b.requires_grad]
    dk = torch.zeros_like(key, memory_format=torch.contiguous_format)
    dv = torch.zeros_like(value, memory_format=torch.contiguous_format)
    dbuf = [torch.zeros_like(score_mod_other_buffers[i], memory_format=torch.contiguous_format) for i in grad_bufs]
    plan = _Plan(block_mask, B, Hq, Lq, Lkv, query.device)
    mask_mod = block_mask[-1]
    with _autograd_on():
        for q0, q1, cols, valid, partial in plan.blocks():
            if cols is None:
                continue
            qb = query[:, :, q0:q1].detach().requires_grad_()
            k = _expand_kv(kf, B, Hq)
            v = _expand_kv(vf, B, Hq)
            z = _block_scores(
                qb,
                _gather_cols(k, cols),
                q0,
                q1,
                cols,
                valid,
                partial,
                fw_graph,
                mask_mod,
                scale,
                sbuf,
                mask_mod_other_buffers,
            )
            l_blk = lse[:, :, q0:q1]
            dead = torch.isinf(l_blk) & (l_blk < 0)
            p = torch.where(dead.unsqueeze(-1), 0.0, torch.exp(z - torch.where(dead, 0.0, l_blk).unsqueeze(-1)))
            o = p.to(query.dtype) @ _gather_cols(v, cols).to(query.dtype)
            w = (glse[:, :, q0:q1] - delta[:, :, q0:q1]).unsqueeze(-1)
            f = (grad_out[:, :, q0:q1].to(wd) * o.to(wd)).sum() + (w * p).sum()
            wrt = [qb, kf, vf] + [sbuf[i] for i in grad_bufs]
            grads = torch.autograd.grad(f, wrt, allow_unused=True)
            dq[:, :, q0:q1] = grads[0]
            if grads[1] is not None:
                dk += grads[1]
            if grads[2] is not None:
                dv += grads[2]
            for j, g in enumerate(grads[3:]):
                if g is not None:
                    dbuf[j] += g
    buf_grads = [None] * len(score_mod_other_buffers)
    for j, i in enumerate(grad_bufs):
        buf_grads[i] = dbuf[j]

    # the layouts PyTorch's fake kernel promises (compiled backward graphs view them accordingly)
    dq, dk, dv = (_permute_strides(g, x.stride()) for g, x in ((dq, query), (dk, key), (dv, value)))
    return dq, dk, dv, tuple(buf_grads)


def flex_autocast(
    query,
    key,
    value,
    score_mod,
    block_mask,
    scale,
    kernel_options,
    score_mod_other_buffers=(),
    mask_mod_other_buffers=(),
):
    """Forward HOP under ``torch.autocast("tpu")``: q, k, v cast to the autocast dtype, then the
    HOP again with tpu autocast excluded (what PyTorch registers for CPU and CUDA autocast)."""
    from torch._higher_order_ops.flex_attention import flex_attention
    from torch.amp.autocast_mode import _cast

    dtype = torch.get_autocast_dtype("tpu")
    query, key, value = (_cast(t, "tpu", dtype) for t in (query, key, value))
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(DispatchKey.AutocastPrivateUse1)):
        return flex_attention(
            query,
            key,
            value,
            score_mod,
            block_mask,
            scale,
            kernel_options,
            score_mod_other_buffers,
            mask_mod_other_buffers,
        )


def _allow_tpu_device() -> None:
    """Wraps ``flex_attention._validate_device`` so that tpu tensors pass (the one patch)."""
    import torch.nn.attention.flex_attention as fa

    orig = fa._validate_device
    if getattr(orig, "_torch_tpu", False):
        return

    def _validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return orig(query, key, value)

    _validate_device._torch_tpu = True
    _validate_device.__wrapped__ = orig
    _validate_device.__doc__ = "torch_tpu: tpu tensors pass; every other device keeps PyTorch's check."
    fa._validate_device = _validate_device


def install() -> None:
    """Registers the tpu kernels of both flex_attention HOPs and lets tpu through the device check (idempotent)."""
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    if DispatchKey.PrivateUse1 not in flex_attention.py_kernels:
        flex_attention.py_impl(DispatchKey.PrivateUse1)(flex_forward)
    if DispatchKey.AutocastPrivateUse1 not in flex_attention.py_kernels:
        flex_attention.py_impl(DispatchKey.AutocastPrivateUse1)(flex_autocast)
    if DispatchKey.PrivateUse1 not in flex_attention_backward.py_kernels:
        flex_attention_backward.py_impl(DispatchKey.PrivateUse1)(flex_backward)
    # autocast passes the backward HOP through, as PyTorch does for CPU and CUDA autocast
    flex_attention_backward.fallthrough(DispatchKey.AutocastPrivateUse1)
    _allow_tpu_device()
