"""Real StableHLO through a real XLA (jaxlib's XLA:CPU): compiled programs and defer_and_fuse
regions parse, verify and give our executor's values; the XLA executor; export."""

import copy
import glob
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from helpers.compile_models import MLP
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)

pytest.importorskip("jaxlib")

from helpers.xla_check import compare, recording  # noqa: E402
from torch_tpu.compile import xla  # noqa: E402


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.emb = nn.Embedding(10, 16)

    def forward(self, x, ids):
        h = F.max_pool2d(torch.relu(self.conv(x)), 2, padding=1).flatten(1)
        e = self.emb(ids).sum(1)
        return torch.softmax(h[:, :16] + e, dim=-1).cumsum(1)


@pytest.fixture(autouse=True)
def _tile_executor(monkeypatch):
    """Our executor unless a test picks another (these tests record what ours runs)."""
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "tile")


def _close(a, b, atol=1e-4, rtol=1e-4):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=atol, rtol=rtol)


def test_compiled_programs_parse_verify_and_match_xla(tmp_path, monkeypatch):
    """Training-step programs (forward and backward: matmuls, layer norm, softmax, convolution,
    embedding) as StableHLO: each dumped module parses and verifies; each compiles with XLA:CPU
    and gives our executor's values on the same inputs."""
    monkeypatch.setenv("TORCH_TPU_DUMP_IR", str(tmp_path / "dump"))
    torch.manual_seed(0)
    mlp, conv = MLP().to("tpu"), ConvNet().to("tpu")
    x, img, ids = torch.randn(8, 32), torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2, 5))
    with recording() as seen:
        out = torch.compile(mlp, backend="tpu")(x.to("tpu"))
        out.square().sum().backward()
        y = torch.compile(conv, backend="tpu")(img.to("tpu"), ids.to("tpu"))
        y.sum().backward()
    assert len(seen) == 4
    assert compare(seen) == []  # nothing stayed a custom call (convolution backward included)
    files = glob.glob(str(tmp_path / "dump" / "program_*.mlir"))
    assert len(files) == 4
    texts = [open(f).read() for f in files]
    for t in texts:
        xla.parse(t)
    joined = "\n".join(texts)
    assert "stablehlo.dot_general" in joined and "precision = [HIGHEST, HIGHEST]" in joined
    assert "stablehlo.convolution" in joined and '"stablehlo.gather"' in joined
    assert "stablehlo.custom_call" not in joined
    s = torch_tpu.compile_stats()
    assert s["custom_calls"] == {}


def test_matmul_precision_level_is_the_dot_general_precision():
    from torch_tpu.compile.stablehlo import lower

    with recording() as seen:
        torch.compile(lambda a, b: a @ b, backend="tpu")(torch.randn(4, 8).tpu(), torch.randn(8, 2).tpu())
    desc = seen[0][0].desc
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        assert "precision = [DEFAULT, DEFAULT]" in lower(desc).text
    assert "precision = [HIGH, HIGH]" in lower(desc, precision="HIGH").text


