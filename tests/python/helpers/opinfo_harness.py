"""OpInfo conformance: runs PyTorch's ``op_db`` sample inputs on ``tpu`` against CPU.

Shared by ``tests/python/ops/test_opinfo.py`` (pytest: the CI shard, or the whole
matrix with TORCH_TPU_CONFORMANCE=full) and ``scripts/conformance.py`` (the
whole matrix in crash/hang-isolated workers, figures per dtype and kind).

A *case* is (op, dtype, kind); dtypes float32, bfloat16, int64, bool where the
op supports them on CPU (``op.supported_dtypes("cpu")``):

- ``forward``:   every sample runs on CPU (the oracle) and on tpu; outputs
                 (after the sample's ``output_process_fn_grad``) are compared.
- ``grad``:      float32; ``torch.autograd.grad`` of the differentiable outputs
                 with a random cotangent, w.r.t. every input that requires grad.
- ``noncontig``: like forward, with every tensor input made non-contiguous on
                 each side (``SampleInput.noncontiguous``: on tpu a strided view of
                 a larger tpu buffer, built by tpu ops).
- ``out``:       ops with ``supports_out``: the out= variant writing into tpu
                 tensors, once correctly sized and once empty (the op resizes
                 them), compared with the functional CPU result; the returned
                 tensors must be the out tensors. Samples whose out= CPU rejects
                 too are not counted.

Samples are generated on CPU with a per-case seed, then copied: one copy stays
on CPU, one goes to tpu with the same strides and storage offset (leaves stay
leaves: ``.to("tpu").requires_grad_(x.requires_grad)``), so both sides see
identical values. When the CPU rejects a sample (raises), tpu must raise the
same exception type. Tolerances: assert_close's defaults for float32,
1.6e-2 for bfloat16, exact for integer/bool outputs; the OpInfo's own
toleranceOverride/precisionOverride; TOLERANCE_OVERRIDES below, each with a
reason.

Random ops (sampling, dropout, random projections) cannot be compared by value:
shapes, dtypes, device and finiteness are compared, and for >= 100 values the
mean and spread (a large extra sample per random op makes that meaningful).
Ops returning uninitialised memory (``empty*``) are compared by shape/dtype.
Skipped cases live in ``opinfo_skips.py``, each with a reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.testing._internal import common_utils as _common_utils
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo import core as _opinfo_core
from torch.testing._internal.opinfo.core import DecorateInfo, OpInfo, SampleInput

DEVICE = "tpu"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
}
KINDS = ("forward", "grad", "noncontig", "out")

# assert_close's defaults for float32; bfloat16 as in torch.testing's table.
DEFAULT_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1.3e-6, 1e-5),  # (rtol, atol)
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# Ops whose values are random (or uninitialised memory): compared by
# shape / dtype / device / finiteness, never by value.
RANDOM_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
    "normal", "normal.number_mean", "normal.in_place", "uniform",
    "rand_like", "randint", "randint_like", "randn", "randn_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu",
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
    "torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward",
    # random projections inside
    "svd_lowrank", "pca_lowrank",
})

# Per-op tolerance widenings: {(full_name, dtype_name, kind or '*'): ((rtol, atol), reason)}.
# Applied on top of the OpInfo's own toleranceOverride / precisionOverride.
TOLERANCE_OVERRIDES: dict[tuple[str, str, str], tuple[tuple[float, float], str]] = {}


def full_name(op: OpInfo) -> str:
    """``name`` or ``name.variant_test_name``: the key used in the skip file and reports."""
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


OPS: dict[str, OpInfo] = {full_name(op): op for op in op_db}


# Ops returning uninitialised memory: not even finiteness can be compared.
UNINIT_OPS = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                        "new_empty_strided"})


# Random ops whose draws have no usable mean/variance for a statistical check.
HEAVY_TAILED = frozenset({"cauchy", "log_normal"})


def draws_inside(op: OpInfo, s: SampleInput) -> bool:
    """A sample of an otherwise deterministic op that draws from the device generator inside
    (fractional pooling without ``_random_samples``, attention dropout): the chip's Philox
    stream is not CPU's, so such a sample is compared as a random op's."""
    if op.name.startswith("nn.functional.fractional_max_pool"):
        return s.kwargs.get("_random_samples") is None
    if op.name == "nn.functional.scaled_dot_product_attention":
        return bool(s.kwargs.get("dropout_p", 0.0))
    if op.name == "nn.functional.multi_head_attention_forward":  # dropout_p: the 11th argument
        p = s.args[9] if len(s.args) > 9 else s.kwargs.get("dropout_p", 0.0)
        return bool(p) and s.kwargs.get("training", True)
    return False


def is_random(op: OpInfo) -> bool:
    return full_name(op) in RANDOM_OPS or op.name in RANDOM_OPS or op.has_nondeterministic_output


# ---------------------------------------------------------------- skips

def load_skips() -> dict:
    from helpers.opinfo_skips import SKIPS
    return SKIPS


def skip_reason(skips: dict, name: str, dtype: str, kind: str) -> str | None:
    """The skip-file reason for this case, or None. Keys: (op, dtype or '*', kind)."""
    return skips.get((name, dtype, kind)) or skips.get((name, "*", kind))


def applicable(op: OpInfo, dtype: str, kind: str) -> str | None:
    """None when the case exists, else why it does not (not counted anywhere)."""
    dt = DTYPES[dtype]
    if dt not in op.supported_dtypes("cpu"):
        return f"{dtype} not supported by the op on cpu"
    if kind == "grad":
        if dtype != "float32":
            return "gradients are checked in float32 only"
        if not op.supports_autograd:
            return "op does not support autograd"
        if dt not in op.supported_backward_dtypes("cpu"):
            return "float32 backward not supported on cpu"
    if kind == "out" and not op.supports_out:
        return "op has no out= variant"
    return None


# ---------------------------------------------------------------- tolerances

def _tol_from_decorator(dec: Any, dt: torch.dtype) -> tuple[float, float] | None:
    if isinstance(dec, toleranceOverride) and dt in dec.d:
        return (dec.d[dt].rtol, dec.d[dt].atol)
    if isinstance(dec, precisionOverride) and dt in dec.d:
        return (DEFAULT_TOL.get(dt, (0.0, 0.0))[0], dec.d[dt])
    return None


def tolerance(op: OpInfo, dtype: str, kind: str) -> tuple[float | None, float | None, str]:
    """(rtol, atol, where-from) for a case; (None, None) means exact for integer/bool."""
    dt = DTYPES[dtype]
    if not dt.is_floating_point:
        # Integer/bool cases: exact for integer outputs, assert_close's defaults
        # for floating outputs (e.g. int64 inputs of ops returning float32).
        return None, None, "per-output dtype defaults"
    rtol, atol = DEFAULT_TOL[dt]
    source = "default"
    # The OpInfo's own overrides: op-wide, or for the CPU-vs-device test.
    for d in op.decorators:
        if isinstance(d, DecorateInfo):
            if d.test_name not in (None, "test_compare_cpu"):
                continue
            if d.device_type not in (None, "cpu") or (d.dtypes is not None and dt not in d.dtypes):
                continue
            decs = d.decorators
        else:
            decs = [d]
        for dec in decs:
            t = _tol_from_decorator(dec, dt)
            if t:
                rtol, atol = max(rtol, t[0]), max(atol, t[1])
                source = "opinfo"
    name = full_name(op)
    for key in ((name, dtype, kind), (name, dtype, "*"), (name, "*", kind), (name, "*", "*")):
        if key in TOLERANCE_OVERRIDES:
            (r, a), why = TOLERANCE_OVERRIDES[key]
            rtol, atol, source = max(rtol, r), max(atol, a), "override: " + why
            break
    return rtol, atol, source


# ---------------------------------------------------------------- moving samples

def _copy_tensor(x: torch.Tensor, device: str) -> torch.Tensor:
    """A copy of x on `device` with x's strides and storage offset.

    Views into a larger storage (partial views, non-contiguous samples) are
    copied with their whole storage, so as_strided-style samples stay valid and
    non-contiguous inputs stay non-contiguous on tpu.
    """
    x = x.detach()
    n = x.untyped_storage().nbytes() // x.element_size()
    if x.layout != torch.strided or (x.is_contiguous() and x.storage_offset() == 0 and n == x.numel()):
        return x.to(device) if device != "cpu" else x.clone()
    whole = x.as_strided((n,), (1,), 0)
    whole = whole.to(device) if device != "cpu" else whole.clone()
    return whole.as_strided(x.shape, x.stride(), x.storage_offset())


def _leaf_to(device: str) -> Callable[[Any], Any]:
    def f(x):
        if isinstance(x, torch.Tensor):
            y = _copy_tensor(x, device)
            return y.requires_grad_(x.requires_grad) if y.is_floating_point() or y.is_complex() else y
        return x
    return f


def _is_cpu_device(v: Any) -> bool:
    return (isinstance(v, torch.device) and v.type == "cpu") or v == "cpu"


# Tensor arguments an op requires on the host (as with CUDA): {op: positional indices}.
HOST_ARGS: dict[str, tuple[int, ...]] = {
    "tensor_split": (0,),  # tensor_indices_or_sections must be a CPU tensor
}


def copy_sample(sample: SampleInput, device: str, op_name: str = "") -> SampleInput:
    """A copy of a CPU sample on `device`: fresh leaves, 'cpu' device arguments mapped."""
    s = sample.transform(_leaf_to(device))
    if device == "cpu":
        return s
    args = list(s.args)
    for i in HOST_ARGS.get(op_name, ()):
        if i < len(args) and isinstance(sample.args[i], torch.Tensor):
            args[i] = sample.args[i].detach().clone()
    s.args = tuple(torch.device(device) if _is_cpu_device(a) else a for a in args)
    s.kwargs = {k: torch.device(device) if k == "device" and _is_cpu_device(v) else v
                for k, v in s.kwargs.items()}
    return s


def on_device(s: SampleInput) -> bool:
    """Whether a tpu sample involves the device at all (else results rightly stay on CPU)."""
    return any(t.device.type == DEVICE for t in sample_tensors(s)) or \
        any(isinstance(a, torch.device) and a.type == DEVICE for a in list(s.args) + list(s.kwargs.values()))


def tensors_in(x: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            out.extend(tensors_in(e))
    elif isinstance(x, dict):
        for e in x.values():
            out.extend(tensors_in(e))
    return out


def sample_tensors(s: SampleInput) -> list[torch.Tensor]:
    return tensors_in(s.input) + tensors_in(list(s.args)) + tensors_in(s.kwargs)


# ---------------------------------------------------------------- comparison

class Mismatch(AssertionError):
    pass


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor[{tuple(x.shape)}, {x.dtype}, {x.device}]"
    return f"{type(x).__name__}({x!r})"[:200]


def _compare_random(a: torch.Tensor, e: torch.Tensor, path: str, heavy_tailed: bool) -> None:
    """Random values: finite where CPU's are, and (for >= 100 values) the same mean
    and spread within loose statistical bounds (same distribution, independent draws)."""
    if e.is_floating_point() and bool(torch.isfinite(e).all()) and not bool(torch.isfinite(a).all()):
        raise Mismatch(f"{path}: random op produced non-finite values on {DEVICE}")
    if heavy_tailed or e.numel() < 100 or not bool(torch.isfinite(e).all()):
        return
    a64, e64 = a.double(), e.double()
    n = e.numel()
    sa, se = a64.std().item(), e64.std().item()
    bound = 8 * math.sqrt((sa ** 2 + se ** 2) / n) + 1e-2 * max(abs(e64.mean().item()), 1e-3)
    if abs(a64.mean().item() - e64.mean().item()) > bound:
        raise Mismatch(f"{path}: random values' mean {a64.mean().item():.4g} on {DEVICE}, "
                       f"{e64.mean().item():.4g} on cpu (bound {bound:.3g})")
    if (sa == 0) != (se == 0) or (se > 0 and not 0.5 < sa / se < 2.0):
        raise Mismatch(f"{path}: random values' std {sa:.4g} on {DEVICE}, {se:.4g} on cpu")


def compare(actual: Any, expected: Any, rtol: float | None, atol: float | None,
            random: Any = False, path: str = "out", check_device: bool = True) -> None:
    """Recursively compare a tpu result with the CPU result. Raises Mismatch.

    rtol/atol None: assert_close's defaults for each output's dtype (exact for
    integers and bool). check_device: tensor results must be on tpu.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")
        if check_device and actual.device.type != DEVICE:
            raise Mismatch(f"{path}: result on {actual.device}, expected on {DEVICE}")
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            raise Mismatch(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")
        if expected.layout != torch.strided:
            raise Mismatch(f"{path}: non-strided layout {expected.layout}")
        a = actual.detach().cpu()
        e = expected.detach()
        if random == "uninit":
            return
        if random:
            _compare_random(a, e, path, heavy_tailed=random == "heavy")
            return
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True,
                                       check_device=False, check_stride=False)
        except AssertionError as err:
            raise Mismatch(f"{path}: {err}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, rtol, atol, random, f"{path}[{i}]", check_device)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise Mismatch(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")
        for k in expected:
            compare(actual[k], expected[k], rtol, atol, random, f"{path}[{k!r}]", check_device)
        return
    if isinstance(expected, float) and not random:
        if not isinstance(actual, (int, float)) or not (
                (math.isnan(expected) and math.isnan(actual)) or
                math.isclose(actual, expected, rel_tol=rtol or 1.3e-6, abs_tol=atol or 1e-5)):
            raise Mismatch(f"{path}: expected {expected!r}, got {actual!r}")
        return
    if isinstance(expected, torch.device):
        return  # a device is expected to differ
    if not random and actual != expected:
        raise Mismatch(f"{path}: expected {_describe(expected)}, got {_describe(actual)}")


