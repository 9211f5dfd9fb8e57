"""Check compiled programs against XLA:CPU: every Program run inside :func:`recording` is lowered
to StableHLO, parsed, verified, compiled by XLA:CPU through jaxlib and run on the same inputs;
its results are compared with our executor's."""

import contextlib

import torch

from torch_tpu.compile import program as program_mod
from torch_tpu.compile import stablehlo, xla
from torch_tpu.compile.xla_executor import host_array


def to_host(t):
    return t.detach().cpu() if isinstance(t, torch.Tensor) else t


def run_lowered(low, inputs: list) -> tuple[list, dict]:
    """Compile `low` (a :class:`stablehlo.Lowered`) with XLA and run it on `inputs` (the program's
    inputs): (results as CPU tensors, {input index: new value})."""
    exe = xla.compile_module(low.text)
    args = [host_array(inputs[i]) for i in low.params]
    outs = xla.run(exe, args)
    return [_to_torch(o) for o in outs]


def _to_torch(o):
    try:
        return torch.from_dlpack(o)
    except Exception:  # noqa: BLE001 (a dtype DLPack cannot carry)
        import numpy as np

        return torch.from_numpy(np.asarray(o).copy())


@contextlib.contextmanager
def recording():
    """Within it, every program run is recorded as (Program, inputs on CPU, our outputs on CPU,
    the StableHLO precision of its matmuls)."""
    seen = []
    orig = program_mod.Program.__call__

    def call(self, args):
        ins = [to_host(a) for a in args]
        precision = stablehlo._precision()  # the level the program's matmuls run at
        out = orig(self, args)
        seen.append((self, ins, [to_host(o) for o in out], precision))
        return out

    program_mod.Program.__call__ = call
    try:
        yield seen
    finally:
        program_mod.Program.__call__ = orig


def compare(seen, atol=1e-4, rtol=1e-4) -> list[str]:
    """Lower, verify, compile and run each recorded program; assert XLA's values equal ours.
    Returns the names of the custom calls met (programs with them are checked for parsing only)."""
    customs = []
    for prog, ins, ours, precision in seen:
        low = stablehlo.lower(prog.desc, "m", precision)
        xla.parse(low.text)
        if low.custom_calls:
            customs += [c for c, _ in low.custom_calls]
            continue
        got = run_lowered(low, ins)
        if precision != "HIGHEST" and "dot_general" in low.text:
            continue  # XLA:CPU computes float32 dots in full precision whatever the precision config
        flat = _flatten(low.outputs)
        assert len(flat) == len(ours), (len(flat), len(ours))
        for o, ref in zip(flat, ours):
            if "r" in o:
                x = got[o["r"]]
                torch.testing.assert_close(x.to(ref.dtype) if ref.dtype != x.dtype else x, ref, atol=atol, rtol=rtol)
    return customs


def _flatten(enc):
    if isinstance(enc, dict) and "l" in enc:
        return [y for x in enc["l"] for y in _flatten(x)]
    return [enc]
