"""torch_tpu.estimate: dry-run mode and the per-chip training-step estimator.

Expected values are computed here from the configurations and the published formulas
(ring collectives, FSDP sharding, Megatron all-reduce counts), not read back from the
estimator. The in-process tests use tpu:1 (general-work chips, see conftest.py) and whatever
slice this process runs on; slices of other sizes run through the CLI in subprocesses.
"""

import gc
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

import torch_tpu.runtime
from torch_tpu.estimate import LLAMA_PRESETS, Parallelism, dry_run, model_spec, run, train_step
from torch_tpu.estimate.__main__ import main as cli_main
from torch_tpu.estimate.models.gpt import GPT, PRESETS, GPTConfig, make_optimizer

DEV = 1
GENS = ("v4", "v5e", "v5p", "v6e", "tpu7x")


def _chips():
    return torch.tpu.topology()["num_chips"]


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure_real_step(model, opt, x, y, dev):
    """Counters of the second real training step (the first creates optimizer state)."""
    train_step(model, opt, x, y, dev, torch.bfloat16).item()
    torch.tpu.synchronize(dev.index)
    torch_tpu.runtime.reset_stats(dev.index)
    loss = train_step(model, opt, x, y, dev, torch.bfloat16)
    assert math.isfinite(loss.item())  # it really ran
    torch.tpu.synchronize(dev.index)
    return torch_tpu.runtime.stats(dev.index)


def _assert_same_estimate(real, dry):
    for key in ("ops", "flops", "bytes_read", "bytes_written"):
        assert dry[key] == real[key], key
    for g in GENS:
        r, d = real["device_seconds_by_generation"][g], dry["device_seconds_by_generation"][g]
        assert d == pytest.approx(r, rel=1e-6), g
        parts = dry["device_bound_by_generation"][g]
        assert parts["mxu"] + parts["vpu"] + parts["hbm"] + parts["overhead"] == pytest.approx(d, rel=1e-9)


def test_dry_run_equals_real_demo_step():
    """The demo's step (GPT small, batch 16 x 128, bf16 autocast, clip, AdamW) priced while it
    really runs equals the dry-run estimate of the same per-chip step."""
    dev = torch.device("tpu", DEV)
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=128, **PRESETS["small"])).to(dev)
    opt = make_optimizer(model, 1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 128), generator=g)
    y = torch.randint(0, 256, (16, 128), generator=g)
    real = _measure_real_step(model, opt, x, y, dev)
    n = _chips()
    raw = run(model_spec("gpt-small", batch=16 * n, seq_len=128), Parallelism(dp=n), device=DEV)
    assert raw["local_batch"] == 16
    _assert_same_estimate(real, raw["stats"])
    assert raw["stats"]["device_seconds"] > 0 and raw["stats"]["ops"] > 500


def test_dry_run_equals_real_llama_step():
    """Same for a small Llama-style model (flash attention kernel, RMSNorm, SwiGLU, GQA)."""
    from torch_tpu.estimate.core import _optimizer
    from torch_tpu.estimate.models import Llama

    cfg = LLAMA_PRESETS["llama-tiny"]
    dev = torch.device("tpu", DEV)
    torch.manual_seed(0)
    model = Llama(cfg).to(dev)
    spec = model_spec("llama-tiny")
    opt = _optimizer(spec, model)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    y = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    real = _measure_real_step(model, opt, x, y, dev)
    n = _chips()
    raw = run(model_spec("llama-tiny", batch=4 * n), Parallelism(dp=n), device=DEV)
    _assert_same_estimate(real, raw["stats"])


def test_dry_run_allocates_no_host_memory():
    """8 GiB of HBM in use inside a dry run; the process's resident memory barely moves."""
    dev = torch.device("tpu", DEV)
    before_alloc = torch.tpu.memory_allocated(DEV)
    rss0 = _rss()
    with dry_run():
        a = torch.empty(2**30, dtype=torch.float32, device=dev)  # 4 GiB
        b = a * 2                                                 # 4 GiB more, "computed"
        b.add_(1)
        a.fill_(3.0)
        c = torch.ones(1024, 1024, device=dev)                    # a fill: priced, not written
        peak = torch.tpu.memory_allocated(DEV) - before_alloc
        del a, b, c
    torch.tpu.synchronize(DEV)
    grown = _rss() - rss0
    assert peak >= 8 * 2**30
    assert grown < 256 * 2**20, f"resident memory grew by {grown / 2**20:.0f} MiB"


