"""Large float32 products on oneDNN where MKL is slow (csrc/aten/host_matmul.h, docs/env.md
TORCH_TPU_ONEDNN_GEMM): on an AMD CPU with full-width AVX-512 (Zen 5 and later) the worker computes
2-D mm and addmm of at least 2^26 multiply-adds (64 rows and columns or more) with oneDNN's matmul,
K in chunks of 128; elsewhere (Zen 4 unless TORCH_TPU_ONEDNN_GEMM=1), below the bounds, or with
TORCH_TPU_ONEDNN_GEMM=0, ATen's kernel (CPU eager's bits). Either way the values are float32
products summed in some order: CPU eager's to rounding, and as close to float64's as CPU's (oneDNN
over all of K at once would sum K terms in a row, 1.6-2.1x MKL's error). Where the CPU can run the
route at all (an AMD CPU with AVX-512), the value tests turn it on (torch_tpu._C._set_onednn_gemm)."""

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu


def _cpuinfo() -> str:
    return open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""


def _amd_avx512() -> bool:
    info = _cpuinfo()
    flags = info.split()
    return "AuthenticAMD" in info and all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


def _cpu_family() -> int:
    for line in _cpuinfo().splitlines():
        if line.startswith("cpu family"):
            return int(line.split(":")[1])
    return 0


ROUTED = _amd_avx512()  # the value tests below run with the route on wherever it can run

