"""defer_and_fuse against CPU PyTorch on randomized expression chains (a differential fuzz test).

Every case is deterministic: its expression, shape, dtype and input view come
from a fixed seed at collection time, and its inputs from a seed of its own,
so a failing case's id names what it computed. The executor's fast paths
(tiles aligned to rows, uniform / in-place loads, whole-row reductions and
broadcasts, vectorized float max/min with NaN tracking, paired binary ops,
huge-page HBM segments) get targeted cases at the end of the file.

Tolerances: float32 and float64 sums add in another order and
transcendentals are the executor's polynomials; bfloat16 chains are exact for
arithmetic but a transcendental or a reduction one ulp off propagates through
later ops (scaled by the result's magnitude here). A float result outside
assert_close's bounds still passes when it is as close to the CPU's as the
CPU's is to the float64 result (see _within_cpu_rounding): cancellation
(x - mean(x) over constant rows, e * sum(e) + sum(p)) amplifies rounding on
both sides alike, while structural errors are orders of magnitude off.

Not compared: the sign of a zero chosen by max/min between +0.0 and -0.0
(assert_close treats them as equal; ATen's CPU kernels themselves differ
between their vectorized body and scalar tail), and gelu(+inf) (ATen's
vectorized CPU gelu gives NaN, its scalar path and the executor +inf).
"""

import math
import random

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.debug as tdebug
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


@pytest.fixture(autouse=True)
def _compiled_single_ops():
    """Regions of one op compiled too (by default they run ATen's kernel): every case goes through the executor."""
    torch_tpu._C._defer_set_single_op_aten(False)
    yield
    torch_tpu._C._defer_set_single_op_aten(True)


# --------------------------------------------------------------------------
# inputs

ROW_LENGTHS = [1, 7, 127, 128, 129, 1000, 1023, 1024, 1025, 2048, 3000, 4097]
SHAPES = [(), (1,), (0,), (3, 0), (0, 5), (1, 1), (5, 1), (4, 7), (1, 1, 1), (2, 3, 5), (3, 1, 7),
          (2, 4, 1), (2, 0, 3)] + [(2, n) for n in ROW_LENGTHS] + [(3, 2, 129), (2, 3, 1025), (1, 4097), (4097,)]
# several tiles: short rows packed, long rows cut, tiles ending mid-row; >= 256K elements run in row chunks
BIG_SHAPES = [(700, 7), (33, 127), (40, 129), (9, 1000), (5, 1023), (6, 1025), (3, 3000), (3, 4097), (2, 2049),
              (3, 50, 129), (4, 3, 1025), (600, 3), (257, 1025), (70, 4097), (2, 5, 4097), (9000, 1), (4099,)]
VIEWS = ["contig", "transposed", "permuted", "sliced", "expanded", "pending_transposed"]
SCALARS = ["2", "-3", "0.5", "1.5", "-0.25"]
SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0]


