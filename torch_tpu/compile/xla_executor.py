"""The XLA executor (``TORCH_TPU_EXECUTOR=xla`` / ``auto``): a compiled program's StableHLO module
compiled by XLA (XLA:CPU through jaxlib, or a PJRT plugin, see :mod:`.xla`) and run on the
program's inputs in place of our tile executor.

Stream order: the chip's stream is synchronized before the inputs are read (the work queued
before the call has run), the results are written back to the chip's memory before the call
returns, so later work sees them. Contiguous chip inputs go to XLA:CPU through DLPack without a
copy (the vTPU's HBM is host memory; private ``jax._src.lib._jax.dlpack_managed_tensor_to_buffer``),
others as host arrays (one copy); host views of the results come from XLA's buffers through
DLPack (no copy) and are copied once onto the chip.
A program whose module holds a custom call (an op with no StableHLO lowering), reads a
non-tensor value, or that XLA rejects, runs on our executor; the reason is appended to
``compile_stats()["xla_fallbacks"]``.

``auto`` picks per program, deterministically from the program alone (so the choice is the
same whenever the program is built or loaded, never re-timed): see :func:`auto_picks_xla`
(XLA:CPU measured faster on matmuls and on small elementwise chains, ours on reductions and
large chains; bench/README.md).
"""

import hashlib
import logging
import os
import threading

import torch

from . import cache, stats
from .hlo_emit import parse_type
from .stablehlo import lower

log = logging.getLogger("torch_tpu.compile")

EXECUTORS = ("tile", "xla", "auto")
AUTO_MAX_ELEMENTS = 1 << 21  # 2M elements


def executor_setting() -> str:
    """``TORCH_TPU_EXECUTOR``: ``tile`` (ours, the default), ``xla`` or ``auto``.

    Raises:
        ValueError: another value.
    """
    v = (os.environ.get("TORCH_TPU_EXECUTOR") or "tile").strip().lower()
    if v not in EXECUTORS:
        raise ValueError(f"TORCH_TPU_EXECUTOR={v!r}: expected one of {', '.join(EXECUTORS)}")
    return v


def auto_picks_xla(desc) -> bool:
    """``auto``'s choice for a program (a pure function of its description): XLA when its module
    is complete and it holds a matmul or convolution, or when it is reduction-free and no tensor
    has more than :data:`AUTO_MAX_ELEMENTS` elements; ours otherwise (bench/README.md)."""
    low = lower(desc, "auto")
    if not low.complete:
        return False
    if "stablehlo.dot_general" in low.text or "stablehlo.convolution" in low.text:
        return True
    if "stablehlo.reduce" in low.text:
        return False
    biggest = 0
    for t in list(desc["input_types"]) + list(desc.get("output_types", [])):
        tt = parse_type(t)
        if tt is not None:
            biggest = max(biggest, _numel(tt.shape))
    for st in desc["steps"]:
        tt = parse_type(st.get("type") or "")
        if tt is not None:
            biggest = max(biggest, _numel(tt.shape))
        for _dt, shape in st.get("types", []) if st["kind"] == "region" else []:
            biggest = max(biggest, _numel(shape))
    return biggest <= AUTO_MAX_ELEMENTS


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class XlaProgram:
    """A program run by XLA; `fallback` (our :class:`.program.Program`) runs it when XLA cannot.

    Calling it (boxed: one list of inputs, which it empties) returns the outputs as a list.
    """

    _boxed_call = True

    def __init__(self, desc, fallback, key: str | None, name: str):
        self.desc = desc
        self.fallback = fallback
        self.key = key
        self.name = name
        self.reason: str | None = None
        self._exe: dict[str, object] = {}
        self._lock = threading.Lock()
        self.regions = fallback.regions
        self.num_kernels = fallback.num_kernels

    def _fail(self, reason: str) -> None:
        self.reason = reason
        stats.append("xla_fallbacks", f"{self.name}: {reason}")
        log.info("%s runs on the tile executor: %s", self.name, reason)

    def _executable(self, precision: str):
        """(Lowered, executable) for the current matmul precision; None when XLA cannot run it."""
        with self._lock:
            if precision in self._exe:
                return self._exe[precision]
            from . import xla

            entry = None
            try:
                low = lower(self.desc, "main_module", precision)
                cpu = _cpu_tensors(self.desc)
                if not low.complete:
                    self._fail("; ".join(low.problems[:3]))
                elif cpu:
                    self._fail(cpu)
                elif (precision != "HIGHEST" and xla.backend().platform == "cpu"
                      and ("dot_general" in low.text or "convolution" in low.text)):
                    # XLA:CPU computes float32 dots in full precision whatever precision_config says
                    self._fail(f"matmul precision {precision}: XLA:CPU ignores precision_config")
                    self.reason = None  # another precision level may still run on XLA
                else:
                    entry = (low, _load_or_compile(low.text, self.key, precision))
            except Exception as e:  # noqa: BLE001 (XLA rejects the module, jaxlib absent...: ours runs it)
                if isinstance(e, xla.XlaUnavailable) and os.environ.get("TORCH_TPU_PJRT_PLUGIN"):
                    raise
                self._fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            self._exe[precision] = entry
            return entry

    def __call__(self, args: list) -> list:
        from .stablehlo import _precision

        entry = None if self.reason else self._executable(_precision())
        if entry is None or any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in args):
            return self.fallback(args)
        low, exe = entry
        from . import xla

        inputs = list(args)
        args.clear()
        device = _device_of(inputs)
        for d in {t.device for t in inputs if isinstance(t, torch.Tensor) and t.device.type == "tpu"}:
            torch.tpu.synchronize(d)  # stream order: the work queued before this call has run
        host = [xla_input(inputs[i], exe) for i in low.params]
        outs = xla.run(exe, host)
        res = [_to_torch(o, device) for o in outs]
        for i, r in low.mutations:
            inputs[i].copy_(res[r])
        stats.add("xla_programs")
        stats.add("programs_run")
        out = _build(low.outputs, res)
        return list(out) if isinstance(out, (list, tuple)) else [out]