M, K, N = 512, 520, 384  # 2^26.9 multiply-adds; K not a multiple of the 128-wide chunks
# (name, the call on a device, arguments built on CPU); each routed on such a host unless "not routed"
CASES = {
    "mm": (lambda a, b: a @ b, lambda: (torch.randn(M, K), torch.randn(K, N))),
    "mm transposed operands": (lambda a, b: a.t() @ b.t(), lambda: (torch.randn(K, M), torch.randn(N, K))),
    "mm column slices": (lambda a, b: a[:, 7:] @ b[7:], lambda: (torch.randn(M, K + 7), torch.randn(K + 7, N))),
    "linear with bias": (lambda x, w, b: torch.nn.functional.linear(x, w, b),
                         lambda: (torch.randn(M, K), torch.randn(N, K), torch.randn(N))),
    "addmm beta alpha": (lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=2.0),
                         lambda: (torch.randn(M, N), torch.randn(M, K), torch.randn(K, N))),
    "addmm into self": (lambda s, a, b: s.clone().addmm_(a, b, beta=1.5),
                        lambda: (torch.randn(M, N), torch.randn(M, K), torch.randn(K, N))),
    "matmul 3d by 2d": (torch.matmul, lambda: (torch.randn(2, M // 2, K), torch.randn(K, N))),
    "mm K within one chunk": (lambda a, b: a @ b, lambda: (torch.randn(1024, 100), torch.randn(100, 1024))),
    "not routed: bmm": (torch.bmm, lambda: (torch.randn(3, 128, K), torch.randn(3, K, 256))),
    "not routed: small": (lambda a, b: a @ b, lambda: (torch.randn(32, 64), torch.randn(64, 48))),
    "not routed: 4 rows": (lambda a, b: a @ b, lambda: (torch.randn(4, K), torch.randn(K, 40000))),
}


def _run(case: str, device: str):
    fn, make = CASES[case]
    torch.manual_seed(0)
    args = make()
    return fn(*[a.to(device) for a in args]).cpu()


@pytest.fixture(autouse=True)
def highest_and_routed():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    was_routed = torch_tpu._C._set_onednn_gemm(ROUTED)
    yield
    torch_tpu._C._set_onednn_gemm(was_routed)
    torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("case", list(CASES))
def test_values_agree_with_cpu_to_rounding(case):
    got, cpu = _run(case, "tpu"), _run(case, "cpu")
    if case.startswith("not routed") or not ROUTED:
        torch.testing.assert_close(got, cpu, atol=0, rtol=0)  # ATen's kernel: CPU eager's bits
    else:
        torch.testing.assert_close(got, cpu, atol=1e-4, rtol=1e-5)  # sums of 520 products in another order
    # the kept (fast-path) call computes as the first
    torch.testing.assert_close(_run(case, "tpu"), got, atol=0, rtol=0)


@pytest.mark.parametrize("k,layout", [(512, "row-major"), (2048, "row-major"), (2048, "linear"), (8192, "row-major")])
def test_as_accurate_as_cpu(k, layout):
    torch.manual_seed(k)
    a = torch.randn(256, k)
    b = torch.randn(k, 512) if layout == "row-major" else torch.randn(512, k).t()  # nn.Linear's weight.t()
    exact = a.double() @ b.double()
    got, cpu = (a.tpu() @ b.tpu()).cpu(), a @ b
    assert (got.double() - exact).abs().mean() <= 1.25 * (cpu.double() - exact).abs().mean()


def test_beta_zero_ignores_nan_and_alpha_zero_scales_self():
    torch.manual_seed(1)
    a, b = torch.randn(M, K), torch.randn(K, N)
    nan = torch.full((M, N), float("nan"))
    got = torch.addmm(nan.tpu(), a.tpu(), b.tpu(), beta=0).cpu()
    assert not got.isnan().any()
    torch.testing.assert_close(got, a @ b, atol=1e-4, rtol=1e-5)
    s = torch.randn(M, N)
    torch.testing.assert_close(torch.addmm(s.tpu(), a.tpu(), b.tpu(), beta=3, alpha=0).cpu(), 3 * s)
    zeros = torch.addmm(nan.tpu(), a.tpu(), b.tpu(), beta=0, alpha=0).cpu()
    assert (zeros == 0).all()


def test_beta_zero_still_checks_that_self_broadcasts():
    a, b = torch.randn(M, K), torch.randn(K, N)
    for bad in (torch.randn(M, 5), torch.randn(M, N + 1), torch.randn(1, M, N)):
        with pytest.raises(RuntimeError) as cpu:
            torch.addmm(bad, a, b, beta=0)
        with pytest.raises(type(cpu.value)):
            torch.addmm(bad.tpu(), a.tpu(), b.tpu(), beta=0).cpu()


def test_nan_alpha_gives_cpus_result():
    torch.manual_seed(3)
    s, a, b = torch.randn(M, N), torch.randn(M, K), torch.randn(K, N)
    cpu = torch.addmm(s, a, b, alpha=float("nan"))
    got = torch.addmm(s.tpu(), a.tpu(), b.tpu(), alpha=float("nan")).cpu()
    torch.testing.assert_close(got, cpu, atol=0, rtol=0, equal_nan=True)


def test_out_overlapping_an_operand_gives_cpus_result():
    torch.manual_seed(2)
    results = []
    for dev in ("cpu", "tpu"):
        buf = torch.randn(1024, 1024, device=dev)
        torch.mm(buf, buf, out=buf)  # out is an operand: ATen's kernel, whatever it does
        results.append(buf.cpu())
    torch.testing.assert_close(results[1], results[0], atol=0, rtol=0, equal_nan=True)


def _bits_in_subprocess(env_value: str) -> dict:
    code = (
        "import json, torch, torch_tpu\n"
        "torch.manual_seed(0)\n"
        f"a, b = torch.randn({M}, {K}), torch.randn({K}, {N})\n"
        "print(json.dumps({'routed': torch_tpu._C._onednn_gemm(),"
        " 'equal_cpu': bool(torch.equal((a.tpu() @ b.tpu()).cpu(), a @ b))}))\n"
    )
    env = dict(os.environ, TORCH_TPU_ONEDNN_GEMM=env_value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_switch_off_gives_cpus_bits():
    off = _bits_in_subprocess("0")
    assert off == {"routed": False, "equal_cpu": True}


def test_routed_only_on_amd_avx512_and_then_not_cpus_bits():
    on = _bits_in_subprocess("1")
    assert on["routed"] == ROUTED
    # Routed, oneDNN sums in another order than MKL: this product differs from CPU eager's bits
    # somewhere (so the tests above compared oneDNN's values, not MKL's twice).
    assert on["equal_cpu"] == (not ROUTED)


def test_by_default_routed_only_on_full_width_avx512():
    # Zen 4 (family 0x19) runs AVX-512 on 256-bit halves, where MKL's AVX2 code is as fast.
    full_width = ROUTED and _cpu_family() >= 0x1A
    assert _bits_in_subprocess("") == {"routed": full_width, "equal_cpu": not full_width}
    assert _bits_in_subprocess("auto")["routed"] == full_width


def test_turning_the_route_on_where_it_cannot_run_raises():
    if ROUTED:
        assert torch_tpu._C._set_onednn_gemm(True) is True  # the fixture turned it on
        assert torch_tpu._C._onednn_gemm()
    else:
        with pytest.raises(RuntimeError, match="need an AMD CPU with AVX-512"):
            torch_tpu._C._set_onednn_gemm(True)
        assert not torch_tpu._C._onednn_gemm()


def test_mkldnn_disabled_gives_cpus_bits():
    torch.manual_seed(0)
    a, b = torch.randn(M, K), torch.randn(K, N)
    with torch.backends.mkldnn.flags(enabled=False):
        got = (a.tpu() @ b.tpu()).cpu()
        cpu = a @ b
    torch.testing.assert_close(got, cpu, atol=0, rtol=0)
