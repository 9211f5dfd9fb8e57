"""Runtime counters and the cost model's estimates, checked by hand."""

import pytest
import torch

import torch_tpu


@pytest.fixture
def fresh_stats():
    torch.tpu.synchronize()
    torch_tpu.runtime.reset_stats()
    yield
    torch.tpu.synchronize()


def _spec(gen):
    return next(g for g in torch_tpu.runtime.generations() if g["generation"] == gen)


def test_matmul_flops_bytes_and_estimate(fresh_stats):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        a = torch.randn(256, 512, device="tpu", dtype=torch.bfloat16)
        b = torch.randn(512, 1024, device="tpu", dtype=torch.bfloat16)
        torch.tpu.synchronize()
        torch_tpu.runtime.reset_stats()
        c = a @ b
        torch.tpu.synchronize()
        s = torch_tpu.runtime.stats()
    finally:
        torch.set_float32_matmul_precision(old)
    assert s["ops"] == 1
    assert s["flops"] == 2 * 256 * 512 * 1024
    # bf16 tiles are (16,128): these shapes are whole tiles, physical == logical
    assert s["bytes_read"] == 2 * (256 * 512 + 512 * 1024)
    assert s["bytes_written"] == 2 * 256 * 1024
    spec = _spec(s["generation"])
    # dims are multiples of the MXU size; the MXU runs at the generation's measured fraction of its peak
    mxu = s["flops"] / (spec["peak_bf16_flops"] * spec["mxu_sustained_fraction"])
    hbm = (s["bytes_read"] + s["bytes_written"]) / (spec["hbm_bandwidth"] * spec["hbm_sustained_fraction"])
    assert s["mxu_seconds"] == pytest.approx(mxu)
    assert s["hbm_seconds"] == pytest.approx(hbm)
    assert s["device_seconds"] == pytest.approx(max(mxu, hbm) + 2e-6)
    assert s["host_seconds"] > 0
    torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu())


def test_fp32_highest_costs_six_passes(fresh_stats):
    a = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    for precision, passes in (("highest", 6), ("high", 3), ("medium", 1)):
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            torch_tpu.runtime.reset_stats()
            a @ a
            s = torch_tpu.runtime.stats()
        finally:
            torch.set_float32_matmul_precision(old)
        spec = _spec(s["generation"])
        rate = spec["peak_bf16_flops"] * spec["mxu_sustained_fraction"]
        assert s["mxu_seconds"] == pytest.approx(
            passes * 2 * 256**3 / rate / (256 / spec["mxu_size"] if spec["mxu_size"] > 256 else 1)
        )


def test_tpu7x_matmul_runs_at_the_measured_gemm_rate(fresh_stats):
    """TPU7x prices a large matrix product at accelerator-microbenchmarks' measured bf16 GEMM rate,
    956.3824592 TFLOP/s per device (two devices per chip) instead of the 2307 TFLOP/s peak; the
    generations without a published measurement run at their peak."""
    from torch_tpu.estimate import dry_run

    with dry_run():  # priced, not computed
        a = torch.empty(2048, 2048, device="tpu", dtype=torch.bfloat16)
        b = torch.empty(2048, 2048, device="tpu", dtype=torch.bfloat16)
        torch.tpu.synchronize()
        torch_tpu.runtime.reset_stats()
        a @ b
        torch.tpu.synchronize()
        bound = torch_tpu.runtime.stats()["device_bound_by_generation"]
    flops = 2 * 2048**3
    assert _spec("tpu7x")["mxu_sustained_fraction"] == pytest.approx(956.3824592 / 1153.5, rel=1e-12)
    assert bound["tpu7x"]["mxu"] == pytest.approx(flops / (2 * 956.3824592e12), rel=1e-12)
    assert bound["tpu7x"]["total"] == pytest.approx(flops / (2 * 956.3824592e12) + 2e-6, rel=1e-12)
    for gen, peak in (("v4", 275e12), ("v5e", 197e12), ("v5p", 459e12), ("v6e", 918e12)):
        assert _spec(gen)["mxu_sustained_fraction"] == 1.0
        assert bound[gen]["mxu"] == pytest.approx(flops / peak, rel=1e-12), gen


def test_repeated_signature_counted_at_every_call(fresh_stats):
    """Strict mode prices a signature once and reuses it: each call still counts, another shape anew."""
    a = torch.randn(64, 64, device="tpu")
    b = torch.randn(64, 128, device="tpu")
    torch.tpu.synchronize()
    torch_tpu.runtime.reset_stats()
    for _ in range(5):
        a + a
    b + b
    torch.tpu.synchronize()
    s = torch_tpu.runtime.stats()
    tile = 64 * 128 * 4  # f32 (8,128) tiles: [64,64] and [64,128] both take 32 KiB
    assert s["ops"] == 6
    assert s["flops"] == 5 * 64 * 64 + 64 * 128
    assert s["bytes_read"] == (5 * 2 + 2) * tile
    assert s["bytes_written"] == (5 + 1) * tile


def test_elementwise_is_priced_at_bandwidth(fresh_stats):
    x = torch.randn(1024, 1024, device="tpu")
    torch.tpu.synchronize()
    torch_tpu.runtime.reset_stats()
    y = x * x
    s = torch_tpu.runtime.stats()
    assert s["flops"] == 1024 * 1024
    assert s["bytes_read"] == 2 * 4 * 1024 * 1024 and s["bytes_written"] == 4 * 1024 * 1024
    for gen, seconds in s["device_seconds_by_generation"].items():
        spec = _spec(gen)
        bandwidth = spec["hbm_bandwidth"] * spec["hbm_sustained_fraction"]  # measured where published
        assert seconds == pytest.approx(12 * 1024 * 1024 / bandwidth + 2e-6), gen
    # TPU7x at accelerator-microbenchmarks' measured HBM copy rate, 6420.961823 GB/s per chip.
    assert s["device_seconds_by_generation"]["tpu7x"] == pytest.approx(12 * 1024 * 1024 / 6420.961823e9 + 2e-6)
    torch.testing.assert_close(y.cpu(), x.cpu() * x.cpu())


def test_physical_bytes_count_tile_padding(fresh_stats):
    x = torch.randn(3, 5, device="tpu")  # one (8,128) f32 tile: 4096 bytes
    torch.tpu.synchronize()
    torch_tpu.runtime.reset_stats()
    x.neg()
    s = torch_tpu.runtime.stats()
    assert s["bytes_read"] == 4096 and s["bytes_written"] == 4096


def test_conv_flops_match_flop_counter(fresh_stats):
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.conv2d(x, w, padding=1)
    xt, wt = x.tpu(), w.tpu()
    torch.tpu.synchronize()
    torch_tpu.runtime.reset_stats()
    torch.nn.functional.conv2d(xt, wt, padding=1)
    assert torch_tpu.runtime.stats()["flops"] == counter.get_total_flops()


def test_reset_and_float64_marked_emulated(fresh_stats):
    torch_tpu.runtime.reset_stats()
    assert torch_tpu.runtime.stats()["ops"] == 0
    d = torch.ones(4, dtype=torch.float64, device="tpu")
    torch_tpu.runtime.reset_stats()
    d + d
    assert torch_tpu.runtime.stats()["emulated_ops"] == 1
