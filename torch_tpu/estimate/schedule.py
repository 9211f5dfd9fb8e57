"""The overlap schedule: how much collective and host-offload time a training step exposes.

The dry run records, in program order, where each transfer of the measured step happens
(:class:`Timeline`): the *position* of an event is the cost model's compute seconds issued
before it. :func:`simulate` then runs the step as an XLA schedule of the recipes runs it, one
rule for every configuration:

- Compute is one resource and runs the program in order. ICI, DCN, the host link's two
  directions (``d2h``, ``h2d``: the link is full duplex) are one resource each, serial within
  themselves (FIFO in issue order), running concurrently with compute and with each other.
- **Prefetched** transfers (FSDP's all-gather of a unit's weights before its forward and again
  before its backward; the reload of a layer's offloaded activations before its backward) are
  issued one unit ahead: when the compute of the previous unit starts (the previous distinct
  position of a prefetched transfer; the first of the step, e.g. the embedding's all-gather,
  has none before it and is issued where it is needed). The compute waits at the position where
  the transfer is needed until it has finished.
- **Issued-after** transfers start where the program issues them: a unit's gradient
  reduce-scatter (and HSDP's all-reduce of the shard across slices, DCN) after its backward, a
  layer's offload to host after its forward. Gradient reductions must finish before the
  optimizer step (the *sync* position, end of the backward: the last layer's reduce-scatter and
  the DCN reduction behind it have no compute left to hide behind); a reload waits for its own
  offload (so a saturated host link shows up where the backward needs the last offloaded layers).
  Pure data parallelism (fsdp 1): the dry run prices DDP's bucket all-reduces after the backward,
  so the schedule exposes them whole (an upper bound; no published row runs pure DP).
- **Blocking** transfers (tensor-parallel all-reduces, expert all-to-alls) are needed where they
  are issued, on the ICI queue shared with FSDP's.

Exposed time per resource = the compute's waits attributed to the transfer it waited for (its
own duration first, the queueing before it to the same resource); a transfer still running
after the compute ends extends the step. Units: seconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

RESOURCES = ("ici", "dcn", "d2h", "h2d")
NEEDS = ("here", "sync", "none")


@dataclass
class Transfer:
    """One transfer of the step.

    ``pos``: compute seconds issued before it in program order. ``chain``: ``(resource,
    seconds)`` parts run one after the other (an all-gather over DCN then ICI). ``need``:
    ``"here"`` (the compute waits at ``pos``), ``"sync"`` (it waits at the sync position),
    ``"none"`` (nothing waits; it only extends the step if still running at the end).
    ``prefetch``: issued one unit ahead (see the module docstring). ``key`` / ``after``: a
    transfer with ``after=k`` starts only once the one with ``key=k`` has finished (a reload
    after its offload).
    """

    pos: float
    chain: tuple[tuple[str, float], ...]
    need: str = "here"
    prefetch: bool = False
    key: object = None
    after: object = None


def _check(transfers, compute_s, sync_pos):
    if compute_s < 0 or (sync_pos is not None and not 0 <= sync_pos <= compute_s + 1e-12):
        raise ValueError(f"schedule: compute {compute_s!r} s and sync position {sync_pos!r} s must satisfy "
                         "0 <= sync <= compute")
    keys = set()
    for t in transfers:
        if t.need not in NEEDS:
            raise ValueError(f"schedule: need must be one of {', '.join(NEEDS)}, got {t.need!r}")
        if t.need == "sync" and sync_pos is None:
            raise ValueError("schedule: a transfer needed at the sync position, but no sync position given")
        for res, s in t.chain:
            if res not in RESOURCES:
                raise ValueError(f"schedule: unknown resource {res!r}; valid: {', '.join(RESOURCES)}")
            if s < 0:
                raise ValueError(f"schedule: negative duration {s!r} s on {res}")
        if t.key is not None:
            keys.add(t.key)
    for t in transfers:
        if t.after is not None and t.after not in keys:
            raise ValueError(f"schedule: transfer after {t.after!r}, which no transfer has as its key")


def simulate(transfers: list[Transfer], compute_s: float, sync_pos: float | None = None) -> dict:
    """Runs the step's compute (``compute_s`` seconds) with ``transfers`` (program order) on
    their resources. Returns ``step_s`` (compute + exposed), ``exposed_s`` and ``busy_s`` per
    resource (:data:`RESOURCES`). Raises ValueError for an unknown resource or need, a negative
    duration, a sync position outside the compute, or an ``after`` naming no key.

    Example (hand-checkable): two layers of 1 s compute each and an all-gather of 1.5 s needed
    before each (prefetched): the first is exposed whole (1.5 s), the second is issued when the
    first layer starts (t = 1.5), ends at 3.0, while layer 0's compute ends at 2.5: 0.5 s
    exposed; the step is 2 + 1.5 + 0.5 = 4 s.
    """
    _check(transfers, compute_s, sync_pos)
    need_pos = sorted({t.pos for t in transfers if t.prefetch and t.need == "here"})
    issue = []
    for t in transfers:
        q = t.pos
        if t.prefetch:
            earlier = [p for p in need_pos if p < t.pos]
            q = earlier[-1] if earlier else t.pos
        issue.append(q)
    points = sorted({*issue, *(t.pos for t in transfers), *(() if sync_pos is None else (sync_pos,))})
    issued_at, needed_at = defaultdict(list), defaultdict(list)
    for i, t in enumerate(transfers):
        issued_at[issue[i]].append(i)
        if t.need == "here":
            needed_at[t.pos].append(i)
    synced = [i for i, t in enumerate(transfers) if t.need == "sync"]
    free = dict.fromkeys(RESOURCES, 0.0)
    busy = dict.fromkeys(RESOURCES, 0.0)
    exposed = dict.fromkeys(RESOURCES, 0.0)
    ends: dict[int, float] = {}
    key_end: dict[object, float] = {}
    stall = 0.0

    def wait(i):
        nonlocal stall
        t = transfers[i]
        now = p + stall
        if ends[i] <= now or not t.chain:
            return
        w = ends[i] - now
        stall += w
        # Attribute the wait: each part's own duration, from the last, then the queueing to the last.
        left = w
        for res, s in reversed(t.chain):
            take = min(left, s)
            exposed[res] += take
            left -= take
        exposed[t.chain[-1][0]] += left

    for p in points:
        for i in issued_at.get(p, ()):
            t = transfers[i]
            start = p + stall
            if t.after is not None:
                start = max(start, key_end[t.after])
            for res, s in t.chain:
                start = max(start, free[res])
                free[res] = start + s
                busy[res] += s
                start += s
            ends[i] = start
            if t.key is not None:
                key_end[t.key] = start
        for i in needed_at.get(p, ()):
            wait(i)
        if sync_pos is not None and p == sync_pos:
            for i in synced:
                wait(i)
    step = compute_s + stall
    tail = max(ends.values(), default=0.0)
    if tail > step:
        last = max(ends, key=ends.get)
        exposed[transfers[last].chain[-1][0]] += tail - step
        step = tail
    return {"step_s": step, "exposed_s": exposed, "busy_s": busy}


class Timeline:
    """Records the measured step's transfers with their positions (compute seconds per
    generation so far, read from the runtime's counters of tpu:``device``). ``events``: dicts
    with ``kind`` ("collective", "d2h", "h2d", "sync"), ``pos`` ({generation: seconds}) and the
    kind's data (collective: op, axis, ici_bytes, dcn_bytes, links, steps; d2h / h2d: bytes,
    key)."""

    def __init__(self, device: int):
        self.device = device
        self.events: list[dict] = []
        self.active = False

    def record(self, kind: str, **data) -> None:
        if not self.active:
            return
        import torch

        from .. import _C

        torch.tpu.synchronize(self.device)
        pos = dict(_C._stats(self.device)["device_seconds_by_generation"])
        self.events.append({"kind": kind, "pos": pos, **data})


def transfers_for(events: list[dict], generation: str, host_bytes_per_s: float) -> tuple[list[Transfer], float | None]:
    """The :class:`Transfer` list and sync position of a :class:`Timeline`'s events for
    ``generation`` (collective seconds by tpu_dist's formula, ``_C._collective_seconds``; host
    copies at ``host_bytes_per_s``)."""
    from .. import _C

    out, sync = [], None
    for e in events:
        pos = e["pos"][generation]
        if e["kind"] == "sync":
            sync = pos
        elif e["kind"] in ("d2h", "h2d"):
            s = e["bytes"] / host_bytes_per_s
            if e["kind"] == "d2h":
                out.append(Transfer(pos, (("d2h", s),), "none", key=e["key"]))
            else:
                out.append(Transfer(pos, (("h2d", s),), "here", prefetch=True, after=e["key"]))
        else:
            ici = _C._collective_seconds(generation, e["ici_bytes"], e["links"], e["steps"], 0.0)
            dcn = _C._collective_seconds(generation, 0.0, 1, 0, e["dcn_bytes"])
            parts = [("dcn", dcn), ("ici", ici)] if e["op"] == "all_gather" else [("ici", ici), ("dcn", dcn)]
            chain = tuple((r, s) for r, s in parts if s > 0)
            if e["axis"] == "fsdp" and e["op"] == "all_gather":
                out.append(Transfer(pos, chain, "here", prefetch=True))
            elif e["axis"] in ("fsdp", "dp"):  # gradient reductions: before the optimizer step
                out.append(Transfer(pos, chain, "sync"))
            else:  # tp / ep / pp: on the critical path
                out.append(Transfer(pos, chain, "here"))
    return out, sync
