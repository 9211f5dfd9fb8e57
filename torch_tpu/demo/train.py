"""The demo's training job: loop, evaluation, checkpoints, sampling, final report.

Units: losses are mean cross-entropy in nats per byte token; times are seconds of
host wall clock unless named ``device``; memory figures are bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from . import data, estimate
from .model import GPT, GPTConfig, PRESETS

CHECKPOINT_VERSION = 1
KEEP_CHECKPOINTS = 2
_CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
LATEST = "latest"  # text file in --out naming the newest checkpoint

# Settings that define a run's trajectory: a resumed run takes them from its checkpoint.
_RUN_KEYS = ("model_size", "batch_size", "seq_len", "seed", "lr", "dtype", "corpus")


class DemoError(Exception):
    """An error the demo reports as one clean message (no traceback) and a non-zero exit."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class CheckpointError(DemoError):
    pass


# --- learning rate ------------------------------------------------------------------


def lr_at(step: int, total_steps: int, peak_lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``peak_lr / 10`` at ``total_steps``.

    A function of the step alone, so a resumed run follows the same schedule.
    """
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return peak_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """AdamW, betas (0.9, 0.95); weight decay on matrices only (not biases, norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


# --- checkpoints ----------------------------------------------------------------------


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def checkpoint_path(out: str, step: int) -> str:
    return os.path.join(out, f"ckpt-{step:07d}.pt")


def list_checkpoints(out: str) -> List[Tuple[int, str]]:
    """``[(step, path)]`` of the ``ckpt-<step>.pt`` files in ``out``, newest first."""
    if not os.path.isdir(out):
        return []
    found = []
    for name in os.listdir(out):
        m = _CKPT_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(out, name)))
    return sorted(found, reverse=True)


def _atomic_write(path: str, write) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(out: str, state: dict, keep: List[str]) -> str:
    """Write ``state`` to ``out/ckpt-<step>.pt`` atomically (temporary file, then ``os.replace``),
    point ``out/latest`` at it, and delete other checkpoints except those in ``keep``.
    Returns the new path."""
    os.makedirs(out, exist_ok=True)
    path = checkpoint_path(out, state["step"])
    _atomic_write(path, lambda f: torch.save(state, f))
    _atomic_write(os.path.join(out, LATEST), lambda f: f.write((os.path.basename(path) + "\n").encode()))
    keep_set = {os.path.abspath(p) for p in keep} | {os.path.abspath(path)}
    for _, p in list_checkpoints(out):
        if os.path.abspath(p) not in keep_set:
            os.remove(p)
    return path


def _load_one(path: str) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    missing = [k for k in ("version", "step", "model", "optimizer", "model_config", "run") if k not in state]
    if missing:
        raise ValueError(f"not a demo checkpoint (missing {', '.join(missing)})")
    if state["version"] != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {state['version']}, this demo reads {CHECKPOINT_VERSION}")
    return state


def load_latest_checkpoint(out: str, log=print) -> Optional[Tuple[dict, str]]:
    """The newest loadable checkpoint of ``out`` as ``(state, path)``; None if ``out`` has none.

    Tries the file named by ``out/latest`` first, then the others newest first. A
    checkpoint that fails to load (truncated, corrupted) is renamed ``*.corrupt`` so
    that it is never picked or counted again, and the next older one is used.
    Raises CheckpointError when checkpoints exist but none loads.
    """
    candidates = [p for _, p in list_checkpoints(out)]
    latest = os.path.join(out, LATEST)
    if os.path.exists(latest):
        with open(latest) as f:
            named = os.path.join(out, f.read().strip())
        if named in candidates:
            candidates.remove(named)
            candidates.insert(0, named)
    failures = []
    for path in candidates:
        try:
            return _load_one(path), path
        except Exception as e:  # noqa: BLE001  (any unreadable file is skipped the same way)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failures.append(f"{os.path.basename(path)}: {reason}")
            os.replace(path, path + ".corrupt")
            log(f"warning: checkpoint {path} is corrupted or truncated ({reason}); "
                f"kept as {os.path.basename(path)}.corrupt, trying an older one")
    if failures:
        raise CheckpointError(f"--resume: no usable checkpoint in {out}: " + "; ".join(failures))
    return None


# --- evaluation and sampling ----------------------------------------------------------


