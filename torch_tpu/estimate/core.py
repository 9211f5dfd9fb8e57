"""The estimator: one training step of a model's per-chip share, run in dry-run mode, and
the report built from the runtime's counters.

Units: bytes, seconds (estimated device seconds of the cost model unless named ``wall``),
FLOPs, tokens.
"""

from __future__ import annotations

import contextlib
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
from .flops import mfu, model_flops_per_token
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
    for axis in ("dp", "fsdp", "tp", "slices"):
        v = getattr(par, axis)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"--{axis} must be a positive integer, got {v!r}")
    chips = slice_chips * par.slices
    if par.chips != chips:
        raise ValueError(f"dp {par.dp} x fsdp {par.fsdp} x tp {par.tp} = {par.chips} chips, but "
                         f"{par.slices} slice(s) of {slice_chips} chips have {chips}: the product must equal it")
    if par.dp % par.slices:
        raise ValueError(f"dp {par.dp} is not a multiple of slices {par.slices} (data parallelism spans the slices)")
    if spec.batch % par.data_parallel:
        raise ValueError(f"global batch {spec.batch} does not divide into dp x fsdp = {par.data_parallel} "
                         f"data-parallel replicas")
    if spec.kind == "llama":
        c = spec.llama
        if c.n_heads % par.tp:
            raise ValueError(f"tp {par.tp} does not divide the {c.n_heads} attention heads")
        if c.n_kv_heads % par.tp and par.tp % c.n_kv_heads:
            raise ValueError(f"tp {par.tp} and the {c.n_kv_heads} key/value heads: one must divide the other")
        if c.ffn_dim % par.tp:
            raise ValueError(f"tp {par.tp} does not divide the MLP width {c.ffn_dim}")
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
        return M.Llama(spec.llama, tp=coll.par.tp, attention=attention, hooks=tp_hooks(coll), loss_chunks=loss_chunks)
    if spec.kind == "gpt":
        return M.demo_gpt(spec.gpt_preset, seq_len=spec.seq_len)
    model = _factory(spec.factory)(**spec.factory_kwargs)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model '{spec.factory}' returned {type(model).__name__}, not an nn.Module")
    return model


def _distinct_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied ones once


