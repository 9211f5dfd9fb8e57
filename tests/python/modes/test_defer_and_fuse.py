"""defer_and_fuse: fusible ops recorded into regions, compiled, run; CPU is the oracle.

Tolerances: float32 results use assert_close's defaults (transcendentals are
the executor's polynomials, within a few ulp; sums add in another order).
16-bit floats are rounded once per ATen op, as eager PyTorch does, so
arithmetic chains match the CPU exactly; where a transcendental or a
reduction's different summation order lands a value on the other side of a
rounding boundary, the result differs by one bf16/f16 ulp (assert_close's
16-bit defaults allow that), except after catastrophic cancellation (x - mean
in a bf16 layer norm), which the tests avoid.
"""


import pytest
import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.debug as tdebug
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


@pytest.fixture
def defer():
    """defer_and_fuse on this thread, counters reset; pending work flushed at the end."""
    tdebug.reset_region_stats()
    with torch_tpu.eager_mode("defer_and_fuse"):
        yield
    assert tdebug.pending_ops() == 0


@pytest.fixture
def defer_global():
    """defer_and_fuse process-wide (autograd's backward runs on another thread)."""
    tdebug.reset_region_stats()
    torch_tpu.set_eager_mode("defer_and_fuse")
    try:
        yield
    finally:
        torch_tpu.set_eager_mode("strict")


@pytest.fixture
def fused_single_ops():
    """Regions of one op compiled too (by default they run ATen's kernel), so that every lowering runs."""
    torch_tpu._C._defer_set_single_op_aten(False)
    yield
    torch_tpu._C._defer_set_single_op_aten(True)


def stats():
    return tdebug.region_stats()


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g)
    y = torch.randn(6, 10, generator=g)
    b = torch.randn(10, generator=g)
    p = torch.rand(6, 10, generator=g) + 0.1
    i = torch.randint(-5, 5, (6, 10), generator=g)
    j = torch.randint(1, 5, (6, 10), generator=g)
    m = torch.rand(6, 10, generator=g) > 0.5
    return [t.to(dtype) if t.is_floating_point() else t for t in (x, y, b, p, i, j, m)]


# name -> f(x, y, b, p, i, j, m); each is recorded whole (no flush before the host read).
FUSIBLE = {
    "add_bcast_alpha": lambda x, y, b, p, i, j, m: torch.add(x, b, alpha=0.5) + y,
    "sub_rsub": lambda x, y, b, p, i, j, m: (x - y) - (1 - x),
    "mul_div_scalar": lambda x, y, b, p, i, j, m: x * 0.1 / p + x / 3,
    "int_true_div": lambda x, y, b, p, i, j, m: i / j,
    "int_promote": lambda x, y, b, p, i, j, m: (i * j + 3) + 0.5,
    "max_min": lambda x, y, b, p, i, j, m: torch.maximum(x, y) + torch.minimum(x, b),
    "pow": lambda x, y, b, p, i, j, m: x ** 2 + x ** 3 + p ** 0.5 + p ** -1 + p ** 1.7 + p ** y,
    "compare_logical": lambda x, y, b, p, i, j, m: ((x > y) & (x <= 1.0)) | (i == 2) | ~m | (j != 3),
    "where": lambda x, y, b, p, i, j, m: torch.where(m, x, y) + torch.where(x > 0, x, 0.0),
    "clamp": lambda x, y, b, p, i, j, m: x.clamp(-0.5, 0.5) + x.clamp(min=0.1) + x.clamp(min=y, max=y + 1),
    "relu_family": lambda x, y, b, p, i, j, m: F.relu(x) + F.relu6(x * 4) + F.hardtanh(x) + F.leaky_relu(x, 0.2),
    "gelu": lambda x, y, b, p, i, j, m: F.gelu(x) + F.gelu(y, approximate="tanh"),
    "sigmoid_tanh_silu": lambda x, y, b, p, i, j, m: torch.sigmoid(x) + torch.tanh(y) + F.silu(x) + F.softplus(x * 10),
    "exp_log": lambda x, y, b, p, i, j, m: torch.exp(x) + torch.log(p) + torch.log1p(p) + torch.expm1(x),
    "sqrt_trig_erf": lambda x, y, b, p, i, j, m: (torch.sqrt(p) + torch.rsqrt(p) + torch.sin(x) + torch.cos(x)
                                                 + torch.erf(y)),
    "rounding_sign": lambda x, y, b, p, i, j, m: torch.floor(x * 3) + torch.ceil(y * 3) + torch.sign(x) - torch.abs(i),
    "reciprocal_neg": lambda x, y, b, p, i, j, m: torch.reciprocal(p) - x,
    "sum_mean": lambda x, y, b, p, i, j, m: (x * y).sum(1) + x.mean(1) + x.sum() + y.mean(),
    "keepdim_bcast": lambda x, y, b, p, i, j, m: x.sum(0, keepdim=True) + x.mean(-1, keepdim=True) * y,
    "amax_amin_max": lambda x, y, b, p, i, j, m: x.amax(1) + x.amin(1) + x.max() - y.min(),
    "int_bool_sums": lambda x, y, b, p, i, j, m: i.sum(1) + m.sum() + i.prod(),
    "softmax": lambda x, y, b, p, i, j, m: torch.softmax(x, -1) + torch.softmax(y, 0) + torch.log_softmax(x, -1),
    "casts": lambda x, y, b, p, i, j, m: (x * 3).half().float() + x.to(torch.bfloat16).float() + (y * 3).long(),
    "contiguous_of_transpose": lambda x, y, b, p, i, j, m: (x.t() * 2).contiguous() + 1,
    "layer_norm_elementwise": lambda x, y, b, p, i, j, m: (
        (x - x.mean(-1, keepdim=True))
        * torch.rsqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-5)
        * b + b),
}