def autocast_ctx(device: torch.device, dtype: str):
    """bf16 autocast on the device (matmuls on the MXU in bf16, fp32 accumulation) or nothing for fp32."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def evaluate(model: GPT, batches, device: torch.device, dtype: str) -> float:
    """Mean validation loss (nats per byte) over the fixed validation ``batches``."""
    was_training = model.training
    model.eval()
    losses = []
    for x, y in batches:
        with autocast_ctx(device, dtype):
            _, loss = model(x.to(device), y.to(device))
        losses.append(loss.item())  # one batch at a time: queued batches would all hold HBM
    value = sum(losses) / len(losses)
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


# --- errors ------------------------------------------------------------------------


_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _parse_size(text: str) -> Optional[int]:
    m = re.match(r"\s*([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)", text)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def oom_message(err: BaseException, what: str) -> str:
    """A clear message for an out-of-HBM error: how much the run needed, how much the chip has."""
    text = str(err).strip().split("\nException raised from")[0]
    props = torch.tpu.get_device_properties()
    capacity = props.total_memory
    spec_hbm = torch.tpu.topology()["spec"]["hbm_bytes"]
    m_req = re.search(r"tried to allocate ([\d.]+ \w+)", text)
    m_used = re.search(r"capacity [\d.]+ \w+, ([\d.]+ \w+) allocated", text)
    req = _parse_size(m_req.group(1)) if m_req else None
    used = _parse_size(m_used.group(1)) if m_used else None
    if req is not None:
        needed = f"at least {_mib(req + (used or 0))} of HBM ({_mib(used or 0)} in use + {_mib(req)} requested)"
    else:
        needed = "more HBM than the chip has"
    cap = f"{props.name} has {_mib(capacity)} per chip"
    if capacity != spec_hbm:
        cap += f" (TORCH_TPU_HBM_BYTES; the generation's spec is {_mib(spec_hbm)})"
    return (f"out of HBM: {what} needed {needed}; {cap}. Use a smaller --model-size, --batch-size or "
            f"--seq-len, or a --topology whose generation has more HBM.\n  runtime: {text.splitlines()[0]}")


def clean_error_text(err: BaseException) -> str:
    """An exception's message without the C++ stack trace that c10 errors carry."""
    return str(err).strip().split("\nException raised from")[0].strip()


# --- the job -------------------------------------------------------------------------


@dataclass
class Result:
    val_loss: float
    unigram_nats: float
    tokens_per_s: float
    steps: int
    params: int
    estimate: dict

    def json_line(self) -> str:
        return json.dumps({"val_loss": self.val_loss, "unigram_nats": self.unigram_nats,
                           "tokens_per_s": self.tokens_per_s, "steps": self.steps, "params": self.params,
                           "estimate": self.estimate})


class _InterruptFlag:
    """SIGINT handler (and any other `signals`): the first signal asks the loop to stop after the
    current step (and save); a second one raises KeyboardInterrupt at once."""

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


def _log_event(out: str, event: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "log.jsonl"), "a") as f:
        f.write(json.dumps(event) + "\n")


def run(args: argparse.Namespace) -> int:
    """Train, evaluate and sample as ``args`` says; print the final JSON line. Returns the exit code.

    ``args`` carries the CLI flags (see ``torch_tpu.demo.__main__``). Raises DemoError
    (and subclasses), data.CorpusError or torch.OutOfMemoryError for bad input; the CLI
    turns those into messages.
    """
    from tqdm import tqdm

    log = tqdm.write
    device = torch.device("tpu")
    try:
        torch.tpu.init()
        topo = torch.tpu.topology()
    except (ValueError, RuntimeError) as e:
        raise DemoError(f"cannot start the tpu runtime: {clean_error_text(e)}", exit_code=2) from None
    generation = topo["spec"]["generation"]

    # Resume: the checkpoint fixes the run's trajectory (model, data order, lr).
    resumed = None
    if args.resume:
        resumed = load_latest_checkpoint(args.out, log=log)
        if resumed is None:
            log(f"--resume: no checkpoint in {args.out}; starting a new run")
        else:
            run_cfg = resumed[0]["run"]
            for k in _RUN_KEYS:
                given = getattr(args, k)
                if given is not None and given != run_cfg[k]:
                    log(f"note: --{k.replace('_', '-')} {given} ignored: the checkpoint's run used {run_cfg[k]}")
                setattr(args, k, run_cfg[k])
    for k, v in DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)

    corpus = data.load_corpus(args.corpus, min_tokens=args.seq_len + 1)
    log(corpus.describe())
    log(f"checkpoints and log.jsonl in {os.path.abspath(args.out)}")

    if args.model_size not in PRESETS:
        raise DemoError(f"unknown --model-size {args.model_size!r}; choose one of {', '.join(PRESETS)}", 2)
    if resumed is not None:
        cfg = GPTConfig(**resumed[0]["model_config"])  # the checkpoint's shapes, even if a preset changed
    else:
        cfg = GPTConfig(seq_len=args.seq_len, **PRESETS[args.model_size])
    torch.manual_seed(args.seed)
    model = GPT(cfg)  # initialised on the host: identical weights on any device
    params = model.num_params()
    what = (f"model {args.model_size!r} ({params / 1e6:.2f} M parameters, batch {args.batch_size} x "
            f"{args.seq_len} tokens)")
    try:
        return _train(args, corpus, model, cfg, params, device, topo, generation, resumed, log)
    except torch.OutOfMemoryError as e:
        raise DemoError(oom_message(e, what)) from None


