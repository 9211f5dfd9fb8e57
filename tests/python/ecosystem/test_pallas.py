"""torch.tpu.pallas: Pallas TPU kernels written in JAX, run as PyTorch ops on tpu tensors.

Each kernel runs for real in Pallas's TPU interpret mode; CPU PyTorch is the oracle. Shapes
are small: interpret mode executes every grid step in Python-driven callbacks.
"""

import functools

import pytest
import torch

import torch_tpu

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from torch.tpu import pallas as tp  # noqa: E402

_BLOCK = (8, 128)


def _rows(i):
    return (i, 0)


# --- kernels ----------------------------------------------------------------------------


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@tp.jax_op("pallas_test::add")
def pallas_add(x: jax.Array, y: jax.Array) -> jax.Array:
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[pl.BlockSpec(_BLOCK, _rows)] * 2, out_specs=pl.BlockSpec(_BLOCK, _rows))(x, y)


def _block_sum_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


@tp.jax_op("pallas_test::block_sum")
def block_sum(x: jax.Array) -> jax.Array:
    """Sum of the (8, 128) row blocks of x: an accumulation over the grid."""
    return pl.pallas_call(_block_sum_kernel, out_shape=jax.ShapeDtypeStruct(_BLOCK, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[pl.BlockSpec(_BLOCK, _rows)], out_specs=pl.BlockSpec(_BLOCK, lambda i: (0, 0)))(x)


def _matmul_kernel(a_ref, b_ref, o_ref, acc_ref, *, steps):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == steps - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_fn(a: jax.Array, b: jax.Array, bm: int = 128, bk: int = 128, bn: int = 128) -> jax.Array:
    m, k = a.shape
    n = b.shape[1]
    grid = (m // bm, n // bn, k // bk)
    return pl.pallas_call(
        functools.partial(_matmul_kernel, steps=grid[2]), out_shape=jax.ShapeDtypeStruct((m, n), a.dtype), grid=grid,
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, s: (i, s)), pl.BlockSpec((bk, bn), lambda i, j, s: (s, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, s: (i, j)), scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )(a, b)


pallas_matmul = tp.jax_op("pallas_test::matmul", matmul_fn)


def _two_kernel(x_ref, y_ref, s_ref, p_ref):
    s_ref[...] = x_ref[...] + y_ref[...]
    p_ref[...] = x_ref[...] * y_ref[...]


@tp.jax_op("pallas_test::sum_and_product")
def sum_and_product(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(_two_kernel, out_shape=(out, out))(x, y)


def _scale_kernel(x_ref, o_ref, *, factor):
    o_ref[...] = x_ref[...] * factor


@tp.jax_op("pallas_test::scale_aliased")
def scale_aliased(x: jax.Array, factor: float) -> jax.Array:
    """A grid kernel whose output aliases its input (input_output_aliases)."""
    return pl.pallas_call(functools.partial(_scale_kernel, factor=factor),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[pl.BlockSpec(_BLOCK, _rows)], out_specs=pl.BlockSpec(_BLOCK, _rows),
                          input_output_aliases={0: 0})(x)


def _double_buffer_kernel(x_hbm, o_ref, buf, sem, *, chunks):
    """o = 2 * x, x streamed from HBM in (8, 128) chunks, two VMEM buffers in flight."""

    def copy(c, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(c * 8, 8)], buf.at[slot], sem.at[slot])

    copy(0, 0).start()

    def body(c, carry):
        slot = c % 2

        @pl.when(c + 1 < chunks)
        def _():
            copy(c + 1, 1 - slot).start()

        copy(c, slot).wait()
        o_ref[pl.ds(c * 8, 8), :] = buf[slot] * 2.0
        return carry

    jax.lax.fori_loop(0, chunks, body, 0)


@tp.jax_op("pallas_test::double_buffered")
def double_buffered(x: jax.Array) -> jax.Array:
    chunks = x.shape[0] // 8
    return pl.pallas_call(
        functools.partial(_double_buffer_kernel, chunks=chunks), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), x.dtype), pltpu.SemaphoreType.DMA((2,))])(x)