@pytest.mark.parametrize("name", sorted(FUSIBLE))
def test_fusible_ops_match_cpu_float32(name, defer, fused_single_ops):
    f = FUSIBLE[name]
    args = _inputs()
    ref = f(*args)
    out = f(*[a.tpu() for a in args])
    s = stats()
    assert s["ops_recorded"] >= 1 and s["fallbacks"] == 0, s
    assert s["regions_flushed"] == 0, "the whole expression is one region"
    torch.testing.assert_close(out.cpu(), ref)
    assert stats()["regions_run"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_fusible_ops_match_cpu_other_dtypes(dtype, defer, fused_single_ops):
    args = _inputs(dtype)
    skip = {"layer_norm_elementwise"} if dtype == torch.bfloat16 else set()  # cancellation, see the docstring
    for name, f in sorted(FUSIBLE.items()):
        if name in skip:
            continue
        try:
            ref = f(*args)
        except RuntimeError:
            continue  # not defined on the CPU for this dtype
        out = f(*[a.tpu() for a in args])
        # softmax in 16 bits: ATen's reduced-precision kernels round their
        # intermediates their own way; within 2 ulp.
        tol = {"rtol": 2e-3, "atol": 1e-5} if dtype == torch.float16 and name == "softmax" else {}
        torch.testing.assert_close(out.cpu(), ref, msg=lambda m, name=name, dtype=dtype: f"{name} ({dtype}): {m}",
                                   **tol)
    assert stats()["fallbacks"] == 0


def test_single_op_regions_run_atens_kernel(defer):
    x = torch.randn(64, 256)
    xt = x.tpu()
    y = torch.softmax(xt, -1)       # alone in its region: ATen's kernel, bit for bit
    assert torch.equal(y.cpu(), torch.softmax(x, -1))
    g = torch.ops.aten.gelu_backward(y, xt)  # its out= overload is named grad_input
    assert torch.equal(g.cpu(), torch.ops.aten.gelu_backward(torch.softmax(x, -1), x))
    z = F.gelu(xt) + 1              # two ops: compiled
    torch.testing.assert_close(z.cpu(), F.gelu(x) + 1)
    s = stats()
    assert s["single_op_regions"] == 2 and s["regions_compiled"] + s["cache_hits"] == 1, s


def test_regions_whose_results_all_live_run_atens_kernels(defer):
    x = torch.randn(64, 256)
    xt = x.tpu()
    y = xt * 3                      # every result held: ATen's kernels, bit for bit
    e = torch.exp(y)
    z = e + y
    w = F.gelu(z)
    ty, te = x * 3, torch.exp(x * 3)
    assert torch.equal(w.cpu(), F.gelu(te + ty)) and torch.equal(z.cpu(), te + ty)
    assert torch.equal(e.cpu(), te) and torch.equal(y.cpu(), ty)
    s = stats()
    assert s["regions_replayed"] == 1 and s["kernels_launched"] == 0 and s["ops_fused"] == 4, s
    v = F.gelu(torch.exp(xt * 3) + 1)  # intermediates dropped: compiled
    torch.testing.assert_close(v.cpu(), F.gelu(torch.exp(x * 3) + 1))
    s = stats()
    assert s["regions_replayed"] == 1 and s["kernels_launched"] >= 1 and s["outputs_dead"] == 3, s


def test_regions_that_keep_few_bytes_out_of_hbm_run_atens_kernels(defer):
    x = torch.randn(512, 256)
    xt = x.tpu()
    bias_sum = xt.sum(0) * 2        # the [256] sum dies: fusion would keep 1 KiB out of HBM
    e = torch.exp(xt)               # ... next to 512 KiB it must write anyway
    assert torch.equal(e.cpu(), torch.exp(x)) and torch.equal(bias_sum.cpu(), x.sum(0) * 2)
    s = stats()
    assert s["regions_replayed"] == 1 and s["kernels_launched"] == 0 and s["outputs_dead"] == 1, s


def test_replayed_regions_keep_in_place_writes_and_dtype_conversions_in_order(defer):
    x, b = torch.randn(32, 128), torch.randn(32, 128)
    xt, bt = x.tpu(), b.tpu()
    h = xt.to(torch.bfloat16)       # _to_copy: copy_ into the result
    g = h * 2
    bb = bt.to(torch.bfloat16)
    g.add_(bb)                      # in place on a region result
    gf = g.float()
    xt.mul_(gf)                     # in place on memory the region read before
    h_ref = x.bfloat16()
    g_ref = (h_ref * 2).add_(b.bfloat16())
    assert torch.equal(xt.cpu(), x * g_ref.float())
    assert torch.equal(g.cpu(), g_ref) and torch.equal(h.cpu(), h_ref) and torch.equal(gf.cpu(), g_ref.float())
    assert torch.equal(bb.cpu(), b.bfloat16())
    s = stats()
    assert s["regions_replayed"] >= 1 and s["kernels_launched"] == 0, s


def test_replayed_regions_give_strict_modes_gradients(defer_global):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 8))
    x = torch.randn(16, 64)
    ref = [p.detach().clone() for p in model.parameters()]
    model.tpu()

    def grads():
        model.zero_grad(set_to_none=True)
        with torch.autocast("tpu", dtype=torch.bfloat16):
            loss = model(x.tpu()).float().square().mean()
        loss.backward()
        return [p.grad.cpu() for p in model.parameters()]

    deferred = grads()
    torch_tpu.set_eager_mode("strict")
    strict = grads()
    for d, st in zip(deferred, strict):
        assert torch.equal(d, st)
    assert stats()["regions_replayed"] >= 1
    assert all(torch.equal(p.cpu(), r) for p, r in zip(model.parameters(), ref))