def test_defer_and_fuse_region_dumps_parse_and_run_on_xla(tmp_path):
    code = textwrap.dedent("""
        import torch, torch_tpu
        x = torch.linspace(-2, 2, 96).reshape(8, 12)
        y = (torch.tanh(x.tpu() * 2 + 1).exp() - x.tpu()).sum(1)
        print(y.cpu().tolist())
    """)
    env = {**os.environ, "TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_DUMP_IR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=120)
    files = glob.glob(str(tmp_path / "region_*.mlir"))
    assert files
    x = torch.linspace(-2, 2, 96).reshape(8, 12)
    want = (torch.tanh(x * 2 + 1).exp() - x).sum(1)
    matched = 0
    for f in files:
        text = open(f).read()
        xla.parse(text)
        import re

        fn = re.search(r"func\.func @(\w+)\(", text).group(1)
        module = "module {\n" + text.replace(f"@{fn}(", "@main(", 1) + "}\n"
        params = re.findall(r"%arg\d+: (tensor<[^>]*>)", text.split("{")[0])
        if params and set(params) == {"tensor<8x12xf32>"}:  # each x.tpu() is a parameter of its own
            out = xla.run(xla.compile_module(module), [x.numpy()] * len(params))
            _close(torch.from_dlpack(out[-1]), want)
            matched += 1
    assert matched == 1


def test_xla_executor_matches_cpu(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "xla")
    torch.manual_seed(0)
    ref = MLP()
    dev = copy.deepcopy(ref).to("tpu")
    x = torch.randn(8, 32)
    out = torch.compile(dev, backend="tpu")(x.to("tpu"))
    expected = ref(x)
    _close(out, expected, 1e-5, 1.3e-6)
    assert out.device.type == "tpu"
    out.square().sum().backward()
    expected.square().sum().backward()
    for p, q in zip(dev.parameters(), ref.parameters()):
        _close(p.grad, q.grad)
    s = torch_tpu.compile_stats()
    assert s["xla_programs"] == 2 and s["xla_fallbacks"] == []


def test_xla_executor_in_place_update_and_stream_order(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "xla")

    @torch.compile(backend="tpu")
    def step(p, g):
        p.add_(g, alpha=-0.5)
        return (p * p).sum()

    p0, g = torch.randn(16), torch.randn(16)
    p = p0.tpu()
    p.mul_(2)  # queued on the stream before the program reads p
    loss = step(p, g.tpu())
    want = p0 * 2 - 0.5 * g
    _close(p, want, 1e-5, 1e-5)
    _close(loss, (want * want).sum(), 1e-4, 1e-5)
    assert torch_tpu.compile_stats()["xla_programs"] == 1


def test_xla_executor_falls_back_with_a_reason_for_an_unlowerable_op(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "xla")

    def f(x):
        return torch.median(x.exp(), dim=1).values * 2

    x = torch.randn(4, 8)
    _close(torch.compile(f, backend="tpu")(x.tpu()), f(x), 1e-5, 1e-5)
    s = torch_tpu.compile_stats()
    assert s["custom_calls"] == {"aten::median.dim": 1}
    assert s["xla_programs"] == 0 and len(s["xla_fallbacks"]) == 1
    assert "aten::median.dim stays a custom call" in s["xla_fallbacks"][0]
    # the process keeps working: the next program runs on XLA
    _close(torch.compile(lambda a: a.tanh() + 1, backend="tpu")(x.tpu()), x.tanh() + 1, 1e-5, 1e-5)
    assert torch_tpu.compile_stats()["xla_programs"] == 1


def test_xla_executor_leaves_reduced_precision_matmuls_and_cpu_tensors_to_ours(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "xla")
    a, b = torch.randn(48, 128), torch.randn(128, 24)
    f = torch.compile(lambda x, y: torch.relu(x @ y), backend="tpu")
    _close(f(a.tpu(), b.tpu()), torch.relu(a @ b), 1e-4, 1e-5)
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):  # XLA:CPU would run it in float32
        one_pass = f(a.tpu(), b.tpu())
    assert (one_pass.cpu() - torch.relu(a @ b)).abs().max() > 1e-3
    s = torch_tpu.compile_stats()
    assert s["xla_programs"] == 1 and "matmul precision DEFAULT: XLA:CPU ignores precision_config" in s[
        "xla_fallbacks"][0]
    g = torch.compile(lambda x: (x.tpu() * 2, torch.zeros(3, device="cpu") + 1), backend="tpu")
    y, z = g(a)
    assert y.device.type == "tpu" and z.device.type == "cpu"
    _close(y, a * 2)


def test_bad_executor_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "fastest")
    with pytest.raises(Exception, match="TORCH_TPU_EXECUTOR='fastest': expected one of tile, xla, auto"):
        torch.compile(lambda a: a + 1, backend="tpu")(torch.ones(2).tpu())
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "tile")
    torch._dynamo.reset()
    _close(torch.compile(lambda a: a + 1, backend="tpu")(torch.ones(2).tpu()), torch.full((2,), 2.0))


def test_named_pjrt_plugin_absent_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_PJRT_PLUGIN", "/nonexistent/libtpu.so")
    monkeypatch.setenv("TORCH_TPU_XLA_PLATFORM", "tpu")
    xla.backend.cache_clear()
    try:
        with pytest.raises(xla.XlaUnavailable, match="TORCH_TPU_PJRT_PLUGIN='/nonexistent/libtpu.so': no such PJRT"):
            xla.backend()
    finally:
        monkeypatch.undo()
        xla.backend.cache_clear()
    assert xla.backend().platform == "cpu"


def test_auto_executor_choice_is_per_program_and_deterministic(monkeypatch):
    from torch_tpu.compile import xla_executor

    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "auto")
    small, big = torch.randn(64), torch.randn(1 << 22)
    f = torch.compile(lambda a: torch.tanh(a) * 2, backend="tpu", dynamic=False)
    _close(f(small.tpu()), torch.tanh(small) * 2, 1e-5, 1e-5)
    with recording() as seen:  # records the programs our executor runs
        _close(f(big.tpu()), torch.tanh(big) * 2, 1e-5, 1e-5)
        y = F.layer_norm(small.tpu().reshape(8, 8), (8,))
        _close(torch.compile(lambda a: F.layer_norm(a, (8,)), backend="tpu")(small.tpu().reshape(8, 8)), y)
    s = torch_tpu.compile_stats()
    assert s["xla_programs"] == 1  # the small chain on XLA; the big chain and the norm on ours
    assert len(seen) == 2
    assert [xla_executor.auto_picks_xla(p.desc) for p, *_ in seen] == [False, False]  # the same decision again
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    _close(torch.compile(lambda x, w: torch.relu(x @ w), backend="tpu")(a.tpu(), b.tpu()), torch.relu(a @ b))
    assert torch_tpu.compile_stats()["xla_programs"] == 2  # a matmul program: XLA