def _make(shape, dtype, gen, specials=False, positive=False):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype == torch.int64:
        return torch.randint(-5, 6, shape, generator=gen)
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
    if positive:
        t = t.abs() + 0.1
    if specials and t.numel():
        flat = t.view(-1)
        k = max(1, flat.numel() // 8)
        idx = torch.randint(0, flat.numel(), (k,), generator=gen)
        which = torch.randint(0, len(SPECIALS), (k,), generator=gen)
        for i, w in zip(idx.tolist(), which.tolist()):
            flat[i] = SPECIALS[w]
    return t.to(dtype)


def _viewed(shape, dtype, view, gen, specials=False):
    """A tensor of `shape` as the view `view` of a base tensor (CPU); returns (base, f) with f(base) the view."""
    nd = len(shape)
    if view == "transposed" and nd >= 2:
        base = _make(shape[:-2] + (shape[-1], shape[-2]), dtype, gen, specials)
        return base, lambda b: b.transpose(-1, -2)
    if view == "permuted" and nd >= 3:
        perm = (nd - 1,) + tuple(range(nd - 1))         # base dims [last, 0, 1, ...]
        base = _make(tuple(shape[p] for p in perm), dtype, gen, specials)
        inv = [perm.index(d) for d in range(nd)]
        return base, lambda b: b.permute(*inv)
    if view == "sliced" and nd >= 1:
        base = _make(shape[:-1] + (2 * shape[-1] + 1,), dtype, gen, specials)
        return base, lambda b: b[..., 1::2]
    if view == "expanded" and nd >= 1:
        d = max(range(nd), key=lambda k: shape[k])   # the longest dimension has stride 0
        bshape = tuple(1 if k == d else s for k, s in enumerate(shape))
        base = _make(bshape, dtype, gen, specials)
        return base, lambda b: b.expand(*shape)
    if view == "expanded0" and nd >= 2:             # rows repeated (stride 0 along dim 0)
        base = _make((1,) + tuple(shape[1:]), dtype, gen, specials)
        return base, lambda b: b.expand(*shape)
    if view == "pending_transposed" and nd >= 2:
        base = _make(shape[:-2] + (shape[-1], shape[-2]), dtype, gen, specials)
        return base, lambda b: (b * 1).transpose(-1, -2)     # a view of a pending result on tpu
    return _make(shape, dtype, gen, specials), lambda b: b


def _tol(dtype, ref):
    if dtype in (torch.int64, torch.bool):
        return dict(rtol=0, atol=0)
    if dtype == torch.float64:
        return dict(rtol=1e-9, atol=1e-9)
    if dtype == torch.float32:
        return dict(rtol=1e-4, atol=1e-4)
    finite = ref.float()[torch.isfinite(ref.float())] if ref.numel() else ref.float()
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    return dict(rtol=2e-2, atol=2e-2 * scale)


def check(code, shape, dtype, view="contig", seed=0, specials=False, tol=None, extra=None):
    """Runs `code` (statements assigning `r`) on CPU tensors and on tpu tensors in defer_and_fuse; compares r."""
    gen = torch.Generator().manual_seed(seed)
    named = {}
    for name in ("x", "y", "z"):
        named[name] = _viewed(shape, dtype, view, gen, specials)
    last = shape[-1] if shape else 1
    named["w"] = (_make((last,), dtype, gen), lambda b: b)                       # broadcast along rows
    named["c"] = (_make(tuple(shape[:-1]) + (1,) if shape else (), dtype, gen), lambda b: b)  # a column
    named["i"] = (_make(shape, torch.int64, gen), lambda b: b)
    named["m"] = (_make(shape, torch.bool, gen), lambda b: b)
    named["f"] = (_make(shape, torch.float32, gen), lambda b: b)
    named["d"] = (_make(shape, torch.float64, gen), lambda b: b)
    for k, v in (extra or {}).items():
        named[k] = (v, lambda b: b)
    env = {"torch": torch, "F": F, "math": math}

    tpu_bases = {k: b.to("tpu") for k, (b, f) in named.items()}
    torch.tpu.synchronize()
    cpu_vars = {k: f(b.clone()) for k, (b, f) in named.items()}  # the code may write its inputs
    ref_err = None
    try:
        exec(code, env, cpu_vars)
        ref = cpu_vars["r"]
    except Exception as e:  # noqa: BLE001
        ref_err = e
    if ref_err is not None:
        with pytest.raises(Exception):  # noqa: B017  (whatever CPU raised, tpu must raise too)
            with torch_tpu.eager_mode("defer_and_fuse"):
                tpu_vars = {k: named[k][1](b) for k, b in tpu_bases.items()}
                exec(code, env, tpu_vars)
                tpu_vars["r"].cpu()
                torch.tpu.synchronize()
        try:  # an error of an op queued asynchronously is raised once, at the next sync
            tdebug.flush()
            torch.tpu.synchronize()
        except RuntimeError:
            pass
        return
    with torch_tpu.eager_mode("defer_and_fuse"):
        tpu_vars = {k: named[k][1](b) for k, b in tpu_bases.items()}
        exec(code, env, tpu_vars)
        out = tpu_vars["r"].cpu()
    assert tdebug.pending_ops() == 0
    assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, out.shape, ref.dtype, ref.shape)
    # float32 / bfloat16 inputs: their tolerance even where the result is promoted (to float64)
    t = tol or _tol(dtype if dtype in (torch.float32, torch.bfloat16) and ref.is_floating_point() else ref.dtype, ref)
    try:
        torch.testing.assert_close(out, ref, equal_nan=True, **t,
                                   msg=lambda m: f"{code!r} shape={shape} dtype={dtype} view={view}: {m}")
    except AssertionError:
        if not _within_cpu_rounding(code, env, named, out, ref, t):
            raise


