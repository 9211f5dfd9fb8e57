"""The demo trained with FSDP2 over ``tpu_dist``: one process per vTPU chip.

``python -m torch_tpu.run -n 4 -m torch_tpu.demo --fsdp [flags]``. Each process
runs on ``tpu:LOCAL_RANK``; every transformer block and the root module are
``fully_shard``-ed (parameters, gradients and AdamW state split across ranks,
gathered per block for forward and backward, gradients reduce-scattered).

``--batch-size`` is the *global* batch: rank ``r`` takes rows ``[r*b, (r+1)*b)``
(``b = batch_size / world``) of the same batch the single-chip run draws at that
step, so the loss trajectory equals single-chip training on the same data up to
floating-point reduction order. Validation batches are split the same way.
Checkpoints are ``torch.distributed.checkpoint`` folders ``<out>/dcp-<step>/``
(model and optimizer shards, plus ``demo.json`` written by rank 0 once the save
is complete); ``--resume`` loads the newest complete one. Rank 0 alone logs and
prints the final JSON line, which adds ``world_size`` and ``fsdp`` to the
single-chip fields (``tokens_per_s`` counts all ranks' tokens).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sys
import time
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from . import data, estimate
from .model import GPT, GPTConfig, PRESETS
from .train import (DEFAULTS, DemoError, CheckpointError, _InterruptFlag, _RUN_KEYS, _log_event, autocast_ctx,
                    clean_error_text, lr_at, make_optimizer, oom_message, sample)

_DCP_RE = re.compile(r"^dcp-(\d+)$")
LATEST_DCP = "latest-dcp"  # text file in --out naming the newest complete DCP checkpoint
KEEP_CHECKPOINTS = 2
META = "demo.json"  # inside a DCP folder; its presence marks the save as complete


def _world() -> Tuple[int, int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    except KeyError:
        raise DemoError("--fsdp runs one process per chip: launch it with "
                        "`python -m torch_tpu.run -n 4 -m torch_tpu.demo --fsdp ...` (or torchrun)", 2) from None


def list_dcp_checkpoints(out: str) -> List[Tuple[int, str]]:
    """``[(step, folder)]`` of complete DCP checkpoints (``dcp-<step>/demo.json``) in ``out``, newest first."""
    if not os.path.isdir(out):
        return []
    found = []
    for name in os.listdir(out):
        m = _DCP_RE.match(name)
        path = os.path.join(out, name)
        if m and os.path.exists(os.path.join(path, META)):
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def _state_dicts(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optimizer": osd}


def save_dcp(out: str, step: int, model, opt, meta: dict, rank: int) -> str:
    """Save model and optimizer shards of every rank to ``out/dcp-<step>/``; rank 0 then writes
    ``demo.json`` (which marks it complete), points ``out/latest-dcp`` at it and deletes older
    complete checkpoints beyond KEEP_CHECKPOINTS. Collective: every rank must call it."""
    import torch.distributed.checkpoint as dcp

    path = os.path.join(out, f"dcp-{step:07d}")
    dcp.save(_state_dicts(model, opt), checkpoint_id=path)  # returns once every rank's shards are written
    if rank == 0:
        tmp = os.path.join(path, META + ".tmp")
        with open(tmp, "w") as f:
            json.dump({**meta, "step": step}, f)
        os.replace(tmp, os.path.join(path, META))
        with open(os.path.join(out, LATEST_DCP + ".tmp"), "w") as f:
            f.write(os.path.basename(path) + "\n")
        os.replace(os.path.join(out, LATEST_DCP + ".tmp"), os.path.join(out, LATEST_DCP))
        for _, old in list_dcp_checkpoints(out)[KEEP_CHECKPOINTS:]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()  # nobody reads or prunes the folder before rank 0 is done with it
    return path


def load_dcp(path: str, model, opt) -> None:
    """Load ``path`` (a folder of :func:`save_dcp`) into the sharded ``model`` and ``opt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    sd = _state_dicts(model, opt)
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])


