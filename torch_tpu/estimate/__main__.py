"""python -m torch_tpu.estimate: dry-run estimate of one training step per chip.

Examples::

    python -m torch_tpu.estimate --model llama3-8b --topology v5p-256 --fsdp 128
    python -m torch_tpu.estimate --model llama3-70b --topology v5p-1024 --remat
    python -m torch_tpu.estimate --model llama --config '{"n_layers": 4, "d_model": 1024}' --batch 8
    python -m torch_tpu.estimate --model gpt-small --topology v6e-1 --batch 16 --seq-len 128
    python -m torch_tpu.estimate --model mypkg.models:build --model-kwargs '{"width": 512}'

The process re-executes itself once with ``TORCH_TPU_TOPOLOGY`` (the slice) and
``TORCH_TPU_HBM_BYTES`` (raised so that any per-chip share can be allocated; whether it fits
is then checked against each generation's HBM). Output: a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .._units import format_bytes

_MARK = "TORCH_TPU_ESTIMATE_CHILD"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.estimate",
                                description="Dry-run estimate of one training step per chip: HBM peak and fit, "
                                            "step time split into MXU / VPU / HBM / ICI / DCN, tokens/s, MFU.")
    p.add_argument("--model", default="gpt-small",
                   help="llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, llama3-405b, llama-tiny, "
                        "llama (flags / --config), gpt-tiny / gpt-small / gpt-base (the demo's GPT), "
                        "or package.module:factory")
    p.add_argument("--config", help="Llama config as JSON text or a JSON file (Hugging Face config.json keys work: "
                                    "Llama, Qwen3, Qwen3-MoE; torch_tpu/estimate/configs/ has Qwen3-8B, "
                                    "Qwen3-30B-A3B and Qwen3-235B-A22B)")
    p.add_argument("--model-kwargs", help="JSON object of keyword arguments for a factory")
    for name, help_ in (("vocab-size", "vocabulary"), ("n-layers", "decoder layers"), ("d-model", "width"),
                        ("n-heads", "attention heads"), ("n-kv-heads", "key/value heads"),
                        ("ffn-dim", "MLP width")):
        p.add_argument(f"--{name}", type=int, help=f"Llama: {help_}")
    p.add_argument("--batch", type=int, help="global batch in sequences per step")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--topology", default=os.environ.get("TORCH_TPU_TOPOLOGY") or "v6e-8",
                   help="slice, as TORCH_TPU_TOPOLOGY accepts it (v5e-256, v6e-256, v5p-1024 = 512 chips, "
                        "tpu7x-64, v5p:8x8x8, ...)")
    p.add_argument("--slices", type=int, default=1, help="slices joined over DCN (multislice); dp spans them")
    p.add_argument("--dp", type=int, help="data-parallel size (default: what is left after fsdp and tp)")
    p.add_argument("--fsdp", type=int, help="FSDP size (default: every chip left after dp and tp)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (Llama only)")
    p.add_argument("--attention", choices=("flash", "math"), default="flash",
                   help="flash: fused kernel (scores stay on chip); math: PyTorch's math path (T x T in HBM)")
    p.add_argument("--remat", nargs="?", const="full", default="none", metavar="POLICY",
                   help="MaxText remat policy of every layer (bare --remat: full): none, full, minimal, "
                        "minimal_with_context, save_dot_with_context_except_mlp, save_dot_except_mlpwi, "
                        "save_dot_except_mlp, save_qkv_proj, save_out_proj, qkv_proj_offloaded, minimal_offloaded, "
                        "custom (with --save / --offload)")
    p.add_argument("--save", default="", help="comma-separated tensor names kept in HBM (decoder_layer_input, "
                                              "query_proj, key_proj, value_proj, context, out_proj, mlpwi_0, "
                                              "mlpwi_1, mlpwo, ...)")
    p.add_argument("--offload", default="", help="comma-separated tensor names offloaded to host memory")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (mixture of experts; divides --fsdp)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (1F1B; divides the layers)")
    p.add_argument("--microbatches", type=int, default=0,
                   help="pipeline microbatches per step (default: one per sequence of the chip's batch)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast or fp32")
    p.add_argument("--weight-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="parameters (FSDP shards), gradients and AdamW state: fp32 or bf16 (MaxText's weight_dtype)")
    p.add_argument("--mu-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="AdamW's first moment: fp32 or bf16 (MaxText's mu_dtype; the TPU7x recipes use bf16)")
    p.add_argument("--fuse", action="store_true",
                   help="price (and allocate) chains of elementwise ops as defer_and_fuse's fused regions instead of "
                        "one op at a time")
    p.add_argument("--loss-chunks", type=int, default=None,
                   help="Llama: output projection and loss over N chunks of tokens, each recomputed in backward "
                        "(default: enough chunks for at most 256 MiB of float32 logits each)")
    p.add_argument("--no-overlap", action="store_true",
                   help="do not overlap FSDP / DP collectives with compute (they add to the step); = --overlap none")
    p.add_argument("--overlap", choices=("hidden", "schedule", "none"), default=None,
                   help="how collectives and host offload overlap compute: hidden (default: up to the step's "
                        "compute), schedule (layer by layer, each link its own queue; docs/estimate.md), none")
    p.add_argument("--plot", metavar="FILE.png", help="draw the step-time breakdown across generations")
    p.add_argument("--serve", action="store_true",
                   help="serving instead of training, per chip: prefill and decode step times, tokens/s, KV-cache "
                        "blocks that fit (--batch sequences, --seq-len prompt tokens, --context; docs/serving.md)")
    p.add_argument("--context", type=int,
                   help="--serve: tokens in the KV cache a decode step attends (default --seq-len)")
    p.add_argument("--block-size", type=int, default=16, help="--serve: KV-cache block in tokens (vLLM's, default 16)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="--serve: fraction of HBM for weights and KV cache (vLLM's, default 0.9)")
    return p


def _sizes(args, chips: int):
    """dp, fsdp, tp with the defaults filled in; ValueError when they cannot be."""
    from .parallel import Parallelism

    pp = args.pp
    if pp is None or pp < 1 or chips % pp:
        raise ValueError(f"--pp {pp} does not divide the {chips} chips")
    chips //= pp
    tp = args.tp
    if tp is None or tp < 1 or chips % tp:
        raise ValueError(f"--tp {tp} does not divide the {chips} chips")
    dp, fsdp = args.dp, args.fsdp
    if dp is None and fsdp is None:
        dp = args.slices
        fsdp = chips // tp // dp if (chips // tp) % dp == 0 else None
        if fsdp is None:
            raise ValueError(f"{chips} chips / tp {tp} do not split over {args.slices} slices")
    elif dp is None:
        if fsdp < 1 or (chips // tp) % fsdp or chips % (tp * fsdp):
            raise ValueError(f"fsdp {fsdp} x tp {tp} does not divide the {chips} chips")
        dp = chips // (tp * fsdp)
    elif fsdp is None:
        if dp < 1 or chips % (tp * dp):
            raise ValueError(f"dp {dp} x tp {tp} does not divide the {chips} chips")
        fsdp = chips // (tp * dp)
    return Parallelism(dp=dp, fsdp=fsdp, tp=tp, slices=args.slices, ep=args.ep, pp=pp,
                       microbatches=args.microbatches)


def _fmt_count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def format_table(r: dict) -> str:
    """The readable report: configuration, memory, then one row per generation."""
    par = r["parallelism"]
    lines = [
        f"{r['model']}: {_fmt_count(r['params'])} parameters, global batch {r['global_batch']} x "
        f"{r['seq_len']} tokens; {r['chips']} chips ({r['topology']} x {par['slices']} slice(s)), "
        f"dp {par['dp']} x fsdp {par['fsdp']} x tp {par['tp']}"
        + (f" x pp {par['pp']}" if par.get("pp", 1) > 1 else "")
        + (f", ep {par['ep']} (within fsdp)" if par.get("ep", 1) > 1 else "")
        + f"; per chip: batch {r['local_batch']}, "
        f"{r['per_chip_params'] / 1e6:.1f} M parameter elements held, {r['ops_per_chip']} ops, "
        f"{r['counted_flops_per_chip'] / 1e12:.2f} TFLOP counted",
        f"HBM peak per chip: {format_bytes(r['hbm_peak_bytes'])} physical "
        f"(reserved {format_bytes(r['hbm_reserved_peak_bytes'])})",
        f"remat {r['remat']['policy'] if r.get('remat') else 'none'}"
        + (f" (saved: {', '.join(r['remat']['save']) or '-'}; offloaded: {', '.join(r['remat']['offload']) or '-'}, "
           f"{format_bytes(r['host_offload_bytes'])} to host per step)" if r.get("remat") and r["remat"]["policy"]
           != "none" else "")
        + f"; loss in {r.get('loss_chunks') or 1} chunk(s)"
        + (f"; pipeline: {r['pipeline']['microbatches']} microbatches of {r['pipeline']['microbatch']}, "
           f"{r['pipeline']['in_flight']} in flight" if r.get("pipeline") else ""),
        "per chip, estimated (cost model; ms per step):",
        f"  {'gen':<6} {'step':>9} {'MXU':>9} {'VPU':>8} {'HBM':>8} {'ovh':>7} {'ICI':>8} {'DCN':>8} {'host':>7} "
        f"{'tok/s/chip':>11} {'MFU':>6} {'MFU(c)':>6} {'HBM/chip':>10}  fits",
    ]
    for g, e in r["by_generation"].items():
        b = e["breakdown_s"]
        mark = " (chosen)" if g == r["generation"] else ""
        lines.append(
            f"  {g:<6} {e['step_time_s'] * 1e3:>9.1f} {b['mxu'] * 1e3:>9.1f} {b['vpu'] * 1e3:>8.1f} "
            f"{b['hbm'] * 1e3:>8.1f} {b['overhead'] * 1e3:>7.1f} {e['ici_s'] * 1e3:>8.1f} {e['dcn_s'] * 1e3:>8.1f} "
            f"{e.get('host_s', 0.0) * 1e3:>7.1f} "
            f"{e['tokens_per_s_per_chip']:>11.0f} {100 * e['mfu']:>5.1f}% {100 * e['mfu_causal']:>5.1f}% "
            f"{format_bytes(e['hbm_bytes']):>10}  "
            f"{'yes' if e['fits'] else 'NO'}{mark}")
    lines.append("  (MXU/VPU/HBM/ovh: compute time by the unit bounding each op; ICI/DCN/host: all collective and "
                 "offload time, "
                 + {"hidden": "of which FSDP/DP traffic overlaps compute", "none": "serial",
                    "schedule": "exposed by the layer-by-layer overlap schedule"}[r["overlap"]]
                 + "; MFU(c): causal attention FLOPs halved, as MaxText counts them)")
    for key, c in r["collectives"].items():
        lines.append(f"  {key:<22} x{c['count']:<5} {format_bytes(c['payload_bytes']):>11} payload, "
                     f"{format_bytes(c['ici_bytes']):>11} ICI, {format_bytes(c['dcn_bytes']):>11} DCN, "
                     f"{c['links']} link(s)")
    lines.append(f"dry run: {r['dry_run_wall_s']:.1f} s wall, host memory grew "
                 f"{format_bytes(r['host_rss_growth_bytes'])}")
    return "\n".join(lines)


def plot(r: dict, path: str) -> None:
    """Stacked bars of step time per generation (MXU, VPU, HBM, overhead, exposed ICI, DCN)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gens = list(r["by_generation"])
    parts = ("mxu", "vpu", "hbm", "overhead", "ici", "dcn", "host")
    labels = {"mxu": "MXU-bound", "vpu": "VPU-bound", "hbm": "HBM-bound", "overhead": "launch overhead",
              "ici": "ICI (exposed)", "dcn": "DCN (exposed)", "host": "host offload (exposed)"}
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(gens)
    for part in parts:
        vals = [r["by_generation"][g]["breakdown_s"][part] * 1e3 for g in gens]
        ax.bar(gens, vals, bottom=bottom, label=labels[part])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, g in enumerate(gens):
        e = r["by_generation"][g]
        ax.text(i, bottom[i], f"MFU {100 * e['mfu']:.0f}%" + ("" if e["fits"] else "\nno fit"),
                ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(bottom) * 1.18)  # room for the labels
    par = r["parallelism"]
    ax.set_ylabel("estimated step time per chip (ms)")
    ax.set_title(f"{r['model']} on {r['chips']} chips (dp {par['dp']}, fsdp {par['fsdp']}, tp {par['tp']}), "
                 f"batch {r['global_batch']}x{r['seq_len']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    from .. import _C
    from .core import DRY_RUN_HBM, check_plan, model_spec

    # Everything is checked before any work (and before re-executing).
    try:
        name, _, slice_chips, _ = _C._parse_topology(args.topology)
        if args.slices < 1:
            raise ValueError(f"--slices must be at least 1, got {args.slices}")
        if args.no_overlap and args.overlap not in (None, "none"):
            raise ValueError(f"--no-overlap contradicts --overlap {args.overlap}")
        par = _sizes(args, slice_chips * args.slices)
        kwargs = json.loads(args.model_kwargs) if args.model_kwargs else None
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError("--model-kwargs must be a JSON object")
        if kwargs is not None and ":" not in args.model:
            raise ValueError(f"--model-kwargs applies to a factory (package.module:callable), not '{args.model}'")
        spec = model_spec(args.model, config_json=args.config, batch=args.batch, seq_len=args.seq_len,
                          factory_kwargs=kwargs, vocab_size=args.vocab_size, n_layers=args.n_layers,
                          d_model=args.d_model, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
                          ffn_dim=args.ffn_dim)
        check_plan(spec, par, slice_chips)
        from .remat import resolve

        names = lambda v: tuple(n.strip() for n in v.split(",") if n.strip())  # noqa: E731
        resolve(args.remat, names(args.save), names(args.offload))
        if args.loss_chunks is not None and (args.loss_chunks < 1 or (args.loss_chunks > 1 and spec.kind != "llama")):
            raise ValueError(f"--loss-chunks {args.loss_chunks}: a positive integer, above 1 for Llama-style "
                             "models only")
        if spec.kind == "factory":
            from .core import _factory

            _factory(spec.factory)  # importable and callable
        if args.plot:
            import matplotlib  # noqa: F401  (fail now, not after the run)

            folder = os.path.dirname(os.path.abspath(args.plot))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                raise ValueError(f"--plot {args.plot}: the folder {folder} does not exist or is not writable")
    except (ValueError, json.JSONDecodeError, ImportError) as e:
        raise SystemExit(f"torch_tpu.estimate: error: {e}") from None

    if os.environ.get(_MARK) != "1":
        env = dict(os.environ, TORCH_TPU_TOPOLOGY=args.topology, TORCH_TPU_HBM_BYTES=DRY_RUN_HBM, **{_MARK: "1"})
        for k in ("TPU_VISIBLE_CHIPS", "TORCH_TPU_HOST_ID"):
            env.pop(k, None)
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "torch_tpu.estimate", *argv], env)

    if args.serve:
        from .serve import format_serve_table, serve_estimate

        try:
            r = serve_estimate(spec, batch=spec.batch, prefill_len=spec.seq_len, context=args.context or spec.seq_len,
                               block_size=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization,
                               dtype=args.dtype)
        except ValueError as e:
            raise SystemExit(f"torch_tpu.estimate: error: {e}") from None
        print(format_serve_table(r))
        print(json.dumps(r))
        return 0

    from .core import report, run

    try:
        raw = run(spec, par, attention=args.attention, remat=args.remat, save=names(args.save),
                  offload=names(args.offload), dtype=args.dtype, loss_chunks=args.loss_chunks,
                  weight_dtype=args.weight_dtype, fuse=args.fuse, mu_dtype=args.mu_dtype)
    except ValueError as e:  # a factory that raises or returns no nn.Module: its message, not a traceback
        raise SystemExit(f"torch_tpu.estimate: error: {e}") from None
    r = report(spec, par, raw, topology=name, overlap="none" if args.no_overlap else args.overlap or "hidden")
    print(format_table(r))
    if args.plot:
        plot(r, args.plot)
        print(f"plot written to {args.plot}")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
