"""Rematerialisation policies as MaxText names them, and host offload of saved activations.

A decoder layer's forward runs under activation checkpointing (``torch.utils.checkpoint``,
non-reentrant) with a selective policy: the outputs of the ops the model tags with a name
(``models.llama.tag``) are kept in HBM (*saved*), moved to host memory until the backward
(*offloaded*), or recomputed in the backward (everything else). The names and the policies
are MaxText's (``src/maxtext/layers/decoders.py``, ``Decoder.get_remat_policy``, and
``src/maxtext/utils/maxtext_utils.py``, ``get_save_and_offload_names``, in
github.com/AI-Hypercomputer/maxtext at commit e591f30cbbf217ed67ef71263ec0538239f9c3b8):

- ``decoder_layer_input``: the layer's input (always kept by checkpointing; ``custom`` may
  offload it),
- ``query_proj``, ``key_proj``, ``value_proj`` (``qkv_proj``, ``kv_proj`` are fused forms and
  name the same tensors here), ``context`` (the attention kernel's output), ``out_proj``
  (the attention output projection), ``mlpwi_0`` / ``mlpwi_1`` (the gate and up projections;
  ``mlpwi`` names both), ``mlpwo`` (the down projection).

Recomputed ops are priced again in the backward by the same cost model (the recompute FLOPs
and HBM traffic are counted, not estimated); offloaded bytes go over the host link both ways
(see :data:`HOST_LINK_BYTES_PER_S`).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch

# Names a model can tag (MaxText's checkpoint names). The fused names are aliases.
NAMES = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "qkv_proj", "kv_proj", "context",
         "out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")
_ALIASES = {"qkv_proj": ("query_proj", "key_proj", "value_proj"), "kv_proj": ("key_proj", "value_proj"),
            "mlpwi": ("mlpwi_0", "mlpwi_1")}

_MINIMAL = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj", "out_proj", "mlpwi_0", "mlpwi_1",
            "mlpwi", "mlpwo")
_QKV = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj")

# policy -> (names kept in HBM, names offloaded to host), as MaxText defines them.
POLICIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "none": ((), ()),  # no checkpointing: every intermediate the backward needs stays in HBM
    "full": ((), ()),  # only the layer input is kept
    "minimal": (_MINIMAL, ()),
    "minimal_with_context": (_MINIMAL + ("context",), ()),
    "minimal_flash": (_MINIMAL + ("context",), ()),  # MaxText's deprecated alias of minimal_with_context
    "save_dot_with_context_except_mlp": (_QKV + ("context", "out_proj"), ()),
    "save_dot_except_mlpwi": (_QKV + ("out_proj", "mlpwo"), ()),
    "save_dot_except_mlp": (_QKV + ("out_proj",), ()),
    "save_qkv_proj": (_QKV, ()),
    "save_out_proj": (("out_proj",), ()),
    "qkv_proj_offloaded": ((), ("query_proj", "value_proj", "key_proj", "kv_proj")),
    "minimal_offloaded": ((), _MINIMAL),
    "custom": ((), ()),  # the names come from save= / offload=
}

# Host link per chip, bytes/s in each direction (PCIe between the chip and its host). No
# per-generation figure is published in Cloud TPU's documentation; "How to Scale Your Model"
# (Austin et al., Google DeepMind, 2025, https://jax-ml.github.io/scaling-book/tpus/, section
# "TPU networking", and its worked problem on TPU v6e) uses 1.5e10 B/s of PCIe bandwidth per
# chip, which is taken here for every generation.
HOST_LINK_BYTES_PER_S: dict[str, float] = {"v4": 1.5e10, "v5e": 1.5e10, "v5p": 1.5e10, "v6e": 1.5e10,
                                           "tpu7x": 1.5e10}


def _expand(names) -> frozenset:
    out = set()
    for n in names:
        out.update(_ALIASES.get(n, (n,)))
    return frozenset(out)


@dataclass(frozen=True)
class RematPlan:
    """A resolved policy: ``checkpoint`` (whether layers are checkpointed at all), ``save`` and
    ``offload`` (tag names, aliases expanded)."""

    policy: str = "none"
    save: frozenset = field(default_factory=frozenset)
    offload: frozenset = field(default_factory=frozenset)

    @property
    def checkpoint(self) -> bool:
        return self.policy != "none"


def resolve(policy: str | bool | None, save=(), offload=()) -> RematPlan:
    """The plan for MaxText policy ``policy`` (``True``: ``full``; ``False`` / None: ``none``).
    ``save`` / ``offload`` add names (``custom`` takes only these).

    Raises ValueError for an unknown policy (listing the valid ones), an unknown name (listing
    the valid ones), a name both saved and offloaded, or names given with ``none``.
    """
    if policy is True:
        policy = "full"
    elif policy is False or policy is None:
        policy = "none"
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"unknown remat policy {policy!r}; valid: {', '.join(POLICIES)}")
    save, offload = tuple(save or ()), tuple(offload or ())
    for n in save + offload:
        if n not in NAMES:
            raise ValueError(f"remat: unknown tensor name {n!r}; valid: {', '.join(NAMES)}")
    if policy == "none" and (save or offload):
        raise ValueError("remat: --save / --offload need a checkpointing policy (e.g. custom), not 'none'")
    base_save, base_off = POLICIES[policy]
    s, o = _expand(base_save + save), _expand(base_off + offload)
    if s & o:
        raise ValueError(f"remat: {', '.join(sorted(s & o))} cannot be both saved and offloaded")
    return RematPlan(policy, s, o)


# -- tagging --------------------------------------------------------------------------------
_current: list[str | None] = [None]
_residual: list[bool] = [True]

# Ops whose output a tag names (the MXU op of a projection, the attention kernel).
_TAGGED_OPS = {"mm", "bmm", "addmm", "_scaled_dot_product_flash_attention_for_cpu",
               "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_attention_math", "baddbmm"}


@contextlib.contextmanager
def tag(name: str, residual: bool = True):
    """The matmul / attention ops run inside produce the tensor MaxText calls ``name``.
    ``residual=False``: no backward op of the layer reads it and the recomputation stops before
    it (e.g. the MLP's output, consumed only by the residual add, whose gradient needs no input);
    JAX keeps a named value only when it is a residual of the backward, so a policy saving or
    offloading it keeps nothing and moves nothing."""
    prev, prev_residual = _current[0], _residual[0]
    _current[0], _residual[0] = name, residual
    try:
        yield
    finally:
        _current[0], _residual[0] = prev, prev_residual


class HostTraffic:
    """Bytes moved to the host in the forward (``d2h``) and back in the backward (``h2d``)."""

    def __init__(self):
        self.d2h = 0.0
        self.h2d = 0.0
        self.count = 0
        self.timeline = None  # a schedule.Timeline: each layer's offload and reload in the step

    def seconds(self, generation: str) -> tuple[float, float]:
        bw = HOST_LINK_BYTES_PER_S[generation]
        return self.d2h / bw, self.h2d / bw


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class _Offloaded:
    """Storages moved to host after a layer's forward and back before its backward."""

    def __init__(self, traffic: HostTraffic):
        self.traffic = traffic
        self.tensors: list[torch.Tensor] = []

    def add(self, t: torch.Tensor) -> None:
        if any(t.untyped_storage()._cdata == u.untyped_storage()._cdata for u in self.tensors):
            return
        self.tensors.append(t)

    def evict(self) -> None:
        # The dry run holds no values: the HBM goes (as a copy to host would free it) and the
        # transfer is priced on the host link.
        moved = 0
        for t in self.tensors:
            s = t.untyped_storage()
            n = s.nbytes()
            if n:
                self.traffic.d2h += n
                self.traffic.count += 1
                t._offload_nbytes = n
                s.resize_(0)
                moved += n
        if moved and self.traffic.timeline is not None:
            self.traffic.timeline.record("d2h", bytes=moved, key=id(self))

    def restore(self) -> None:
        moved = 0
        for t in self.tensors:
            s = t.untyped_storage()
            n = getattr(t, "_offload_nbytes", 0)
            if n and s.nbytes() == 0:
                s.resize_(n)
                self.traffic.h2d += n
                moved += n
        if moved and self.traffic.timeline is not None:
            self.traffic.timeline.record("h2d", bytes=moved, key=id(self))
        self.tensors = []


def _policy_fn(plan: RematPlan, offloaded: _Offloaded, ctx, func, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    name = _current[0]
    if name is not None and func._opname in _TAGGED_OPS and _residual[0]:
        if name in plan.save:
            return CheckpointPolicy.MUST_SAVE
        if name in plan.offload:
            for t in (ctx.op_output if isinstance(ctx.op_output, (tuple, list)) else (ctx.op_output,)):
                if isinstance(t, torch.Tensor):
                    offloaded.add(t)
            return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def wrap_layer(layer: torch.nn.Module, plan: RematPlan, traffic: HostTraffic) -> None:
    """Runs ``layer``'s forward under ``plan``: checkpointed with the selective policy, tagged
    outputs saved or offloaded (offloaded storages freed after the forward and restored, priced
    on ``traffic``, when the gradient of the layer's output arrives). The first positional
    argument is the layer input (``decoder_layer_input``)."""
    if not plan.checkpoint:
        return
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    inner = layer.forward
    selective = bool(plan.save or plan.offload - {"decoder_layer_input"})

    def forward(x, *args, **kwargs):
        off = _Offloaded(traffic)
        ctx_fn = (functools.partial(create_selective_checkpoint_contexts,
                                    functools.partial(_policy_fn, plan, off), allow_cache_entry_mutation=True)
                  if selective else None)
        extra = {"context_fn": ctx_fn} if ctx_fn is not None else {}
        out = checkpoint(inner, x, *args, use_reentrant=False, preserve_rng_state=False, **extra, **kwargs)
        if "decoder_layer_input" in plan.offload:
            off.add(x)
        if off.tensors and isinstance(out, torch.Tensor) and out.requires_grad:
            off.evict()
            out.register_hook(lambda g: off.restore())
        return out

    layer.forward = forward
