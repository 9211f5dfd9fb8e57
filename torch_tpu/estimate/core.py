"""The estimator: one training step of a model's per-chip share, run in dry-run mode, and
the report built from the runtime's counters.

Units: bytes, seconds (estimated device seconds of the cost model unless named ``wall``),
FLOPs, tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

import torch_tpu.runtime

from .. import _C
from . import models as M
from . import remat as R
from . import schedule as S
from .flops import mfu, model_flops_per_token
from .optim import AdamWMu
from .parallel import Collectives, Parallelism, layer_modules, price_dp_grads, shard_model, tp_hooks

GENERATIONS = ("v4", "v5e", "v5p", "v6e", "tpu7x")
# The dry run allocates HBM without touching it; capacity is checked against each
# generation afterwards, so the runtime's own capacity must never be the limit.
DRY_RUN_HBM = "16TiB"


@contextlib.contextmanager
def dry_run():
    """Context manager: tpu ops inside are shaped, allocated in HBM and priced by the cost
    model into ``torch_tpu.runtime.stats()`` exactly as when they run, but not computed
    (copies and fills are priced and skipped; nothing writes HBM, so the pages backing it
    are never touched and take no host memory).

    Process-wide while active (autograd's backward thread included). Reading values on the
    host inside it (``.item()``, ``.cpu()``, printing, data-dependent ops such as
    ``nonzero``) raises RuntimeError. Tensors allocated or written inside hold no values after
    it: reading one raises RuntimeError until it is overwritten whole (``copy_``, ``fill_``).
    Work queued before entering is finished first.
    """
    if torch.tpu.is_available():
        for i in range(torch.tpu.device_count()):
            torch.tpu.synchronize(i)
    previous = _C._dry_run()
    _C._set_dry_run(True)
    try:
        yield
    finally:
        _C._set_dry_run(previous)


@dataclass
class ModelSpec:
    """What to build. ``kind``: "llama" (``llama`` config), "gpt" (the demo's GPT, ``gpt_preset``)
    or "factory" (``factory`` = "pkg.mod:callable", called with ``factory_kwargs``)."""

    kind: str
    name: str
    llama: M.LlamaConfig | None = None
    gpt_preset: str = "small"
    factory: str | None = None
    factory_kwargs: dict = field(default_factory=dict)
    batch: int = 8      # global sequences per step
    seq_len: int = 128
    vocab_size: int = 256  # token ids of generated inputs are < this (GPT: its vocabulary)


MODEL_NAMES = tuple(M.LLAMA_PRESETS) + ("llama", "gpt-tiny", "gpt-small", "gpt-base")


def model_spec(name: str, *, config_json: str | None = None, batch: int | None = None,
               seq_len: int | None = None, factory_kwargs: dict | None = None, **llama_overrides) -> ModelSpec:
    """A ModelSpec from a model name: a Llama preset (``llama3-8b``, ...), ``llama`` (defaults
    + ``config_json`` + overrides: vocab_size, n_layers, d_model, n_heads, n_kv_heads,
    ffn_dim), ``gpt-tiny`` / ``gpt-small`` / ``gpt-base`` (the demo's GPT), or an import path
    ``pkg.mod:factory`` returning an ``nn.Module`` whose ``forward(idx [B, T] int64,
    targets [B, T] int64)`` returns the loss or a tuple ending with it.

    Raises ValueError for unknown names (listing the valid ones) and bad configs.
    """
    for what, v in (("batch", batch), ("seq_len", seq_len)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    if ":" in name:
        mod, _, attr = name.partition(":")
        if not mod or not attr:
            raise ValueError(f"model '{name}': an import path must read 'package.module:factory'")
        return ModelSpec("factory", name, factory=name, factory_kwargs=dict(factory_kwargs or {}),
                         batch=8 if batch is None else batch, seq_len=128 if seq_len is None else seq_len)
    if name.startswith("gpt-"):
        preset = name[4:]
        if preset not in M.GPT_PRESETS:
            raise ValueError(f"unknown model '{name}'; valid: {', '.join(MODEL_NAMES)} or package.module:factory")
        return ModelSpec("gpt", name, gpt_preset=preset, batch=16 if batch is None else batch,
                         seq_len=128 if seq_len is None else seq_len)
    if name in M.LLAMA_PRESETS or name == "llama":
        cfg = M.llama_config(None if name == "llama" else name, config_json,
                             seq_len=seq_len, batch=batch, **llama_overrides)
        return ModelSpec("llama", name, llama=cfg, batch=cfg.batch, seq_len=cfg.seq_len, vocab_size=cfg.vocab_size)
    raise ValueError(f"unknown model '{name}'; valid: {', '.join(MODEL_NAMES)} or package.module:factory")


def check_plan(spec: ModelSpec, par: Parallelism, slice_chips: int) -> None:
    """Raises ValueError when the parallel sizes do not divide the slice or the model, or the
    batch does not divide the data-parallel size. Run before any work."""
    for axis in ("dp", "fsdp", "tp", "slices", "ep", "pp"):
        v = getattr(par, axis)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"--{axis} must be a positive integer, got {v!r}")
    if not isinstance(par.microbatches, int) or par.microbatches < 0:
        raise ValueError(f"--microbatches must be a positive integer, got {par.microbatches!r}")
    chips = slice_chips * par.slices
    if par.chips != chips:
        pp = f" x pp {par.pp}" if par.pp > 1 else ""
        raise ValueError(f"dp {par.dp} x fsdp {par.fsdp} x tp {par.tp}{pp} = {par.chips} chips, but "
                         f"{par.slices} slice(s) of {slice_chips} chips have {chips}: the product must equal it")
    if par.ep > 1:
        if spec.kind != "llama" or not spec.llama.is_moe:
            raise ValueError(f"--ep {par.ep}: expert parallelism needs a mixture-of-experts model (n_experts > 0), "
                             f"not '{spec.name}'")
        if spec.llama.n_experts % par.ep:
            raise ValueError(f"--ep {par.ep} does not divide the {spec.llama.n_experts} experts")
        if par.fsdp % par.ep:
            raise ValueError(f"--ep {par.ep} does not divide --fsdp {par.fsdp} (expert parallelism uses FSDP's chips)")
    if par.pp > 1:
        if spec.kind != "llama":
            raise ValueError(f"--pp: pipeline parallelism is modelled for Llama-style models only, not '{spec.name}'")
        if spec.llama.n_layers % par.pp:
            raise ValueError(f"--pp {par.pp} does not divide the {spec.llama.n_layers} layers")
    elif par.microbatches:
        raise ValueError("--microbatches applies to pipeline parallelism (--pp above 1)")
    if par.dp % par.slices and par.fsdp % par.slices:
        raise ValueError(f"neither dp {par.dp} nor fsdp {par.fsdp} is a multiple of slices {par.slices} "
                         "(data parallelism, or else FSDP, spans the slices)")
    if spec.batch % par.data_parallel:
        raise ValueError(f"global batch {spec.batch} does not divide into dp x fsdp = {par.data_parallel} "
                         f"data-parallel replicas")
    local = spec.batch // par.data_parallel
    if par.pp > 1 and par.microbatches and local % par.microbatches:
        raise ValueError(f"--microbatches {par.microbatches} does not divide the chip's batch of {local} sequences")
    if spec.kind == "llama":
        c = spec.llama
        if c.n_heads % par.tp:
            raise ValueError(f"tp {par.tp} does not divide the {c.n_heads} attention heads")
        if c.n_kv_heads % par.tp and par.tp % c.n_kv_heads:
            raise ValueError(f"tp {par.tp} and the {c.n_kv_heads} key/value heads: one must divide the other")
        if c.ffn_dim % par.tp and not c.is_moe:
            raise ValueError(f"tp {par.tp} does not divide the MLP width {c.ffn_dim}")
        if c.is_moe and c.moe_ffn_dim % par.tp:
            raise ValueError(f"tp {par.tp} does not divide the expert MLP width {c.moe_ffn_dim}")
        if c.vocab_size % par.tp:
            raise ValueError(f"tp {par.tp} does not divide the vocabulary {c.vocab_size}")
        if c.d_model % par.tp:
            raise ValueError(f"tp {par.tp} does not divide the width {c.d_model}")
    elif par.tp > 1:
        raise ValueError(f"tensor parallelism is modelled for Llama-style models only, not '{spec.name}'")


def _factory(path: str) -> Callable[..., nn.Module]:
    mod, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"model '{path}': cannot import module '{mod}': {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"model '{path}': module '{mod}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"model '{path}': '{attr}' is not callable")
    return obj


def _build(spec: ModelSpec, coll: Collectives, attention: str, loss_chunks: int = 1) -> nn.Module:
    if spec.kind == "llama":
        cfg = spec.llama
        if coll.par.pp > 1:  # one stage: L / pp layers (with the embedding and the head)
            cfg = dataclasses.replace(cfg, n_layers=cfg.n_layers // coll.par.pp)
        return M.Llama(cfg, tp=coll.par.tp, attention=attention, hooks=tp_hooks(coll), loss_chunks=loss_chunks,
                       ep=coll.par.ep)
    if spec.kind == "gpt":
        return M.demo_gpt(spec.gpt_preset, seq_len=spec.seq_len)
    model = _factory(spec.factory)(**spec.factory_kwargs)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model '{spec.factory}' returned {type(model).__name__}, not an nn.Module")
    return model


def _distinct_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied ones once


def _optimizer(spec: ModelSpec, model: nn.Module, mu_dtype: str = "fp32") -> torch.optim.Optimizer:
    if spec.kind == "gpt" and mu_dtype == "fp32":
        return M.make_optimizer(model, 1e-3)  # the demo's AdamW and parameter groups
    if mu_dtype == "bf16":  # MaxText's mu_dtype=bfloat16: the first moment in bf16
        return AdamWMu(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, mu_dtype=torch.bfloat16)
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               device: torch.device, amp: torch.dtype | None, after_backward: Callable[[], None] = lambda: None,
               opt_step: Callable[[], None] | None = None, after_forward: Callable[[], None] = lambda: None
               ) -> torch.Tensor:
    """One training step, the demo's (torch_tpu/demo/loop.py calls it): inputs moved to the device,
    forward under autocast (``amp``, None for none), backward, gradient clipping at 1.0,
    optimizer step (``opt_step``, default ``opt.step``; the demo's compile mode passes a compiled
    one), gradients set to None; ``after_forward`` / ``after_backward`` are called between the
    phases. ``x``, ``y``: host int64 [B, T]. Returns the loss (a device
    tensor; not read, so that the step runs in a dry run)."""
    ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    with ctx:
        out = model(x.to(device), y.to(device))
    loss = out[-1] if isinstance(out, (tuple, list)) else out
    after_forward()
    loss.backward()
    after_backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    (opt_step or opt.step)()
    opt.zero_grad(set_to_none=True)
    return loss


@contextlib.contextmanager
def _global_eager_mode(mode: str):
    """The process-wide eager mode inside (autograd's backward thread follows it), the previous
    one restored after."""
    previous = _C._get_eager_mode()
    _C._defer_flush()
    _C._set_eager_mode(mode)
    try:
        yield
    finally:
        _C._defer_flush()  # issues (here: prices) what the mode recorded
        _C._set_eager_mode(previous)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# Auto loss chunking: chunks of at most this many float32 logits bytes (MaxText's vocabulary
# tiling; XLA never materialises the whole float32 logits of a large vocabulary either).
LOSS_CHUNK_BYTES = 1 << 28


def auto_loss_chunks(spec: ModelSpec, par: Parallelism) -> int:
    """Chunks of the output projection and loss for ``loss_chunks=None``: Llama-style models whose
    chip's float32 logits exceed :data:`LOSS_CHUNK_BYTES` (256 MiB) get enough chunks to stay under it
    (one chunk's logits alive at a time); others 1."""
    if spec.kind != "llama":
        return 1
    tokens = spec.batch // par.data_parallel * spec.seq_len
    if par.pp > 1:
        tokens = _pipeline(spec, par)[1] * _pipeline(spec, par)[2] * spec.seq_len
    logits = tokens * (spec.llama.vocab_size // par.tp) * 4
    return max(1, min(tokens, -(-logits // LOSS_CHUNK_BYTES)))


def _pipeline(spec: ModelSpec, par: Parallelism) -> tuple[int, int, int]:
    """(microbatches M, sequences per microbatch, microbatches in flight on stage 0 = min(pp, M))."""
    b = spec.batch // par.data_parallel
    m = par.microbatches or b
    return m, b // m, min(par.pp, m)


def _bound(device: int) -> dict:
    torch.tpu.synchronize(device)
    st = torch_tpu.runtime.stats(device)
    return {g: dict(v) for g, v in st["device_bound_by_generation"].items()}


def run(spec: ModelSpec, par: Parallelism = Parallelism(), *, attention: str = "flash", remat=False,
        save=(), offload=(), dtype: str = "bf16", loss_chunks: int | None = 1, steps: int = 2,
        device: int = 0, weight_dtype: str = "fp32", fuse: bool = False, mu_dtype: str = "fp32") -> dict:
    """Dry-runs ``steps`` training steps of chip 0's share of the model on tpu:``device`` of
    this process's slice and measures the last one (the first creates optimizer state).
    ``remat``: a MaxText remat policy name (``remat.POLICIES``; True: ``full``, False:
    ``none``), ``save`` / ``offload``: tensor names added to it (``custom`` takes only these).
    ``loss_chunks``: Llama only, see ``models.Llama``; None: :func:`auto_loss_chunks`.
    ``weight_dtype`` ("fp32" or "bf16", MaxText's ``weight_dtype``): the parameters (FSDP
    shards), their gradients and the AdamW state. ``mu_dtype`` ("fp32" or "bf16", MaxText's
    ``mu_dtype``): bf16 stores AdamW's first moment in bf16 (``optim.AdamWMu``). ``fuse``: run
    the step in ``defer_and_fuse`` mode, so that chains of elementwise ops are priced (and
    allocated) as the fused regions a compiler makes of them (an XLA step fuses them too);
    False (default): every op on its own (strict; docs/estimate.md says why this is the default).
    With pipeline parallelism the chip runs one stage over the microbatches in flight on
    stage 0 (min(pp, M) of them, one forward and backward), and :func:`report` scales the
    time to M microbatches and adds the bubble.

    Returns the raw measurements: ``stats`` (the runtime's counters over the measured step),
    ``phases`` (per generation, the cost model's device seconds by bounding unit after the
    forward, after the backward and at the end), ``host`` (offloaded bytes each way),
    ``hbm_peak_bytes`` / ``hbm_reserved_peak_bytes`` (physical), ``collectives`` (tally),
    ``params`` (whole model), ``per_chip_params`` (elements this chip holds),
    ``local_batch``, ``wall_s`` and ``rss`` before / after. Raises ValueError for a bad plan
    or policy.
    """
    topo = _C._topology()
    check_plan(spec, par, topo["num_chips"])
    plan = R.resolve(remat, save, offload)
    if attention not in ("flash", "math"):
        raise ValueError(f"attention must be 'flash' or 'math', got {attention!r}")
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}")
    if weight_dtype not in ("bf16", "fp32"):
        raise ValueError(f"weight_dtype must be 'bf16' or 'fp32', got {weight_dtype!r}")
    wdt = torch.bfloat16 if weight_dtype == "bf16" else torch.float32
    if mu_dtype not in ("bf16", "fp32"):
        raise ValueError(f"mu_dtype must be 'bf16' or 'fp32', got {mu_dtype!r}")
    if loss_chunks is None:
        loss_chunks = auto_loss_chunks(spec, par)
    if not isinstance(loss_chunks, int) or loss_chunks < 1:
        raise ValueError(f"loss_chunks must be a positive integer, got {loss_chunks!r}")
    if loss_chunks > 1 and spec.kind != "llama":
        raise ValueError("loss_chunks applies to Llama-style models only")
    if not isinstance(steps, int) or steps < 1:  # the counters read are those of the last step
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    gc.collect()  # a previous run's model and optimizer (reference cycles) hold no HBM during this one
    t0 = time.perf_counter()
    rss0 = _rss_bytes()
    dev = torch.device("tpu", device)
    coll = Collectives(par, topo["num_chips"], device)
    host = R.HostTraffic()
    timeline = S.Timeline(device)
    coll.timeline = host.timeline = timeline
    amp = torch.bfloat16 if dtype == "bf16" else None
    with dry_run(), _global_eager_mode("defer_and_fuse" if fuse else "strict"):
        try:
            with torch.device("meta"):
                model = _build(spec, coll, attention, loss_chunks)
        except ValueError:
            raise
        except Exception:  # noqa: BLE001  (a factory that cannot build on meta: build on the chip)
            try:
                with torch.device(dev):
                    model = _build(spec, coll, attention, loss_chunks)
            except ValueError:
                raise
            except Exception as e:  # noqa: BLE001 (user code: name it and what it raised)
                raise ValueError(f"model '{spec.factory or spec.name}' raised {type(e).__name__}: {e}") from e
        # The whole model's parameters (the per-chip model holds 1/tp of most of them).
        params = spec.llama.num_params() if spec.kind == "llama" else _distinct_params(model)
        if par.fsdp > 1:
            shard_model(model, coll, torch.bfloat16 if amp is not None else torch.float32, wdt)
        elif wdt != torch.float32:
            model.to(wdt)
        model.to_empty(device=dev)
        for _, layer in layer_modules(model):
            R.wrap_layer(layer, plan, host)
        per_chip_params = sum(p.numel() for p in model.parameters())
        opt = _optimizer(spec, model, mu_dtype)
        b = spec.batch // par.data_parallel
        m, micro, inflight = _pipeline(spec, par) if par.pp > 1 else (1, b, 1)
        rows = micro * inflight  # sequences this step's forward and backward run
        x = torch.zeros(rows, spec.seq_len, dtype=torch.int64)
        y = torch.zeros(rows, spec.seq_len, dtype=torch.int64)
        phases = {}

        def after_forward():
            phases["forward"] = _bound(device)

        def after_backward():
            if par.fsdp == 1:
                price_dp_grads(model, coll)  # noqa: F821  (called by train_step, before `del model`)
            if spec.kind == "llama" and par.tp > 1:
                # Vocabulary-parallel cross-entropy: max and sum-exp per token, all-reduced.
                for _ in range(2):
                    coll.price("all_reduce", "tp", rows * spec.seq_len * 4)
            if par.pp > 1:  # activations to the next stage, gradients back: per microbatch each
                act = micro * spec.seq_len * spec.llama.d_model * (2 if amp is not None else 4)
                for _ in range(2 * m):
                    coll.price("send", "pp", act)
            timeline.record("sync")  # the optimizer step: gradient reductions must have finished
            timeline.active = False
            phases["backward"] = _bound(device)

        for i in range(steps):
            if i == steps - 1:
                torch.tpu.synchronize(device)
                torch_tpu.runtime.reset_stats(device)
                torch.tpu.reset_peak_memory_stats(device)
                coll.tally.clear()
                host.__init__()
                host.timeline = timeline
                timeline.active = True
            train_step(model, opt, x, y, dev, amp, after_backward, after_forward=after_forward)
        stats = torch_tpu.runtime.stats(device)
        phases["end"] = _bound(device)
        mem = _C._memory_stats(device)
    out = {
        "stats": stats,
        "phases": phases,
        "timeline": timeline.events,
        "host": {"d2h_bytes": host.d2h, "h2d_bytes": host.h2d, "tensors": host.count},
        "remat": {"policy": plan.policy, "save": sorted(plan.save), "offload": sorted(plan.offload)},
        "loss_chunks": loss_chunks,
        "weight_dtype": weight_dtype,
        "mu_dtype": mu_dtype,
        "fused": fuse,
        "pipeline": {"microbatches": m, "microbatch": micro, "in_flight": inflight} if par.pp > 1 else None,
        "hbm_peak_bytes": int(mem["allocated_bytes_peak"]),
        "hbm_reserved_peak_bytes": int(mem["reserved_bytes_peak"]),
        "collectives": {f"{op}/{axis}": {"count": int(v[0]), "payload_bytes": v[1], "ici_bytes": v[2],
                                         "dcn_bytes": v[3], "ici_steps": int(v[4]), "links": coll.links[axis]}
                        for (op, axis), v in sorted(coll.tally.items())},
        "params": params,
        "per_chip_params": per_chip_params,
        "local_batch": b,
        "wall_s": time.perf_counter() - t0,
        "rss_before_bytes": rss0,
        "rss_after_bytes": _rss_bytes(),
    }
    del model, opt
    return out


OVERLAP_MODES = ("hidden", "schedule", "none")


def _overlap_mode(overlap) -> str:
    mode = {True: "hidden", False: "none"}.get(overlap, overlap) if isinstance(overlap, bool) else overlap
    if mode not in OVERLAP_MODES:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_MODES)} (or True / False), got {overlap!r}")
    return mode


def report(spec: ModelSpec, par: Parallelism, raw: dict, *, topology: str, overlap: bool | str = True) -> dict:
    """Per-chip estimate for every generation from :func:`run`'s measurements.

    For generation g: ``compute_s`` (the cost model's device seconds, split into ``mxu``,
    ``vpu``, ``hbm``, ``overhead`` by the unit bounding each op), ``ici_s`` and ``dcn_s``
    (collectives). ``overlap`` says how much of the collectives and host offload the step
    exposes: ``"hidden"`` (default, True): tp / ep all-reduces on the critical path, fsdp / dp
    collectives exposed only beyond the whole step's compute (max(0, their time - compute)), each
    host direction only beyond the forward + backward compute; ``"schedule"``: the layer-by-layer
    overlap schedule of :mod:`schedule` over the measured step's timeline (pipelines: as
    ``"hidden"``); ``"none"`` (False): everything adds to the step.
    ``step_time_s`` = compute + exposed collectives + exposed host offload (each direction of
    the full-duplex host link overlaps the forward and backward compute; priced at
    ``remat.HOST_LINK_BYTES_PER_S``), ``host_s`` (all offload time), ``bubble_s`` (pipeline:
    the 1F1B bubble, (pp - 1) / (M + pp - 1) of the stage's forward and backward time),
    ``tokens_per_s`` (whole job),
    ``tokens_per_s_per_chip``, ``mfu`` (``flops.mfu``: model FLOPs of ``flops.model_flops_per_token``
    over chips · step time · peak bf16 FLOP/s), ``mfu_causal`` the same with causal attention
    FLOPs halved (MaxText's convention), ``hbm_bytes`` and ``fits`` (peak physical HBM <= the generation's HBM).
    Collective seconds come from the counters' own formula (vtpu::collective_seconds).
    """
    mode = _overlap_mode(overlap)
    overlap = mode != "none"
    specs = {g["generation"]: g for g in torch_tpu.runtime.generations()}
    stats = raw["stats"]
    chips = par.chips
    tokens = spec.batch * spec.seq_len
    flops_token = model_flops_per_token(spec, raw["params"])
    flops_token_causal = model_flops_per_token(spec, raw["params"], causal=True)
    chosen = _C._parse_topology(topology)[1]
    gens = [chosen] + [g for g in GENERATIONS if g != chosen]
    pipe = raw.get("pipeline")
    if pipe:  # in-flight microbatches measured -> M microbatches, and the 1F1B bubble
        repeat = pipe["microbatches"] / pipe["in_flight"]
        stretch = (pipe["microbatches"] + par.pp - 1) / pipe["in_flight"]
    else:
        repeat = stretch = 1.0
    host = raw.get("host") or {"d2h_bytes": 0.0, "h2d_bytes": 0.0}
    phases = raw.get("phases")
    by_gen = {}
    for g in gens:
        bound = stats["device_bound_by_generation"][g]
        if phases:
            f, b, e = phases["forward"][g], phases["backward"][g], phases["end"][g]
            parts = {k: b[k] * stretch + (e[k] - b[k]) for k in ("mxu", "vpu", "hbm", "overhead")}
            fwd_s, bwd_s = f["total"] * stretch, (b["total"] - f["total"]) * stretch
        else:
            parts = {k: bound[k] for k in ("mxu", "vpu", "hbm", "overhead")}
            fwd_s, bwd_s = bound["total"] / 3, bound["total"] * 2 / 3
        compute = sum(parts.values())
        crit = other = ici = dcn = 0.0
        for key, c in raw["collectives"].items():
            op, axis = key.split("/")
            links = 1 if op == "send" else c["links"]
            s_ici = _C._collective_seconds(g, c["ici_bytes"], links, c["ici_steps"], 0.0)
            s_dcn = _C._collective_seconds(g, 0.0, 1, 0, c["dcn_bytes"])
            if axis in ("tp", "ep"):  # per microbatch, on the critical path
                s_ici, s_dcn = s_ici * stretch, s_dcn * stretch
                crit += s_ici + s_dcn
            else:
                other += s_ici + s_dcn
            ici += s_ici
            dcn += s_dcn
        d2h_s, h2d_s = (host["d2h_bytes"] * repeat / R.HOST_LINK_BYTES_PER_S[g],
                        host["h2d_bytes"] * repeat / R.HOST_LINK_BYTES_PER_S[g])
        events = raw.get("timeline")
        if mode == "schedule" and events is not None and not pipe:
            # The overlap schedule (schedule.py): the step as XLA's schedule runs it, each transfer
            # on its resource beside the compute, exposed where its queue outlasts the compute.
            tr, sync = S.transfers_for(events, g, R.HOST_LINK_BYTES_PER_S[g])
            sched = S.simulate(tr, compute, sync)
            x = sched["exposed_s"]
            step = sched["step_s"]
            exposed_ici, exposed_dcn, exposed_host = x["ici"], x["dcn"], x["d2h"] + x["h2d"]
        else:
            # "hidden" (pipelines with "schedule" too: the measured in-flight microbatches stand for M of
            # them) or "none": tp / ep on the critical path, FSDP / DP collectives hidden up to the
            # compute's length, each host direction up to the forward and backward compute.
            exposed_other = max(0.0, other - compute) if overlap else other
            exposed_host = max(0.0, max(d2h_s, h2d_s) - (fwd_s + bwd_s)) if overlap else d2h_s + h2d_s
            step = compute + crit + exposed_other + exposed_host
            comm = crit + other
            share = (crit + exposed_other) / comm if comm > 0 else 0.0
            exposed_ici, exposed_dcn = ici * share, dcn * share
        comm = crit + other
        peak = specs[g]["peak_bf16_flops"]
        by_gen[g] = {
            "step_time_s": step,
            "step_time_serial_s": compute + comm + d2h_s + h2d_s,
            "compute_s": compute,
            "breakdown_s": {**parts, "ici": exposed_ici, "dcn": exposed_dcn, "host": exposed_host},
            "ici_s": ici,
            "dcn_s": dcn,
            "host_s": d2h_s + h2d_s,
            "bubble_s": (stretch - repeat) * sum(b[k] for k in ("mxu", "vpu", "hbm", "overhead")) if phases and pipe
            else 0.0,
            "tokens_per_s": tokens / step if step else None,
            "tokens_per_s_per_chip": tokens / step / chips if step else None,
            "mfu": mfu(flops_token * tokens, step, peak, chips),
            "mfu_causal": mfu(flops_token_causal * tokens, step, peak, chips),
            "hbm_bytes": int(specs[g]["hbm_bytes"]),
            "fits": raw["hbm_peak_bytes"] <= specs[g]["hbm_bytes"],
        }
    return {
        "model": spec.name,
        "config": asdict(spec.llama) if spec.llama is not None else None,
        "topology": topology,
        "generation": chosen,
        "parallelism": asdict(par),
        "chips": chips,
        "params": raw["params"],
        "per_chip_params": raw["per_chip_params"],
        "global_batch": spec.batch,
        "local_batch": raw["local_batch"],
        "seq_len": spec.seq_len,
        "tokens_per_step": tokens,
        "model_flops_per_step": flops_token * tokens,
        "model_flops_per_step_causal": flops_token_causal * tokens,
        "counted_flops_per_chip": stats["flops"],
        "ops_per_chip": int(stats["ops"]),
        "hbm_peak_bytes": raw["hbm_peak_bytes"],
        "hbm_reserved_peak_bytes": raw["hbm_reserved_peak_bytes"],
        "collectives": raw["collectives"],
        "remat": raw.get("remat"),
        "loss_chunks": raw.get("loss_chunks"),
        "weight_dtype": raw.get("weight_dtype", "fp32"),
        "mu_dtype": raw.get("mu_dtype", "fp32"),
        "fused": raw.get("fused", False),
        "pipeline": pipe,
        "host_offload_bytes": host["d2h_bytes"] * repeat,
        "overlap": mode,
        "by_generation": by_gen,
        "dry_run_wall_s": raw["wall_s"],
        "host_rss_growth_bytes": raw["rss_after_bytes"] - raw["rss_before_bytes"],
    }


def estimate(model: str = "gpt-small", *, parallel: Parallelism | None = None, attention: str = "flash",
             remat: bool | str = False, save=(), offload=(), dtype: str = "bf16", loss_chunks: int | None = None,
             overlap: bool | str = True, weight_dtype: str = "fp32", fuse: bool = False, mu_dtype: str = "fp32",
             **model_args) -> dict:
    """Dry-run estimate of one training step of ``model`` (see :func:`model_spec`; keyword
    arguments go there: batch, seq_len, config_json, n_layers, ...) on this process's slice
    (``TORCH_TPU_TOPOLOGY``), chip 0's share under ``parallel`` (default: FSDP over every chip
    of the slice). ``remat`` / ``save`` / ``offload``: a MaxText remat policy and tensor names
    (:func:`run`); ``loss_chunks`` None: chunked by :func:`auto_loss_chunks`; ``weight_dtype``, ``mu_dtype``,
    ``fuse``: see :func:`run`; ``overlap``: see :func:`report`. Returns
    :func:`report`'s dict.

    HBM capacity is the runtime's (``TORCH_TPU_HBM_BYTES``); a share that does not fit it
    raises torch.OutOfMemoryError — ``python -m torch_tpu.estimate`` raises the capacity so
    that any share runs and reports ``fits`` per generation instead.
    """
    spec = model_spec(model, **model_args)
    topo = _C._topology()
    if parallel is None:
        parallel = Parallelism(fsdp=topo["num_chips"])
    check_plan(spec, parallel, topo["num_chips"])
    R.resolve(remat, save, offload)
    _overlap_mode(overlap)
    raw = run(spec, parallel, attention=attention, remat=remat, save=save, offload=offload, dtype=dtype,
              loss_chunks=loss_chunks, weight_dtype=weight_dtype, fuse=fuse, mu_dtype=mu_dtype)
    return report(spec, parallel, raw, topology=topo["name"], overlap=overlap)