def test_dry_run_host_reads_raise():
    dev = torch.device("tpu", DEV)
    with dry_run():
        x = torch.ones(4, 4, device=dev)
        for read in (lambda: x.sum().item(), lambda: x.cpu(), lambda: print(x), lambda: torch.nonzero(x),
                     lambda: bool(x.any())):
            with pytest.raises(RuntimeError, match="dry run"):
                read()
    # Outside, the device works as before.
    assert torch.ones(3, device=dev).sum().item() == 3.0


def test_dry_run_prices_like_a_real_op():
    """A matmul's dry-run price equals its real price (same op_cost path)."""
    dev = torch.device("tpu", DEV)
    a = torch.randn(256, 512, device=dev)
    b = torch.randn(512, 384, device=dev)
    torch.tpu.synchronize(DEV)
    torch_tpu.runtime.reset_stats(DEV)
    (a @ b).relu()
    torch.tpu.synchronize(DEV)
    real = torch_tpu.runtime.stats(DEV)
    torch_tpu.runtime.reset_stats(DEV)
    with dry_run():
        (a @ b).relu()
    dry = torch_tpu.runtime.stats(DEV)
    assert dry["ops"] == real["ops"] == 2
    assert dry["flops"] == real["flops"] == 2 * 256 * 512 * 384 + 256 * 384
    assert dry["device_seconds_by_generation"] == real["device_seconds_by_generation"]


# --- parallelism arithmetic -----------------------------------------------------------


def _layer_numel(cfg, tp):
    c, d = cfg.d_model, cfg.d_model // cfg.n_heads
    h, kv = cfg.n_heads // tp, max(1, cfg.n_kv_heads // tp)
    return c * h * d + 2 * c * kv * d + h * d * c + 3 * c * cfg.ffn_dim // tp + 2 * c


