"""The demo's training loop, one for the single-chip job (train.py) and FSDP (fsdp.py).

A :class:`Job` says what differs between them: the device, how the model is placed (moved,
sharded), the checkpoint format, which rows of each batch this process trains on, how values
are averaged over ranks and which rank prints. The rest is here: resume, the learning-rate
schedule, the training step, evaluation, checkpoint cadence, Ctrl-C, log.jsonl, the estimate
and the final JSON line.

Units: losses are mean cross-entropy in nats per byte token; times are seconds of host wall
clock unless named ``device``; memory figures are bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext

import torch

from ..estimate.core import train_step
from ..estimate.models.gpt import GPT, PRESETS, GPTConfig, make_optimizer
from . import data, estimate
from .errors import DemoError, oom_message

# Settings that define a run's trajectory: a resumed run takes them from its checkpoint.
RUN_KEYS = ("model_size", "batch_size", "seq_len", "seed", "lr", "dtype", "corpus")
# Defaults of the settings a resumed run takes from its checkpoint (argparse leaves them None).
DEFAULTS = {"model_size": "small", "batch_size": 16, "seq_len": 128, "seed": 0, "lr": 2e-3, "dtype": "bf16",
            "corpus": None}
KEEP_CHECKPOINTS = 2


class Job:
    """One process's part of the run; these defaults are the single-chip job's. A subclass
    provides the checkpoint format (``find_checkpoint``, ``load``, ``save``)."""

    rank = 0
    world = 1
    checkpoint_noun = "checkpoint"  # in the --resume message
    stop_signals = (signal.SIGINT,)
    # False: once a signal came, the loop stops before the next step. True: each step carries
    # the ranks' stop vote (see step_result), so that every rank stops after the same step.
    votes_to_stop = False
    compiles = False  # honours --mode compile
    oom_prefix = ""

    def __init__(self, device: torch.device, topo: dict):
        self.device = device
        self.topo = topo

    @property
    def is_main(self) -> bool:
        """The process that logs, prints and writes log.jsonl."""
        return self.rank == 0

    def log(self, msg: str) -> None:
        if self.is_main:
            from tqdm import tqdm

            tqdm.write(msg)

    def check(self, args: argparse.Namespace) -> None:
        """Raises DemoError for settings this job cannot run."""

    def describe(self, args: argparse.Namespace) -> str:
        """The log line after the corpus's."""
        return f"checkpoints and log.jsonl in {os.path.abspath(args.out)}"

    def describe_batch(self, args: argparse.Namespace) -> str:
        return f"{args.batch_size} x {args.seq_len} tokens"

    def find_checkpoint(self, out: str) -> tuple[dict, str] | None:
        """``(meta, path)`` of the newest usable checkpoint in ``out`` (meta: ``step``, ``run``,
        ``model_config``), or None."""
        raise NotImplementedError

    def place(self, model: GPT) -> GPT:
        """The model on this job's device(s)."""
        return model.to(self.device)

    def load(self, resumed: tuple[dict, str], model: GPT, opt: torch.optim.Optimizer) -> None:
        raise NotImplementedError

    def fresh_start(self, out: str) -> None:
        """A new run begins in ``out`` (nothing resumed)."""

    def save(self, out: str, step: int, model: GPT, opt: torch.optim.Optimizer, meta: dict) -> str:
        """Saves a checkpoint of ``step``; returns its path."""
        raise NotImplementedError

    def rows(self, batch_size: int) -> slice:
        """The rows of a global batch that this process computes."""
        return slice(None)

    def mean(self, value: float) -> float:
        """``value`` averaged over the ranks."""
        return value

    def step_result(self, loss: torch.Tensor, stop: bool) -> tuple[float, bool]:
        """The global batch's loss and whether to stop (the ranks' vote when ``votes_to_stop``)."""
        return loss.item(), False  # waits for the step's work, so the caller's clock times the whole step

    def finish_estimate(self, est: dict, window: estimate.StatsWindow) -> str:
        """Adds this job's fields to ``est``; returns lines printed under its table ("" for none)."""
        return ""

    def result_fields(self) -> dict:
        """Keys this job adds to the final JSON line."""
        return {}


