"""torch_tpu._internal.pallas: the private paths Helion, TorchRec and tokamax import, used
the way those callers use them (their sources: docs/pallas.md)."""

import pytest
import torch

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.experimental import pallas as pl  # noqa: E402

from torch_tpu._internal import pallas  # noqa: E402  (TorchRec's import)
from torch_tpu._internal.pallas import tpu_torch_pallas  # noqa: E402
from torch_tpu._internal.pallas.pallas import JaxCallable, _get_kernel_invocation_key, jax_placeholder  # noqa: E402


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def test_paths_exist_as_callers_spell_them():
    import torch.tpu.pallas as tp

    assert pallas.jax_op is tp.jax_op and pallas.get_default_pallas_mesh is tp.get_default_pallas_mesh
    assert pallas.pallas.get_default_pallas_mesh().devices.size == torch.tpu.device_count()
    for name in ("register_custom_kernel", "lookup_custom_kernel", "call_custom_kernel"):
        assert callable(getattr(tpu_torch_pallas, name))


def test_torchrec_style_jax_op_call_and_tokamax_style_register_fake():
    def twice(x: jax.Array) -> jax.Array:
        return x * 2

    op = pallas.jax_op("pallas_internal_test::twice", twice)  # TorchRec: pallas.jax_op(name, jax_fn)

    @op.register_fake  # tokamax: .register_fake / .register_autograd on the result
    def _(x):
        return torch.empty_like(x)

    x = torch.randn(8, 128)
    torch.testing.assert_close(op(x.to("tpu")).cpu(), x * 2)


def test_jax_placeholder():
    p = jax_placeholder(torch.empty(3, 5, dtype=torch.bfloat16, device="tpu"))
    assert p.shape == (3, 5) and p.dtype == jnp.bfloat16
    with pytest.raises(TypeError, match=r"jax_placeholder: torch.float64"):
        jax_placeholder(torch.empty(2, dtype=torch.float64))


def test_jax_callable_with_aliases_and_direct_calls():
    out_shape = jax.ShapeDtypeStruct((16, 128), jnp.float32)

    def fn(x, o):
        return pl.pallas_call(_double_kernel, out_shape=out_shape, grid=(2,),
                              in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)

    call = JaxCallable(name="double", jit_fn=jax.jit(fn), trace_key="double_test", input_output_aliases={1: 0})
    x = torch.randn(16, 128)
    out = torch.zeros(16, 128, device="tpu")
    result = call(x.to("tpu"), out)
    assert result is out  # the aliased output is written back into the input tensor
    torch.testing.assert_close(out.cpu(), x * 2, rtol=0, atol=0)
    # what Helion reads after the first call, then its direct call
    key = _get_kernel_invocation_key(call.trace_key, (x.to("tpu"), out), {}, call.static_argnums)
    shapes, tree = call.output_shapes[key]
    assert [s.shape for s in shapes] == [(16, 128)]
    fingerprint = call.kernel_key_to_mlir_fingerprint[key]
    assert tpu_torch_pallas.lookup_custom_kernel("double", fingerprint)
    results = tpu_torch_pallas.call_custom_kernel("double", fingerprint, inputs=[x.to("tpu") + 1, out],
                                                  output_shapes=shapes, donate_argnums=[1], device_assignment=[])
    torch.testing.assert_close(tree.unflatten(results).cpu(), (x + 1) * 2)


def test_mosaic_module_callers_get_not_implemented():
    assert not tpu_torch_pallas.lookup_custom_kernel("inductor_kernel", "k0")
    with pytest.raises(NotImplementedError, match=r"register_custom_kernel\('inductor_kernel'\).*Mosaic module"):
        tpu_torch_pallas.register_custom_kernel("inductor_kernel", "k0", serialized_mlir_module=b"\x00")
    with pytest.raises(KeyError, match=r"no kernel 'inductor_kernel' with key 'k0'"):
        tpu_torch_pallas.call_custom_kernel("inductor_kernel", "k0", inputs=[])
