"""torch.tpu.precision and torch.compile: a compiled program's matmuls are library calls that
read the precision when the program runs, so one compiled program follows the block it is
called in (no recompilation, no cache-key entry needed)."""

import torch

import torch_tpu
from helpers.mxu import bf16 as _bf16

P = torch.tpu.Precision


def test_a_compiled_program_follows_the_block_it_runs_in():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        torch._dynamo.reset()
        g = torch.Generator().manual_seed(7)
        a, b = torch.randn(48, 128, generator=g), torch.randn(128, 24, generator=g)

        @torch.compile(backend="tpu")
        def f(x, y):
            return torch.relu(x @ y) * 2

        ta, tb = a.tpu(), b.tpu()
        exact = f(ta, tb).cpu()
        compiled = torch_tpu.compile_stats()["compilations"]
        with torch.tpu.precision(P.DEFAULT):
            one_pass = f(ta, tb).cpu()
        again = f(ta, tb).cpu()
        assert torch_tpu.compile_stats()["compilations"] == compiled  # the same program ran three times
        torch.testing.assert_close(exact, torch.relu(a @ b) * 2)
        torch.testing.assert_close(one_pass, torch.relu(_bf16(a) @ _bf16(b)) * 2, atol=1e-4, rtol=1e-5)
        assert (one_pass - exact).abs().max() > 1e-3
        torch.testing.assert_close(again, exact)
    finally:
        torch.set_float32_matmul_precision(old)