def _within_cpu_rounding(code, env, named, out, ref, t):
    """Whether out is as close to ref as ref is to the float64 result (4x, plus the tolerance and a tenth of
    it relative to the result's largest magnitude): where a reduction's order or a transcendental's ulp gets
    amplified (sums that cancel, x - mean(x) over constant rows), the CPU's own error is the measure.
    Structural errors (a wrong row, a lost NaN, a misplaced broadcast) are orders of magnitude off."""
    if not ref.is_floating_point() or ref.dtype == torch.float64:
        return False
    try:
        vars64 = {k: f(b.double() if b.is_floating_point() else b) for k, (b, f) in named.items()}
        exec(code, env, vars64)
        ref64 = vars64["r"].double()
    except Exception:  # noqa: BLE001
        return False
    if ref64.shape != ref.shape:
        return False
    o, r = out.double(), ref.double()
    same = (o == r) | (o.isnan() & r.isnan())
    finite = ref64[torch.isfinite(ref64)]
    scale = finite.abs().max().item() if finite.numel() else 0.0   # r = e * sum(e) + sum(p): terms that cancel
    allowed = t["atol"] + t["rtol"] * r.abs() + 4 * (r - ref64).abs() + t["rtol"] * 0.1 * scale
    return bool((same | ((o - r).abs() <= allowed)).all())


# --------------------------------------------------------------------------
# random expression chains

def _float_elem(rng, depth, exact, specials, view=""):
    """A float expression over x, y, z (full shape), w (row vector), c (column), scalars."""
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(["x", "y", "z", "x", "y", "w", "c"])
    a = _float_elem(rng, depth - 1, exact, specials, view)
    b = _float_elem(rng, depth - 1, exact, specials, view)
    # x - mean(x) over rows an expanded view makes constant is rounding noise (the CPU's mean of equal
    # values happens to be exact more often), which a later sum over the row multiplies by its length
    centered = (f"({a} - {a}.mean(-1, keepdim=True) * 0.5)" if view == "expanded"
                else f"({a} - {a}.mean(-1, keepdim=True))")
    s = rng.choice(SCALARS)
    forms = [
        f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({s} - {a} * {b})", f"({a} * {s} + {b})",
        f"(({a} - {b}) * {s})", f"({s} * {a} - {b})", f"({a} * {b} * {s})", f"({s} + {a})",
        f"torch.add({a}, {b}, alpha={s})", f"torch.maximum({a}, {b})", f"torch.minimum({a}, {b})",
        f"torch.where({a} > {b}, {a}, {b})", f"torch.clamp({a}, -1.5, 2.0)", f"torch.relu({a})",
        f"(-{a})", f"{a}.abs()", f"({a} / ({b}.abs() + 1))", centered,
        f"({a} * {a}.amax(-1, keepdim=True))", f"({a} - {a}.amin(-1, keepdim=True) * {s})",
        f"({a} + i)", f"({a} * m)", f"torch.where(m, {a}, {s})",
        # views of pending results the IR expresses (reshape, unsqueeze, expand), reductions reshaped back
        f"({a} - {a}.sum(-1).unsqueeze(-1))", f"({a}.reshape(-1) * {s}).reshape({a}.shape)",
        f"({a} * {a}.amax(-1, keepdim=True).expand_as({a}).contiguous())", f"{a}.clone().add_({b})",
        f"({a} - {a}.amin(-1).reshape({a}.shape[:-1] + (1,)))",
    ]
    if not exact:
        forms += [f"torch.sigmoid({a})", f"torch.tanh({a})", f"torch.exp(-{a}.abs())", f"F.silu({a})",
                  f"torch.softmax({a}, -1)"]
        if not specials:  # ATen's vectorized CPU gelu gives NaN at +inf (its scalar path, and the executor, inf)
            forms.append(f"F.gelu({a})")
    return rng.choice(forms)


