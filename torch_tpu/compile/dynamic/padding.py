"""Runtime padding of a bucketed call: the inputs padded to the bucket, the true lengths
as 0-dim tensors, the outputs sliced back to their true sizes."""

from typing import Any

import torch

from .analysis import Analysis

_length_cache: dict[tuple[str, int], torch.Tensor] = {}


def length_tensor(value: int, device: torch.device) -> torch.Tensor:
    """A 0-dim int64 tensor holding a true length, on ``device``; cached (programs only read
    it), so a call does not copy it to the device again."""
    key = (str(device), value)
    t = _length_cache.get(key)
    if t is None:
        if len(_length_cache) > 4096:
            _length_cache.clear()
        t = _length_cache[key] = torch.tensor(value, dtype=torch.int64, device=device)
    return t


def input_device(analysis: Analysis, args) -> torch.device:
    """The device of the first tensor input (cpu without any)."""
    for i in analysis.tensor_inputs:
        return args[i].device
    return torch.device("cpu")


def pad_inputs(analysis: Analysis, args, buckets: dict[Any, int]) -> tuple[list[torch.Tensor], bool, torch.device]:
    """The tensor inputs zero-padded to their buckets (``F.pad``: autograd flows back through
    it), whether any needed padding, and the device the programs run on."""
    a = analysis
    out = []
    any_pad = False
    dev = None
    for i in a.tensor_inputs:
        t = args[i]
        if dev is None or (dev.type == "cpu" and t.device.type != "cpu"):
            dev = t.device
        dims = a.dyn_dims.get(i)
        if dims:
            pad: list[int] = []
            for d in reversed(range(t.dim())):
                extra = buckets.get(dims[d], t.shape[d]) - t.shape[d] if d in dims else 0
                pad += [0, extra]
            if any(pad):
                any_pad = True
                t = torch.nn.functional.pad(t, pad)
        out.append(t)
    return out, any_pad, dev if dev is not None else torch.device("cpu")


def unpad_outputs(analysis: Analysis, outs, true: dict[Any, int]) -> list:
    """Each output narrowed back to its true sizes."""
    env = {s: v for s, v in true.items()}
    res = []
    for o, exprs in zip(outs, analysis.out_exprs):
        if exprs is not None and isinstance(o, torch.Tensor):
            for d, e in enumerate(exprs):
                if not e.is_number:
                    n = int(e.subs(env))
                    if o.shape[d] != n:
                        o = o.narrow(d, 0, n)
        res.append(o)
    return res