def _optimizer(spec: ModelSpec, model: nn.Module) -> torch.optim.Optimizer:
    if spec.kind == "gpt":
        return M.make_optimizer(model, 1e-3)  # the demo's AdamW and parameter groups
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               device: torch.device, amp: torch.dtype | None, after_backward: Callable[[], None] = lambda: None,
               opt_step: Callable[[], None] | None = None) -> torch.Tensor:
    """One training step, the demo's (torch_tpu/demo/loop.py calls it): inputs moved to the device,
    forward under autocast (``amp``, None for none), backward, gradient clipping at 1.0,
    optimizer step (``opt_step``, default ``opt.step``; the demo's compile mode passes a compiled
    one), gradients set to None. ``x``, ``y``: host int64 [B, T]. Returns the loss (a device
    tensor; not read, so that the step runs in a dry run)."""
    ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    with ctx:
        out = model(x.to(device), y.to(device))
    loss = out[-1] if isinstance(out, (tuple, list)) else out
    loss.backward()
    after_backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    (opt_step or opt.step)()
    opt.zero_grad(set_to_none=True)
    return loss


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run(spec: ModelSpec, par: Parallelism = Parallelism(), *, attention: str = "flash", remat: bool = False,
        dtype: str = "bf16", loss_chunks: int = 1, steps: int = 2, device: int = 0) -> dict:
    """Dry-runs ``steps`` training steps of chip 0's share of the model on tpu:``device`` of
    this process's slice and measures the last one (the first creates optimizer state).
    ``loss_chunks``: Llama only, see ``models.Llama``.

    Returns the raw measurements: ``stats`` (the runtime's counters over the measured step),
    ``hbm_peak_bytes`` / ``hbm_reserved_peak_bytes`` (physical), ``collectives`` (tally),
    ``params`` (whole model), ``per_chip_params`` (elements this chip holds),
    ``local_batch``, ``wall_s`` and ``rss`` before / after. Raises ValueError for a bad plan.
    """
    topo = _C._topology()
    check_plan(spec, par, topo["num_chips"])
    if attention not in ("flash", "math"):
        raise ValueError(f"attention must be 'flash' or 'math', got {attention!r}")
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}")
    if not isinstance(loss_chunks, int) or loss_chunks < 1:
        raise ValueError(f"loss_chunks must be a positive integer, got {loss_chunks!r}")
    if loss_chunks > 1 and spec.kind != "llama":
        raise ValueError("loss_chunks applies to Llama-style models only")
    if not isinstance(steps, int) or steps < 1:  # the counters read are those of the last step
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    t0 = time.perf_counter()
    rss0 = _rss_bytes()
    dev = torch.device("tpu", device)
    coll = Collectives(par, topo["num_chips"], device)
    amp = torch.bfloat16 if dtype == "bf16" else None
    with dry_run():
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
            shard_model(model, coll, torch.bfloat16 if amp is not None else torch.float32)
        model.to_empty(device=dev)
        if remat:
            from torch.utils.checkpoint import checkpoint

            for _, layer in layer_modules(model):
                layer.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False,
                                                                       preserve_rng_state=False, **k))(layer.forward)
        per_chip_params = sum(p.numel() for p in model.parameters())
        opt = _optimizer(spec, model)
        b = spec.batch // par.data_parallel
        x = torch.zeros(b, spec.seq_len, dtype=torch.int64)
        y = torch.zeros(b, spec.seq_len, dtype=torch.int64)

        def after_backward():
            if par.fsdp == 1:
                price_dp_grads(model, coll)  # noqa: F821  (called by train_step, before `del model`)
            if spec.kind == "llama" and par.tp > 1:
                # Vocabulary-parallel cross-entropy: max and sum-exp per token, all-reduced.
                for _ in range(2):
                    coll.price("all_reduce", "tp", b * spec.seq_len * 4)

        for i in range(steps):
            if i == steps - 1:
                torch.tpu.synchronize(device)
                torch_tpu.runtime.reset_stats(device)
                torch.tpu.reset_peak_memory_stats(device)
                coll.tally.clear()
            train_step(model, opt, x, y, dev, amp, after_backward)
        stats = torch_tpu.runtime.stats(device)
        mem = _C._memory_stats(device)
    out = {
        "stats": stats,
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


def report(spec: ModelSpec, par: Parallelism, raw: dict, *, topology: str, overlap: bool = True) -> dict:
    """Per-chip estimate for every generation from :func:`run`'s measurements.

    For generation g: ``compute_s`` (the cost model's device seconds, split into ``mxu``,
    ``vpu``, ``hbm``, ``overhead`` by the unit bounding each op), ``ici_s`` and ``dcn_s``
    (collectives; tp all-reduces are on the critical path, fsdp / dp collectives overlap
    with compute when ``overlap``: exposed = max(0, their time - compute)),
    ``step_time_s`` = compute + exposed collectives, ``tokens_per_s`` (whole job),
    ``tokens_per_s_per_chip``, ``mfu`` (``flops.mfu``: model FLOPs of ``flops.model_flops_per_token``
    over chips · step time · peak bf16 FLOP/s), ``mfu_causal`` the same with causal attention
    FLOPs halved (MaxText's convention), ``hbm_bytes`` and ``fits`` (peak physical HBM <= the generation's HBM).
    Collective seconds come from the counters' own formula (vtpu::collective_seconds).
    """
    specs = {g["generation"]: g for g in torch_tpu.runtime.generations()}
    stats = raw["stats"]
    chips = par.chips
    tokens = spec.batch * spec.seq_len
    flops_token = model_flops_per_token(spec, raw["params"])
    flops_token_causal = model_flops_per_token(spec, raw["params"], causal=True)
    chosen = _C._parse_topology(topology)[1]
    gens = [chosen] + [g for g in GENERATIONS if g != chosen]
    by_gen = {}
    for g in gens:
        bound = stats["device_bound_by_generation"][g]
        compute = bound["total"]
        crit = other = ici = dcn = 0.0
        for key, c in raw["collectives"].items():
            axis = key.split("/")[1]
            s_ici = _C._collective_seconds(g, c["ici_bytes"], c["links"], c["ici_steps"], 0.0)
            s_dcn = _C._collective_seconds(g, 0.0, 1, 0, c["dcn_bytes"])
            ici += s_ici
            dcn += s_dcn
            if axis == "tp":
                crit += s_ici + s_dcn
            else:
                other += s_ici + s_dcn
        exposed_other = max(0.0, other - compute) if overlap else other
        step = compute + crit + exposed_other
        comm = crit + other
        exposed = crit + exposed_other
        share = exposed / comm if comm > 0 else 0.0
        peak = specs[g]["peak_bf16_flops"]
        by_gen[g] = {
            "step_time_s": step,
            "step_time_serial_s": compute + comm,
            "compute_s": compute,
            "breakdown_s": {"mxu": bound["mxu"], "vpu": bound["vpu"], "hbm": bound["hbm"],
                            "overhead": bound["overhead"], "ici": ici * share, "dcn": dcn * share},
            "ici_s": ici,
            "dcn_s": dcn,
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
        "overlap": overlap,
        "by_generation": by_gen,
        "dry_run_wall_s": raw["wall_s"],
        "host_rss_growth_bytes": raw["rss_after_bytes"] - raw["rss_before_bytes"],
    }


def estimate(model: str = "gpt-small", *, parallel: Parallelism | None = None, attention: str = "flash",
             remat: bool = False, dtype: str = "bf16", loss_chunks: int = 1, overlap: bool = True,
             **model_args) -> dict:
    """Dry-run estimate of one training step of ``model`` (see :func:`model_spec`; keyword
    arguments go there: batch, seq_len, config_json, n_layers, ...) on this process's slice
    (``TORCH_TPU_TOPOLOGY``), chip 0's share under ``parallel`` (default: FSDP over every chip
    of the slice). Returns :func:`report`'s dict.

    HBM capacity is the runtime's (``TORCH_TPU_HBM_BYTES``); a share that does not fit it
    raises torch.OutOfMemoryError — ``python -m torch_tpu.estimate`` raises the capacity so
    that any share runs and reports ``fits`` per generation instead.
    """
    spec = model_spec(model, **model_args)
    topo = _C._topology()
    if parallel is None:
        parallel = Parallelism(fsdp=topo["num_chips"])
    check_plan(spec, parallel, topo["num_chips"])
    raw = run(spec, parallel, attention=attention, remat=remat, dtype=dtype, loss_chunks=loss_chunks)
    return report(spec, parallel, raw, topology=topo["name"], overlap=overlap)