def test_replayed_regions_run_on_the_stream_they_were_recorded_on(defer_global):
    bt = torch.randn(1024, 1024, device="tpu") / 32  # a region on the default stream too
    side = torch.tpu.Stream()
    side.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(side):
        a = bt @ bt @ bt @ bt       # strict products queued on the side stream
        y = a * 3                   # a region on the side stream reading them, every result held
        e = torch.exp(y)
        z = e + y
    w = torch.ones(4, device="tpu") + 1  # recorded on the default stream: flushes the side region from here
    torch.tpu.synchronize()
    big = bt.cpu()
    ref = big @ big @ big @ big
    torch.testing.assert_close(a.cpu(), ref)
    torch.testing.assert_close(z.cpu(), torch.exp(ref * 3) + ref * 3)
    torch.testing.assert_close(w.cpu(), torch.full((4,), 2.0))
    assert stats()["regions_replayed"] >= 1


def test_replay_takes_a_0dim_cpu_operands_value_at_the_call(defer):
    x = torch.arange(4.0)
    scale, one = torch.tensor(2.0), torch.tensor(1.0)
    xt = x.tpu()
    y = xt * scale                  # an lr or scale kept on the CPU...
    z = y * 1
    z.add_(one)
    scale.fill_(5.0)                # ... changed before the region is flushed
    one.add_(10)
    assert torch.equal(y.cpu(), x * 2) and torch.equal(z.cpu(), x * 2 + 1)
    assert stats()["regions_replayed"] == 1


def test_an_op_that_raises_when_its_region_replays_spoils_only_what_reads_it(defer):
    x = torch.full((4, 4), 3.0)
    xt = x.tpu()
    h = xt.half()
    s = torch._softmax(h, 1, True)  # its meta kernel accepts what CPU's kernel refuses
    t = s * 2
    k = xt + 1
    with pytest.raises(RuntimeError, match=r"half to float conversion is not supported.*aten::_softmax"):
        s.cpu()
    assert torch.equal(k.cpu(), x + 1) and torch.equal(h.cpu(), x.half())
    with pytest.raises(RuntimeError, match=r"holds no values: aten::_softmax.* raised when its region ran"):
        s.cpu()
    with pytest.raises(RuntimeError, match="reads the result of a deferred op that raised"):
        t.cpu()
    s.fill_(1.0)                    # overwritten whole: usable again
    assert torch.equal(s.cpu(), torch.ones(4, 4))


def test_replay_off_compiles_regions_whose_results_live(defer, fused_single_ops):
    x = torch.randn(64, 256)
    xt = x.tpu()
    y = xt * 3
    e = torch.exp(y)
    z = e + y
    torch.testing.assert_close(z.cpu(), torch.exp(x * 3) + x * 3)
    torch.testing.assert_close(e.cpu(), torch.exp(x * 3))
    torch.testing.assert_close(y.cpu(), x * 3)
    s = stats()
    assert s["regions_replayed"] == 0 and s["kernels_launched"] >= 1, s


def test_bf16_arithmetic_rounds_per_op_like_eager(defer):
    x, y = (torch.randn(4096) * 10).bfloat16(), torch.randn(4096).bfloat16()
    f = lambda x, y: ((x * 0.1 + y) * y - x / 3).clamp(-2, 2) * 1.5  # noqa: E731
    assert torch.equal(f(x.tpu(), y.tpu()).cpu(), f(x, y))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_python_scalars_in_16_bit_chains_round_like_eager(dtype, defer):
    # ATen casts the scalar of add/sub/rsub to the 16-bit common dtype (0.3 -> 0.30078125 in
    # bf16) and reads mul/div's in float32: a fused chain must do the same.
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(dtype)
    for f in (lambda t: t * 1.7 + 0.3, lambda t: t * 1.7 - 0.3, lambda t: 0.3 - t * 1.7,
              lambda t: (t + 0.3) * 0.7 / 1.3, lambda t: torch.add(t * 2, 0.3, alpha=3)):
        assert torch.equal(f(x.tpu()).cpu(), f(x))


def test_chain_is_one_region_and_intermediates_get_no_hbm(defer):
    x = torch.randn(512, 1024).tpu()
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    y = F.gelu(x * 2 + 1, approximate="tanh").sigmoid() * 3
    assert torch.tpu.memory_allocated() == before  # recorded, nothing allocated yet
    ref = F.gelu(x.cpu() * 2 + 1, approximate="tanh").sigmoid() * 3
    torch.testing.assert_close(y.cpu(), ref)
    s = stats()
    assert s["ops_fused"] == 5 and s["regions_run"] == 1 and s["outputs_materialized"] == 1
    assert s["outputs_dead"] == 4 and s["hbm_bytes_avoided"] == 4 * 512 * 1024 * 4
    assert torch.tpu.memory_allocated() == before + 512 * 1024 * 4


def test_compile_cache_hits_across_iterations(defer):
    x = torch.randn(64, 128).tpu()
    outs = [(torch.sigmoid(x) * x + 1).cpu() for _ in range(4)]
    s = stats()
    assert s["regions_compiled"] == 1 and s["cache_hits"] == 3 and s["kernels_launched"] == 4
    torch.testing.assert_close(outs[-1], torch.sigmoid(x.cpu()) * x.cpu() + 1)


def test_changing_scalars_become_parameters(defer):
    x = torch.randn(64, 128).tpu()
    outs = []
    for step in range(6):
        lr = 0.1 / (step + 1)
        outs.append((torch.tanh(x * lr) + step).cpu())  # both scalars change every step
    s = stats()
    # Step 0 bakes them in; step 1 sees them change and makes them parameters; then hits.
    assert s["regions_compiled"] == 2 and s["cache_hits"] == 4, s
    for step, out in enumerate(outs):
        torch.testing.assert_close(out, torch.tanh(x.cpu() * (0.1 / (step + 1))) + step)