def _ring_kernel(x_ref, o_ref, send_sem, recv_sem):
    """Each device sends its block to its right neighbour along "x"."""
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    right = jax.lax.rem(me + 1, n)
    copy = pltpu.make_async_remote_copy(src_ref=x_ref, dst_ref=o_ref, send_sem=send_sem, recv_sem=recv_sem,
                                        device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    copy.start()
    copy.wait()


def ring_shift(x: jax.Array) -> jax.Array:
    return pl.pallas_call(_ring_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])(x)


# --- helpers ----------------------------------------------------------------------------


def _inputs(*shape, n=2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(n)]


# --- kernels against CPU PyTorch -----------------------------------------------------------


def test_elementwise_on_tpu_queued_and_counted():
    x, y = _inputs(16, 128)
    torch_tpu.runtime.reset_stats()
    out = pallas_add(x.to("tpu"), y.to("tpu"))
    assert out.device.type == "tpu" and out.shape == (16, 128) and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)
    s = torch_tpu.runtime.stats()
    assert s["pallas_calls"] == 1 and s["pallas_kernels"] == 1
    assert s["pallas_output_copies"] == 1 and s["pallas_output_copy_bytes"] == 16 * 128 * 4
    # priced by the kernel: one add per element; each (8, 128) block read twice and written once
    assert s["flops"] >= 16 * 128 and s["device_seconds"] > 0


def test_call_does_not_wait_for_the_chip(gate):
    x, y = (t.to("tpu") for t in _inputs(16, 128))
    pallas_add(x, y)  # compiles the JAX function before the gate blocks the stream
    torch.tpu.synchronize()
    blocked = gate(torch.zeros(8, device="tpu"))
    out = pallas_add(x, y)  # queued behind the gate: returns at once
    assert gate.log == []
    gate.open()
    torch.testing.assert_close(out.cpu(), x.cpu() + y.cpu())
    assert blocked.cpu().eq(1).all() and gate.log == [True]


def test_cpu_tensors_run_too():
    x, y = _inputs(16, 128)
    torch.testing.assert_close(pallas_add(x, y), x + y, rtol=0, atol=0)


def test_reduction_over_the_grid():
    (x,) = _inputs(32, 128, n=1)
    torch.testing.assert_close(block_sum(x.to("tpu")).cpu(), x.reshape(4, 8, 128).sum(0))


