"""The demo trained with FSDP2 over ``tpu_dist``: one process per vTPU chip, the loop of loop.py.

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
import os
import re
import shutil
import signal

import torch
import torch.distributed as dist

from .._units import format_bytes
from ..estimate.models.gpt import GPT
from . import loop
from .errors import CheckpointError, DemoError, clean_error_text

_DCP_RE = re.compile(r"^dcp-(\d+)$")
LATEST_DCP = "latest-dcp"  # text file in --out naming the newest complete DCP checkpoint
META = "demo.json"  # inside a DCP folder; its presence marks the save as complete


def _world() -> tuple[int, int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    except KeyError:
        raise DemoError("--fsdp runs one process per chip: launch it with "
                        "`python -m torch_tpu.run -n 4 -m torch_tpu.demo --fsdp ...` (or torchrun)", 2) from None


def list_dcp_checkpoints(out: str) -> list[tuple[int, str]]:
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


def publish_dcp(out: str, path: str, meta: dict, step: int, keep: list[str]) -> None:
    """Rank 0's part of a save once every shard of ``path`` is written: write ``demo.json`` (which
    marks it complete), point ``out/latest-dcp`` at it, and delete the other complete checkpoints
    of ``out`` except ``keep`` (this run's previous ones): by lineage, not step number, so that a
    new run never deletes what it just saved because an older run reached higher steps."""
    tmp = os.path.join(path, META + ".tmp")
    with open(tmp, "w") as f:
        json.dump({**meta, "step": step}, f)
    os.replace(tmp, os.path.join(path, META))
    with open(os.path.join(out, LATEST_DCP + ".tmp"), "w") as f:
        f.write(os.path.basename(path) + "\n")
    os.replace(os.path.join(out, LATEST_DCP + ".tmp"), os.path.join(out, LATEST_DCP))
    keep_set = {os.path.abspath(p) for p in keep} | {os.path.abspath(path)}
    for _, old in list_dcp_checkpoints(out):
        if os.path.abspath(old) not in keep_set:
            shutil.rmtree(old, ignore_errors=True)


def find_dcp_checkpoint(out: str) -> tuple[dict, str] | None:
    """``(meta, path)`` of the checkpoint to resume: the one ``out/latest-dcp`` names when it is
    complete, else the complete one with the highest step; None if ``out`` has none."""
    try:
        with open(os.path.join(out, LATEST_DCP)) as f:
            named = os.path.join(out, f.read().strip())
    except OSError:
        named = None
    found = [p for _, p in list_dcp_checkpoints(out)]
    if named is not None and os.path.abspath(named) in {os.path.abspath(p) for p in found}:
        path = named
    elif found:
        path = found[0]
    else:
        return None
    with open(os.path.join(path, META)) as f:
        return json.load(f), path


def save_dcp(out: str, step: int, model, opt, meta: dict, rank: int, keep: list[str]) -> str:
    """Save model and optimizer shards of every rank to ``out/dcp-<step>/``; rank 0 then publishes
    it (:func:`publish_dcp`, keeping ``keep``). Collective: every rank must call it."""
    import torch.distributed.checkpoint as dcp

    path = os.path.join(out, f"dcp-{step:07d}")
    dcp.save(_state_dicts(model, opt), checkpoint_id=path)  # returns once every rank's shards are written
    if rank == 0:
        publish_dcp(out, path, meta, step, keep)
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


class FSDPJob(loop.Job):
    """This rank's part: its rows of every batch, DCP checkpoints, rank 0 alone prints. Ctrl-C
    (the launcher forwards it to every rank) or SIGTERM: the ranks vote in the next step, all
    stop after it and save."""

    checkpoint_noun = "DCP checkpoint"
    stop_signals = (signal.SIGINT, signal.SIGTERM)
    votes_to_stop = True

    def __init__(self, device: torch.device, topo: dict, rank: int, world: int):
        super().__init__(device, topo)
        self.rank, self.world = rank, world
        self.oom_prefix = f"rank {rank}: "
        self.lineage: list[str] = []  # this run's DCP checkpoints (the previous one survives a save)

    def check(self, args) -> None:
        if args.batch_size % self.world:
            raise DemoError(f"--batch-size {args.batch_size} (the global batch) is not a multiple of the "
                            f"{self.world} ranks", 2)

    def describe(self, args) -> str:
        return (f"FSDP2 over tpu_dist: {self.world} ranks on {self.topo['name']}, global batch {args.batch_size} "
                f"({args.batch_size // self.world} per rank); DCP checkpoints and log.jsonl in "
                f"{os.path.abspath(args.out)}")

    def describe_batch(self, args) -> str:
        return f"{args.batch_size // self.world} x {args.seq_len} tokens per rank, FSDP2 over {self.world} ranks"

    def find_checkpoint(self, out: str) -> tuple[dict, str] | None:
        return find_dcp_checkpoint(out)

    def place(self, model: GPT) -> GPT:
        return shard_model(model.to(self.device))

    def load(self, resumed: tuple[dict, str], model, opt) -> None:
        path = resumed[1]
        try:
            load_dcp(path, model, opt)
        except Exception as e:  # noqa: BLE001  (DCP raises CheckpointException wrapping each rank's error)
            raise CheckpointError(f"--resume: cannot load {path}: {clean_error_text(e)}") from None
        self.lineage = [path]

    def save(self, out: str, step: int, model, opt, meta: dict) -> str:
        path = save_dcp(out, step, model, opt, {**meta, "world_size": self.world}, self.rank,
                        keep=self.lineage[-(loop.KEEP_CHECKPOINTS - 1):])
        self.lineage.append(path)
        return path

    def rows(self, batch_size: int) -> slice:
        b = batch_size // self.world
        return slice(self.rank * b, (self.rank + 1) * b)

    def mean(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return float(t.item())

    def step_result(self, loss: torch.Tensor, stop: bool) -> tuple[float, bool]:
        # The gradients were reduce-scattered in backward (FSDP2: mean over ranks); one collective
        # here for the loss of the global batch and the stop vote.
        both = torch.stack([loss.detach().float(), torch.tensor(float(stop), device=self.device)])
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
        total, stops = both.tolist()
        return total / self.world, stops > 0

    def finish_estimate(self, est: dict, window) -> str:
        est["per_chip"] = True  # step time, MFU and HBM are one chip's share of the sharded step
        steps_measured = max(window.steps, 1)
        est["ici_s_per_step"] = window.total["ici_seconds"] / steps_measured
        est["ici_bytes_per_step"] = window.total["ici_bytes"] / steps_measured
        return (f"  (per chip, {self.world} chips; collectives add {est['ici_s_per_step'] * 1e3:.3f} ms of "
                f"estimated ICI time per step, {format_bytes(est['ici_bytes_per_step'])})")

    def result_fields(self) -> dict:
        return {"world_size": self.world, "fsdp": True}


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
        return loop.train(args, FSDPJob(device, topo, rank, world))
    finally:
        dist.destroy_process_group()