def test_scalar_sites_are_told_apart_by_source_line(defer):
    # The same op and argument on two lines: only the line whose scalar changes makes it a parameter.
    x = torch.randn(64, 128).tpu()
    outs = []
    for step in range(4):
        a = (torch.tanh(x * (step + 1.0)) + 1).cpu()  # varies: a parameter from step 1 on
        b = (torch.tanh(x * 3.0) + 1).cpu()  # constant: stays baked in (sharing a's site it would not)
        outs.append((a, b))
    s = stats()
    assert s["regions_compiled"] == 3 and s["cache_hits"] == 5, s
    xc = x.cpu()
    for step, (a, b) in enumerate(outs):
        torch.testing.assert_close(a, torch.tanh(xc * (step + 1.0)) + 1)
        torch.testing.assert_close(b, torch.tanh(xc * 3.0) + 1)


@pytest.mark.parametrize("rows", [1024, 1023])
def test_large_regions_run_in_chunks(rows, defer):
    # Results of >= 256K elements are computed in row chunks on the intra-op threads.
    x, r = torch.randn(rows, 512), torch.randn(512, rows)
    w, b = torch.randn(512), torch.randn(rows, 1)
    acc = torch.randn(rows, 512)

    def f(x, r, w, b, acc):
        h = x + r.t() * w                      # a transposed input, a broadcast row
        mu = h.mean(-1, keepdim=True)
        y = (h - mu) * torch.rsqrt(((h - mu) ** 2).mean(-1, keepdim=True) + 1e-5) + b
        acc.add_(y, alpha=0.5)                 # an in-place write-back
        return y, h.amax(-1)

    dev = [t.tpu() for t in (x, r, w, b, acc)]
    y, m = f(*dev)
    y_ref, m_ref = f(x, r, w, b, acc)
    torch.testing.assert_close(y.cpu(), y_ref)
    torch.testing.assert_close(m.cpu(), m_ref)
    torch.testing.assert_close(dev[4].cpu(), acc)
    if torch.get_num_threads() > 1:
        assert stats()["regions_split"] == 1


def test_region_of_independent_parts_runs_them_over_the_threads(defer):
    # A backward-like region: an activation's gradient [rows, 512] next to a
    # weight's cast [300, 1000] and a bias gradient (a sum over the rows): the
    # results differ in length, so the region cannot be split whole; its three
    # independent parts run as tasks on the intra-op threads (the large one in
    # row chunks).
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(1024, 512, generator=g), torch.randn(1024, 512, generator=g)
    w, b = torch.randn(300, 1000, generator=g), torch.randn(333, generator=g)

    def f(x, dy, w, b):
        dx = dy * torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))
        wg = (w * 0.5).to(torch.bfloat16)
        bg = (dy * 2).sum(0)
        return dx, wg, bg, b.exp()

    got = [t.cpu() for t in f(*(t.tpu() for t in (x, dy, w, b)))]
    s = stats()
    assert s["regions_run"] == 1, s
    if torch.get_num_threads() > 1:
        assert s["regions_in_parts"] == 1, s
    ref = f(x, dy, w, b)
    for i in (0, 1, 3):
        torch.testing.assert_close(got[i], ref[i])
    # The sum over 1024 rows: the executor's summation order (not ATen's), so bit for bit the
    # same reduction run alone, and CPU's within the rounding of 1024 terms.
    alone = (dy.tpu() * 2).sum(0).cpu()
    assert torch.equal(got[2], alone)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-4, atol=5e-4)


# ---------------------------------------------------------------- aliasing


def test_inplace_on_pending_and_on_materialized_tensors(defer):
    a = torch.randn(8, 16)
    at = a.tpu()
    torch.tpu.synchronize()
    y = at * 2          # pending
    y.add_(1).mul_(3)   # in place on a pending result: rebinds it
    at.sub_(y * 0.01)   # in place on a real tensor, from a pending one: written back after the kernels
    F.relu(at, inplace=True)
    z = at + y          # reads the written-back value inside the same region
    assert stats()["regions_flushed"] == 0
    ref_y = (a * 2 + 1) * 3
    ref_a = F.relu(a - ref_y * 0.01)
    torch.testing.assert_close(z.cpu(), ref_a + ref_y)
    torch.testing.assert_close(y.cpu(), ref_y)
    torch.testing.assert_close(at.cpu(), ref_a)
    assert stats()["fallbacks"] == 0


def test_inplace_on_views(defer):
    a = torch.randn(8, 16)
    at = a.tpu()
    row = at[2]             # a view of a real tensor: written back through its strides
    row.mul_(10)
    col = at[:, 3]
    col.add_(1)
    a[2] *= 10
    a[:, 3] += 1
    torch.testing.assert_close(at.cpu(), a)
    y = at * 1              # pending; then an in-place op on a view of it
    y[1:3].zero_()          # fill_ on a slice of a pending result: flushes, then runs strictly
    y[0].add_(5)
    ref = a.clone()
    ref[1:3] = 0
    ref[0] += 5
    torch.testing.assert_close(y.cpu(), ref)


def test_views_of_pending_results(defer):
    x = torch.randn(6, 10)
    xt = x.tpu()
    s = xt.sum(1)                       # pending [6]
    a = s.unsqueeze(1) * xt             # broadcast view: expressed in the IR
    b = (xt * 2).view(-1) + 1           # row-major reshape: expressed in the IR
    c = (xt * 2).expand(3, 6, 10) - 1   # expand: expressed in the IR
    assert stats()["regions_flushed"] == 0
    d = (xt * 2).t() + 1                # transpose: not expressible, flushes
    e = (xt * 3)[1:4] * 2               # slice: flushes
    assert stats()["regions_flushed"] >= 1
    torch.testing.assert_close(a.cpu(), x.sum(1).unsqueeze(1) * x)
    torch.testing.assert_close(b.cpu(), (x * 2).view(-1) + 1)
    torch.testing.assert_close(c.cpu(), (x * 2).expand(3, 6, 10) - 1)
    torch.testing.assert_close(d.cpu(), (x * 2).t() + 1)
    torch.testing.assert_close(e.cpu(), (x * 3)[1:4] * 2)


