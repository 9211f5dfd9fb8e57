"""``scaled_dot_product_attention`` inside compiled graphs: one op forward, one op backward.

Without this, AOTAutograd traces SDPA's composite math path: ``q`` and ``k`` each scaled by
``sqrt(scale)``, the causal mask built and added, ``_safe_softmax`` (softmax plus an
``isneginf``/``any`` pass over the scores for fully masked rows), and a backward of a dozen ops;
in the demo's training step that is 4 library calls and about 10 region passes over the
``T x S`` scores per layer and direction. Strict mode takes ATen's flash kernel, whose bf16
*backward* is slow on the host (bench/README.md). :func:`route` replaces Dynamo's SDPA calls
that have no attention mask and no dropout by ``torch.ops.tpu.attention`` (a custom op with its
own autograd, so the compiled graphs call it as one op):

* forward: ``scores = baddbmm(causal_mask, q, k^T, alpha=scale)`` (``beta=0``, no mask, when
  not causal), ``probs = _softmax(scores)``, ``out = bmm(probs, v)``; the probabilities are
  saved for backward (``[B * H, T, S]`` in q's dtype, as the math path saves its softmax);
* backward (``torch.ops.tpu.attention_backward``): ``dv = probs^T dout``, ``dprobs = dout v^T``,
  ``dscores = _softmax_backward_data(dprobs, probs)``, ``dq = scale * dscores k``,
  ``dk = scale * dscores^T q``.

The causal mask is top-left aligned (query ``i`` sees keys ``j <= i``, as SDPA's ``is_causal``),
so every row has key 0 and no row is fully masked: the safe-softmax pass is not needed.
"""

import math

import torch
import torch.fx

__all__ = ["route"]


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"tpu.attention: q, k, v must be [B, H, T, D], got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2] or q.shape[3] != k.shape[3] or k.shape[2] != v.shape[2]:
        raise ValueError(
            f"tpu.attention: q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} differ in batch, "
            "heads, head dim (q, k) or length (k, v)"
        )


def _causal_mask(t: int, s: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full((t, s), float("-inf"), dtype=like.dtype, device=like.device).triu_(1)


@torch.library.custom_op("tpu::attention", mutates_args=())
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale [+ causal mask]) v for q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv]:
    (out [B, H, T, Dv], probs [B * H, T, S]), both in q's dtype."""
    _check(q, k, v)
    B, H, T, _ = q.shape
    q3, k3, v3 = _as_3d(q), _as_3d(k), _as_3d(v)
    if is_causal:
        scores = torch.baddbmm(_causal_mask(T, k.shape[2], q), q3, k3.transpose(1, 2), alpha=scale)
    else:
        scores = torch.baddbmm(q3.new_empty(()), q3, k3.transpose(1, 2), beta=0, alpha=scale)
    probs = torch._softmax(scores, -1, False)
    return torch.bmm(probs, v3).view(B, H, T, v.shape[3]), probs


@attention.register_fake
def _(q, k, v, is_causal, scale):
    _check(q, k, v)
    B, H, T, _ = q.shape
    return q.new_empty((B, H, T, v.shape[3])), q.new_empty((B * H, T, k.shape[2]))


@torch.library.custom_op("tpu::attention_backward", mutates_args=())
def attention_backward(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, probs: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of :func:`attention`'s output given its saved probabilities."""
    q3, k3, v3, g3 = _as_3d(q), _as_3d(k), _as_3d(v), _as_3d(grad)
    dv = torch.bmm(probs.transpose(1, 2), g3)
    dscores = torch._softmax_backward_data(torch.bmm(g3, v3.transpose(1, 2)), probs, -1, q.dtype)
    none = q3.new_empty(())  # beta=0: ignored; the scale applied inside the product (one rounding)
    dq = torch.baddbmm(none, dscores, k3, beta=0, alpha=scale)
    dk = torch.baddbmm(none, dscores.transpose(1, 2), q3, beta=0, alpha=scale)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


@attention_backward.register_fake
def _(grad, q, k, v, probs, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, _, scale = inputs
    ctx.save_for_backward(q, k, v, output[1])
    ctx.scale = scale


def _backward(ctx, grad_out, grad_probs):
    q, k, v, probs = ctx.saved_tensors
    if grad_out is None:
        return None, None, None, None, None
    dq, dk, dv = torch.ops.tpu.attention_backward(grad_out, q, k, v, probs, ctx.scale)
    return dq, dk, dv, None, None


attention.register_autograd(_backward, setup_context=_setup)


def _sdpa(q, k, v, is_causal=False, scale=None):
    """SDPA's value through :func:`attention` (what a routed graph node calls)."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return torch.ops.tpu.attention(q, k, v, bool(is_causal), s)[0]


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _routable(q, k, v, kwargs: dict, in_autocast: bool) -> bool:
    """Whether a graph's SDPA call (its example values) computes what :func:`attention` does."""
    if set(kwargs) - {"attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"}:
        return False
    if kwargs.get("attn_mask") is not None or kwargs.get("dropout_p", 0.0) != 0.0:
        return False
    if not isinstance(kwargs.get("is_causal", False), bool) or not isinstance(
        kwargs.get("scale"), (float, int, type(None))
    ):
        return False
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return False
    if any(
        t.dim() != 4
        or t.numel() == 0
        or t.dtype != q.dtype
        or t.device.type != "tpu"
        or t.is_nested
        or any(isinstance(s, torch.SymInt) for s in t.shape)
        for t in (q, k, v)
    ):
        return False
    # autocast would cast float32 inputs to bf16 inside SDPA; the custom op has no autocast rule
    if q.dtype not in _DTYPES or (in_autocast and q.dtype in (torch.float32, torch.float64)):
        return False
    # same batch and heads (grouped-query heads stay on the composite), K and V the same length
    return bool(
        q.shape[0] == k.shape[0] == v.shape[0]
        and q.shape[1] == k.shape[1] == v.shape[1]
        and q.shape[3] == k.shape[3]
        and k.shape[2] == v.shape[2]
    )


def route(gm: torch.fx.GraphModule) -> int:
    """Point Dynamo's ``scaled_dot_product_attention`` calls without mask or dropout at
    :func:`attention` (one op forward and one backward for AOTAutograd to trace). Returns how
    many were routed; ``gm`` is recompiled when any was."""
    sdpa = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
    depth, routed = 0, 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        name = getattr(n.target, "__name__", "")
        if name == "_enter_autocast":
            depth += 1
        elif name == "_exit_autocast":
            depth = max(depth - 1, 0)
        if n.target not in sdpa or len(n.args) != 3:
            continue
        vals = [a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in n.args]
        if not _routable(*vals, dict(n.kwargs), depth > 0 or torch.is_autocast_enabled("tpu")):
            continue
        n.target = _sdpa
        n.kwargs = {"is_causal": n.kwargs.get("is_causal", False), "scale": n.kwargs.get("scale")}
        routed += 1
    if routed:
        gm.recompile()
    return routed