def xla_input(t, exe):
    """`t` as an XLA:CPU buffer: the chip tensor's own memory through DLPack when it is
    contiguous (no copy; the caller has synchronized the stream), else :func:`host_array`."""
    if isinstance(t, torch.Tensor) and t.device.type == "tpu" and t.is_contiguous() and t.numel() > 0:
        try:
            from jax._src.lib import _jax

            if exe.local_devices()[0].platform == "cpu":
                return _jax.dlpack_managed_tensor_to_buffer(torch.utils.dlpack.to_dlpack(t.detach()),
                                                            exe.local_devices()[0], None)
        except Exception as e:  # noqa: BLE001 (a layout or dtype DLPack cannot carry: one copy)
            log.debug("XLA input by copy: %s", e)
    return host_array(t)


def _cpu_tensors(desc) -> str | None:
    """Why a program makes CPU tensors (a factory with ``device="cpu"``), else None: XLA's
    results all go to the chip."""
    def walk(a):
        if isinstance(a, dict):
            if a.get("device", "").startswith("cpu"):
                return True
            return any(walk(v) for v in (a.get("l") or (a.get("d") or {}).values()))
        return False

    for st in desc["steps"]:
        if st["kind"] in ("call", "getitem") and (walk(st["args"]) or walk(st["kwargs"])):
            return f"{st.get('op')} makes a CPU tensor (XLA's results all go to the chip)"
    return None


def host_array(t):
    """A tensor's values as a host array XLA takes (bf16 as ml_dtypes.bfloat16); a chip tensor is
    read after its stream has run the work queued before (one copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"XLA executor: input {type(t).__name__} is not a tensor")
    h = t.detach()
    if h.device.type != "cpu":
        h = h.cpu()  # waits for the chip's stream: the work queued before this call has run
    if h.dtype == torch.bfloat16:
        import ml_dtypes  # jax's dependency

        return h.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return h.contiguous().numpy()


def _device_of(inputs):
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return t.device
    return torch.device("tpu")


def _to_torch(arr, device):
    try:
        h = torch.from_dlpack(arr)  # XLA:CPU's buffer, no copy
    except Exception:  # noqa: BLE001 (a dtype DLPack cannot carry)
        import numpy as np

        h = torch.from_numpy(np.asarray(arr).copy())
    return h.to(device)


def _build(enc, res):
    if isinstance(enc, dict):
        if "r" in enc:
            return res[enc["r"]]
        if "c" in enc:
            return enc["c"]
        if "l" in enc:
            xs = [_build(x, res) for x in enc["l"]]
            return tuple(xs) if enc.get("t") else xs
        if "d" in enc:
            return {k: _build(v, res) for k, v in enc["d"].items()}
    return enc


def _load_or_compile(text: str, key: str | None, precision: str):
    """The executable of `text`: from ``$TORCH_TPU_CACHE_DIR/programs/xla`` when an entry of the
    same program key, precision and XLA version exists, else compiled (and stored)."""
    from . import xla

    be = xla.backend()
    path = None
    if key is not None and os.environ.get("TORCH_TPU_CACHE_DIR", None) != "":
        k = hashlib.sha256(f"{key}|{precision}|{xla.version()}|{be.platform}|{be.platform_version}|"
                           f"{hashlib.sha256(text.encode()).hexdigest()}".encode()).hexdigest()[:32]
        path = os.path.join(cache.cache_dir(), "xla", f"{k}.xla")
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    return be.deserialize_executable(f.read(), xla.device_list())
            except Exception as e:  # noqa: BLE001 (stale or corrupt entry: recompile)
                log.info("XLA cache entry %s unusable (%s): recompiling", path, e)
    exe = xla.compile_module(text)
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(exe.serialize())
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 (a cache write failure never fails the program)
            log.info("XLA cache entry %s not written: %s", path, e)
    return exe


def wrap(prog, desc, key: str | None, name: str):
    """`prog` as the current ``TORCH_TPU_EXECUTOR`` runs it: itself (``tile``), or an :class:`XlaProgram`."""
    setting = executor_setting()
    if setting == "tile" or (setting == "auto" and not auto_picks_xla(desc)):
        return prog
    return XlaProgram(desc, prog, key, name)