def _int_elem(rng, depth):
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(["x", "y", "z", "w", "c"])
    a = _int_elem(rng, depth - 1)
    b = _int_elem(rng, depth - 1)
    s = rng.choice(["2", "-3", "1"])
    return rng.choice([
        f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({s} - {a} * {b})", f"({a} * {s} + {b})",
        f"torch.maximum({a}, {b})", f"torch.minimum({a}, {b})", f"torch.where({a} > {b}, {a}, {b})",
        f"torch.clamp({a}, -3, 4)", f"(-{a})", f"{a}.abs()", f"({a} - {a}.sum(-1, keepdim=True))",
        f"({a} * {a}.amax(-1, keepdim=True))", f"torch.where(m, {a}, {s})", f"({a} + m)",
    ])


def _bool_elem(rng, depth):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(["x", "y", "z", "m", "(f > 0)", "(i <= 1)", "w"])
    a = _bool_elem(rng, depth - 1)
    b = _bool_elem(rng, depth - 1)
    return rng.choice([f"({a} & {b})", f"({a} | {b})", f"(~{a})", f"({a} == {b})", f"({a} != {b})"])


def _mid(nd):
    return 1 if nd >= 3 else 0


def _head(rng, kind, nd, view=""):
    """What is done with the elementwise expression E: returned as a format string over E.

    No layer norm over rows made constant by an expanded view: x - mean(x) is rounding noise there, and
    rsqrt(var + eps) scales it by ~300."""
    heads = ["{E}", "{E}"]
    if kind == "bool":
        return rng.choice(heads + ["{E}.sum(-1)", "torch.where({E}, f, 2.0)", "({E}.float() * f)",
                                   "({E}.to(torch.int64) + i)", "{E}.sum(-1, keepdim=True) * i"])
    heads += ["{E}.sum(-1)", "{E}.sum(-1, keepdim=True)", f"{{E}}.sum(dim={_mid(nd)})",
              f"{{E}}.amax(dim={_mid(nd)}, keepdim=True)", "{E}.amin(-1)", "{E}.max()", "{E}.min()"]
    if nd >= 2:
        heads += ["{E}.sum(dim=(0, -1))", "{E}.amax(dim=(0, -1), keepdim=True)",
                  "({E} - {E}.sum(dim=(0, -1), keepdim=True))"]
    if kind == "int":
        heads += ["({E} * 0.5)", "({E} / 2)", "({E} + f)", "{E}.float().mean(-1)", "({E} > 0).sum(-1)"]
    else:
        heads += ["{E}.mean(-1)", f"{{E}}.mean(dim={_mid(nd)}, keepdim=True)", "torch.softmax({E}, -1)",
                  "torch.log_softmax({E}, -1)", f"torch.softmax({{E}}, {_mid(nd)})",
                  "({E} - {E}.amax(-1, keepdim=True)).exp().sum(-1)"]
        if view != "expanded":
            heads.append("(({E}) - ({E}).mean(-1, keepdim=True)) * torch.rsqrt((((({E}) - ({E}).mean(-1, keepdim=True))"
                         " ** 2).mean(-1, keepdim=True) + 1e-5)) * w + c")
        heads += ["({E} + d)", "({E} * f)", "({E}.double() * 3)", "({E} + i * 0.5)", "({E} > 0.5).sum(-1)"]
    return rng.choice(heads)


POSTS = [
    "",
    "r.add_(1)",
    "r[..., :1].mul_(2)",
    "r.mul_(3).sub_(1)",
    "r.transpose(0, -1).add_(2)",
    "r[:1].mul_(-1)",
]