def _embed_numel(cfg, tp):
    return (cfg.vocab_size // tp) * cfg.d_model


def _head_numel(cfg, tp):  # final norm + output projection
    return (cfg.vocab_size // tp) * cfg.d_model + cfg.d_model


@pytest.mark.parametrize("dp,fsdp,tp,remat", [(1, 0, 2, False), (2, 0, 1, True), (1, 0, 1, False)])
def test_fsdp_tp_arithmetic(dp, fsdp, tp, remat):
    n = _chips()
    fsdp = n // (dp * tp)
    if fsdp < 2:
        pytest.skip("needs at least 4 chips")
    cfg = LLAMA_PRESETS["llama-tiny"]
    par = Parallelism(dp=dp, fsdp=fsdp, tp=tp)
    batch = 2 * dp * fsdp
    raw = run(model_spec("llama-tiny", batch=batch), par, remat=remat, device=DEV)
    L = cfg.n_layers
    layer, embed, head = _layer_numel(cfg, tp), _embed_numel(cfg, tp), _head_numel(cfg, tp)
    shard = lambda numel: -(-numel // fsdp)  # noqa: E731
    held = L * shard(layer) + shard(embed) + shard(head)
    assert raw["per_chip_params"] == held
    assert raw["local_batch"] == 2
    assert raw["params"] == cfg.num_params()
    coll = raw["collectives"]
    ag = coll["all_gather/fsdp"]
    # Each unit (layers, embedding, head) gathered before its forward and again before its
    # backward; the buffer holds fsdp shards in bf16.
    assert ag["count"] == 2 * (L + 2)
    assert ag["payload_bytes"] == 2 * held * fsdp * 2
    assert ag["ici_bytes"] == pytest.approx((fsdp - 1) / fsdp * ag["payload_bytes"])
    assert ag["ici_steps"] == ag["count"] * (fsdp - 1)
    rs = coll["reduce_scatter/fsdp"]
    assert rs["count"] == L + 2
    if tp > 1:
        ar = coll["all_reduce/tp"]
        tokens = 2 * cfg.seq_len
        # Megatron: 2 per layer forward (+2 more recomputed with remat), 2 backward; the
        # embedding's forward, the output's backward; cross-entropy's max and sum-exp.
        assert ar["count"] == (6 if remat else 4) * L + 4
        big = ar["count"] - 2  # activations [B, T, C], bf16 or float32 (norm outputs' gradients)
        assert ar["ici_bytes"] == pytest.approx(2 * (tp - 1) / tp * ar["payload_bytes"])
        small = 2 * tokens * 4
        assert big * tokens * cfg.d_model * 2 + small <= ar["payload_bytes"] <= big * tokens * cfg.d_model * 4 + small
    if dp > 1:
        hs = coll["all_reduce/dp"]
        assert hs["count"] == L + 2  # HSDP: each unit's shard across replicas
        assert hs["payload_bytes"] == held * 2
    # The counters' ICI time is the sum over the tally (same formula).
    specs = {g["generation"]: g for g in torch_tpu.runtime.generations()}
    v6e = specs["v6e"]
    expect = 0.0
    for c in coll.values():
        links = min(c["links"], v6e["ici_links"])
        expect += c["ici_steps"] * 1e-6 + c["ici_bytes"] / (links * v6e["ici_link_bandwidth"])
    assert raw["stats"]["ici_seconds_by_generation"]["v6e"] == pytest.approx(expect, rel=1e-9)


def test_data_parallel_arithmetic():
    """Pure dp: local batch = batch / dp, gradients all-reduced (fp32, one bucket per layer
    plus the rest), each 2(n-1)/n of the payload over ICI; doubling the batch per chip
    doubles the matmul FLOPs of the forward/backward."""
    n = _chips()
    cfg = LLAMA_PRESETS["llama-tiny"]
    one = run(model_spec("llama-tiny", batch=n), Parallelism(dp=n), device=DEV)
    two = run(model_spec("llama-tiny", batch=2 * n), Parallelism(dp=n), device=DEV)
    assert one["local_batch"] == 1 and two["local_batch"] == 2
    ar = one["collectives"]["all_reduce/dp"]
    assert ar["count"] == cfg.n_layers + 1
    assert ar["payload_bytes"] == 4 * cfg.num_params()
    assert ar["ici_bytes"] == pytest.approx(2 * (n - 1) / n * ar["payload_bytes"])
    # Optimizer and clipping FLOPs do not depend on the batch: the difference is one
    # sequence's worth of forward + backward, the same again going from 2 to 3.
    three = run(model_spec("llama-tiny", batch=3 * n), Parallelism(dp=n), device=DEV)
    d1 = two["stats"]["flops"] - one["stats"]["flops"]
    d2 = three["stats"]["flops"] - two["stats"]["flops"]
    assert d1 > 0 and d2 == pytest.approx(d1, rel=1e-9)
    # Matmul FLOPs of one sequence: 2·(params in matmuls)·T forward, twice that backward,
    # plus causal attention's 4·P·C forward and 8·P·C backward over its P = T(T+1)/2 unmasked
    # query/key pairs (flop_counter's sdpa counts, masked blocks skipped).
    T, C = cfg.seq_len, cfg.d_model
    matmul_params = cfg.n_layers * (_layer_numel(cfg, 1) - 2 * C) + cfg.vocab_size * C
    mxu = 6 * matmul_params * T + 12 * cfg.n_layers * T * (T + 1) // 2 * C
    assert d1 > mxu and d1 < 1.2 * mxu  # the rest: elementwise ops, one FLOP per element


# --- CLI ---------------------------------------------------------------------------


def _cli(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
    proc = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt-huge"], "valid: llama2-7b"),
    (["--model", "nosuchpkg.mod:build"], "cannot import module"),
    (["--model", "llama3-8b", "--topology", "v9x-8"], "valid generations"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--dp", "3"], "does not divide"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--dp", "2", "--fsdp", "2", "--tp", "1"], "must equal"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--fsdp", "8", "--batch", "12"], "does not divide into"),
    (["--model", "llama2-7b", "--topology", "v6e-64", "--tp", "64", "--fsdp", "1"], "attention heads"),
    (["--model", "llama", "--n-heads", "24", "--n-kv-heads", "6", "--d-model", "1536", "--topology", "v6e-4",
      "--tp", "4", "--fsdp", "1"], "key/value heads"),
    (["--model", "llama", "--d-model", "1000", "--n-heads", "16"], "not a multiple of n_heads"),
    (["--model", "gpt-small", "--topology", "v6e-8", "--tp", "2"], "Llama-style models only"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--slices", "2", "--dp", "1", "--tp", "16", "--fsdp", "1"],
     "multiple of slices"),
    # bad input that used to escape as a traceback or be silently replaced by a default
    (["--model", "llama", "--config", "[1, 2]"], "--config: a JSON object"),
    (["--model", "gpt-tiny", "--model-kwargs", '{"d_model": 8}'], "--model-kwargs applies to a factory"),
    (["--model", "llama", "--config", '{"n_layers": true}'], "n_layers must be a positive integer, got True"),
    (["--model", "llama", "--config", "/nonexistent/config.json"], "--config: cannot read"),
    (["--model", "llama", "--config", '{"n_layers": 2, "d_model": '], "--config: invalid JSON"),
    (["--model", "gpt-tiny", "--topology", "v6e-1", "--batch", "0"], "batch must be a positive integer, got 0"),
    (["--model", "gpt-tiny", "--topology", "v6e-1", "--seq-len", "0"], "seq_len must be a positive integer"),
    (["--model", "torch_tpu.estimate.models:GPT", "--topology", "v6e-1", "--batch", "-2"], "batch must be a positive"),
    (["--model", "llama-tiny", "--topology", "v6e-1", "--plot", "/nonexistent/dir/x.png"], "--plot"),
])
def test_bad_input_errors_before_work(args, message, monkeypatch):
    def no_exec(*a):
        raise AssertionError("validation passed: the CLI tried to start the run")

    monkeypatch.setattr(os, "execve", no_exec)
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        cli_main(args)
    assert message in str(e.value), str(e.value)
    assert time.perf_counter() - t0 < 5  # nothing ran


def test_cli_small_llama_json_table_and_plot(tmp_path):
    png = tmp_path / "breakdown.png"
    proc = _cli("--model", "llama", "--config", json.dumps({"n_layers": 2, "d_model": 256, "n_heads": 4,
                                                             "n_kv_heads": 2, "ffn_dim": 512, "vocab_size": 1024}),
                "--seq-len", "128", "--batch", "16", "--topology", "v5p-16", "--tp", "2", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    r = json.loads(lines[-1])
    assert "MFU" in proc.stdout and "fits" in proc.stdout
    assert r["chips"] == 8 and r["parallelism"] == {"dp": 1, "fsdp": 4, "tp": 2, "slices": 1, "ep": 1, "pp": 1,
                                                    "microbatches": 0}
    assert r["local_batch"] == 4
    assert set(r["by_generation"]) == set(GENS) and r["generation"] == "v5p"
    specs = {g["generation"]: g for g in torch_tpu.runtime.generations()}
    for g, e in r["by_generation"].items():
        parts = e["breakdown_s"]
        assert sum(parts.values()) == pytest.approx(e["step_time_s"], rel=1e-9)
        assert e["mfu"] == pytest.approx(r["model_flops_per_step"] / (8 * e["step_time_s"]
                                                                       * specs[g]["peak_bf16_flops"]))
        assert e["tokens_per_s"] == pytest.approx(16 * 128 / e["step_time_s"])
        assert e["fits"] == (r["hbm_peak_bytes"] <= specs[g]["hbm_bytes"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_cli_multislice_prices_dcn():
    """dp across 2 slices: the gradient all-reduce's cross-slice part goes over DCN,
    2(H-1)/H of the 1/L shard (tpu_dist's hierarchical all-reduce), H = 2, L = dp / 2."""
    proc = _cli("--model", "llama-tiny", "--topology", "v6e-4", "--slices", "2", "--dp", "8", "--fsdp", "1",
                "--batch", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    ar = r["collectives"]["all_reduce/dp"]
    assert ar["dcn_bytes"] == pytest.approx(2 * (2 - 1) / 2 * ar["payload_bytes"] / 4)
    assert ar["ici_bytes"] == pytest.approx(2 * (4 - 1) / 4 * ar["payload_bytes"])
    assert r["by_generation"]["v6e"]["dcn_s"] == pytest.approx(ar["dcn_bytes"] / 12.5e9)


def test_cli_llama3_70b_on_512_chips_under_two_minutes():
    """The issue's scale target: a 70 B model's per-chip step on a 512-chip slice."""
    t0 = time.perf_counter()
    proc = _cli("--model", "llama3-70b", "--topology", "v5p-1024", "--batch", "512", "--remat", timeout=300)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert wall < 120, wall
    assert r["chips"] == 512 and r["params"] == LLAMA_PRESETS["llama3-70b"].num_params()
    assert 70e9 < r["params"] < 71e9
    # FSDP over 512 chips: the chip holds 1/512 of every unit (rounded up per unit).
    assert r["per_chip_params"] < r["params"] / 512 * 1.01
    assert r["by_generation"]["v5p"]["fits"]
    assert r["host_rss_growth_bytes"] < 1 << 30  # ~28 GiB of HBM in use, no host memory behind it
    assert r["hbm_peak_bytes"] > 8 << 30


def test_cli_module_factory():
    """Any nn.Module factory by import path (here the demo GPT's builder, tiny preset)."""
    proc = _cli("--model", "torch_tpu.estimate.models:demo_gpt", "--model-kwargs", '{"preset": "tiny", "seq_len": 64}',
                "--seq-len", "64", "--batch", "8", "--topology", "v5e-4", "--dp", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg = GPTConfig(seq_len=64, **PRESETS["tiny"])
    assert r["params"] == GPT(cfg).num_params()
    assert r["local_batch"] == 2 and r["collectives"]["all_reduce/dp"]["payload_bytes"] == 4 * r["params"]


def test_loss_chunks_bound_the_logits_memory():
    """Large vocabulary: the float32 logits dominate the peak. Computing the loss in 8
    recomputed chunks keeps one chunk's logits alive and costs one more forward of the output
    projection (2·N·C·V FLOPs for N tokens) plus the loss's elementwise work again."""
    n = _chips()
    cfg = dict(vocab_size=32768, n_layers=1, d_model=128, n_heads=4, n_kv_heads=4, ffn_dim=256, seq_len=256)
    one = run(model_spec("llama", batch=4 * n, **cfg), Parallelism(dp=n), device=DEV)
    eight = run(model_spec("llama", batch=4 * n, **cfg), Parallelism(dp=n), loss_chunks=8, device=DEV)
    tokens = 4 * cfg["seq_len"]
    logits_f32 = tokens * cfg["vocab_size"] * 4
    assert one["hbm_peak_bytes"] > 3 * logits_f32
    assert one["hbm_peak_bytes"] - eight["hbm_peak_bytes"] > 2 * logits_f32
    extra = eight["stats"]["flops"] - one["stats"]["flops"]
    recompute = 2 * tokens * cfg["d_model"] * cfg["vocab_size"]
    assert recompute < extra < 1.1 * recompute
    with pytest.raises(ValueError, match="Llama-style models only"):
        run(model_spec("gpt-tiny", batch=n), Parallelism(dp=n), loss_chunks=2, device=DEV)


def test_factory_that_raises_or_returns_junk_is_a_clear_error(tmp_path):
    (tmp_path / "badfac.py").write_text("import torch\n"
                                        "def build():\n    raise RuntimeError('factory exploded')\n"
                                        "def junk():\n    return 5\n"
                                        "def meta_shy():\n"  # fails on meta only: built on the chip instead
                                        "    if torch.empty(0).device.type == 'meta':\n"
                                        "        raise NotImplementedError('no meta')\n"
                                        "    from torch_tpu.estimate.models.gpt import GPT, GPTConfig, PRESETS\n"
                                        "    return GPT(GPTConfig(**PRESETS['tiny']))\n")
    env_path = str(tmp_path)
    for factory, message in (("badfac:build", "model 'badfac:build' raised RuntimeError: factory exploded"),
                             ("badfac:junk", "returned int, not an nn.Module")):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
        env["PYTHONPATH"] = env_path + os.pathsep + env.get("PYTHONPATH", "")
        p = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", "--model", factory, "--topology", "v6e-1"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, p.stderr[-2000:]
        assert "torch_tpu.estimate: error: " in p.stderr and message in p.stderr, p.stderr[-2000:]
        assert "Traceback" not in p.stderr, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", "--model", "badfac:meta_shy", "--topology",
                        "v6e-1", "--batch", "2", "--seq-len", "16"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["params"] > 0


def test_run_rejects_zero_steps():
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        run(model_spec("llama-tiny", batch=_chips()), Parallelism(fsdp=_chips()), steps=0)


def test_values_written_in_a_dry_run_raise_when_read_after_it():
    """A dry run computes nothing: its tensors (and tensors it wrote in place) must not be
    read afterwards as if they held values (they would be stale HBM bytes)."""
    dev = torch.device("tpu", DEV)
    real = torch.full((4, 4), 7.0, device=dev)
    param = torch.ones(4, device=dev)
    with dry_run():
        made = real * 2 + 1
        param.add_(5)                      # skipped: param's values are now unknown
        filled = torch.empty(3, device=dev)
        filled.fill_(3.0)
    for read in (lambda: made.cpu(), lambda: made.sum().item(), lambda: (made + 1).cpu(), lambda: param.cpu(),
                 lambda: print(filled), lambda: torch.compile(lambda a: a * 2 + 1, backend="tpu")(param)):
        with pytest.raises(RuntimeError, match=r"holds no values: it was written inside torch_tpu.estimate.dry_run"):
            read()
    # a view reads nothing; overwriting whole makes a tensor usable again
    v = made.t()
    made.copy_(torch.arange(16.0).view(4, 4))
    assert torch.equal(v.cpu(), torch.arange(16.0).view(4, 4).t())
    param.zero_()
    assert param.sum().item() == 0.0
    with dry_run():
        out = torch.empty(4, device=dev)
    torch.add(param, 2.0, out=out)  # an out= result is written whole
    assert torch.equal(out.cpu(), torch.full((4,), 2.0))
    filled.normal_()
    assert filled.cpu().shape == (3,)
    # tensors untouched by the dry run still hold their values; real work is exact
    assert torch.equal(real.cpu(), torch.full((4, 4), 7.0))
    assert torch.equal((real * 2 + 1).cpu(), torch.full((4, 4), 15.0))
    # a partial overwrite leaves the rest undefined
    with dry_run():
        part = torch.empty(4, device=dev)
    part[:2] = 1.0
    with pytest.raises(RuntimeError, match="holds no values"):
        part.cpu()


def test_dry_run_restores_the_mode_after_an_exception_and_nests():
    from torch_tpu import _C

    with pytest.raises(KeyError):
        with dry_run():
            raise KeyError("inside")
    assert not _C._dry_run()
    with dry_run():
        with dry_run():
            pass
        assert _C._dry_run()  # the inner exit restores the outer dry run
    assert not _C._dry_run()


def test_fused_dry_run_equals_real_defer_and_fuse_llama_step():
    """fuse=True: the dry run prices the fused regions a real defer_and_fuse step runs: the same
    ops and FLOPs; HBM bytes and device seconds within 0.5 % (the dry run's data-parallel
    gradient pricing reads the gradients, which ends some regions at other points)."""
    from torch_tpu.estimate.core import _global_eager_mode, _optimizer
    from torch_tpu.estimate.models import Llama

    cfg = LLAMA_PRESETS["llama-tiny"]
    dev = torch.device("tpu", DEV)
    torch.manual_seed(0)
    model = Llama(cfg).to(dev)
    opt = _optimizer(model_spec("llama-tiny"), model)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    y = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    with _global_eager_mode("defer_and_fuse"):
        real = _measure_real_step(model, opt, x, y, dev)
    n = _chips()
    raw = run(model_spec("llama-tiny", batch=4 * n), Parallelism(dp=n), device=DEV, fuse=True)
    assert raw["fused"] and raw["stats"]["ops"] < run(model_spec("llama-tiny", batch=4 * n), Parallelism(dp=n),
                                                      device=DEV)["stats"]["ops"]
    dry = raw["stats"]
    assert dry["ops"] == real["ops"] and dry["flops"] == real["flops"]
    for key in ("bytes_read", "bytes_written"):
        assert dry[key] == pytest.approx(real[key], rel=5e-3), key
    for g in GENS:
        assert dry["device_seconds_by_generation"][g] == pytest.approx(real["device_seconds_by_generation"][g],
                                                                       rel=5e-3), g


def test_a_run_frees_its_model():
    """Nothing of an estimate outlives its run(): no HBM left allocated on the chip, and no
    tensor without values (a dry run's) kept alive to slow every later op (fast_ops.cc)."""
    if _chips() < 8:
        pytest.skip("needs 8 chips")
    gc.collect()
    before = torch.tpu.memory_allocated(DEV)
    run(model_spec("llama-tiny", batch=4), Parallelism(dp=1, fsdp=4, tp=2), remat=False, device=DEV)
    gc.collect()
    assert torch.tpu.memory_allocated(DEV) == before
    x = torch.ones(3, 2, device=DEV)
    x.exp()
    n0 = torch_tpu._C._fast_kept_calls()
    x.exp()
    assert torch_tpu._C._fast_kept_calls() == n0 + 1