# ---------------------------------------------------------------- running cases

@dataclasses.dataclass
class CaseResult:
    op: str
    dtype: str
    kind: str
    status: str          # passed | failed | skipped | n/a
    detail: str = ""
    samples: int = 0
    seconds: float = 0.0


def case_seed(name: str, dtype: str, kind: str) -> int:
    return zlib.crc32(f"{name}|{dtype}|{kind}".encode()) & 0x7FFFFFFF


def sync() -> None:
    torch.tpu.synchronize()


def _stat_samples(name: str, dtype: str) -> list[SampleInput]:
    """Large samples for random ops (OpInfo's are too small for statistics): first in line."""
    dt = DTYPES[dtype]
    if not dt.is_floating_point:
        return []
    n = 4096

    def big():
        return torch.empty(n, dtype=dt)

    table: dict[str, Callable[[], SampleInput]] = {
        "bernoulli": lambda: SampleInput(torch.full((n,), 0.3, dtype=dt)),
        "exponential": lambda: SampleInput(big(), args=(0.5,)),
        "geometric": lambda: SampleInput(big(), args=(0.2,)),
        "multinomial": lambda: SampleInput(torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=dt), args=(n, True)),
        "normal": lambda: SampleInput(torch.full((n,), 1.5, dtype=dt), args=(torch.full((n,), 0.5, dtype=dt),)),
        "normal.number_mean": lambda: SampleInput(1.6, args=(0.3, [n]), kwargs={"dtype": dt, "device": "cpu"}),
        "normal.in_place": lambda: SampleInput(big(), args=(0, 5)),
        "uniform": lambda: SampleInput(big(), args=(-100, 100)),
        "rand_like": lambda: SampleInput(big()),
        "randn_like": lambda: SampleInput(big()),
        "randint_like": lambda: SampleInput(big(), args=(10,)),
        "randn": lambda: SampleInput((n,), kwargs={"dtype": dt, "device": "cpu", "requires_grad": False}),
        "nn.functional.dropout": lambda: SampleInput(torch.ones(64, 64, dtype=dt), kwargs={"p": 0.3, "training": True}),
        "nn.functional.alpha_dropout": lambda: SampleInput(torch.ones(64, 64, dtype=dt),
                                                            kwargs={"p": 0.3, "training": True}),
        "nn.functional.rrelu": lambda: SampleInput(-torch.rand(n, dtype=dt) - 0.1,
                                                   kwargs={"lower": 0.1, "upper": 0.5, "training": True}),
    }
    return [table[name]()] if name in table else []