def _train(args, corpus, model, cfg, params, device, topo, generation, resumed, log) -> int:
    from tqdm import tqdm

    model.to(device)
    opt = make_optimizer(model, args.lr)
    start = 0
    lineage: List[str] = []  # checkpoints of this run kept on disk (the previous one survives a save)
    if resumed is not None:
        state, path = resumed
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        lineage = [path]
        log(f"resumed from {path} at step {start}")
    elif list_checkpoints(args.out):
        log(f"note: starting a new run in {args.out}; its older checkpoints are replaced as this run saves "
            f"(pass --resume to continue them)")

    forward, opt_step = model, opt.step
    compiled = getattr(args, "mode", "strict") == "compile"
    if compiled:
        # torch.compile(backend="tpu"): forward + backward, and the AdamW step (lr as a tensor, so
        # the schedule changes a value, not the compiled program)
        forward, opt_step = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")
        for g in opt.param_groups:
            g["lr"] = torch.tensor(float(g["lr"]))
    run_cfg = {k: getattr(args, k) for k in _RUN_KEYS}
    vbatches = data.val_batches(corpus, args.eval_batches, args.batch_size, args.seq_len, args.seed)
    tokens_per_step = args.batch_size * args.seq_len
    warmup = max(1, min(args.warmup, args.steps // 10 or 1))

    def save(step: int) -> str:
        state = {"version": CHECKPOINT_VERSION, "step": step, "model": _to_cpu(model.state_dict()),
                 "optimizer": _to_cpu(opt.state_dict()), "model_config": cfg.to_dict(), "run": run_cfg}
        path = save_checkpoint(args.out, state, keep=lineage[-(KEEP_CHECKPOINTS - 1):])
        lineage.append(path)
        _log_event(args.out, {"event": "checkpoint", "step": step, "path": path})
        return path

    def train_step(step: int, lr: float) -> float:
        """One optimizer step on the batch of ``step``; returns its training loss (nats/byte)."""
        x, y = data.train_batch(corpus, args.batch_size, args.seq_len, args.seed, step)
        for g in opt.param_groups:
            if compiled:
                g["lr"].fill_(lr)
            else:
                g["lr"] = lr
        with autocast_ctx(device, args.dtype):
            _, loss = forward(x.to(device), y.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # waits for the step's work, so the caller's clock times the whole step

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
               mininterval=0.5 if sys.stderr.isatty() else 30.0)
    interrupted = False
    try:
        with _InterruptFlag(log) as flag:
            window.start()
            window_from = step
            while step < args.steps:
                if flag.hit:
                    interrupted = True
                    break
                t0 = time.perf_counter()
                lr = lr_at(step, args.steps, args.lr, warmup)
                loss_value = train_step(step, lr)
                step += 1
                train_seconds += time.perf_counter() - t0
                train_tokens += tokens_per_step
                if not math.isfinite(loss_value):
                    raise DemoError(f"training diverged: loss {loss_value} at step {step}; try a lower --lr")
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{train_tokens / train_seconds:.0f}", refresh=False)
                bar.update(1)  # redraws at most every `mininterval` seconds
                eval_due = step % args.eval_every == 0 or step == args.steps
                ckpt_due = step % args.checkpoint_every == 0 or step == args.steps
                if eval_due or ckpt_due:
                    window.stop(step - window_from)  # evaluation and checkpoints stay out of the estimate
                    if eval_due:
                        val_loss = evaluate(model, vbatches, device, args.dtype)
                        log(f"step {step}: train loss {loss_value:.4f}, val loss {val_loss:.4f} "
                            f"({val_loss / corpus.unigram_nats:.3f} x unigram), lr {lr:.2e}")
                        _log_event(args.out, {"event": "eval", "step": step, "train_loss": loss_value,
                                              "val_loss": val_loss, "lr": lr,
                                              "tokens_per_s": train_tokens / train_seconds})
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
        print(f"interrupted at step {step}: checkpoint saved in {args.out}; "
              f"continue with --resume --out {args.out}", flush=True)
        return 130

    if val_loss is None:  # nothing trained in this process (the checkpoint was already at --steps)
        val_loss = evaluate(model, vbatches, device, args.dtype)
        log(f"step {step}: val loss {val_loss:.4f} ({val_loss / corpus.unigram_nats:.3f} x unigram)")
    if saved_step != step:
        save(step)

    text = sample(model, device, args.dtype, args.prompt, args.sample_tokens, args.seed)
    print("--- sample ---")
    print(text)
    print("--- end of sample ---")

    host_step = train_seconds / max(1, step - start)
    est = estimate.build(window, estimate.generation_specs(), generation=generation, params=params,
                         tokens_per_step=tokens_per_step, hbm_peak_bytes=torch.tpu.max_memory_allocated(),
                         host_step_seconds=host_step if step > start else None)
    est["topology"] = topo["name"]
    print(estimate.format_table(est))
    result = Result(val_loss=val_loss, unigram_nats=corpus.unigram_nats,
                    tokens_per_s=train_tokens / train_seconds if train_seconds else 0.0,
                    steps=step, params=params, estimate=est)
    _log_event(args.out, {"event": "result", **json.loads(result.json_line())})
    print(result.json_line(), flush=True)
    return 0


# Defaults of the settings a resumed run takes from its checkpoint (argparse leaves them None).
DEFAULTS = {"model_size": "small", "batch_size": 16, "seq_len": 128, "seed": 0, "lr": 2e-3, "dtype": "bf16",
            "corpus": None}