def lr_at(step: int, total_steps: int, peak_lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``peak_lr / 10`` at ``total_steps``.

    A function of the step alone, so a resumed run follows the same schedule.
    """
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return peak_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def autocast_ctx(device: torch.device, dtype: str):
    """bf16 autocast on the device (matmuls on the MXU in bf16, fp32 accumulation) or nothing for fp32."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def evaluate(model: GPT, batches, job: Job, dtype: str) -> float:
    """Mean validation loss (nats per byte) over the fixed validation ``batches``: each rank
    scores its rows of every batch and the ranks' means are averaged (equal rows per rank, so
    this is the single-chip value)."""
    was_training = model.training
    model.eval()
    losses = []
    for x, y in batches:
        rows = job.rows(x.shape[0])
        with autocast_ctx(job.device, dtype):
            _, loss = model(x[rows].to(job.device), y[rows].to(job.device))
        losses.append(loss.item())  # one batch at a time: queued batches would all hold HBM
    value = job.mean(sum(losses) / len(losses))
    model.train(was_training)
    return value


@torch.no_grad()
def sample(model: GPT, device: torch.device, dtype: str, prompt: str, n_tokens: int, seed: int) -> str:
    """``prompt`` continued by ``n_tokens`` sampled bytes (temperature 0.8, top-k 40), as text."""
    model.eval()
    idx = torch.tensor([list(prompt.encode("utf-8"))], dtype=torch.long, device=device)
    gen = torch.Generator().manual_seed(seed)
    with autocast_ctx(device, dtype):
        out = model.generate(idx, n_tokens, generator=gen)
    return data.decode(out[0].tolist())


class InterruptFlag:
    """Handler of ``signals``: the first one asks the loop to stop after the current step (and
    save); a second one raises KeyboardInterrupt at once."""

    def __init__(self, log, signals=(signal.SIGINT,)):
        self.hit = False
        self.log = log
        self._signals = signals
        self._prev = {}

    def __enter__(self):
        for s in self._signals:
            self._prev[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True
        self.log("interrupt: finishing this step, then saving a checkpoint (Ctrl-C again to abort)")

    def __exit__(self, *exc):
        for s, h in self._prev.items():
            signal.signal(s, h)
        return False


def log_event(out: str, event: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "log.jsonl"), "a") as f:
        f.write(json.dumps(event) + "\n")


def _resume(args: argparse.Namespace, job: Job) -> tuple[dict, str] | None:
    """The checkpoint to resume (``--resume``), its run settings copied into ``args``, then the
    defaults filled in."""
    resumed = None
    if args.resume:
        resumed = job.find_checkpoint(args.out)
        if resumed is None:
            job.log(f"--resume: no {job.checkpoint_noun} in {args.out}; starting a new run")
        else:
            run_cfg = resumed[0]["run"]
            for k in RUN_KEYS:
                given = getattr(args, k)
                if given is not None and given != run_cfg[k]:
                    job.log(f"note: --{k.replace('_', '-')} {given} ignored: the checkpoint's run used {run_cfg[k]}")
                setattr(args, k, run_cfg[k])
    for k, v in DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    return resumed


def train(args: argparse.Namespace, job: Job) -> int:
    """Train, evaluate and sample as ``args`` says; the main process prints the final JSON line.
    Returns the exit code.

    ``args`` carries the CLI flags (see ``torch_tpu.demo.__main__``). Raises DemoError (and
    subclasses) or data.CorpusError for bad input; the CLI turns those into messages.
    """
    resumed = _resume(args, job)
    job.check(args)
    if args.model_size not in PRESETS:
        raise DemoError(f"unknown --model-size {args.model_size!r}; choose one of {', '.join(PRESETS)}", 2)
    corpus = data.load_corpus(args.corpus, min_tokens=args.seq_len + 1)
    job.log(corpus.describe())
    job.log(job.describe(args))

    if resumed is not None:
        cfg = GPTConfig(**resumed[0]["model_config"])  # the checkpoint's shapes, even if a preset changed
    else:
        cfg = GPTConfig(seq_len=args.seq_len, **PRESETS[args.model_size])
    torch.manual_seed(args.seed)
    model = GPT(cfg)  # initialised on the host: identical weights on any device, and on every rank
    params = model.num_params()
    what = f"model {args.model_size!r} ({params / 1e6:.2f} M parameters, batch {job.describe_batch(args)})"
    try:
        return _train(args, job, corpus, job.place(model), cfg, params, resumed)
    except torch.OutOfMemoryError as e:
        raise DemoError(job.oom_prefix + oom_message(e, what)) from None


def _train(args, job: Job, corpus, model: GPT, cfg: GPTConfig, params: int, resumed) -> int:
    from tqdm import tqdm

    log = job.log
    opt = make_optimizer(model, args.lr)
    start = 0
    if resumed is not None:
        job.load(resumed, model, opt)
        start = int(resumed[0]["step"])
        log(f"resumed from {resumed[1]} at step {start}")
    else:
        job.fresh_start(args.out)

    forward, opt_step = model, None
    compiled = job.compiles and getattr(args, "mode", "strict") == "compile"
    if compiled:
        # torch.compile(backend="tpu"): forward + backward, and the AdamW step (lr as a tensor, so
        # the schedule changes a value, not the compiled program)
        forward, opt_step = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")
        for g in opt.param_groups:
            g["lr"] = torch.tensor(float(g["lr"]))
    meta = {"model_config": cfg.to_dict(), "run": {k: getattr(args, k) for k in RUN_KEYS}}
    vbatches = data.val_batches(corpus, args.eval_batches, args.batch_size, args.seq_len, args.seed)
    rows = job.rows(args.batch_size)
    amp = torch.bfloat16 if args.dtype == "bf16" else None
    tokens_per_step = args.batch_size * args.seq_len
    warmup = max(1, min(args.warmup, args.steps // 10 or 1))

    def event(entry: dict) -> None:
        if job.is_main:
            log_event(args.out, entry)

    def save(step: int) -> None:
        path = job.save(args.out, step, model, opt, meta)
        event({"event": "checkpoint", "step": step, "path": path})

    def one_step(step: int, lr: float, stop: bool) -> tuple[float, bool]:
        """One optimizer step on this process's rows of the batch of ``step``; returns the batch's
        training loss (nats/byte) and whether to stop."""
        x, y = data.train_batch(corpus, args.batch_size, args.seq_len, args.seed, step)
        for g in opt.param_groups:
            if compiled:
                g["lr"].fill_(lr)
            else:
                g["lr"] = lr
        loss = train_step(forward, opt, x[rows], y[rows], job.device, amp, opt_step=opt_step)
        return job.step_result(loss, stop)

    window = estimate.StatsWindow()
    train_seconds = 0.0
    train_tokens = 0
    val_loss = None
    step = start
    saved_step = start if resumed is not None else None
    torch.tpu.reset_peak_memory_stats()
    model.train()
    # Into a file or pipe, redraw rarely: each redraw is a line of the log there.
    bar = tqdm(total=args.steps, initial=start, desc="train", unit="step", dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 30.0, disable=not job.is_main)
    interrupted = False
    try:
        with InterruptFlag(log, job.stop_signals) as flag:
            window.start()
            window_from = step
            while step < args.steps:
                if flag.hit and not job.votes_to_stop:
                    interrupted = True
                    break
                t0 = time.perf_counter()
                lr = lr_at(step, args.steps, args.lr, warmup)
                loss_value, stop = one_step(step, lr, flag.hit)
                step += 1
                train_seconds += time.perf_counter() - t0
                train_tokens += tokens_per_step
                if not math.isfinite(loss_value):
                    raise DemoError(f"training diverged: loss {loss_value} at step {step}; try a lower --lr")
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{train_tokens / train_seconds:.0f}", refresh=False)
                bar.update(1)  # redraws at most every `mininterval` seconds
                if stop:
                    interrupted = True
                    break
                eval_due = step % args.eval_every == 0 or step == args.steps
                ckpt_due = step % args.checkpoint_every == 0 or step == args.steps
                if eval_due or ckpt_due:
                    window.stop(step - window_from)  # evaluation and checkpoints stay out of the estimate
                    if eval_due:
                        val_loss = evaluate(model, vbatches, job, args.dtype)
                        log(f"step {step}: train loss {loss_value:.4f}, val loss {val_loss:.4f} "
                            f"({val_loss / corpus.unigram_nats:.3f} x unigram), lr {lr:.2e}")
                        event({"event": "eval", "step": step, "train_loss": loss_value, "val_loss": val_loss,
                               "lr": lr, "tokens_per_s": train_tokens / train_seconds})
                    if ckpt_due:
                        save(step)
                        saved_step = step
                    window.start()
                    window_from = step
            window.stop(step - window_from)
    finally:
        bar.close()  # before any error message, so that it does not share the bar's line

    if interrupted:
        if saved_step != step:
            save(step)
        if job.is_main:
            print(f"interrupted at step {step}: checkpoint saved in {args.out}; "
                  f"continue with --resume --out {args.out}", flush=True)
        return 130

    if val_loss is None:  # nothing trained in this process (the checkpoint was already at --steps)
        val_loss = evaluate(model, vbatches, job, args.dtype)
        log(f"step {step}: val loss {val_loss:.4f} ({val_loss / corpus.unigram_nats:.3f} x unigram)")
    if saved_step != step:
        save(step)
    if getattr(args, "export_hf", None) and job.is_main:
        from .export_hf import export

        log(f"exported the model as a Hugging Face checkpoint: {os.path.abspath(export(model, args.export_hf))}")

    # Every rank runs the sampler (FSDP: each forward all-gathers the blocks); same host RNG, same text.
    text = sample(model, job.device, args.dtype, args.prompt, args.sample_tokens, args.seed)
    host_step = train_seconds / max(1, step - start)
    est = estimate.build(window, estimate.generation_specs(), generation=job.topo["spec"]["generation"],
                         params=params, tokens_per_step=tokens_per_step // job.world,
                         hbm_peak_bytes=torch.tpu.max_memory_allocated(job.device),
                         host_step_seconds=host_step if step > start else None)
    est["topology"] = job.topo["name"]
    note = job.finish_estimate(est, window)
    if not job.is_main:
        return 0
    print("--- sample ---")
    print(text)
    print("--- end of sample ---")
    print(estimate.format_table(est))
    if note:
        print(note)
    result = {"val_loss": val_loss, "unigram_nats": corpus.unigram_nats,
              "tokens_per_s": train_tokens / train_seconds if train_seconds else 0.0,
              "steps": step, "params": params, "estimate": est, **job.result_fields()}
    log_event(args.out, {"event": "result", **result})
    print(json.dumps(result), flush=True)
    return 0