@contextlib.contextmanager
def _no_test_fn_lookup():
    """OpInfo's sample iterator looks for the running unittest method with inspect.stack()
    (source context of every frame: ~0.1 s a call under pytest, twice per case, most of the
    shard's time). Here there is no such method and the lookup returns None anyway."""
    saved = _common_utils.extract_test_fn, _opinfo_core.extract_test_fn
    _common_utils.extract_test_fn = _opinfo_core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        _common_utils.extract_test_fn, _opinfo_core.extract_test_fn = saved


def _samples(op: OpInfo, dtype: str, kind: str, max_samples: int | None) -> Iterable[SampleInput]:
    dt = DTYPES[dtype]
    with _no_test_fn_lookup():
        it = op.sample_inputs("cpu", dt, requires_grad=(kind == "grad"))
    if kind in ("forward", "noncontig") and is_random(op):
        it = itertools.chain(_stat_samples(full_name(op), dtype), it)
    return itertools.islice(it, max_samples) if max_samples else it


def _call(op: OpInfo, s: SampleInput, **extra):
    return op(s.input, *s.args, **s.kwargs, **extra)


BOTH_RAISE = "cpu and tpu both reject some samples"


def _same_error(e_cpu: Exception, run_dev: Callable[[], Any]) -> str:
    """The CPU rejected the sample: tpu must reject it too, with the same exception type
    (or a RuntimeError naming the op when the error surfaced from queued work)."""
    try:
        run_dev()
        sync()
    except Exception as e_dev:  # noqa: BLE001
        if isinstance(e_dev, type(e_cpu)) or (
                type(e_dev) is RuntimeError and "asynchronously executed op" in str(e_dev)):
            return BOTH_RAISE
        raise Mismatch(f"cpu raised {type(e_cpu).__name__} ({str(e_cpu)[:200]}), tpu raised "
                       f"{type(e_dev).__name__}: {e_dev}") from None
    raise Mismatch(f"cpu raised {type(e_cpu).__name__} ({str(e_cpu)[:300]}); tpu did not")