def test_tensor_mutated_after_a_pending_read(defer):
    x = torch.randn(32, 32)
    xt = x.tpu()
    y = xt * 2               # reads xt (pending)
    xt.copy_(torch.ones(32, 32).tpu())  # a strict write to what the region reads: flushes first
    z = xt + 1
    xt.fill_(7)              # a strict write: flushes first
    w = xt * y               # records again
    torch.testing.assert_close(y.cpu(), x * 2)
    torch.testing.assert_close(z.cpu(), torch.full((32, 32), 2.0))
    torch.testing.assert_close(w.cpu(), 7 * x * 2)
    assert stats()["flush_reasons"]["conflict"] >= 2


def test_recorded_inplace_after_a_recorded_read(defer):
    x = torch.randn(16, 16)
    xt = x.tpu()
    torch.tpu.synchronize()
    y = xt.exp()       # reads xt
    xt.mul_(y)         # recorded write to xt (y is pending), after the read, in the same region
    z = xt + y         # reads the new xt
    assert stats()["regions_flushed"] == 0
    torch.testing.assert_close(y.cpu(), x.exp())
    torch.testing.assert_close(z.cpu(), x * x.exp() + x.exp())
    torch.testing.assert_close(xt.cpu(), x * x.exp())
    xt.mul_(2)         # nothing pending involved: ATen's in-place kernel; reads of xt flush first
    torch.testing.assert_close(xt.cpu(), x * x.exp() * 2)


def test_input_metadata_changed_in_place_after_recording(defer):
    x = torch.randn(4, 6)
    xt = x.tpu()
    y = xt.exp()          # one op: ATen's kernel runs it at the flush
    xt.t_()               # the input's metadata changes before the flush
    torch.testing.assert_close(y.cpu(), x.exp())
    z = xt * 2 + 1        # two ops: compiled
    xt.t_()
    torch.testing.assert_close(z.cpu(), x.t() * 2 + 1)
    w = xt.sigmoid()
    xt.resize_(24)        # resizing a tensor a region reads flushes it first
    torch.testing.assert_close(w.cpu(), x.sigmoid())


def test_unused_fresh_tensors_are_not_flushed_for(defer):
    x = torch.randn(128).tpu()
    y = x * 2
    zeros = torch.zeros(128, device="tpu")   # fill_ on fresh memory: queued ahead, no flush
    w = torch.where(y > 0, y, 0.5) + zeros
    other = torch.ones(128, device="tpu")
    other.mul_(3)                            # in place, nothing of the region: runs now, no flush
    assert stats()["regions_flushed"] == 0
    assert other.sum().item() == 384
    torch.testing.assert_close(w.cpu(), torch.where(x.cpu() * 2 > 0, x.cpu() * 2, 0.5))


# ---------------------------------------------------------------- autograd, RNG


def test_mlp_gradients_match_cpu(defer_global):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 32),
                              torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 32),
                              torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4))
    dev.load_state_dict(cpu.state_dict())
    dev = dev.tpu()
    x, t = torch.randn(8, 16), torch.randn(8, 4)

    def loss_of(model, x, t):
        h = model(x)
        return (((h - t) ** 2).mean() + torch.softmax(h, -1).amax(-1).sum() * 0.1)

    loss = loss_of(dev, x.tpu(), t.tpu())
    loss.backward()
    ref = loss_of(cpu, x, t)
    ref.backward()
    torch.testing.assert_close(loss.cpu(), ref)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
    s = stats()
    assert s["ops_fused"] > 20 and s["fallbacks"] == 0, s


def test_rng_ops_flush_and_match_strict(defer):
    def run(mode):
        with torch_tpu.eager_mode(mode):
            torch.manual_seed(123)
            x = torch.randn(64, 64, device="tpu")
            h = F.gelu(x * 2 + 1)
            d = F.dropout(h, 0.3)            # recorded: the mask is drawn when the region runs
            n = torch.randn(64, 64, device="tpu")
            out = (d + n * 0.1).sigmoid()
            u = torch.empty(64, device="tpu").uniform_()
            return (out * u).cpu()

    ref = run("strict")
    torch.testing.assert_close(run("defer_and_fuse"), ref)


def test_large_layer_norm_region_runs_in_cache_sized_chunks_on_one_thread(defer):
    # A residual add + layer norm over 512 rows of 1024: five kernels, run in
    # chunks of 256 rows (TORCH_TPU_DEFER_CHUNK_ELEMENTS) one after another, so
    # x + r stays in cache between them; rows are independent, so the result
    # equals the unsplit one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        x, r = torch.randn(512, 1024, generator=g), torch.randn(512, 1024, generator=g)
        w, b = torch.randn(1024, generator=g), torch.randn(1024, generator=g)

        def ln(x, r, w, b):
            h = x + r
            mu = h.mean(-1, keepdim=True)
            var = ((h - mu) ** 2).mean(-1, keepdim=True)
            return (h - mu) * torch.rsqrt(var + 1e-5) * w + b
        got = ln(x.tpu(), r.tpu(), w.tpu(), b.tpu()).cpu()
        assert stats()["regions_split"] == 1, stats()
        torch.testing.assert_close(got, ln(x, r, w, b))
    finally:
        torch.set_num_threads(threads)


