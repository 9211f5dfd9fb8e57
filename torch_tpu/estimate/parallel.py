"""One chip's share of a data / fully-sharded / tensor-parallel training step, on one process.

The estimator runs the per-chip model of chip 0 of the slice. Parallelism changes what that
chip holds and computes, and adds the collectives the chip would take part in:

- **DP** (``dp``): the chip sees batch / (dp · fsdp) sequences; gradients are all-reduced over
  the dp group after backward (one all-reduce per FSDP unit, i.e. per layer bucket).
- **FSDP** (``fsdp``): the parameters of each unit (each element of every ``nn.ModuleList``,
  e.g. a decoder layer; each other child of the root, e.g. the embedding and the head; a root
  unit with what is left) live as one flat shard (float32, or the weight dtype) of
  1/fsdp of the unit's elements; before the unit's forward the full unit is gathered into a
  bf16 buffer that is *allocated in HBM* (so peak memory is exact), freed after the forward
  (storage resized to 0, as FSDP2 does), gathered again before its backward, and its gradient
  is reduce-scattered into a shard gradient of the shard's dtype. Gradients and AdamW state
  are therefore 1/fsdp too (and in the weight dtype: MaxText's ``weight_dtype``, its optimizer
  state following it). A root unit stays gathered from its forward to its backward.
- **TP** (``tp``): Megatron-style, through the model (``models.Llama``): heads, MLP width and
  vocabulary / tp per chip, all-reduces at Megatron's f / g operators.
- **EP** (``ep``, mixture-of-experts models): the experts are split over ep chips of the
  FSDP group (expert parallelism borrows from the data-parallel chips, as TorchTitan's and
  MaxText's meshes do): the chip holds E/ep experts (FSDP shards them further) and each MoE
  layer exchanges its tokens with an all-to-all over the ep group (dispatch and combine, each
  again in the backward), on the critical path.
- **PP** (``pp``): the layers are split into pp stages of L/pp layers (1F1B schedule); the
  chip runs one stage (the slowest: with the embedding and the output head) over M
  microbatches, with the pipeline bubble (pp - 1) / (M + pp - 1) of the step, and sends each
  microbatch's activations to the next stage (and gradients back) over one ICI link.
- **Slices** (``slices``): several slices joined by the data-centre network; the dp axis spans
  them when dp is a multiple of slices (HSDP) and its all-reduce is hierarchical, as tpu_dist's:
  reduce-scatter inside the slice, all-reduce of the shard across slices (DCN), all-gather.
  Otherwise the fsdp axis spans them (MaxText's ``dcn_fsdp_parallelism``): each all-gather /
  reduce-scatter is a DCN exchange of the 1/local shards between the slices plus the slice's
  ICI ring over the whole buffer.

Collectives are priced with tpu_dist's own ring formulas (``_C._ring_cost``, from
csrc/distributed/collectives.cc), over as many ICI links as tpu_dist would drive for the
group's chips (``ring_links``, groups laid out by ``topology_aware_mesh``), and recorded in
the chip's counters (``_C._record_collective``) exactly as a real collective is.
Inside a slice all traffic is ICI: a Cloud TPU slice is one ICI domain across its hosts.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import _C


@dataclass(frozen=True)
class Parallelism:
    """Sizes of the parallel axes; ``dp * fsdp * tp * pp`` must equal the chips of all slices;
    ``ep`` divides ``fsdp`` (its chips are FSDP's); ``microbatches`` (pipeline only) divides the
    chip's batch."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    slices: int = 1
    ep: int = 1
    pp: int = 1
    microbatches: int = 0  # 0: as many as the chip's sequences (pp > 1)

    @property
    def chips(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def fsdp_slices(self) -> int:
        """Slices the fsdp axis spans: 1 when dp spans them (HSDP, dp a multiple of the slices),
        else all of them (FSDP over DCN, MaxText's dcn_fsdp_parallelism)."""
        return 1 if self.dp % self.slices == 0 else self.slices

    @property
    def data_parallel(self) -> int:
        """Ways the batch is split: dp · fsdp."""
        return self.dp * self.fsdp


def _group_chips(par: Parallelism, slice_chips: int) -> dict[str, list[int]]:
    """Global chip ids (in slice 0) of chip 0's tp, fsdp and dp groups: mesh
    (dp / slices, fsdp, tp) laid out by ``topology_aware_mesh`` (tp innermost)."""
    from ..distributed.mesh import rank_chips, topology_aware_mesh

    shape = (max(1, par.dp // par.slices) * par.pp, par.fsdp // par.fsdp_slices, par.tp)
    try:
        mesh = topology_aware_mesh(shape, world_size=slice_chips)
    except ValueError:
        mesh = torch.arange(slice_chips).view(shape)  # does not factor onto the torus: rank order
    chips = rank_chips(slice_chips)
    fsdp = [chips[int(r)] for r in mesh[0, :, 0]]
    outer = [chips[int(r)] for r in mesh[:, 0, 0]]  # stage-major: pp stages of dp replicas
    return {"tp": [chips[int(r)] for r in mesh[0, 0, :]], "fsdp": fsdp, "ep": fsdp[:par.ep],
            "dp": outer[::par.pp], "pp": outer[:par.pp]}


class Collectives:
    """Prices chip 0's collectives into tpu:``device``'s counters and keeps a tally.

    ``tally[(op, axis)] = [count, payload_bytes, ici_bytes, dcn_bytes, ici_steps]``.
    """

    def __init__(self, par: Parallelism, slice_chips: int, device: int = 0):
        self.par = par
        self.device = device
        self.groups = _group_chips(par, slice_chips)
        self.links = {axis: _C._tpu_dist_ring_links(chips) if len(chips) > 1 else 1
                      for axis, chips in self.groups.items()}
        self.tally: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0])
        self.timeline = None  # a schedule.Timeline: each collective's position in the step

    def size(self, axis: str) -> int:
        return {"tp": self.par.tp, "fsdp": self.par.fsdp, "dp": self.par.dp, "ep": self.par.ep,
                "pp": self.par.pp}[axis]

    def price(self, op: str, axis: str, payload_bytes: float) -> None:
        """One collective ``op`` (all_reduce, all_gather, reduce_scatter, all_to_all, send) over
        chip 0's ``axis`` group; ``payload_bytes`` as tpu_dist counts it (the buffer the op is
        called with; for all_gather / reduce_scatter the whole n-rank buffer).

        ``all_to_all``: the chip keeps 1/n of its buffer and sends the rest, (n-1)/n of the
        payload over ICI in n-1 exchange steps, over the group's links (MoE's ragged
        all-to-all with balanced routing). ``send``: the buffer to the next pipeline stage over
        one link, one step."""
        n = self.size(axis)
        if n <= 1:
            return
        if op in ("all_to_all", "send"):
            ici = (n - 1) / n * payload_bytes if op == "all_to_all" else float(payload_bytes)
            steps = n - 1 if op == "all_to_all" else 1
            links = self.links[axis] if op == "all_to_all" else 1
            _C._record_collective(self.device, float(payload_bytes), ici, links, steps, 0.0)
            self._tally(op, axis, payload_bytes, ici, 0.0, steps, links)
            return
        hosts = self.par.slices if axis == "dp" else self.par.fsdp_slices if axis == "fsdp" else 1
        local = n // hosts
        ici = dcn = 0.0
        steps = 0
        if hosts == 1:
            c = _C._ring_cost(op, n, float(payload_bytes))
            ici, steps = c["ici_bytes"], c["ici_steps"]
        elif op in ("all_gather", "reduce_scatter"):
            # FSDP over DCN: the chips holding the same shard position in each slice exchange their
            # shards over DCN ((H-1)/H of the 1/local buffer), and the slice-local ring gathers /
            # scatters the whole buffer over ICI (reduce-scatter: the same two in reverse).
            if local > 1:
                c = _C._ring_cost(op, local, float(payload_bytes))
                ici, steps = c["ici_bytes"], c["ici_steps"]
            dcn = _C._ring_cost(op, hosts, float(payload_bytes) / local)["ici_bytes"]
        else:
            # tpu_dist's hierarchical all_reduce (csrc/distributed/hierarchical_transport.cc): local
            # reduce-scatter, all-reduce of the 1/local shard across slices, local all-gather.
            if op != "all_reduce":
                raise NotImplementedError(f"{op} across slices is not modelled")
            if local > 1:
                for part in ("reduce_scatter", "all_gather"):
                    c = _C._ring_cost(part, local, float(payload_bytes))
                    ici += c["ici_bytes"]
                    steps += c["ici_steps"]
            dcn = _C._ring_cost("all_reduce", hosts, float(payload_bytes) / local)["ici_bytes"]
        _C._record_collective(self.device, float(payload_bytes), ici, self.links[axis], steps, dcn)
        self._tally(op, axis, payload_bytes, ici, dcn, steps, self.links[axis])

    def _tally(self, op, axis, payload_bytes, ici, dcn, steps, links) -> None:
        if self.timeline is not None:
            self.timeline.record("collective", op=op, axis=axis, ici_bytes=ici, dcn_bytes=dcn, links=links,
                                 steps=steps)
        t = self.tally[(op, axis)]
        t[0] += 1
        t[1] += payload_bytes
        t[2] += ici
        t[3] += dcn
        t[4] += steps


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _TPCopy(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, coll):
        ctx.coll = coll
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.coll.price("all_reduce", "tp", _nbytes(g))
        return g, None


class _TPReduce(torch.autograd.Function):
    """Megatron's g: all-reduce forward (in place), identity backward."""

    @staticmethod
    def forward(ctx, x, coll):
        coll.price("all_reduce", "tp", _nbytes(x))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


def tp_hooks(coll: Collectives):
    """``models.TPHooks`` pricing Megatron's all-reduces on ``coll`` (identity for tp = 1)."""
    from .models import TPHooks

    a2a = (lambda x: _AllToAll.apply(x, coll)) if coll.par.ep > 1 else (lambda x: x)
    if coll.par.tp == 1:
        return TPHooks(all_to_all=a2a)
    return TPHooks(copy=lambda x: _TPCopy.apply(x, coll), reduce=lambda x: _TPReduce.apply(x, coll),
                   all_to_all=a2a)


class _AllToAll(torch.autograd.Function):
    """MoE's token exchange over ep: an all-to-all forward, another of the gradient backward."""

    @staticmethod
    def forward(ctx, x, coll):
        ctx.coll = coll
        coll.price("all_to_all", "ep", _nbytes(x))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.coll.price("all_to_all", "ep", _nbytes(g))
        return g, None


class _Gather(torch.autograd.Function):
    """All-gather of a unit's flat shard into one compute-dtype buffer, returned as one view
    per parameter (forward); reduce-scatter of the parameters' gradients into a float32
    shard gradient (backward)."""

    @staticmethod
    def forward(ctx, shard, unit):
        # Weakly: the unit's modules hold the views, whose grad_fn holds ctx; a strong
        # reference closes a cycle through autograd's C++ node that gc cannot break.
        ctx.unit = weakref.ref(unit)
        full = unit.gather(shard)
        return tuple(full[off:off + math.prod(shape)].view(shape) for off, shape in unit.unique)

    @staticmethod
    def backward(ctx, *grads):
        return ctx.unit().reduce_grad(grads), None


class FSDPUnit:
    """FSDP2-style sharding of the parameters ``module`` holds directly or through
    submodules that are not units themselves (``skip``). See the module docstring."""

    def __init__(self, name: str, module: nn.Module, skip: list[nn.Module], coll: Collectives,
                 compute_dtype: torch.dtype, reshard_after_forward: bool, param_dtype: torch.dtype = torch.float32):
        self.name = name
        self.module = module
        self.coll = coll
        self.dtype = compute_dtype
        self.reshard = reshard_after_forward
        self.param_dtype = param_dtype
        self.full: torch.Tensor | None = None
        skip_ids = {id(m) for m in skip}
        self.entries: list[tuple[nn.Module, str, int]] = []  # owner, name, index in unique
        self.unique: list[tuple[int, torch.Size]] = []       # (offset, shape) per distinct parameter
        index: dict[int, int] = {}
        total = 0
        stack = [module]
        while stack:
            mod = stack.pop()
            for pname, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) not in index:  # tied parameters share their elements
                    index[id(p)] = len(self.unique)
                    self.unique.append((total, p.shape))
                    total += p.numel()
                self.entries.append((mod, pname, index[id(p)]))
            stack.extend(c for c in mod.children() if id(c) not in skip_ids)
        self.total = total
        self.shard_numel = -(-total // coll.par.fsdp)
        for mod, pname, _ in self.entries:
            if pname in mod._parameters:
                del mod._parameters[pname]
            object.__setattr__(mod, pname, None)
        self.attr = f"_fsdp_shard_{name.replace('.', '_')}"
        module.register_parameter(self.attr, nn.Parameter(torch.empty(self.shard_numel, dtype=param_dtype,
                                                                      device="meta")))
        module.register_forward_pre_hook(self._pre_forward)
        module.register_forward_hook(self._post_forward)

    def shard(self) -> nn.Parameter:
        return getattr(self.module, self.attr)

    # -- forward ---------------------------------------------------------------------------
    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The all-gather's output buffer [fsdp * shard_numel] in the compute dtype, in HBM."""
        # FSDP2's copy-in casts the shard to the compute dtype; the collective then writes the
        # full buffer (no op of its own on the chip).
        shard.detach().to(self.dtype)
        full = torch.empty(self.shard_numel * self.coll.par.fsdp, dtype=self.dtype, device=shard.device)
        self.coll.price("all_gather", "fsdp", _nbytes(full))
        self.full = full
        return full

    def _pre_forward(self, module, args):
        views = _Gather.apply(self.shard(), self)
        for mod, pname, i in self.entries:
            object.__setattr__(mod, pname, views[i])

    def _post_forward(self, module, args, output):
        if self.reshard and torch.is_grad_enabled() and self.full is not None:
            full = self.full
            full.untyped_storage().resize_(0)  # FSDP2's reshard: the memory goes, the views stay
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda g, full=full: self._regather(full))
                    break
        return output

    # -- backward --------------------------------------------------------------------------
    def _regather(self, full: torch.Tensor) -> None:
        """Before the unit's backward: the all-gather again, into the same storage."""
        storage = full.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(_nbytes(full))
            self.coll.price("all_gather", "fsdp", _nbytes(full))

    def reduce_grad(self, grads) -> torch.Tensor:
        """Copies the gradients into one reduce-scatter input (FSDP2's chunk_cat), prices the
        reduce-scatter (and, with dp > 1, the all-reduce of the shard across replicas) and
        returns the float32 shard gradient [shard_numel]."""
        flat = [g.reshape(-1) for g in grads if g is not None]
        like = flat[0]
        if len(flat) > 1:
            torch.cat(flat)  # the reduce-scatter input, written by one copy (then sent)
        self.coll.price("reduce_scatter", "fsdp", like.element_size() * self.shard_numel * self.coll.par.fsdp)
        part = torch.empty(self.shard_numel, dtype=like.dtype, device=like.device)
        if self.coll.par.dp > 1:
            self.coll.price("all_reduce", "dp", _nbytes(part))  # HSDP: shards across replicas
        if self.full is not None and self.reshard:
            self.full.untyped_storage().resize_(0)
        return part.to(self.param_dtype)


def _tensors(output):
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return []


def layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The units below the root: every element of every ``nn.ModuleList`` (outermost lists)."""
    out: list[tuple[str, nn.Module]] = []
    inside: set = set()
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and id(m) not in inside:
            for i, child in enumerate(m):
                out.append((f"{name}.{i}", child))
                for sub in child.modules():
                    inside.add(id(sub))
    return out


def top_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The root's direct children holding parameters outside :func:`layer_modules` (Llama: the
    embedding and the head), each its own FSDP unit as TorchTitan shards ``tok_embeddings`` and
    ``[norm, output]``; children sharing a parameter with another (tied weights) stay in the root."""
    inside = {id(sub) for _, m in layer_modules(model) for sub in m.modules()}
    kids = [(n, c) for n, c in model.named_children()
            if id(c) not in inside and not isinstance(c, nn.ModuleList) and any(True for _ in c.parameters())]
    owners: dict[int, int] = {}
    for _, c in kids:
        for p in c.parameters():
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [(n, c) for n, c in kids if all(owners[id(p)] == 1 for p in c.parameters())]


def shard_model(model: nn.Module, coll: Collectives, compute_dtype: torch.dtype = torch.bfloat16,
                param_dtype: torch.dtype = torch.float32) -> list[FSDPUnit]:
    """Replaces ``model``'s parameters by FSDP units' shards of ``param_dtype`` (meta tensors: call
    ``model.to_empty(device=...)`` afterwards). Units: each layer (:func:`layer_modules`), each of
    :func:`top_units`, all resharded after their forward (FSDP2's default), then a root unit with
    the rest (if any), kept gathered from its forward to its backward. Returns them in that order."""
    layers = layer_modules(model)
    tops = top_units(model)
    units = [FSDPUnit(name, m, [], coll, compute_dtype, True, param_dtype) for name, m in layers + tops]
    skip = [m for _, m in layers + tops]
    skipped = {id(p) for m in skip for p in m.parameters()}
    if any(id(p) not in skipped for p in model.parameters()):
        units.append(FSDPUnit("root", model, skip, coll, compute_dtype, False, param_dtype))
    return units


def price_dp_grads(model: nn.Module, coll: Collectives) -> None:
    """Pure data parallelism (fsdp = 1): one all-reduce of the gradients per layer bucket
    (each unit of :func:`layer_modules`, then the rest), as DDP's buckets would."""
    if coll.par.dp <= 1:
        return
    seen = set()
    for _, m in layer_modules(model):
        b = 0
        for p in m.parameters():
            if id(p) not in seen and p.grad is not None:
                seen.add(id(p))
                b += _nbytes(p.grad)
        if b:
            coll.price("all_reduce", "dp", b)
    rest = sum(_nbytes(p.grad) for p in model.parameters() if id(p) not in seen and p.grad is not None)
    if rest:
        coll.price("all_reduce", "dp", rest)