def _forward(op, s, rtol, atol, random, noncontig):
    cpu = copy_sample(s, "cpu")
    dev = copy_sample(s, DEVICE, full_name(op))
    if noncontig:
        cpu, dev = cpu.noncontiguous(), dev.noncontiguous()
        for t in sample_tensors(dev):
            if t.device.type == DEVICE and t.numel() > 1 and t.is_contiguous():
                raise Mismatch("noncontig: tpu input unexpectedly contiguous")
    try:
        expected = s.output_process_fn_grad(_call(op, cpu))
    except Exception as e:  # noqa: BLE001
        return _same_error(e, lambda: _call(op, dev))
    actual = s.output_process_fn_grad(_call(op, dev))
    compare(actual, expected, rtol, atol, random, check_device=on_device(dev))
    sync()
    return None


def _grad(op, s, rtol, atol, random, seed):
    cpu = copy_sample(s, "cpu")
    dev = copy_sample(s, DEVICE, full_name(op))
    cpu_in = [t for t in sample_tensors(cpu) if t.requires_grad]
    dev_in = [t for t in sample_tensors(dev) if t.requires_grad]
    if not cpu_in:
        return "no input requires grad"

    def diff_outputs(out):
        return [t for t in tensors_in(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]

    def run(x):
        return s.output_process_fn_grad(op.gradcheck_wrapper(op.get_op(), x.input, *x.args, **x.kwargs))

    try:
        cpu_out = diff_outputs(run(cpu))
    except Exception as e:  # noqa: BLE001
        return _same_error(e, lambda: run(dev))
    dev_out = diff_outputs(run(dev))
    if len(cpu_out) != len(dev_out):
        raise Mismatch(f"{len(dev_out)} differentiable outputs on {DEVICE}, {len(cpu_out)} on cpu")
    if not cpu_out:
        return "no differentiable output"
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(t.shape, dtype=t.dtype, generator=g) for t in cpu_out]
    cpu_g = torch.autograd.grad(cpu_out, cpu_in, cot, allow_unused=True)
    dev_g = torch.autograd.grad(dev_out, dev_in, [c.to(DEVICE) for c in cot], allow_unused=True)
    for i, (a, e) in enumerate(zip(dev_g, cpu_g)):
        if (a is None) != (e is None):
            raise Mismatch(f"grad[{i}]: {DEVICE} {_describe(a)} vs cpu {_describe(e)}")
        if e is not None:
            compare(a, e, rtol, atol, random, f"grad[{i}]")
    sync()
    return None