def _rng_chain(dtype, shape=(64, 1000), gen=None):
    torch.manual_seed(123)
    x = torch.randn(*shape, device="tpu").to(dtype)
    b = torch.randn(shape[-1], device="tpu").to(dtype)
    h = x * 2 + b                                     # exact arithmetic: results compare bit for bit
    d = F.dropout(h, 0.3)
    o, m = torch.native_dropout(h - 1, 0.5, True)
    k = torch.bernoulli(x, 0.25, generator=gen) * x   # bernoulli.p
    j = (x * 3).bernoulli_(0.7, generator=gen) + 1    # bernoulli_.float on a pending result
    n = torch.randn(5, device="tpu")                  # a strict RNG op after them: drawn after theirs
    return [t.cpu() for t in (d * 2, o, m, k, j, n, x, b)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rng_ops_fuse_and_equal_strict_and_cpu(dtype):
    ref = _rng_chain(dtype)
    tdebug.reset_region_stats()
    with torch_tpu.eager_mode("defer_and_fuse"):
        got = _rng_chain(dtype)
    s = stats()
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    # dropout, bernoulli and their arithmetic were recorded (nothing ran strictly, nothing flushed before them)
    assert s["fallbacks"] == 0 and s["ops_fused"] >= 12 and s["flush_reasons"]["view"] == 0, s
    assert s["rng_vectorized"] in (True, False)
    # CPU computes the same from the same inputs and masks. The chip's stream is not CPU's: the
    # masks are drawn again, strictly, at the stream positions each op reserved (philox: an op
    # of n elements takes n positions, rounded up to 4, in program order).
    x, bias = ref[6], ref[7]
    state = torch.tpu.get_rng_state()
    pos = 64000 + 1000  # after randn(64, 1000) and randn(1000)

    def mask(p, dtype):
        nonlocal pos
        st = state.clone()
        st[8:] = torch.tensor([pos], dtype=torch.int64).view(torch.uint8)
        torch.tpu.set_rng_state(st)
        pos += 64000
        return torch.empty(64, 1000, device="tpu", dtype=dtype).bernoulli_(p).cpu()

    h = x * 2 + bias
    noise = mask(0.7, dtype).div_(0.7)               # CPU's dropout: input * (mask / (1 - p))
    assert torch.equal(h * noise * 2, got[0])
    m = mask(0.5, torch.bool)
    assert torch.equal(m, got[2]) and torch.equal((h - 1).mul(m).mul_(2.0), got[1])
    assert torch.equal(mask(0.25, dtype) * x, got[3])
    assert torch.equal(mask(0.7, dtype) + 1, got[4])
    assert 0.6 < noise.ne(0).double().mean().item() < 0.8


def test_rng_ops_with_a_generator_and_in_row_chunks(defer):
    # 512K-element results run in row chunks on the intra-op threads; the
    # mask is drawn whole, in order, before them.
    def run(mode):
        g = torch.Generator(device="tpu").manual_seed(9)
        with torch_tpu.eager_mode(mode):
            return _rng_chain(torch.float32, (512, 1024), gen=g)
    ref = run("strict")
    for a, b in zip(ref, run("defer_and_fuse")):
        assert torch.equal(a, b)


def test_dead_rng_result_still_advances_the_generator(defer):
    def run(mode):
        with torch_tpu.eager_mode(mode):
            torch.manual_seed(5)
            x = torch.ones(300, device="tpu")
            F.dropout(x * 2, 0.5)            # result dropped: never computed, but its numbers are drawn
            torch.bernoulli(x, 0.5)
            return torch.rand(10, device="tpu").cpu()
    ref = run("strict")
    tdebug.reset_region_stats()
    got = run("defer_and_fuse")
    assert torch.equal(got, ref)
    assert stats()["outputs_dead"] >= 2


def test_draw_past_the_largest_offset_leaves_the_pending_region_whole(defer):
    # The draw raises at the call; what was recorded before it still runs.
    x = torch.arange(8.0, device="tpu")
    a = x * 2 + 1
    g = torch.tpu.default_generators[0]
    g.set_offset(2**63 - 4)
    with pytest.raises(RuntimeError, match="past 2"):
        F.dropout(a * 3, 0.5)
    assert g.get_offset() == 2**63 - 4
    torch.tpu.manual_seed(0)
    assert torch.equal(a.cpu(), torch.arange(8.0) * 2 + 1)
    assert torch.equal(F.dropout(a * 3, 0.0).cpu(), (torch.arange(8.0) * 2 + 1) * 3)


def test_reseeding_and_state_with_a_pending_region_that_draws(defer):
    # manual_seed / get_rng_state flush and wait first: the pending region's
    # numbers come from before the reseed, as in strict mode.
    def run(mode):
        with torch_tpu.eager_mode(mode):
            torch.manual_seed(1)
            x = torch.ones(4096, device="tpu")
            a = F.dropout(x * 3, 0.4)
            torch.tpu.manual_seed(2)
            b = F.dropout(x * 3, 0.4)
            state = torch.tpu.get_rng_state()
            c = F.dropout(x - 1, 0.4) + torch.bernoulli(x, 0.5)
            torch.tpu.set_rng_state(state)
            e = F.dropout(x - 1, 0.4) + torch.bernoulli(x, 0.5)
            return [t.cpu() for t in (a, b, c, e)]
    ref = run("strict")
    got = run("defer_and_fuse")
    for r, g in zip(ref, got):
        assert torch.equal(r, g)
    assert torch.equal(got[2], got[3]) and not torch.equal(got[0], got[1])


def test_training_loop_with_dropout_repeats_and_equals_strict():
    def run(mode, steps=60):
        with torch_tpu.eager_mode(mode):
            torch.manual_seed(4)
            x = torch.randn(16, 64, device="tpu")
            for _ in range(steps):            # 6 recorded ops a step, no flush inside
                x = torch.tanh(F.dropout(x * 1.5 + 0.1, 0.2)) * 0.9
            return x.cpu()
    ref = run("strict")
    tdebug.reset_region_stats()
    got = run("defer_and_fuse")
    torch.testing.assert_close(got, ref)   # tanh is the executor's polynomial; a different mask would differ by O(1)
    s = stats()
    assert s["flush_reasons"]["repeat"] >= 10 and s["regions_compiled"] <= 4, s


def test_dropout_draws_from_the_tpu_generator():
    # ATen's native_dropout kernel draws from the CPU's default generator; on
    # tpu the chip's generator decides (torch.tpu.manual_seed), in every mode.
    torch.random.default_generator.manual_seed(2)
    torch.tpu.manual_seed(0)
    with torch_tpu.eager_mode("strict"):
        expected = F.dropout(torch.ones(1000, device="tpu"), 0.5).cpu()
        torch.tpu.manual_seed(1)
        other = F.dropout(torch.ones(1000, device="tpu"), 0.5).cpu()
    assert not torch.equal(other, expected)
    assert 400 < expected.ne(0).sum().item() < 600
    for mode in ("strict", "defer_and_fuse"):
        torch.random.default_generator.manual_seed(1)
        torch.tpu.manual_seed(0)
        with torch_tpu.eager_mode(mode):
            got = F.dropout(torch.ones(1000, device="tpu"), 0.5).cpu()
        assert torch.equal(got, expected), mode


def test_dropout_training_step_gradients_match_cpu(defer_global):
    # Inputs drawn once on CPU and copied; CPU applies the mask the chip's generator draws
    # (a strict dropout of ones from the same generator state).
    gen = torch.Generator().manual_seed(3)
    w0, x0 = torch.randn(32, 64, generator=gen), torch.randn(16, 32, generator=gen)
    torch.tpu.manual_seed(3)
    with torch_tpu.eager_mode("strict"):
        keep = F.dropout(torch.ones(16, 64, device="tpu"), 0.2).cpu()

    def step(device):
        torch.tpu.manual_seed(3)
        w = w0.to(device, copy=True).requires_grad_()
        x = x0.to(device)
        h = F.gelu(x @ w, approximate="tanh")
        h = F.dropout(h, 0.2) if device == "tpu" else h * keep
        loss = (h * h).mean()
        loss.backward()
        return loss.detach().cpu(), w.grad.cpu()
    ref = step("cpu")
    got = step("tpu")
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1])
    assert stats()["fallbacks"] == 0


