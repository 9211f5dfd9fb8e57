"""CLI of the main job: ``python -m torch_tpu.demo [flags]`` (see ``--help``).

``--topology`` must reach the runtime before it starts, and ``python -m
torch_tpu.demo`` imports ``torch_tpu`` (which starts it) before this file runs; so
when the flag differs from the environment this process re-executes itself with
``TORCH_TPU_TOPOLOGY`` set.
"""

from __future__ import annotations

import argparse
import os
import sys

MODES = ("strict", "debug", "defer_and_fuse", "compile")

# Training needs the MXU's numerics, not bit-equality with CPU eager's bf16 kernels: on a host
# without AVX-512 those are a scalar loop (docs/limits.md), so the demo's products run widened.
os.environ.setdefault("TORCH_TPU_WIDEN_HALF_PRODUCTS", "1")


def default_out() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torch_tpu", "demo")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torch_tpu.demo",
        description="Train a byte-level GPT on the Python standard library's source, on the tpu device. "
                    "The last line printed is a JSON object (val_loss, unigram_nats, tokens_per_s, steps, "
                    "params, estimate).")
    # Settings a resumed run takes from its checkpoint default to None here (loop.DEFAULTS fills them).
    p.add_argument("--steps", type=int, default=300, help="total training steps (default 300)")
    p.add_argument("--eval-every", type=int, default=100, help="validation loss every N steps (default 100)")
    p.add_argument("--eval-batches", type=int, default=8, help="validation batches per evaluation (default 8)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens (bytes) per sequence (default 128)")
    p.add_argument("--model-size", default=None,
                   help="tiny (~0.1 M parameters) | small (~4.8 M, the default) | base (~14 M)")
    p.add_argument("--lr", type=float, default=None, help="peak AdamW learning rate (default 2e-3)")
    p.add_argument("--warmup", type=int, default=20, help="learning-rate warm-up steps (default 20)")
    p.add_argument("--seed", type=int, default=None, help="seed of the weights and the data order (default 0)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="bf16: autocast to bfloat16 (the MXU's type); fp32: full precision (default bf16)")
    p.add_argument("--topology", default=None,
                   help="TPU slice, e.g. v6e-8, v5e-4, v5p-8, tpu7x-8 (default: $TORCH_TPU_TOPOLOGY or v6e-8)")
    p.add_argument("--mode", choices=MODES, default="strict",
                   help="execution mode: strict (default, asynchronous), debug (synchronous, checked), "
                        "defer_and_fuse (fusible ops recorded and run as fused kernels) or compile "
                        "(torch.compile(backend='tpu') of the model and the AdamW step)")
    p.add_argument("--out", default=default_out(),
                   help="folder for checkpoints and log.jsonl (default $XDG_CACHE_HOME/torch_tpu/demo, "
                        "i.e. ~/.cache/torch_tpu/demo)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --out (same model, data order and "
                        "optimizer state; --steps may grow, the learning-rate schedule follows it)")
    p.add_argument("--checkpoint-every", type=int, default=100, help="save a checkpoint every N steps (default 100)")
    p.add_argument("--corpus", default=None, help="folder of *.py files (default: the standard library)")
    p.add_argument("--sample-tokens", type=int, default=200, help="bytes generated at the end (default 200)")
    p.add_argument("--prompt", default="def ", help="start of the generated sample (default 'def ')")
    p.add_argument("--fsdp", action="store_true",
                   help="FSDP2 over tpu_dist, one process per chip: python -m torch_tpu.run -n 4 -m "
                        "torch_tpu.demo --fsdp (--batch-size is the global batch; DCP checkpoints)")
    p.add_argument("--export-hf", default=None, metavar="DIR",
                   help="after training, write the model to DIR as a Hugging Face GPT-2 checkpoint (safetensors, "
                        "config.json, byte-level tokenizer, chat template) that vLLM and transformers load; "
                        "see docs/serving.md")
    return p


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    for name in ("steps", "eval_every", "eval_batches", "checkpoint_every", "warmup"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be at least 1", 2)
    for name in ("batch_size", "seq_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be at least 1", 2)

    from ..estimate.models.gpt import PRESETS  # torch is imported already: `python -m` ran torch_tpu/__init__.py

    if args.model_size is not None and args.model_size not in PRESETS:
        return _fail(f"unknown --model-size {args.model_size!r}; choose one of {', '.join(PRESETS)}", 2)

    if args.topology is not None and os.environ.get("TORCH_TPU_TOPOLOGY") != args.topology:
        from torch_tpu import _C

        try:
            _C._parse_topology(args.topology)
        except Exception as e:  # noqa: BLE001  (the runtime raises ValueError; c10 may wrap it)
            from .errors import clean_error_text
            return _fail(f"--topology: {clean_error_text(e)}", 2)
        os.environ["TORCH_TPU_TOPOLOGY"] = args.topology
        sys.stdout.flush()
        sys.stderr.flush()
        # The runtime read the topology once, at import: start over with the new one.
        os.execv(sys.executable, [sys.executable, "-m", "torch_tpu.demo", *argv])

    import torch  # noqa: F401

    import torch_tpu

    if args.mode not in ("strict", "compile"):  # compile: strict eager around the compiled programs
        try:
            torch_tpu.set_eager_mode(args.mode)
        except (NotImplementedError, ValueError) as e:
            return _fail(f"--mode {args.mode}: {e}; use --mode strict", 2)

    if args.export_hf is not None and args.fsdp:
        return _fail("--export-hf: not supported with --fsdp (export a single-chip run, or resume its "
                     "checkpoint on one chip)", 2)

    from .data import CorpusError
    from .errors import DemoError
    from .train import run

    if args.fsdp:
        from .fsdp import run_fsdp as run

    try:
        return run(args)
    except CorpusError as e:
        return _fail(str(e), 1)
    except DemoError as e:
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