def test_matmul_with_vmem_accumulator():
    a, b = _inputs(256, 256, seed=1)
    torch_tpu.runtime.reset_stats()
    out = pallas_matmul(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(out.cpu(), a @ b, rtol=1e-4, atol=1e-3)
    s = torch_tpu.runtime.stats()
    # the jaxpr's dot x the grid (2·M·K·N), plus the accumulator's adds
    assert 2 * 256**3 <= s["flops"] <= 1.01 * 2 * 256**3 and s["mxu_seconds"] > 0
    small = pallas_matmul(a[:128, :128].to("tpu"), b[:128, :128].to("tpu"), 64, 64, 64)  # static args
    torch.testing.assert_close(small.cpu(), a[:128, :128] @ b[:128, :128], rtol=1e-4, atol=1e-3)


def test_profiler_device_track_shows_the_kernel_at_its_estimate():
    from torch.profiler import ProfilerActivity, profile

    a, b = (t.to("tpu") for t in _inputs(256, 256, seed=5))
    pallas_matmul(a, b)
    torch.tpu.synchronize()
    torch_tpu.runtime.reset_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        pallas_matmul(a, b)
        torch.tpu.synchronize()
    rows = {e.key: e for e in prof.key_averages()}
    device = rows["tpu::pallas_test::matmul"]
    assert device.count == 1
    assert device.self_device_time_total == pytest.approx(torch_tpu.runtime.stats()["device_seconds"] * 1e6, abs=1e-2)


def test_multi_output_and_bf16():
    x, y = _inputs(8, 128, dtype=torch.bfloat16)
    s, p = sum_and_product(x.to("tpu"), y.to("tpu"))
    torch.testing.assert_close(s.cpu(), x + y, rtol=0, atol=0)
    torch.testing.assert_close(p.cpu(), x * y, rtol=0, atol=0)
    assert s.dtype == p.dtype == torch.bfloat16


def test_grid_with_input_output_aliases_leaves_the_input_alone():
    (x,) = _inputs(24, 128, n=1)
    xt = x.to("tpu")
    out = scale_aliased(xt, 3.0)
    torch.testing.assert_close(out.cpu(), x * 3.0)
    torch.testing.assert_close(xt.cpu(), x, rtol=0, atol=0)  # the op returns a new tensor


def test_double_buffered_dma():
    (x,) = _inputs(32, 128, n=1)
    torch.testing.assert_close(double_buffered(x.to("tpu")).cpu(), x * 2.0, rtol=0, atol=0)


def test_remote_copy_ring_over_four_chips():
    mesh = tp.get_pallas_mesh("x", (4,))
    assert mesh.devices.size == 4 and mesh.axis_names == ("x",)
    ring = tp.jax_op("pallas_test::ring", ring_shift, mesh=mesh, input_partition_specs=(("x",),),
                     output_partition_specs=(("x",),))
    (x,) = _inputs(32, 128, n=1)
    out = ring(x.to("tpu"))
    # block i (8 rows, device i) lands on device i + 1
    torch.testing.assert_close(out.cpu(), torch.roll(x, 8, dims=0), rtol=0, atol=0)


def test_default_mesh_spans_every_chip():
    mesh = tp.get_default_pallas_mesh()
    assert mesh.devices.size == torch.tpu.device_count() and mesh.axis_names == ("x",)


# --- autograd, modes, compile, export --------------------------------------------------------


def _square_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * x_ref[...]


@tp.jax_op("pallas_test::square")
def square(x: jax.Array) -> jax.Array:
    return pl.pallas_call(_square_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _square_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return pallas_add(grad * x, grad * x)


def _square_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


square.register_autograd(_square_backward, setup_context=_square_setup)


def test_autograd_through_registered_backward():
    (x,) = _inputs(8, 128, n=1)
    xt = x.to("tpu").requires_grad_()
    (square(xt) * 3).sum().backward()
    xc = x.clone().requires_grad_()
    (xc * xc * 3).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)


@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_eager_modes(mode):
    x, y = _inputs(16, 128, seed=2)
    with torch_tpu.eager_mode(mode):
        xt, yt = x.to("tpu"), y.to("tpu")
        out = pallas_add(xt * 2 + 1, yt) * 3  # a flush point between fused chains
        got = out.cpu()
    torch.testing.assert_close(got, (pallas_add(x * 2 + 1, y)) * 3)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_torch_compile(fullgraph):
    x, y = _inputs(16, 128, seed=3)

    def f(a, b):
        return pallas_add(a.sin(), b) * 2

    compiled = torch.compile(f, backend="tpu", fullgraph=fullgraph)
    torch.testing.assert_close(compiled(x.to("tpu"), y.to("tpu")).cpu(), f(x, y))


def test_torch_export():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return pallas_add(a, b) + 1

    x, y = _inputs(16, 128, seed=4)
    ep = torch.export.export(M(), (x, y))
    assert any("pallas_test.add" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x.to("tpu"), y.to("tpu")).cpu(), x + y + 1)


# --- donation --------------------------------------------------------------------------------


@tp.jax_op("pallas_test::add_donating", donate_argnums=(0,))
def add_donating(x: jax.Array, y: jax.Array) -> jax.Array:
    return x + y


def test_donated_input_raises_when_read_afterwards():
    x, y = _inputs(8, 128)
    xt, yt = x.to("tpu"), y.to("tpu")
    out = add_donating(xt, yt)
    torch.testing.assert_close(out.cpu(), x + y)
    with pytest.raises(RuntimeError, match=r"donated to pallas_test::add_donating"):
        xt.cpu()
    with pytest.raises(RuntimeError, match=r"donated to pallas_test::add_donating"):
        xt + 1
    torch.testing.assert_close((yt + 1).cpu(), y + 1)  # the other input is fine
    xt.copy_(yt)  # overwritten whole: usable again
    torch.testing.assert_close(xt.cpu(), y)


# --- bad input -------------------------------------------------------------------------------


def test_name_without_namespace():
    with pytest.raises(ValueError, match=r"'add'.*namespace::name"):
        tp.jax_op("add", lambda x: x)