# ---------------------------------------------------------------- flush triggers


def test_flush_triggers(defer):
    x = torch.randn(64).tpu()
    y = x * 2
    assert tdebug.pending_ops() == 1
    torch.tpu.synchronize()
    assert tdebug.pending_ops() == 0 and stats()["flush_reasons"]["sync"] == 1
    y = x + 1
    _ = y.sum().item()                         # host read
    assert tdebug.pending_ops() == 0
    y = x + 2
    ev = torch.tpu.Event()
    ev.record()                                # event use
    assert tdebug.pending_ops() == 0
    ev.synchronize()
    z = y * 3
    repr(z)                                    # print
    assert tdebug.pending_ops() == 0
    z = y * 4
    assert z.tolist() == (y * 4).cpu().tolist()
    w, ref = x, x.cpu()
    for _ in range(300):                       # the size cap (256 ops)
        w, ref = w * 1.0001, ref * 1.0001
    assert stats()["flush_reasons"]["size_cap"] >= 1
    torch.testing.assert_close(w.cpu(), ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scalar_overloads_round_the_scalar_as_aten_does(dtype, defer, fused_single_ops):
    # ATen's add/sub.Scalar, add_/sub_.Scalar and mul_.Scalar round the scalar
    # to a 16-bit tensor's dtype; mul.Scalar and div(_).Scalar do not (C++
    # callers such as native_dropout use these overloads).
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * 3).to(dtype)
    s = 1 / 0.7
    for name in ["add.Scalar", "add_.Scalar", "sub.Scalar", "sub_.Scalar", "mul.Scalar", "mul_.Scalar",
                 "div.Scalar", "div_.Scalar"]:
        op = getattr(torch.ops.aten, name.split(".")[0]).Scalar
        ref = op(x.clone(), s)
        got = op(x.tpu() * 1, s).cpu()          # on a pending result: recorded
        assert torch.equal(got, ref), name


def _loop_body(x, y):
    # 7 recorded ops: 256 (the size cap) is no multiple of 7, so cap flushes
    # alone would fall at 7 different offsets into the body.
    return (torch.tanh(x * 0.5 + y) - 0.25) * 0.9 + y.sigmoid() * 0.1


def test_repeating_op_sequence_flushes_at_the_same_place(defer):
    g = torch.Generator().manual_seed(0)
    x0, y0 = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    x, y, ref = x0.tpu(), y0.tpu(), x0
    for _ in range(100):                       # warm-up: the first cap flush sets the cut point
        x, ref = _loop_body(x, y), _loop_body(ref, y0)
    torch.testing.assert_close(x.cpu(), ref)
    tdebug.reset_region_stats()
    for _ in range(100):
        x, ref = _loop_body(x, y), _loop_body(ref, y0)
    torch.testing.assert_close(x.cpu(), ref)
    s = stats()
    # one region per iteration, cut at the same offset: compiled at most twice
    # (the first and last partial iterations), the rest are cache hits
    assert s["flush_reasons"]["repeat"] >= 95, s
    assert s["flush_reasons"]["size_cap"] == 0, s
    assert s["regions_compiled"] <= 2 and s["cache_hits"] >= 95, s


def test_repeat_detection_off_drifts(run_python):
    # Without the detector the same loop compiles a region per cap offset.
    code = """
        import json, torch, torch_tpu, torch_tpu.debug as d
        torch_tpu.set_eager_mode("defer_and_fuse")
        x, y = torch.randn(8, 16).tpu(), torch.randn(8, 16).tpu()
        for _ in range(400):  # 12 ops a body
            x = (torch.tanh(x * 0.5 + y) - 0.25) * 0.9 + y.sigmoid() * 0.1
            x = x * 1.5 - x.exp() * 0.5 + 0.3
        x.cpu()
        print(json.dumps(d.region_stats()))
    """
    off = run_python(code, env={"TORCH_TPU_DEFER_REPEAT": "0"}).json()
    on = run_python(code).json()
    assert off["flush_reasons"]["repeat"] == 0 and off["regions_compiled"] >= 8, off
    assert on["flush_reasons"]["repeat"] > 350 and on["regions_compiled"] <= 3, on