def shard_model(model: GPT) -> GPT:
    """FSDP2: one unit per transformer block, the root holds the embeddings, final norm and
    the tied output head (tied parameters must live in one unit)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


@torch.no_grad()
def evaluate_sharded(model, batches, device, dtype: str, rank: int, world: int) -> float:
    """Mean validation loss over ``batches``: each rank scores its rows of every batch and the
    per-rank means are averaged (equal rows per rank, so this is the single-chip value)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for x, y in batches:
        b = x.shape[0] // world
        rows = slice(rank * b, (rank + 1) * b)
        with autocast_ctx(device, dtype):
            _, loss = model(x[rows].to(device), y[rows].to(device))
        total += loss.item()
    t = torch.tensor([total / len(batches)], dtype=torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    model.train(was_training)
    return float(t.item())


class _StopFlag(_InterruptFlag):
    """SIGINT/SIGTERM (the launcher forwards Ctrl-C to every rank): finish the current step, agree
    with the other ranks to stop, save. A second signal raises KeyboardInterrupt."""

    def __init__(self, log):
        super().__init__(log, signals=(signal.SIGINT, signal.SIGTERM))


def run_fsdp(args) -> int:
    """Train the demo GPT with FSDP2 on WORLD_SIZE chips; rank 0 prints the final JSON line.
    Returns the exit code. Raises DemoError (and subclasses) or data.CorpusError for bad input."""
    rank, world, local_rank = _world()
    device = torch.device("tpu", local_rank)
    try:
        torch.tpu.set_device(device)
        topo = torch.tpu.topology()
    except (ValueError, RuntimeError) as e:
        raise DemoError(f"cannot start the tpu runtime on tpu:{local_rank}: {clean_error_text(e)}", 2) from None
    dist.init_process_group("tpu_dist", device_id=device)
    try:
        return _run(args, rank, world, device, topo)
    finally:
        dist.destroy_process_group()


def _run(args, rank: int, world: int, device, topo) -> int:
    from tqdm import tqdm

    def log(msg: str) -> None:
        if rank == 0:
            tqdm.write(msg)

    generation = topo["spec"]["generation"]
    resumed: Optional[Tuple[dict, str]] = None
    if args.resume:
        found = list_dcp_checkpoints(args.out)
        if not found:
            log(f"--resume: no DCP checkpoint in {args.out}; starting a new run")
        else:
            path = found[0][1]
            with open(os.path.join(path, META)) as f:
                meta = json.load(f)
            resumed = (meta, path)
            for k in _RUN_KEYS:
                given = getattr(args, k)
                if given is not None and given != meta["run"][k]:
                    log(f"note: --{k.replace('_', '-')} {given} ignored: the checkpoint's run used {meta['run'][k]}")
                setattr(args, k, meta["run"][k])
    for k, v in DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.batch_size % world:
        raise DemoError(f"--batch-size {args.batch_size} (the global batch) is not a multiple of the "
                        f"{world} ranks", 2)
    if args.model_size not in PRESETS:
        raise DemoError(f"unknown --model-size {args.model_size!r}; choose one of {', '.join(PRESETS)}", 2)

    corpus = data.load_corpus(args.corpus, min_tokens=args.seq_len + 1)
    log(corpus.describe())
    log(f"FSDP2 over tpu_dist: {world} ranks on {topo['name']}, global batch {args.batch_size} "
        f"({args.batch_size // world} per rank); DCP checkpoints and log.jsonl in {os.path.abspath(args.out)}")

    cfg = GPTConfig(**resumed[0]["model_config"]) if resumed else GPTConfig(seq_len=args.seq_len,
                                                                            **PRESETS[args.model_size])
    torch.manual_seed(args.seed)
    model = GPT(cfg)  # same host init on every rank: the shards of one model
    params = model.num_params()
    what = (f"model {args.model_size!r} ({params / 1e6:.2f} M parameters, batch {args.batch_size // world} x "
            f"{args.seq_len} tokens per rank, FSDP2 over {world} ranks)")
    try:
        model.to(device)
        shard_model(model)
        opt = make_optimizer(model, args.lr)
        return _train(args, corpus, model, opt, cfg, params, device, topo, generation, resumed, rank, world, log)
    except torch.OutOfMemoryError as e:
        raise DemoError(f"rank {rank}: " + oom_message(e, what)) from None


def _train(args, corpus, model, opt, cfg, params, device, topo, generation, resumed, rank, world, log) -> int:
    from tqdm import tqdm

    start = 0
    if resumed is not None:
        meta, path = resumed
        try:
            load_dcp(path, model, opt)
        except Exception as e:  # noqa: BLE001  (DCP raises CheckpointException wrapping each rank's error)
            raise CheckpointError(f"--resume: cannot load {path}: {clean_error_text(e)}") from None
        start = int(meta["step"])
        log(f"resumed from {path} at step {start}")

    run_cfg = {k: getattr(args, k) for k in _RUN_KEYS}
    meta = {"model_config": cfg.to_dict(), "run": run_cfg, "world_size": world}
    vbatches = data.val_batches(corpus, args.eval_batches, args.batch_size, args.seq_len, args.seed)
    local_b = args.batch_size // world
    rows = slice(rank * local_b, (rank + 1) * local_b)
    warmup = max(1, min(args.warmup, args.steps // 10 or 1))

    def out_event(event: dict) -> None:
        if rank == 0:
            _log_event(args.out, event)

    def save(step: int) -> None:
        path = save_dcp(args.out, step, model, opt, meta, rank)
        out_event({"event": "checkpoint", "step": step, "path": path})

    def train_step(step: int, lr: float, stop: bool) -> Tuple[float, bool]:
        """One optimizer step on this rank's rows of the global batch of ``step``. Returns the
        global batch's loss (mean over ranks) and whether any rank asked to stop."""
        x, y = data.train_batch(corpus, args.batch_size, args.seq_len, args.seed, step)
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast_ctx(device, args.dtype):
            _, loss = model(x[rows].to(device), y[rows].to(device))
        loss.backward()  # FSDP2 reduce-scatters the gradients (mean over ranks)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # norm of the whole (sharded) gradient
        opt.step()
        opt.zero_grad(set_to_none=True)
        both = torch.stack([loss.detach().float(), torch.tensor(float(stop), device=device)])
        dist.all_reduce(both, op=dist.ReduceOp.SUM)  # one collective: mean loss and the stop vote
        total, stops = both.tolist()
        return total / world, stops > 0

    window = estimate.StatsWindow()
    ici = {"seconds": 0.0, "bytes": 0.0}
    train_seconds = 0.0
    train_tokens = 0
    val_loss = None
    step = start
    saved_step = start if resumed is not None else None
    torch.tpu.reset_peak_memory_stats()
    model.train()
    bar = tqdm(total=args.steps, initial=start, desc="train", unit="step", dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 30.0, disable=rank != 0)
    interrupted = False
    try:
        with _StopFlag(log) as flag:
            window.start()
            window_from = step
            mark = torch_tpu_stats()
            while step < args.steps:
                t0 = time.perf_counter()
                lr = lr_at(step, args.steps, args.lr, warmup)
                loss_value, stop = train_step(step, lr, flag.hit)
                step += 1
                train_seconds += time.perf_counter() - t0
                train_tokens += args.batch_size * args.seq_len
                if not math.isfinite(loss_value):
                    raise DemoError(f"training diverged: loss {loss_value} at step {step}; try a lower --lr")
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{train_tokens / train_seconds:.0f}", refresh=False)
                bar.update(1)
                if stop:
                    interrupted = True
                    break
                eval_due = step % args.eval_every == 0 or step == args.steps
                ckpt_due = step % args.checkpoint_every == 0 or step == args.steps
                if eval_due or ckpt_due:
                    window.stop(step - window_from)
                    now = torch_tpu_stats()
                    ici["seconds"] += now["ici_seconds"] - mark["ici_seconds"]
                    ici["bytes"] += now["ici_bytes"] - mark["ici_bytes"]
                    if eval_due:
                        val_loss = evaluate_sharded(model, vbatches, device, args.dtype, rank, world)
                        log(f"step {step}: train loss {loss_value:.4f}, val loss {val_loss:.4f} "
                            f"({val_loss / corpus.unigram_nats:.3f} x unigram), lr {lr:.2e}")
                        out_event({"event": "eval", "step": step, "train_loss": loss_value, "val_loss": val_loss,
                                   "lr": lr, "tokens_per_s": train_tokens / train_seconds})
                    if ckpt_due:
                        save(step)
                        saved_step = step
                    window.start()
                    window_from = step
                    mark = torch_tpu_stats()
            window.stop(step - window_from)
    finally:
        bar.close()

    if interrupted:
        if saved_step != step:
            save(step)
        if rank == 0:
            print(f"interrupted at step {step}: checkpoint saved in {args.out}; "
                  f"continue with --resume --out {args.out}", flush=True)
        return 130

    if val_loss is None:
        val_loss = evaluate_sharded(model, vbatches, device, args.dtype, rank, world)
        log(f"step {step}: val loss {val_loss:.4f} ({val_loss / corpus.unigram_nats:.3f} x unigram)")
    if saved_step != step:
        save(step)

    # Every rank runs the sampler (each forward all-gathers the blocks); same host RNG, same text.
    text = sample(model, device, args.dtype, args.prompt, args.sample_tokens, args.seed)
    host_step = train_seconds / max(1, step - start)
    est = estimate.build(window, estimate.generation_specs(), generation=generation, params=params,
                         tokens_per_step=args.batch_size * args.seq_len // world,
                         hbm_peak_bytes=torch.tpu.max_memory_allocated(device),
                         host_step_seconds=host_step if step > start else None)
    est["topology"] = topo["name"]
    est["per_chip"] = True  # step time, MFU and HBM are one chip's share of the sharded step
    steps_measured = max(window.steps, 1)
    est["ici_s_per_step"] = ici["seconds"] / steps_measured
    est["ici_bytes_per_step"] = ici["bytes"] / steps_measured
    if rank == 0:
        print("--- sample ---")
        print(text)
        print("--- end of sample ---")
        print(estimate.format_table(est))
        print(f"  (per chip, {world} chips; collectives add {est['ici_s_per_step'] * 1e3:.3f} ms of "
              f"estimated ICI time per step, {est['ici_bytes_per_step'] / 2**20:.1f} MiB)")
        result = {"val_loss": val_loss, "unigram_nats": corpus.unigram_nats,
                  "tokens_per_s": train_tokens / train_seconds if train_seconds else 0.0,
                  "steps": step, "params": params, "estimate": est, "world_size": world, "fsdp": True}
        _log_event(args.out, {"event": "result", **result})
        print(json.dumps(result), flush=True)
    return 0


def torch_tpu_stats() -> dict:
    import torch_tpu.runtime

    torch.tpu.synchronize()
    return torch_tpu.runtime.stats()