def test_function_without_annotations():
    def f(x, y):
        return x + y

    with pytest.raises(TypeError, match=r"pallas_test::unannotated.*parameter 'x' of f has no annotation"):
        tp.jax_op("pallas_test::unannotated", f)

    def g(x: jax.Array):
        return x

    with pytest.raises(TypeError, match=r"pallas_test::no_return.*no return annotation"):
        tp.jax_op("pallas_test::no_return", g)


def test_bad_donate_argnums_and_specs():
    with pytest.raises(ValueError, match=r"donate_argnums entry 2"):
        tp.jax_op("pallas_test::bad_donate", donate_argnums=(2,))(pallas_add._tpu_spec.fn)
    mesh = tp.get_pallas_mesh("x", (2,))
    with pytest.raises(ValueError, match=r"input_partition_specs names axis 'y'"):
        tp.jax_op("pallas_test::bad_spec", ring_shift, mesh=mesh, input_partition_specs=(("y",),))
    with pytest.raises(ValueError, match=r"needs 16 chips"):
        tp.get_pallas_mesh(("a", "b"), (4, 4))


def test_wrong_dtype_names_the_argument():
    x = torch.ones(16, 128, dtype=torch.int64, device="tpu")
    y = torch.ones(16, 128, device="tpu")
    with pytest.raises(TypeError, match=r"pallas_test::add: argument 'x' is torch.int64"):
        pallas_add(x, y)
    torch.testing.assert_close(pallas_add(y, y).cpu(), torch.full((16, 128), 2.0))


@tp.jax_op("pallas_test::dot")
def jax_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b)


def test_wrong_shape_names_the_op_and_arguments():
    a = torch.ones(16, 128, device="tpu")
    b = torch.ones(16, 128, device="tpu")
    with pytest.raises(TypeError, match=r"pallas_test::dot.*a: float32\[16, 128\], b: float32\[16, 128\]"):
        jax_dot(a, b)
    torch.testing.assert_close(jax_dot(a, b.T.contiguous()).cpu(), torch.full((16, 16), 128.0))


def test_block_shape_that_does_not_divide():
    x = torch.ones(20, 128, device="tpu")
    with pytest.raises(ValueError, match=r"pallas_test::block_sum.*block shape \(8, 128\).*\(20, 128\)"):
        block_sum(x)
    torch.testing.assert_close(block_sum(torch.ones(16, 128, device="tpu")).cpu(), torch.full((8, 128), 2.0))


@tp.jax_op("pallas_test::raises_at_trace")
def raises_at_trace(x: jax.Array) -> jax.Array:
    raise ValueError("this kernel refuses")


def test_kernel_raising_inside_jax():
    with pytest.raises(ValueError, match=r"pallas_test::raises_at_trace.*this kernel refuses"):
        raises_at_trace(torch.ones(8, 128, device="tpu"))
    torch.testing.assert_close(square(torch.full((8, 128), 3.0, device="tpu")).cpu(), torch.full((8, 128), 9.0))


def _oob_kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(idx_ref[0], 8), :]


@tp.jax_op("pallas_test::gather_rows")
def gather_rows(idx: jax.Array, x: jax.Array) -> jax.Array:
    return pl.pallas_call(_oob_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.VMEM)])(
                              idx, x)


def test_error_inside_a_queued_kernel_is_sticky_and_names_it():
    x = torch.arange(16 * 128, dtype=torch.float32).reshape(16, 128)
    xt = x.to("tpu")
    ok = gather_rows(torch.tensor([8], dtype=torch.int32, device="tpu"), xt)
    torch.testing.assert_close(ok.cpu(), x[8:16])
    bad = gather_rows(torch.tensor([64], dtype=torch.int32, device="tpu"), xt)  # out of bounds: found when it runs
    with pytest.raises(RuntimeError, match=r"pallas_test::gather_rows"):
        torch.tpu.synchronize()
    del bad
    torch.testing.assert_close(xt.cpu(), x)  # the input is intact, the chip usable
    torch.testing.assert_close(gather_rows(torch.tensor([0], dtype=torch.int32, device="tpu"), xt).cpu(), x[:8])


def test_registering_a_name_twice():
    with pytest.raises(ValueError, match=r"pallas_test::add.*already registered"):
        tp.jax_op("pallas_test::add", pallas_add._tpu_spec.fn)
