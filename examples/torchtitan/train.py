"""TorchTitan's llama3 debug model trained on tpu through ``torchtitan.train``, checked against a plain CPU loop.

    python examples/torchtitan/train.py --nproc 1 --steps 10                 # the stock debug model
    python examples/torchtitan/train.py --nproc 2 --flavor tpu_smoke --steps 3

What it does, in ``--work`` (a temporary folder by default):

1. builds a tokenizer and a dataset from the Python standard library's source (:mod:`assets`);
2. the **oracle**: a plain training loop on CPU over the same TorchTitan model class, tokenizer,
   data loader (one per data-parallel rank, batches concatenated: what FSDP's data parallelism
   trains on), AdamW, LR schedule and gradient clipping, with attention computed densely by
   ``scaled_dot_product_attention`` under the block mask's ``mask_mod`` (CPU flex_attention has no
   backward in torch 2.13). Its initial weights are written as a DCP checkpoint first;
3. TorchTitan itself: ``python -m torch_tpu.run -n NPROC -m torchtitan.train --job.config-file
   llama3_debug_tpu.toml`` plus command-line overrides, loading that checkpoint as its initial
   weights (``--checkpoint.initial-load-path``, model only), float32 parameters, FSDP over
   ``tpu_dist`` when NPROC > 1. TorchTitan picks the tpu device itself (``torch._utils.
   _get_available_device_type`` finds the PrivateUse1 backend ``tpu``);
4. prints both per-step losses, and their largest relative difference.

:func:`run` is the same as a function (the test in tests/python/ecosystem/ calls it).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "llama3_debug_tpu.toml")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


def titan_args(work: str, flavor: str, steps: int, seq_len: int, batch: int) -> list[str]:
    """TorchTitan's command-line arguments (after ``-m torchtitan.train``) for one run in `work`."""
    return [
        "--job.config-file",
        CONFIG,
        "--job.dump-folder",
        os.path.join(work, "outputs"),
        "--model.flavor",
        flavor,
        "--model.hf-assets-path",
        os.path.join(work, "tokenizer"),
        "--training.dataset-path",
        os.path.join(work, "dataset"),
        "--training.steps",
        str(steps),
        "--training.seq-len",
        str(seq_len),
        "--training.local-batch-size",
        str(batch),
        "--experimental.custom-import",
        "tpu_flavors",
        "--checkpoint.enable",
        "--checkpoint.folder",
        f"checkpoint-{time.time_ns()}",
        "--checkpoint.initial-load-path",
        os.path.join(work, "init_ckpt"),
        "--checkpoint.initial-load-model-only",
        "--checkpoint.interval",
        "1000000",
    ]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _dense_flex(q, k, v, *, block_mask, scale=None, enable_gqa=False, return_lse=False, **_):
    """The oracle's attention: SDPA under the dense boolean mask of the block mask's mask_mod."""
    import torch
    from torch.nn.attention.flex_attention import create_mask

    if return_lse:
        raise NotImplementedError("the CPU oracle does not return the log-sum-exp")
    B, H, L, _ = q.shape
    mask = create_mask(block_mask.mask_mod, B, H, L, k.shape[2], device=q.device)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def cpu_oracle(work: str, args: list[str], steps: int, nproc: int) -> list[float]:
    """Writes `work`/init_ckpt and returns the plain CPU loop's per-step losses (TorchTitan's definition)."""
    import torch
    import torch.distributed.checkpoint as dcp

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import torchtitan.models.attention as tt_attention
    import tpu_flavors  # noqa: F401  (registers tpu_smoke)
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    cfg = ConfigManager().parse_args(args)
    spec = get_train_spec(cfg.model.name)
    margs = spec.model_args[cfg.model.flavor]
    margs.update_from_config(cfg)
    # Oracle-only substitutions, in this process: dense attention and an uncompiled CPU block mask.
    tt_attention.FlexAttentionWrapper._compiled_flex_attn = staticmethod(_dense_flex)
    tt_attention._compiled_create_block_mask = lambda *a, **k: create_block_mask(*a, device="cpu", **k)

    torch.manual_seed(cfg.debug.seed or 0)
    with torch.device("cpu"):
        model = spec.model_cls(margs)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    dcp.save(model.state_dict(), checkpoint_id=os.path.join(work, "init_ckpt"), no_dist=True)

    tokenizer = spec.build_tokenizer_fn(cfg)
    loaders = [
        iter(spec.build_dataloader_fn(dp_world_size=nproc, dp_rank=r, tokenizer=tokenizer, job_config=cfg))
        for r in range(nproc)
    ]
    o = cfg.optimizer
    opts = OptimizersContainer(
        [model],
        torch.optim.AdamW,
        {
            "lr": o.lr,
            "betas": (o.beta1, o.beta2),
            "eps": o.eps,
            "weight_decay": o.weight_decay,
            "fused": False,
            "foreach": o.implementation == "foreach",
        },
    )
    scheds = build_lr_schedulers(opts, cfg.lr_scheduler, cfg.training.steps)
    losses = []
    for _ in range(steps):
        opts.zero_grad()
        batches = [next(it) for it in loaders]
        inputs = torch.cat([b[0]["input"] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        masks = model.get_attention_masks(input_batch=inputs, tokenizer=tokenizer)
        pred = model(inputs, attention_masks=masks)
        loss = cross_entropy_loss(pred, labels) / (labels != IGNORE_INDEX).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_norm, foreach=True)
        opts.step()
        scheds.step()
        losses.append(loss.item())
    return losses


def titan_on_tpu(work: str, args: list[str], nproc: int, timeout: float) -> tuple[list[float], str]:
    """Runs ``torchtitan.train`` on tpu under ``torch_tpu.run``; returns (per-step losses, its log)."""
    cmd = [sys.executable, "-m", "torch_tpu.run", "-n", str(nproc), "-m", "torchtitan.train", *args]
    p = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True, timeout=timeout)
    log = _ANSI.sub("", p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"torchtitan.train exited with {p.returncode}:\n{log[-6000:]}")
    by_step: dict[int, float] = {}
    for m in _STEP.finditer(log):
        by_step.setdefault(int(m.group(1)), float(m.group(2)))
    return [by_step[s] for s in sorted(by_step)], log