def _out(op, s, rtol, atol, random):
    """out= on tpu against the functional result on CPU; out= on CPU says whether the
    sample takes out= at all."""
    try:
        expected = _call(op, copy_sample(s, "cpu"))
    except Exception as e:  # noqa: BLE001
        return _same_error(e, lambda: _call(op, copy_sample(s, DEVICE, full_name(op))))
    exp_t = tensors_in(expected)
    if not exp_t or (not isinstance(expected, torch.Tensor) and len(exp_t) != len(expected)):
        return "result is not a tensor or a sequence of tensors"
    for empty in (False, True):  # correctly sized outs, then empty ones the op must resize

        def outs(device, empty=empty):
            def mk(t):
                return torch.empty(0 if empty else t.shape, dtype=t.dtype, device=device)
            if isinstance(expected, torch.Tensor):
                return mk(expected)
            seq = [mk(t) for t in expected]
            return seq if isinstance(expected, list) else tuple(seq)

        cpu_out = outs("cpu")
        try:
            cpu_ret = _call(op, copy_sample(s, "cpu"), out=cpu_out)
        except (TypeError, RuntimeError, ValueError):
            return "some samples take no out= on cpu either"
        dev_out = outs(DEVICE)
        ret = _call(op, copy_sample(s, DEVICE, full_name(op)), out=dev_out)
        if cpu_ret is not None:
            rets = tensors_in(ret)
            for i, (r, o) in enumerate(zip(rets, tensors_in(dev_out))):
                if r is not o and r.data_ptr() != o.data_ptr():
                    raise Mismatch(f"out[{i}]: returned tensor is not the out= tensor")
        # Against the functional result, as PyTorch's test_out does.
        ref = expected if isinstance(expected, torch.Tensor) else type(dev_out)(expected)
        compare(dev_out, ref, rtol, atol, random, "resized out" if empty else "out")
    sync()
    return None