def _gen_cases(n, seed=1234, shapes=SHAPES, tag=""):
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        dtype = rng.choice([torch.float32] * 4 + [torch.bfloat16] * 2 + [torch.float64, torch.int64] * 2
                           + [torch.bool])
        shape = rng.choice(shapes)
        nd = len(shape)
        view = rng.choice(VIEWS)
        if dtype == torch.bool:
            kind, e = "bool", _bool_elem(rng, rng.randint(1, 3))
        elif dtype == torch.int64:
            kind, e = "int", _int_elem(rng, rng.randint(1, 3))
        else:
            specials = rng.random() < 0.3
            kind, e = "float", _float_elem(rng, rng.randint(1, 3), dtype == torch.bfloat16, specials, view)
        if kind != "float":
            specials = False
        code = "r = " + _head(rng, kind, nd, view).format(E=e)
        post = rng.choice(POSTS)
        if post and nd >= 1 and dtype != torch.bool:
            code += "\n" + post
        cases.append(pytest.param(code, shape, dtype, view, k, specials,
                                  id=f"{tag}{k:03d}-{str(dtype)[6:]}-{'x'.join(map(str, shape)) or 'scalar'}-{view}"
                                     f"{'-special' if specials else ''}-{code}"))
    return cases


@pytest.mark.parametrize("code,shape,dtype,view,seed,specials", _gen_cases(2000))
def test_random_chain(code, shape, dtype, view, seed, specials):
    check(code, shape, dtype, view, seed, specials)


@pytest.mark.parametrize("code,shape,dtype,view,seed,specials", _gen_cases(300, seed=99, shapes=BIG_SHAPES, tag="big"))
def test_random_chain_big(code, shape, dtype, view, seed, specials):
    check(code, shape, dtype, view, seed, specials)


# --------------------------------------------------------------------------
# targeted cases for the executor's fast paths

ALL_ROWS = sorted(set(ROW_LENGTHS + [2, 3, 31, 32, 33, 63, 64, 65, 255, 256, 511, 512, 513, 2047, 2049, 4095, 4096,
                                     5000, 8193, 12288]))


