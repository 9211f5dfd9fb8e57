"""What the demo's training step would cost on real TPU generations.

Inputs come from the runtime's cost model (``torch_tpu.runtime.stats()``: estimated
device seconds per generation for the ops that ran) and from the HBM allocator
(``torch.tpu.max_memory_allocated()``: peak physical bytes, tiled layout). For each
generation this module reports:

- ``step_time_s``: estimated device seconds per training step (stats delta / steps);
- ``mfu``: model FLOPs utilisation (``torch_tpu.estimate.flops.mfu``) of the 6·N·T model FLOPs
  (forward 2·N·T plus backward 4·N·T, attention not counted);
- ``hbm_bytes`` and ``fits``: the generation's HBM per chip and whether the measured
  peak fits in it.

Per-generation chip specs (peak bf16 FLOP/s, HBM bytes) come from the runtime's own
table, ``torch_tpu.runtime.generations()`` (sources in csrc/vtpu/spec.cc).
"""

from __future__ import annotations

import torch

import torch_tpu.runtime

from .._units import format_bytes
from ..estimate.flops import dense_flops_per_token, mfu

# Generations always reported side by side (the chosen one is added when it is another).
COMPARED_GENERATIONS = ("v5e", "v6e", "v5p", "tpu7x")

# Additive keys of stats(): deltas over a window are meaningful for these.
_ADDITIVE = ("ops", "host_seconds", "flops", "bytes_read", "bytes_written", "device_seconds",
             "mxu_seconds", "vpu_seconds", "hbm_seconds", "overhead_seconds", "ici_seconds", "ici_bytes")


def generation_specs() -> dict[str, dict]:
    """``{generation: spec}`` from the runtime's generation table (peak_bf16_flops in FLOP/s,
    hbm_bytes in bytes per chip, ...)."""
    return {g["generation"]: dict(g) for g in torch_tpu.runtime.generations()}


class StatsWindow:
    """Accumulates the runtime's cost-model statistics over chosen stretches of the run
    (training steps), leaving out what happens between them (evaluation, checkpoints).

    ``start()`` / ``stop(steps)`` bracket a stretch; each reads ``torch_tpu.runtime.stats()``
    after synchronizing the device so that queued ops are counted.
    """

    def __init__(self):
        self.total: dict[str, float] = {k: 0.0 for k in _ADDITIVE}
        self.by_generation: dict[str, float] = {}
        self.steps = 0
        self._mark: dict | None = None

    @staticmethod
    def _read() -> dict:
        torch.tpu.synchronize()
        return torch_tpu.runtime.stats()

    def start(self) -> None:
        self._mark = self._read()

    def stop(self, steps: int) -> None:
        """Close the stretch that ``start()`` opened; it held ``steps`` training steps."""
        if self._mark is None:
            return
        now, then = self._read(), self._mark
        self._mark = None
        for k in _ADDITIVE:
            self.total[k] += float(now.get(k, 0.0)) - float(then.get(k, 0.0))
        before = then["device_seconds_by_generation"]
        for g, s in now["device_seconds_by_generation"].items():
            self.by_generation[g] = self.by_generation.get(g, 0.0) + s - before.get(g, 0.0)
        self.steps += steps


def build(window: StatsWindow, specs: dict[str, dict], *, generation: str, params: int,
          tokens_per_step: int, hbm_peak_bytes: int, host_step_seconds: float | None = None) -> dict:
    """The ``estimate`` object of the demo's final JSON line.

    ``params``: model parameters; ``tokens_per_step``: batch_size * seq_len;
    ``hbm_peak_bytes``: peak physical HBM bytes of the run; ``host_step_seconds``:
    measured wall seconds per step on the vTPU (for reference beside the estimates).
    Generations reported: ``generation`` first, then COMPARED_GENERATIONS.
    """
    steps = max(window.steps, 1)
    model_flops = dense_flops_per_token(params) * tokens_per_step  # FLOPs per training step
    gens: list[str] = [generation] + [g for g in COMPARED_GENERATIONS if g != generation]
    per_gen = {}
    for g in gens:
        spec = specs.get(g)
        dev_s = window.by_generation.get(g)
        step_time = dev_s / steps if dev_s is not None else None
        entry = {"step_time_s": step_time, "mfu": None, "peak_bf16_flops": None, "hbm_bytes": None, "fits": None}
        if spec is not None:
            entry["peak_bf16_flops"] = spec["peak_bf16_flops"]
            entry["hbm_bytes"] = int(spec["hbm_bytes"])
            entry["fits"] = bool(hbm_peak_bytes <= spec["hbm_bytes"])
            entry["mfu"] = mfu(model_flops, step_time, spec["peak_bf16_flops"])
        per_gen[g] = entry
    return {
        "generation": generation,
        "steps_measured": window.steps,
        "tokens_per_step": tokens_per_step,
        "model_flops_per_step": model_flops,
        "counted_flops_per_step": window.total["flops"] / steps,
        "hbm_bytes_per_step": (window.total["bytes_read"] + window.total["bytes_written"]) / steps,
        "ops_per_step": window.total["ops"] / steps,
        "host_step_s": host_step_seconds,
        # Seconds per step the vTPU's stream workers spent computing (measured, this host).
        "vtpu_busy_s_per_step": window.total["host_seconds"] / steps,
        # The chosen generation's estimate split by unit (seconds per step; the roofline takes
        # the max of the MXU, VPU and HBM terms per op, so the parts need not add up).
        "breakdown_s_per_step": {k.replace("_seconds", ""): window.total[k] / steps
                                 for k in ("mxu_seconds", "vpu_seconds", "hbm_seconds", "overhead_seconds")},
        "hbm_peak_bytes": int(hbm_peak_bytes),
        "by_generation": per_gen,
    }


def format_table(est: dict) -> str:
    """A human-readable table of :func:`build`'s result, one line per generation."""
    lines = [f"estimated cost on TPU generations ({est['steps_measured']} training steps measured, "
             f"{est['model_flops_per_step'] / 1e9:.2f} GFLOP/step by 6·N·T, HBM peak "
             f"{format_bytes(est['hbm_peak_bytes'])} physical):",
             f"  {'generation':<10} {'step time':>12} {'MFU':>8} {'HBM/chip':>11}  fits"]
    for g, e in est["by_generation"].items():
        st = f"{e['step_time_s'] * 1e3:.3f} ms" if e["step_time_s"] is not None else "?"
        mfu_text = f"{100 * e['mfu']:.1f}%" if e["mfu"] is not None else "?"
        fits = {True: "yes", False: "NO", None: "?"}[e["fits"]]
        mark = " (chosen)" if g == est["generation"] else ""
        lines.append(f"  {g:<10} {st:>12} {mfu_text:>8} {format_bytes(e['hbm_bytes']):>11}  {fits}{mark}")
    if est.get("host_step_s"):
        lines.append(f"  (the vTPU took {est['host_step_s'] * 1e3:.0f} ms of host time per step)")
    return "\n".join(lines)