def run_case(name: str, dtype: str, kind: str, max_samples: int | None = None,
             skips: dict | None = None) -> CaseResult:
    """Runs one (op, dtype, kind) case over its samples; never raises."""
    op = OPS[name]
    t0 = time.perf_counter()
    res = CaseResult(name, dtype, kind, "passed")
    why = applicable(op, dtype, kind)
    if why:
        res.status, res.detail = "n/a", why
        return res
    if skips is not None:
        reason = skip_reason(skips, name, dtype, kind)
        if reason:
            res.status, res.detail = "skipped", reason
            return res
    rtol, atol, _ = tolerance(op, dtype, kind)
    random = "uninit" if op.name in UNINIT_OPS else "heavy" if op.name in HEAVY_TAILED else is_random(op)
    seed = case_seed(name, dtype, kind)
    torch.manual_seed(seed)
    n = 0
    compared = 0  # samples where something was compared (values, or matching errors)
    notes = set()
    sample = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for sample in _samples(op, dtype, kind, max_samples):
                torch.manual_seed(seed + n)
                rnd = random or draws_inside(op, sample)
                if kind in ("forward", "noncontig"):
                    note = _forward(op, sample, rtol, atol, rnd, kind == "noncontig")
                elif kind == "grad":
                    note = _grad(op, sample, rtol, atol, rnd, seed + n)
                else:
                    note = _out(op, sample, rtol, atol, rnd)
                if note:
                    notes.add(note)
                if note is None or note == BOTH_RAISE:
                    compared += 1
                n += 1
                sample = None
    except Exception as e:  # noqa: BLE001 - a case reports, never raises
        res.status = "failed"
        msg = f"{type(e).__name__}: {e}" if isinstance(e, Mismatch) else \
            f"{type(e).__name__}: {e}\n{''.join(traceback.format_exception(e)[-3:])}"
        res.detail = f"sample {n} ({_sample_repr(sample)}): {msg}"[:3000]
        with contextlib.suppress(Exception):
            sync()  # a sticky stream error must not leak into the next case
    res.samples = n
    if res.status == "passed" and (compared == 0 or notes == {BOTH_RAISE} and compared == n):
        # Nothing was compared, or CPU rejects every sample (e.g. CUDA-only jiterator ops):
        # the case says nothing about the op on tpu.
        why = "cpu rejects every sample (tpu too)" if compared else "; ".join(sorted(notes))
        res.status, res.detail = "n/a", why if n else "no samples"
    elif res.status == "passed" and notes:
        res.detail = "; ".join(sorted(notes))
    res.seconds = time.perf_counter() - t0
    return res