def oracle_in_subprocess(
    work: str, flavor: str, steps: int, seq_len: int, batch: int, nproc: int, timeout: float
) -> list[float]:
    """:func:`cpu_oracle` in a fresh process (its substitutions stay out of the caller's)."""
    cmd = [
        sys.executable,
        os.path.join(HERE, "train.py"),
        "--oracle",
        "--work",
        work,
        "--flavor",
        flavor,
        "--steps",
        str(steps),
        "--seq-len",
        str(seq_len),
        "--batch",
        str(batch),
        "--nproc",
        str(nproc),
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"CPU oracle exited with {p.returncode}:\n{p.stderr[-6000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(
    work: str | None = None,
    nproc: int = 1,
    steps: int = 3,
    flavor: str = "debugmodel_flex_attn",
    seq_len: int = 128,
    batch: int = 2,
    timeout: float = 1800,
) -> dict:
    """Oracle, then TorchTitan on tpu, each in its own process(es).

    Returns {"cpu": [...], "tpu": [...], "max_rel": float, "seconds": {...}, "log": TorchTitan's log}.
    """
    from assets import build  # noqa: PLC0415 (this folder is on sys.path when run as a script or test)

    work = work or tempfile.mkdtemp(prefix="titan-tpu-")
    build(work)
    t0 = time.perf_counter()
    cpu = oracle_in_subprocess(work, flavor, steps, seq_len, batch, nproc, timeout)
    t1 = time.perf_counter()
    tpu, log = titan_on_tpu(work, titan_args(work, flavor, steps, seq_len, batch), nproc, timeout)
    t2 = time.perf_counter()
    if len(tpu) != steps:
        raise RuntimeError(f"expected {steps} logged steps, found {len(tpu)}:\n{log[-4000:]}")
    rel = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(tpu, cpu))
    return {
        "cpu": cpu,
        "tpu": tpu,
        "max_rel": rel,
        "seconds": {"cpu_oracle": t1 - t0, "torchtitan_tpu": t2 - t1},
        "log": log,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--flavor", default="debugmodel_flex_attn")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--work", default=None)
    ap.add_argument(
        "--oracle", action="store_true", help="only the CPU oracle (in --work, assets built); prints its losses as JSON"
    )
    a = ap.parse_args()
    if a.oracle:
        args = titan_args(a.work, a.flavor, a.steps, a.seq_len, a.batch)
        print(json.dumps(cpu_oracle(a.work, args, a.steps, a.nproc)))
        return
    r = run(a.work, a.nproc, a.steps, a.flavor, a.seq_len, a.batch)
    print(f"{'step':>4} {'cpu oracle':>12} {'torchtitan tpu':>15} {'rel diff':>10}")
    for i, (c, t) in enumerate(zip(r["cpu"], r["tpu"]), 1):
        print(f"{i:>4} {c:>12.5f} {t:>15.5f} {abs(t - c) / abs(c):>10.2e}")
    s = r["seconds"]
    print(
        f"max rel diff {r['max_rel']:.2e}; cpu oracle {s['cpu_oracle']:.1f} s, "
        f"torchtitan on tpu ({a.nproc} process{'es' if a.nproc > 1 else ''}) {s['torchtitan_tpu']:.1f} s"
    )


if __name__ == "__main__":
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    main()