def test_other_modes_flush_what_they_read():
    x = torch.randn(32).tpu()
    with torch_tpu.eager_mode("defer_and_fuse"):
        y = x * 2
    assert tdebug.pending_ops() == 0  # leaving the mode flushes
    with torch_tpu.eager_mode("defer_and_fuse"):
        y = x * 3
        with torch_tpu.eager_mode("strict"):
            z = y @ y                  # a strict op reading a pending result
        with torch_tpu.eager_mode("debug"):
            w = y.cumsum(0)
    torch.testing.assert_close(z.cpu(), (x.cpu() * 3) @ (x.cpu() * 3))
    torch.testing.assert_close(w.cpu(), (x.cpu() * 3).cumsum(0))


# ---------------------------------------------------------------- environment, IR dump, errors


def test_env_var_selects_mode_and_dump_ir_writes_stablehlo(run_python, tmp_path):
    r = run_python(f"""
        import json, os, torch, torch_tpu
        x = torch.randn(1000).tpu()
        y = torch.tanh(x * 2 + 1)
        print(json.dumps({{"mode": torch_tpu.get_eager_mode(), "y": y.cpu().tolist()[:3],
                          "ref": torch.tanh(x.cpu() * 2 + 1).tolist()[:3],
                          "stats": torch_tpu.debug.region_stats(), "files": sorted(os.listdir({str(tmp_path)!r}))}}))
    """, env={"TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_DUMP_IR": str(tmp_path)})
    out = r.json()
    assert out["mode"] == "defer_and_fuse"
    assert out["stats"]["ops_fused"] == 3 and out["stats"]["regions_compiled"] == 1
    torch.testing.assert_close(torch.tensor(out["y"]), torch.tensor(out["ref"]))
    assert len(out["files"]) == 1 and out["files"][0].endswith(".mlir")
    text = (tmp_path / out["files"][0]).read_text()
    assert "func.func" in text and "stablehlo.tanh" in text and "stablehlo.multiply" in text
    assert "aten::tanh at <string>:4" in text


def test_profiler_names_each_region_by_the_hash_of_its_dumped_ir(run_python, tmp_path):
    """A region's device event in torch.profiler is `defer_and_fuse region_<hash>`, the hash in the
    name of the StableHLO file TORCH_TPU_DUMP_IR wrote for it; two structures, two names."""
    r = run_python(f"""
        import json, os, torch, torch_tpu
        from torch.profiler import profile, ProfilerActivity
        x = torch.randn(1000).tpu()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
            for _ in range(2):
                y = torch.tanh(x * 2 + 1); torch.tpu.synchronize()
                z = (x - 3).relu().sum(); torch.tpu.synchronize()
        names = sorted(e.key for e in p.key_averages() if "defer_and_fuse" in e.key)
        counts = [e.count for e in p.key_averages() if "defer_and_fuse" in e.key]
        print(json.dumps({{"names": names, "counts": counts, "files": sorted(os.listdir({str(tmp_path)!r}))}}))
    """, env={"TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_DUMP_IR": str(tmp_path)})
    out = r.json()
    assert len(out["names"]) == 2 and out["counts"] == [2, 2], out
    hashes = {n.rsplit("_", 1)[1] for n in out["names"]}
    assert all(n.startswith("tpu::defer_and_fuse region_") for n in out["names"]), out
    assert hashes == {f.rsplit("_", 1)[1].removesuffix(".mlir") for f in out["files"]}, out


def test_error_in_a_region_names_the_op_and_source_line(run_python):
    r = run_python("""
        import json, torch, torch_tpu
        torch_tpu.set_eager_mode("defer_and_fuse")
        x = torch.randn(1 << 20).tpu()
        small = torch.tanh(x)
        big = x.expand(8, 1 << 20) * 2
        try:
            torch.tpu.synchronize()
            print(json.dumps({"error": None}))
        except torch.OutOfMemoryError as e:
            del big
            print(json.dumps({"error": str(e), "ok": torch.allclose(small.cpu(), torch.tanh(x.cpu()))}))
    """, env={"TORCH_TPU_HBM_BYTES": "24MiB"})
    out = r.json()
    assert out["error"] is not None
    assert "aten::mul.Tensor at <string>:6" in out["error"], out["error"]
    assert out["ok"]  # the region stayed pending; once memory was freed it ran


@pytest.mark.parametrize("shape", [(1, 4), (3, 1, 2), (3, 2, 1, 2)])
def test_reduction_viewed_with_size1_dims_broadcast_back(shape):
    """amax backward's pattern: x.amax(-1).view(keepdim shape) compared with / subtracted from x.
    The fusion planner put the consumer of the reshaped reduction in the reducing kernel itself,
    which read the result's memory before the reduction wrote it (0)."""
    x = torch.randn(*shape)
    keep = shape[:-1] + (1,)
    with torch_tpu.eager_mode("defer_and_fuse"):
        xt = x.to("tpu")
        got = (xt.sum([-1]).view(keep) - xt).cpu()
    torch.testing.assert_close(got, x.sum([-1]).view(keep) - x)


def test_argument_error_in_a_lowering_is_reported_as_strict_mode_does(recwarn):
    """softmax over a dim a 1-D tensor lacks: the same error as strict mode, and no
    'could not record' warning from defer_and_fuse on top."""
    x = torch.randn(5, device="tpu")
    errors = {}
    for mode in ("strict", "defer_and_fuse"):
        with torch_tpu.eager_mode(mode):
            with pytest.raises((IndexError, RuntimeError)) as e:
                torch.softmax(x * 2, 1)
                torch.tpu.synchronize()
            errors[mode] = str(e.value)
    assert "Dimension out of range" in errors["strict"]
    assert "Dimension out of range" in errors["defer_and_fuse"]
    assert not [w for w in recwarn if "could not record" in str(w.message)]