def _sample_repr(s: SampleInput | None) -> str:
    if s is None:
        return "sample generation"

    def r(x):
        if isinstance(x, torch.Tensor):
            s = f"T{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}"
            if x.layout != torch.strided:
                return s + ":" + str(x.layout).replace("torch.", "")
            return s + ("" if x.is_contiguous() else ":nc")
        if isinstance(x, (list, tuple)):
            inner = ", ".join(r(e) for e in x[:6]) + (", ..." if len(x) > 6 else "")
            return ("[" + inner + "]") if isinstance(x, list) else ("(" + inner + ")")
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={r(v)}" for k, v in x.items()) + "}"
        return repr(x)[:60]

    parts = [r(s.input)] + [r(a) for a in s.args] + [f"{k}={r(v)}" for k, v in s.kwargs.items()]
    return "input=" + ", ".join(parts)


# ---------------------------------------------------------------- case lists

# The CI shard (default of test_opinfo.py): bounded, every op at least once.
CI_FORWARD_SAMPLES = 3   # float32 forward: first samples of every op
CI_OTHER_SAMPLES = 1     # every other case: its first sample


def grad_ops() -> list[str]:
    return [n for n, op in OPS.items() if applicable(op, "float32", "grad") is None]


def ci_cases() -> list[tuple[str, str, str, int]]:
    """(op, dtype, kind, max_samples) for the bounded CI shard.

    Every op in forward (float32, or its first supported dtype of int64/bool/
    bfloat16 when it has no float32) on its first samples; then the first sample
    of every other case that exists: gradients (float32) for every op with
    autograd, non-contiguous inputs and out= in float32, forward in bfloat16,
    int64 and bool.
    """
    cases = []
    for n, op in OPS.items():
        first = next((d for d in ("float32", "int64", "bool", "bfloat16")
                      if applicable(op, d, "forward") is None), None)
        if first:
            cases.append((n, first, "forward", CI_FORWARD_SAMPLES))
    done = {c[:3] for c in cases}
    for kind, dtypes in (("grad", ("float32",)), ("noncontig", ("float32",)), ("out", ("float32",)),
                         ("forward", ("bfloat16", "int64", "bool"))):
        for n, op in OPS.items():
            for d in dtypes:
                if applicable(op, d, kind) is None and (n, d, kind) not in done:
                    cases.append((n, d, kind, CI_OTHER_SAMPLES))
    return cases


def full_cases() -> list[tuple[str, str, str, int]]:
    """Every (op, dtype, kind) of the matrix, all samples (cases that do not exist included:
    run_case reports them as n/a)."""
    return [(n, d, k, 0) for k in KINDS for n in OPS for d in DTYPES]