def test_export_fx_and_exported_program():
    from jaxlib.mlir.dialects import stablehlo

    from torch_tpu.export import exported_to_mlir, fx_to_mlir

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    mod = fx_to_mlir(torch.fx.symbolic_trace(m), [x])
    assert mod.input_names[-1] == "input" and mod.custom_calls == []
    args = [t.detach().numpy() for t in m.parameters()] + [x.numpy()]
    got = xla.run(xla.compile_module(mod.serialize_text()), args)
    _close(torch.from_dlpack(got[0]), m(x), 1e-5, 1e-5)
    assert xla.parse(mod.serialize_bytecode().decode("latin1")) if False else mod.serialize_bytecode()[:4] == b"ML\xefR"
    art = mod.serialize_portable_artifact()
    back = stablehlo.deserialize_portable_artifact_str(art)
    got2 = xla.run(xla.compile_module(xla.parse(back).operation.get_asm()), args)
    _close(torch.from_dlpack(got2[0]), m(x), 1e-5, 1e-5)
    ep = torch.export.export(m, (x,))
    mod2 = exported_to_mlir(ep)
    assert "stablehlo.dot_general" in mod2.serialize_text()
    with pytest.raises(TypeError, match="exported_to_mlir: expected a torch.export.ExportedProgram, got str"):
        exported_to_mlir("model")
    with pytest.raises(TypeError, match="fx_to_mlir: gm must be a torch.fx.GraphModule"):
        fx_to_mlir(lambda a: a, [x])


def test_lowered_library_ops_match_ours_on_xla():
    """One program of many lowerings (indexing, scatters, sorts, norms, integer ops) compiled by
    XLA:CPU: the same values as our executor, and nothing left as a custom call."""

    def f(x, i, j, w, b, d):
        d.copy_(x.sum(0).to(torch.float64))  # a copy_ library call: an input mutation
        s = torch.zeros(2, 5, device=x.device).scatter_add(1, i.remainder(5)[None].expand(2, 4),
                                                            torch.ones(2, 4, device=x.device))
        y = x.clone()
        y[i % 2] = 1.0
        return (x[:, i % 5], x[:, :, j], torch.remainder(x, -1.5), torch.arange(7, device=x.device) % -3,
                torch.argmax(x, 1),
                x.repeat(2, 1, 1), torch.linalg.vector_norm(x, dim=-1), torch.topk(x, 2, dim=1).values,
                torch.sort(x, dim=-1, descending=True), F.group_norm(x.reshape(2, 3, 5), 3, w, b),
                s, y, torch.gather(x, 2, j.reshape(1, 2, 2).expand(2, 2, 2)), x.cumsum(1),
                F.pad(x, (1, 2)), torch.where(x > 0, x, 0.5).clamp(-1, 1), torch.cat([x, x], 1).flip(0))

    x = torch.randn(2, 5, 3)
    i, j = torch.tensor([4, 0, 1, 1]), torch.tensor([[2, 0], [1, 1]])
    w, b = torch.randn(3), torch.randn(3)
    d = torch.zeros(15, dtype=torch.float64).reshape(5, 3).tpu()
    with recording() as seen:
        got = torch.compile(f, backend="tpu")(*(t.tpu() for t in (x, i, j, w, b)), d)
    assert compare(seen, atol=1e-5, rtol=1e-5) == []
    assert torch_tpu.compile_stats()["custom_calls"] == {}
    want = f(x, i, j, w, b, torch.zeros(5, 3, dtype=torch.float64))
    for g, e in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        _close(g, e, 1e-5, 1e-5)
    _close(d, x.sum(0).double())


def test_xla_executor_gets_attention_as_standard_ops(monkeypatch):
    # tpu::attention (our executor's one-op SDPA) would be a custom call XLA cannot run
    monkeypatch.setenv("TORCH_TPU_EXECUTOR", "xla")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    out = torch.compile(fn, backend="tpu")(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    _close(out, fn(q, k, v), 1e-5, 1e-6)
    s = torch_tpu.compile_stats()
    assert s["xla_programs"] == 1 and s["xla_fallbacks"] == [], s["xla_fallbacks"]
    assert "tpu::attention.default" not in s["library_calls"]