def _rows_for(length, numel=6000):
    return max(3, numel // length)


@pytest.mark.parametrize("length", ALL_ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_row_statistic_broadcast_back(length, dtype):
    """row_aligned_tile, uniform slots, whole_rows / reduce_rows / expand_rows: per-row statistics broadcast back."""
    shape = (_rows_for(length), length)
    if dtype == torch.int64:
        codes = ["r = (x - x.sum(-1, keepdim=True)) * x.amax(-1, keepdim=True) + w * c",
                 "r = torch.where(x > x.amin(-1, keepdim=True), x.sum(-1, keepdim=True), c) - 2 * w"]
    else:
        codes = ["m = x.mean(-1, keepdim=True)\nr = (x - m) * x.amax(-1, keepdim=True) * w + c",
                 "r = torch.softmax(x, -1) * x.amin(-1, keepdim=True) + x.sum(0, keepdim=True)",
                 "r = torch.where(x < x.amax(-1, keepdim=True), c, x * w).sum(-1, keepdim=True) * x"]
        if dtype != torch.bfloat16:  # cancellation after a bf16 mean (see the module docstring)
            codes.append("m = x.mean(-1, keepdim=True)\nv = ((x - m) ** 2).mean(-1, keepdim=True)\n"
                         "r = (x - m) * torch.rsqrt(v + 1e-5) * w + c")
    for code in codes:
        for view in ("contig", "sliced", "expanded0"):  # not constant rows: x - mean(x) would cancel
            check(code, shape, dtype, view, seed=length)
    # a statistic over the middle dimension and over several, broadcast back
    shape3 = (2, max(2, _rows_for(length, 3000)), length)
    check("r = x - x.amax(1, keepdim=True) + x.sum(dim=(0, 2), keepdim=True) * c", shape3, dtype, seed=length)
    check("r = (x * w).sum(dim=(0, 1), keepdim=True) - x.amin(dim=(1, 2), keepdim=True)", shape3, dtype, seed=length)


def _special_rows(length, dtype):
    nan, inf = float("nan"), float("inf")
    rows = [torch.full((length,), nan), torch.full((length,), -inf), torch.full((length,), inf),
            torch.full((length,), -0.0)]
    for pos in {0, length // 2, length - 1, min(length - 1, 31), min(length - 1, 32), min(length - 1, 64)}:
        r = torch.full((length,), -inf)
        r[pos] = nan
        rows.append(r)
        r = torch.linspace(-3, 3, length)
        r[pos] = nan
        rows.append(r)
        r = torch.full((length,), inf)
        r[pos] = -inf
        rows.append(r)
        r = torch.full((length,), 0.0)
        r[pos] = -0.0
        rows.append(r)
    r = torch.linspace(-3, 3, length)
    r[-1] = inf
    rows.append(r)
    return torch.stack(rows).to(dtype)


EXTREME_CODES = ["r = s.amax(-1)", "r = s.amin(-1)", "r = s.max()", "r = s.min()", "r = s.amax(0)",
                 "r = s.amin(0, keepdim=True) * 2 + s", "r = s.max(-1).values", "r = torch.softmax(s, -1)",
                 "r = torch.log_softmax(s, -1)", "r = torch.softmax(s, 0)", "r = (s * 1).amax(-1) - s.amin(-1)",
                 "r = torch.maximum(s, s.flip(-1)).amin(-1)", "r = s - s.amax(-1, keepdim=True)"]


@pytest.mark.parametrize("length", [1, 7, 31, 32, 33, 64, 65, 100, 1000, 1025, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_max_min_softmax_nan_inf_rows(length, dtype):
    """float_extreme: NaN / -inf / +inf / -0.0 rows, NaNs at lane boundaries, through max/min and softmax."""
    s = _special_rows(length, dtype)
    for code in EXTREME_CODES:
        check(code, (1,), dtype, extra={"s": s})
        check(code, (1,), dtype, extra={"s": s.t().contiguous().t()})   # column-major rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(5, 1025), (3, 4096), (7, 129), (2, 3, 1024), (4097,), (1, 1), ()])
def test_uniform_loads(dtype, shape):
    """Stride-0 loads whose tile lies in one run: scalars for the tile (0-dim tensors, expanded columns)."""
    t0 = _make((), dtype, torch.Generator().manual_seed(3))
    col = tuple(shape[:-1]) + (1,) if shape else ()
    if dtype == torch.bool:
        codes = ["r = x & t", "r = torch.where(c, t, x) | y", "r = (c & x) | ~t",
                 "r = torch.where(c.expand_as(x), f, 1.5)", "r = (c | x).sum(-1)"]
    else:
        codes = ["r = x + t", "r = t - x * c", "r = c.expand_as(x) * 2 + t", "r = torch.where(x > c, c, x * t)",
                 "r = torch.maximum(c, t) - x", "r = torch.clamp(x, min=c, max=t + 3)", "r = (c * t).expand_as(x) + 0",
                 "r = (x - c).sum(-1, keepdim=True) * t", "r = torch.where(m, c, t) + x",
                 "r = c.expand_as(x).abs() + t.expand_as(x).neg()", "r = (c + t) * (c - t) + x"]
    for code in codes:
        for view in ("contig", "expanded"):
            check(code, shape, dtype, view, seed=1,
                  extra={"t": t0, "c": _make(col, dtype, torch.Generator().manual_seed(4))})


PAIR_OPS = ["+", "-", "*"]


@pytest.mark.parametrize("op1", PAIR_OPS)
@pytest.mark.parametrize("op2", PAIR_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paired_binary_ops(op1, op2, dtype):
    """kBinaryPair: (a op b) op2 c and c op2 (a op b) over arrays, Python scalars, uniform columns, in-place reads."""
    operands = ["x", "1.5", "c", "y.t()"]
    for shape in ((5, 1025), (7, 129), (1, 1), (3, 0), (4097,)):
        for a in operands:
            for b in operands:
                for cc in ("z", "-2", "c", "x"):
                    if a[0].isdigit() and b[0].isdigit() or (len(shape) < 2 and "t()" in a + b):
                        continue
                    inner = f"({a} {op1} {b})"
                    code = (f"r = {inner} {op2} {cc}\nq = {cc} {op2} {inner}\n"
                            "r = torch.stack([r.expand_as(x), q.expand_as(x)])")
                    check(code, shape, dtype, "contig", seed=2, tol=None,
                          extra={"y": _make(shape[::-1], dtype, torch.Generator().manual_seed(5))})
        # the inner result read twice (not paired) and stored (an output of its own)
        check(f"t = x {op1} y\nr = torch.stack([t {op2} z, t])", shape, dtype)
        check(f"t = x {op1} 2\nr = (t {op2} z) {op1} (t {op2} 3)", shape, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_large_tensors_huge_page_segments(dtype):
    """HBM segments >= 8 MiB get MADV_HUGEPAGE: results in such segments, written and read back, reused after free."""
    shape = (1536, 2048)  # 12 MiB of float32
    for code in ["r = x * 2 - y", "r = (x - x.mean(-1, keepdim=True) if x.is_floating_point() else x) * w + c",
                 "r = x.sum(-1) + y.amax(-1)"]:
        check(code, shape, dtype, seed=7)
    with torch_tpu.eager_mode("defer_and_fuse"):
        a = torch.ones(3 << 20, device="tpu")
        outs = []
        for k in range(3):
            b = a * k + 1
            outs.append(b.sum().item())
            del b
    assert outs == [float(3 << 20), float(2 * (3 << 20)), float(3 * (3 << 20))]


def test_inplace_on_views_of_pending_results():
    for code in ["r = x * 2\nr[:, 1:3].add_(y[:, 1:3])\nr.t()[0].mul_(3)",
                 "r = x + y\nv = r.view(-1)\nv[::3].sub_(1)\nr = r * 2",
                 "r = torch.softmax(x, -1)\nr[0].mul_(2)\nr = r.sum(-1)",
                 "r = x - 1\nr.transpose(0, 1)[1:].clamp_(-0.5, 0.5)\nr = r.amax(-1, keepdim=True) + r",
                 "r = (x * y).relu_()\nr[..., -1:].copy_(z[..., :1])\nr = r * w",
                 "r = x * 3\ns = r[1:]\ns.mul_(c[1:])\nr = r + s.sum()"]:
        for shape in ((4, 7), (3, 1025), (5, 4097)):
            for dtype in (torch.float32, torch.int64):
                if "softmax" in code and dtype == torch.int64:
                    continue
                check(code, shape, dtype, seed=11)


@pytest.mark.parametrize("code", [
    "r = x + d", "r = x * f + d", "r = x + i * 0.5", "r = (x > 0) + i", "r = i * 2.5 + x", "r = i / 3 + f",
    "r = m + m", "r = m * x - i", "r = torch.where(m, i, x)", "r = x.to(torch.float64) * 3 - d",
    "r = (x.float() + d.bfloat16()) * 2", "r = (i.float() - x).sum(-1)", "r = (x.double() * d).mean(-1)",
    "r = torch.maximum(x, f) - torch.minimum(i, d)", "r = (2 - x * i) * 0.5",
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_mixed_dtype_promotion(code, dtype):
    for shape in ((), (3, 129), (2, 1025)):
        check(code, shape, dtype, seed=13)


@pytest.mark.parametrize("length", [1, 7, 129, 1025, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_of_row_ops(length, dtype):
    """softmax / log_softmax / activation backward ops fuse too (autograd's thread: the global mode)."""
    gen = torch.Generator().manual_seed(length)
    x0 = torch.randn(max(2, 3000 // length), length, generator=gen, dtype=dtype)
    w = torch.randn(length, generator=gen, dtype=dtype)

    def f(x, w):
        h = x * w + 0.5
        m = h.mean(-1, keepdim=True)
        return (torch.softmax(h, -1) * w + torch.log_softmax(h - m, -1) * 0.25 + F.gelu(h) * torch.sigmoid(x)).sum()

    xc = x0.clone().requires_grad_()
    f(xc, w).backward()
    xt = x0.to("tpu").requires_grad_()
    torch_tpu.set_eager_mode("defer_and_fuse")
    try:
        f(xt, w.to("tpu")).backward()
        grad = xt.grad.cpu()
    finally:
        torch_tpu.set_eager_mode("strict")
    torch.testing.assert_close(grad, xc.grad, **_tol(dtype, xc.grad))


@pytest.mark.parametrize("shape", [(7,), (33, 129), (3, 4097)])
def test_dropout_chain_matches_cpu(shape):
    # The chip's stream is not CPU's: the mask comes from a strict tpu dropout of ones drawn at
    # the same seed (same shape, same positions of the stream), the arithmetic from CPU.
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    torch.tpu.manual_seed(123)
    with torch_tpu.eager_mode("strict"):
        mask = F.dropout(torch.ones(shape, device="tpu"), 0.3, training=True).cpu() != 0
    if mask.numel() > 100:
        assert 0.5 < mask.double().mean().item() < 0.9
    ref = (x * 2 - 1).mul(mask).mul_(1 / 0.7) * 3 + x
    torch.tpu.manual_seed(123)
    with torch_tpu.eager_mode("defer_and_fuse"):
        xt = x.to("tpu")
        out = (F.dropout(xt * 2 - 1, 0.3, training=True) * 3 + xt).cpu()
    torch.testing.assert_close(out, ref)


def _gen_broadcast_cases(n, seed=4321):
    """Operands broadcast along random subsets of dimensions, reduced over random subsets and broadcast back:
    the load / reduction nests (collapsed dims, stride-0 runs, whole rows) in many arrangements."""
    rng = random.Random(seed)
    dims_pool = [1, 2, 3, 5, 7, 64, 129, 1024, 1025]
    cases = []
    for k in range(n):
        nd = rng.randint(1, 4)
        while True:
            shape = tuple(rng.choice(dims_pool) for _ in range(nd))
            if math.prod(shape) <= 40000:
                break
        dtype = rng.choice([torch.float32, torch.float32, torch.float64, torch.int64, torch.bfloat16])
        b1 = tuple(1 if rng.random() < 0.5 else s for s in shape)
        b2 = tuple(1 if rng.random() < 0.5 else s for s in shape)
        red = sorted(rng.sample(range(nd), rng.randint(1, nd)))
        red_s = "(" + ", ".join(map(str, red)) + ",)"
        kind = rng.choice(["sum", "amax", "amin"] + (["mean"] if dtype != torch.int64 else []))
        e = rng.choice(["x * p + q", "x - p * q", "torch.maximum(x, p) - q", "torch.where(x > p, q, x)",
                        "(x + p) * (q - 2)"])
        code = rng.choice([
            f"e = {e}\nr = e - e.{kind}(dim={red_s}, keepdim=True) * q",
            f"e = {e}\nr = e.{kind}(dim={red_s})",
            f"e = {e}\nr = e * e.{kind}(dim={red_s}, keepdim=True) + p.{kind}(dim={red_s}, keepdim=True)",
        ])
        cases.append(pytest.param(code, shape, dtype, b1, b2, k,
                                  id=f"bc{k:03d}-{str(dtype)[6:]}-{'x'.join(map(str, shape))}"
                                     f"-p{'x'.join(map(str, b1))}-q{'x'.join(map(str, b2))}-{code}"))
    return cases


@pytest.mark.parametrize("code,shape,dtype,pshape,qshape,seed", _gen_broadcast_cases(400))
def test_random_broadcast_reduce(code, shape, dtype, pshape, qshape, seed):
    gen = torch.Generator().manual_seed(seed)
    check(code, shape, dtype, seed=seed,
          extra={"p": _make(pshape, dtype, gen), "q": _make(qshape, dtype, gen)})


@pytest.mark.parametrize("length", [100, 511, 1000, 1023, 3000])
def test_row_sum_of_equal_values_is_accurate(length):
    """Regression: a reduction run's tail (length % 64 values) was added one by one to the run's whole sum
    (a row of 1000 equal floats 17 ulp off, 1023 of them 27): found as |x - mean(x)| over constant rows,
    summed again, missing the CPU by ~1000 ulp of x. Now the tail goes into the partial sums."""
    v = torch.randn(9, 1, generator=torch.Generator().manual_seed(0)).clamp(-1.5, 2.0).expand(9, length)
    with torch_tpu.eager_mode("defer_and_fuse"):
        got = (v.to("tpu") * 1).sum(-1).cpu().double()
    exact = v[:, 0].double() * length
    ulp = torch.nextafter(exact.abs().float(), torch.tensor(math.inf)).double() - exact.abs().float().double()
    assert ((got - exact).abs() <= 8 * ulp).all(), ((got - exact) / ulp).tolist()
