"""torch_tpu.estimate: MaxText remat policies and host offload, mixture of experts with expert
parallelism, pipeline parallelism, Qwen3 configs, and the published rows (issue 21).

Expected values come from the configurations and the formulas (matmul FLOPs 2·M·K·N, tensor
bytes, the 1F1B bubble), not from the estimator. In-process runs use tpu:1 of this process's
slice (see conftest.py); the published rows run through the CLI in subprocesses.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from torch_tpu.estimate import LLAMA_PRESETS, Parallelism, llama_config, model_spec, report, run
from torch_tpu.estimate import remat as R
from torch_tpu.estimate import schedule as S
from torch_tpu.estimate.__main__ import main as cli_main
from torch_tpu.estimate.published import PUBLISHED

DEV = 1
CONFIGS = Path(__file__).resolve().parents[3] / "torch_tpu" / "estimate" / "configs"


def _chips():
    return torch.tpu.topology()["num_chips"]


# A small Llama whose activations dominate its HBM (4096 tokens per chip, 0.7 M parameters).
SMALL = dict(vocab_size=256, n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, ffn_dim=256, seq_len=512)
ROWS = 8  # sequences per chip


def _run(policy, save=(), offload=(), **kw):
    n = _chips()
    return run(model_spec("llama", batch=ROWS * n, **SMALL), Parallelism(dp=n), remat=policy, save=save,
               offload=offload, device=DEV, **kw)


def test_policies_are_maxtexts():
    """The names and what they keep, as MaxText's Decoder.get_remat_policy defines them."""
    assert set(R.POLICIES) >= {"full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp",
                               "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj",
                               "qkv_proj_offloaded", "minimal_offloaded", "custom", "none"}
    qkv = {"query_proj", "key_proj", "value_proj"}
    assert R.resolve("save_qkv_proj").save == qkv
    assert R.resolve("save_dot_except_mlp").save == qkv | {"out_proj"}
    assert R.resolve("save_dot_except_mlpwi").save == qkv | {"out_proj", "mlpwo"}
    assert R.resolve("minimal").save == qkv | {"out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"}
    assert R.resolve("minimal_with_context").save == R.resolve("minimal").save | {"context"}
    assert R.resolve("qkv_proj_offloaded").offload == qkv and not R.resolve("qkv_proj_offloaded").save
    assert R.resolve("minimal_offloaded").offload == R.resolve("minimal").save
    assert R.resolve("full").checkpoint and not R.resolve("full").save and not R.resolve("none").checkpoint
    p = R.resolve("custom", save=("mlpwi",), offload=("decoder_layer_input", "qkv_proj"))
    assert p.save == {"mlpwi_0", "mlpwi_1"} and p.offload == qkv | {"decoder_layer_input"}
    assert R.resolve(True).policy == "full" and R.resolve(False).policy == "none"


@pytest.mark.parametrize("args,message", [
    (("bogus",), "unknown remat policy 'bogus'; valid: none, full, minimal"),
    (("custom", ("q_proj",)), "unknown tensor name 'q_proj'; valid: decoder_layer_input"),
    (("custom", ("query_proj",), ("query_proj",)), "query_proj cannot be both saved and offloaded"),
    (("none", (), ("query_proj",)), "need a checkpointing policy"),
])
def test_bad_policies(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        R.resolve(*args)


def test_remat_recompute_flops_saved_tensors_and_offload():
    """full recomputes each layer's forward; save_qkv_proj skips exactly the q/k/v projections'
    FLOPs in that recompute; qkv_proj_offloaded recomputes the same but moves those tensors
    (bf16, [tokens, (H + 2K)·D]) to the host and back, and holds less HBM than saving them."""
    c = SMALL
    tokens = ROWS * c["seq_len"]
    d = c["d_model"] // c["n_heads"]
    qkv_cols = (c["n_heads"] + 2 * c["n_kv_heads"]) * d
    qkv_flops = c["n_layers"] * 2 * tokens * c["d_model"] * qkv_cols
    none, full = _run("none"), _run("full")
    save_qkv, off_qkv = _run("save_qkv_proj"), _run("qkv_proj_offloaded")
    # Recompute of the layer forwards: matmuls 2·tokens·(layer matmul parameters) + causal attention
    # 4·C·T(T+1)/2 per sequence,
    # except the last matmul (w2), whose output the backward does not need (recompute stops early).
    layer_mm = c["d_model"] * qkv_cols + c["n_heads"] * d * c["d_model"] + 2 * c["d_model"] * c["ffn_dim"]
    pairs = c["seq_len"] * (c["seq_len"] + 1) // 2
    fwd_mm = c["n_layers"] * (2 * tokens * layer_mm + 4 * ROWS * pairs * c["d_model"])
    extra = full["stats"]["flops"] - none["stats"]["flops"]
    assert fwd_mm < extra < 1.05 * fwd_mm
    assert full["stats"]["flops"] - save_qkv["stats"]["flops"] == qkv_flops
    assert off_qkv["stats"]["flops"] == save_qkv["stats"]["flops"]
    assert full["host"]["d2h_bytes"] == 0 and save_qkv["host"]["d2h_bytes"] == 0
    moved = c["n_layers"] * tokens * qkv_cols * 2
    assert off_qkv["host"]["d2h_bytes"] == moved and off_qkv["host"]["h2d_bytes"] == moved
    assert off_qkv["hbm_peak_bytes"] < save_qkv["hbm_peak_bytes"]
    assert full["hbm_peak_bytes"] <= off_qkv["hbm_peak_bytes"] and 2 * full["hbm_peak_bytes"] < none["hbm_peak_bytes"]
    # The layer input offloaded too: its bf16 [tokens, C] per layer goes to the host as well.
    both = _run("qkv_proj_offloaded", offload=("decoder_layer_input",))
    assert both["host"]["d2h_bytes"] == moved + c["n_layers"] * tokens * c["d_model"] * 2
    # Offload time on the host link, exposed only beyond the compute it overlaps.
    r = report(model_spec("llama", batch=ROWS * _chips(), **SMALL), Parallelism(dp=_chips()), off_qkv,
               topology=torch.tpu.topology()["name"], overlap=False)
    e = r["by_generation"]["v6e"]
    assert e["host_s"] == pytest.approx(2 * moved / R.HOST_LINK_BYTES_PER_S["v6e"])
    assert sum(e["breakdown_s"].values()) == pytest.approx(e["step_time_s"])


def test_overlap_schedule_hand_computed():
    """schedule.simulate on cases small enough to compute by hand (seconds)."""
    T = S.Transfer
    # Three layers of 1 s compute, their all-gathers prefetched one layer ahead on one ICI queue:
    # the first is exposed whole (0.5), the second by max(0, 1.5 - 1) = 0.5, the third (0.7 < 1) not.
    ags = [T(0.0, (("ici", 0.5),), "here", True), T(1.0, (("ici", 1.5),), "here", True),
           T(2.0, (("ici", 0.7),), "here", True)]
    r = S.simulate(ags, 3.0)
    assert r["step_s"] == pytest.approx(4.0) and r["exposed_s"]["ici"] == pytest.approx(1.0)
    assert r["busy_s"]["ici"] == pytest.approx(2.7)
    # Gradient reduce-scatters after each layer's backward: one with 1 s of compute behind it is
    # hidden (0.6 < 1), the last one (at the end of the backward) exposed whole, and the DCN
    # reduction chained behind it too (no compute left).
    rs = [T(2.0, (("ici", 0.6),), "sync"), T(3.0, (("ici", 0.4), ("dcn", 0.3)), "sync")]
    r = S.simulate(rs, 3.0, sync_pos=3.0)
    assert r["step_s"] == pytest.approx(3.7)
    assert r["exposed_s"]["ici"] == pytest.approx(0.4) and r["exposed_s"]["dcn"] == pytest.approx(0.3)
    # Different resources run concurrently: the same transfers on ICI and on the host link hide
    # behind the same compute.
    both = [T(1.0, (("ici", 0.9),), "here"), T(1.0, (("h2d", 0.9),), "here")]
    assert S.simulate([T(0.0, (("ici", 0.0),), "here", True), *both], 2.0)["step_s"] == pytest.approx(2.9)
    # Offload saturation: two forward layers (1 s) each offloading 1.5 s of activations, two
    # backward layers (1 s) reloading them (each reload after its own offload). Offloads:
    # 1.0-2.5, 2.5-4.0; the last layer's reload 4.0-5.5 is needed at 2.0 (3.5 exposed), the
    # first's 5.5-7.0 at 3.0 + 3.5 = 6.5 (0.5 more): step 4 + 4 = 8 s.
    host = [T(1.0, (("d2h", 1.5),), "none", key=0), T(2.0, (("d2h", 1.5),), "none", key=1),
            T(2.0, (("h2d", 1.5),), "here", True, after=1), T(3.0, (("h2d", 1.5),), "here", True, after=0)]
    r = S.simulate(host, 4.0)
    assert r["step_s"] == pytest.approx(8.0) and r["exposed_s"]["h2d"] == pytest.approx(4.0)
    assert r["exposed_s"]["d2h"] == 0.0
    # Below saturation (0.5 s per layer) the first layer's round trip hides, but the last
    # forward layer's offload (2.0-2.5) and its reload (2.5-3.0) have no compute between them:
    # 1 s exposed where the backward starts.
    host = [T(1.0, (("d2h", 0.5),), "none", key=0), T(2.0, (("d2h", 0.5),), "none", key=1),
            T(2.0, (("h2d", 0.5),), "here", True, after=1), T(3.0, (("h2d", 0.5),), "here", True, after=0)]
    r = S.simulate(host, 4.0)
    assert r["step_s"] == pytest.approx(5.0) and r["exposed_s"]["h2d"] == pytest.approx(1.0)
    # A transfer nothing waits for, still running at the end, extends the step.
    assert S.simulate([T(1.0, (("d2h", 2.0),), "none")], 2.0)["step_s"] == pytest.approx(3.0)


@pytest.mark.parametrize("args,message", [
    (([S.Transfer(0.0, (("pcie", 1.0),))], 1.0), "unknown resource 'pcie'"),
    (([S.Transfer(0.0, (("ici", -1.0),))], 1.0), "negative duration"),
    (([S.Transfer(0.0, (("ici", 1.0),), "later")], 1.0), "need must be one of here, sync, none"),
    (([S.Transfer(0.0, (("ici", 1.0),), "sync")], 1.0), "no sync position"),
    (([S.Transfer(0.0, (("h2d", 1.0),), after=7)], 1.0), "after 7, which no transfer"),
    (([], 1.0, 2.0), "0 <= sync <= compute"),
])
def test_overlap_schedule_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        S.simulate(*args)
    assert S.simulate([], 1.0)["step_s"] == 1.0  # still working


def test_overlap_schedule_of_a_dry_run():
    """The measured step's timeline: one offload and one reload per layer (bytes adding up to
    the host traffic), the FSDP all-gathers and reduce-scatters in program order, and the
    report's step = compute + what the schedule exposes (breakdown adding up to it)."""
    n = _chips()
    spec = model_spec("llama", batch=ROWS * n, **SMALL)
    raw = run(spec, Parallelism(fsdp=n), remat="qkv_proj_offloaded", device=DEV)
    ev = raw["timeline"]
    d2h = [e for e in ev if e["kind"] == "d2h"]
    h2d = [e for e in ev if e["kind"] == "h2d"]
    assert len(d2h) == len(h2d) == SMALL["n_layers"]
    assert sum(e["bytes"] for e in d2h) == raw["host"]["d2h_bytes"] == sum(e["bytes"] for e in h2d)
    assert [e["key"] for e in h2d] == [e["key"] for e in reversed(d2h)]  # the backward runs the layers back
    ag = [e for e in ev if e["kind"] == "collective" and e["op"] == "all_gather"]
    rs = [e for e in ev if e["kind"] == "collective" and e["op"] == "reduce_scatter"]
    assert len(ag) == raw["collectives"]["all_gather/fsdp"]["count"] and len(rs) == SMALL["n_layers"] + 2
    pos = [e["pos"]["v6e"] for e in ev]
    assert pos == sorted(pos) and [e["kind"] for e in ev][-1] == "sync"
    r = report(spec, Parallelism(fsdp=n), raw, topology=torch.tpu.topology()["name"], overlap="schedule")
    assert r["overlap"] == "schedule"
    e = r["by_generation"]["v6e"]
    tr, sync = S.transfers_for(ev, "v6e", R.HOST_LINK_BYTES_PER_S["v6e"])
    assert e["step_time_s"] == pytest.approx(S.simulate(tr, e["compute_s"], sync)["step_s"])
    assert e["compute_s"] < e["step_time_s"] <= e["step_time_serial_s"]
    assert sum(e["breakdown_s"].values()) == pytest.approx(e["step_time_s"])
    hidden = report(spec, Parallelism(fsdp=n), raw, topology=torch.tpu.topology()["name"])["by_generation"]["v6e"]
    assert hidden["compute_s"] == e["compute_s"] and hidden["step_time_s"] <= e["step_time_s"]
    with pytest.raises(ValueError, match="overlap must be one of hidden, schedule, none"):
        report(spec, Parallelism(fsdp=n), raw, topology=torch.tpu.topology()["name"], overlap="bogus")


def test_auto_loss_chunks_default():
    """Large vocabularies: float32 logits are chunked to at most 256 MiB per chunk by default."""
    from torch_tpu.estimate.core import LOSS_CHUNK_BYTES, auto_loss_chunks

    spec = model_spec("llama3-8b", batch=1024)
    n = auto_loss_chunks(spec, Parallelism(fsdp=256))
    logits = 4 * 8192 * 128256 * 4
    assert n == -(-logits // LOSS_CHUNK_BYTES) and logits / n <= 256 * 2**20
    assert auto_loss_chunks(model_spec("llama-tiny"), Parallelism()) == 1


def test_qwen3_configs():
    """Hugging Face config.json of Qwen3: head_dim, q/k norms, experts. Parameter counts match
    the model cards (8.2 B; 30.5 B total / 3.3 B active; 235 B / 22 B)."""
    dense = llama_config(None, str(CONFIGS / "qwen3-8b.json"))
    assert (dense.head_dim, dense.qk_norm, dense.n_layers, dense.is_moe) == (128, True, 36, False)
    assert round(dense.num_params() / 1e8) == 82
    small = llama_config(None, str(CONFIGS / "qwen3-30b-a3b.json"))
    assert (small.n_experts, small.top_k, small.moe_ffn_dim, small.head_dim) == (128, 8, 768, 128)
    assert round(small.num_params() / 1e8) == 305 and round(small.num_params(active=True) / 1e8) == 34
    big = llama_config(None, str(CONFIGS / "qwen3-235b-a22b.json"))
    assert round(big.num_params() / 1e9) == 235 and round(big.num_params(active=True) / 1e9) == 22


MOE = dict(vocab_size=512, n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, ffn_dim=256, seq_len=64,
           n_experts=8, top_k=2, moe_ffn_dim=128)


def test_moe_expert_parallel_all_to_all():
    """E/ep experts per chip; each MoE layer's dispatch and combine all-to-alls (and both again
    in the backward) carry tokens·k·C elements, (ep-1)/ep of them over ICI; the experts do the
    matmul work of a dense MLP of width k·F_moe, plus the router."""
    n = _chips()
    ep = 4 if n % 4 == 0 else 2
    spec = model_spec("llama", batch=2 * n, **MOE)
    raw = run(spec, Parallelism(fsdp=n, ep=ep), device=DEV)
    a2a = raw["collectives"]["all_to_all/ep"]
    tokens, k, c = 2 * MOE["seq_len"], MOE["top_k"], MOE["d_model"]
    assert a2a["count"] == 4 * MOE["n_layers"]
    # dispatch and combine, forward and backward: bf16 tokens (activations in the compute dtype)
    assert a2a["payload_bytes"] == 4 * MOE["n_layers"] * tokens * k * c * 2
    assert a2a["ici_bytes"] == pytest.approx((ep - 1) / ep * a2a["payload_bytes"])
    assert raw["params"] == spec.llama.num_params()
    one = run(spec, Parallelism(fsdp=n, ep=1), device=DEV)
    assert "all_to_all/ep" not in one["collectives"]
    # Same tokens through the experts either way: the matmul FLOPs do not change with ep (the
    # optimizer's elementwise work does: the chip updates E/ep experts' shards, not E's).
    assert raw["stats"]["flops"] == pytest.approx(one["stats"]["flops"], rel=1e-2)
    assert raw["per_chip_params"] < one["per_chip_params"]
    dense = run(model_spec("llama", batch=2 * n, **{**MOE, "n_experts": 0, "top_k": 0, "moe_ffn_dim": 0,
                                                     "ffn_dim": k * MOE["moe_ffn_dim"]}),
                Parallelism(fsdp=n), device=DEV)
    # A dense MLP of width k·F_moe does the same matmul work: the difference is the router.
    router = 3 * 2 * tokens * c * MOE["n_experts"] * MOE["n_layers"]
    assert raw["stats"]["flops"] - dense["stats"]["flops"] > router


def test_pipeline_bubble():
    """1F1B over pp stages with M microbatches: the chip runs L/pp layers, the stage's forward
    and backward time is stretched by (M + pp - 1) / in_flight, the bubble is (pp - 1) / (M + pp - 1)
    of it; activations go to the next stage (and gradients back) once per microbatch."""
    n = _chips()
    pp = 2
    spec = model_spec("llama", batch=8 * n // pp, **{**SMALL, "n_layers": 4})
    par = Parallelism(fsdp=n // pp, pp=pp, microbatches=4)
    raw = run(spec, par, device=DEV)
    assert raw["pipeline"] == {"microbatches": 4, "microbatch": 2, "in_flight": 2}
    assert raw["params"] == spec.llama.num_params()
    send = raw["collectives"]["send/pp"]
    assert send["count"] == 2 * 4 and send["payload_bytes"] == 8 * 2 * SMALL["seq_len"] * SMALL["d_model"] * 2
    r = report(spec, par, raw, topology=torch.tpu.topology()["name"])
    fb = raw["phases"]["backward"]["v6e"]["total"]
    e = r["by_generation"]["v6e"]
    m, stretch = 4, (4 + pp - 1) / 2
    assert e["bubble_s"] == pytest.approx(fb * stretch * (pp - 1) / (m + pp - 1))
    assert e["compute_s"] == pytest.approx(fb * stretch + raw["phases"]["end"]["v6e"]["total"] - fb)


def _no_exec(*a):
    raise AssertionError("validation passed: the CLI tried to start the run")


@pytest.mark.parametrize("args,message", [
    (["--model", "llama", "--config", str(CONFIGS / "qwen3-30b-a3b.json"), "--topology", "v6e-8", "--ep", "3",
      "--fsdp", "8"], "--ep 3 does not divide the 128 experts"),
    (["--model", "llama", "--config", str(CONFIGS / "qwen3-30b-a3b.json"), "--topology", "v6e-8", "--ep", "16"],
     "--ep 16 does not divide --fsdp 8"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--ep", "2"], "needs a mixture-of-experts model"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--pp", "3"], "--pp 3 does not divide the 8 chips"),
    (["--model", "llama2-13b", "--topology", "v6e-16", "--pp", "16", "--fsdp", "1"],
     "--pp 16 does not divide the 40 layers"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--microbatches", "4"], "applies to pipeline parallelism"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--pp", "2", "--batch", "8", "--microbatches", "3"],
     "--microbatches 3 does not divide the chip's batch of 2"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--remat", "sometimes"],
     "unknown remat policy 'sometimes'; valid: none, full, minimal"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--remat", "custom", "--offload", "qproj"],
     "unknown tensor name 'qproj'"),
    (["--model", "llama3-8b", "--topology", "v6e-8", "--no-overlap", "--overlap", "schedule"],
     "--no-overlap contradicts --overlap schedule"),
])
def test_bad_plans_error_before_work(args, message, monkeypatch):
    monkeypatch.setattr(os, "execve", _no_exec)
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        cli_main(args)
    assert message in str(e.value), str(e.value)
    assert time.perf_counter() - t0 < 5


def test_cli_hsdp_across_slices():
    """HSDP: FSDP inside each of 2 slices, the gradient shards all-reduced across them over DCN
    (2(H-1)/H of the 1/L local shard, H = 2 slices; L = 1 chip of dp per slice here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
    p = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", "--model", "llama-tiny", "--topology", "v6e-4",
                        "--slices", "2", "--dp", "2", "--fsdp", "4", "--batch", "8", "--remat", "full"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    ar = r["collectives"]["all_reduce/dp"]
    cfg = LLAMA_PRESETS["llama-tiny"]
    assert ar["count"] == cfg.n_layers + 2  # the layers, the embedding and the head
    assert ar["dcn_bytes"] == pytest.approx(ar["payload_bytes"])  # 2·(2-1)/2 of the shard, local size 1
    assert ar["ici_bytes"] == 0
    assert r["by_generation"]["v6e"]["dcn_s"] > 0


def test_cli_fsdp_over_dcn():
    """FSDP over 2 slices (dp 1, MaxText's dcn_fsdp_parallelism 2): each all-gather and
    reduce-scatter moves (L-1)/L of its buffer over the slice's ICI ring (L = 4 chips of a
    slice) and (2-1)/2 of the 1/L shard block over DCN; no dp all-reduce."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
    p = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", "--model", "llama-tiny", "--topology", "v6e-4",
                        "--slices", "2", "--dp", "1", "--batch", "8", "--remat", "full"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["parallelism"]["fsdp"] == 8 and "all_reduce/dp" not in r["collectives"]
    cfg = LLAMA_PRESETS["llama-tiny"]
    for op in ("all_gather/fsdp", "reduce_scatter/fsdp"):
        c = r["collectives"][op]
        assert c["count"] == (2 if op.startswith("all_gather") else 1) * (cfg.n_layers + 2)
        assert c["ici_bytes"] == pytest.approx(3 / 4 * c["payload_bytes"])
        assert c["dcn_bytes"] == pytest.approx(c["payload_bytes"] / 4 / 2)
    assert r["by_generation"]["v6e"]["dcn_s"] > 0


# --- the published rows -------------------------------------------------------------------


def _published(row):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
    p = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", *row["args"]], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# Rows outside 15 % or not fitting today (docs/estimate.md says why); strict: fixing one makes
# its test fail until it leaves this set.
# The layer-by-layer overlap schedule exposes under 0.05 s of their communication: the gap is compute.
KNOWN_OFF = {
    "Llama 2 70B, v6e-256": "0.84: 1.09 s of FSDP ICI and 1.79 s of offload hidden, each under the compute beside "
    "it layer by layer; no tested change with a public source closes the 0.11 s (docs/estimate.md)",
    "Llama 3.1 405B, 2 x v6e-256": "0.70: even with nothing hidden 0.90; unpadded MXU-bound products at v6e's peak "
    "(no published v6e GEMM rate; TPU7x's would give 0.81 and break the 8B rows) (docs/estimate.md)",
}
# Each row is a dry run of a 8 B - 405 B model (10-45 s); by default two run, all of them with
# TORCH_TPU_ESTIMATE_PUBLISHED=1 (bench/estimate_published.py prints the same table).
DEFAULT_ROWS = {"Llama 3.1 70B, v6e-64", "Llama 3.1 8B, v6e-8"}


def _marks(row):
    marks = []
    if row["name"] in KNOWN_OFF:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_OFF[row["name"]]))
    if row["name"] not in DEFAULT_ROWS and os.environ.get("TORCH_TPU_ESTIMATE_PUBLISHED") != "1":
        marks.append(pytest.mark.skip(reason="set TORCH_TPU_ESTIMATE_PUBLISHED=1 to run every published row"))
    return marks


@pytest.mark.parametrize("row", [pytest.param(r, id=r["name"], marks=_marks(r)) for r in PUBLISHED])
def test_published_rows(row):
    """Step time within 15 % of the published one, and the run fits, on the published slice
    with the recipe's remat policy and offloads."""
    r = _published(row)
    e = r["by_generation"][row["generation"]]
    assert e["fits"], f"HBM peak {r['hbm_peak_bytes'] / 2**30:.1f} GiB"
    assert e["step_time_s"] == pytest.approx(row["step_s"], rel=0.15)


# --- pricing rules: causal attention, fused elementwise regions, FSDP units, weight dtype -----


def test_swiglu_gate_backward_writes_into_its_dying_inputs():
    """consume=True: the gate's backward allocates only sigmoid(a) (one [N, F]) and returns da in
    b's buffer, db in the gradient's, with the values of autograd's silu(a) * b (CPU oracle)."""
    import torch.nn.functional as F

    from torch_tpu.estimate.models.llama import swiglu

    dev = torch.device("tpu", DEV)
    n, f = 64, 256
    gen = torch.Generator().manual_seed(0)
    a0, b0, g0 = (torch.randn(n, f, generator=gen) for _ in range(3))
    ac, bc = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    ref = torch.autograd.grad(F.silu(ac) * bc, (ac, bc), g0)
    a_leaf, b_leaf = a0.to(dev).requires_grad_(), b0.to(dev).requires_grad_()
    a, b = a_leaf * 1, b_leaf * 1  # the caller's own temporaries
    y = swiglu(a, b, consume=True)
    g = g0.to(dev)
    torch.tpu.synchronize(DEV)
    base = torch.tpu.memory_allocated(DEV)
    torch.tpu.reset_peak_memory_stats(DEV)
    da, db = torch.autograd.grad(y, (a, b), g)
    torch.tpu.synchronize(DEV)
    assert torch.tpu.max_memory_allocated(DEV) - base == n * f * 4  # s only
    assert da.data_ptr() == b.data_ptr() and db.data_ptr() == g.data_ptr()
    torch.testing.assert_close(da.cpu(), ref[0])
    torch.testing.assert_close(db.cpu(), ref[1])
    # Without consume (the default) the inputs are left alone.
    a, b = a_leaf * 1, b_leaf * 1
    da, db = torch.autograd.grad(swiglu(a, b), (a, b), g0.to(dev))
    torch.testing.assert_close(a.cpu(), a0)
    torch.testing.assert_close(b.cpu(), b0)
    torch.testing.assert_close(da.cpu(), ref[0])


def test_mlp_output_is_no_residual():
    """The dense MLP's output (mlpwo) feeds only the residual add: a policy saving it keeps
    exactly what the same policy without it keeps (same peak, same FLOPs), and offloading it moves
    nothing, as JAX keeps only residuals of the backward."""
    a, b = _run("save_dot_except_mlpwi"), _run("save_dot_except_mlp")
    assert a["hbm_peak_bytes"] == b["hbm_peak_bytes"] and a["stats"]["flops"] == b["stats"]["flops"]
    off = _run("custom", offload=("mlpwo",))
    assert off["host"]["d2h_bytes"] == 0 and off["hbm_peak_bytes"] == _run("full")["hbm_peak_bytes"]


def test_causal_flash_attention_priced_over_unmasked_pairs():
    """is_causal: the fused kernel's FLOPs cover the T(T+1)/2 unmasked query/key pairs of T x T
    (4·B·H·pairs·D forward, 8·B·H·pairs·D backward); without it all T·S pairs."""
    import torch_tpu.runtime
    from torch_tpu.estimate import dry_run

    B, H, T, D = 2, 4, 384, 64
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    flops = {}
    with dry_run():
        q, k, v = (torch.empty(B, H, T, D, dtype=torch.bfloat16, device=f"tpu:{DEV}") for _ in range(3))
        for causal in (False, True):
            torch.tpu.synchronize(DEV)
            torch_tpu.runtime.reset_stats(DEV)
            out, lse = op(q, k, v, 0.0, causal)
            f = torch_tpu.runtime.stats(DEV)["flops"]
            bwd(out, q, k, v, out, lse, 0.0, causal)
            flops[causal] = (f, torch_tpu.runtime.stats(DEV)["flops"] - f)
    assert flops[False] == (4 * B * H * T * T * D, 8 * B * H * T * T * D)
    pairs = T * (T + 1) // 2
    assert flops[True] == (4 * B * H * pairs * D, 8 * B * H * pairs * D)


def test_fused_dry_run_prices_and_allocates_one_region():
    """fuse (defer_and_fuse in the dry run): an elementwise chain reads its input once and
    writes only its live result; strict prices every op's round trip and allocates each
    intermediate."""
    import torch_tpu.runtime
    from torch_tpu.estimate import dry_run
    from torch_tpu.estimate.core import _global_eager_mode

    n = 1 << 20  # float32 [1024, 1024]: 4 MiB, a whole number of (8, 128) tiles
    got = {}
    for mode in ("strict", "defer_and_fuse"):
        with dry_run(), _global_eager_mode(mode):
            x = torch.empty(1024, 1024, device=f"tpu:{DEV}")
            torch.tpu.synchronize(DEV)
            torch_tpu.runtime.reset_stats(DEV)
            torch.tpu.reset_peak_memory_stats(DEV)
            base = torch.tpu.memory_allocated(DEV)
            y = ((x * 2 + 1).exp() * x).sin()
            torch_tpu._C._defer_flush()
            torch.tpu.synchronize(DEV)
            st = torch_tpu.runtime.stats(DEV)
            got[mode] = (st["bytes_read"], st["bytes_written"], torch.tpu.max_memory_allocated(DEV) - base)
            del x, y
    assert got["strict"][:2] == (6 * 4 * n, 5 * 4 * n)  # mul, add, exp, mul (x twice), sin
    assert got["strict"][2] >= 2 * 4 * n  # an intermediate alive beside the next op's output
    assert got["defer_and_fuse"] == (4 * n, 4 * n, 4 * n)  # x read once, y written and allocated


def test_fsdp_units_embedding_and_head_their_own():
    """Llama: every layer, the embedding and the head (norm + output) are FSDP units resharded
    after their forward, no root unit; tied weights (the demo GPT) stay in a root unit.
    weight_dtype bf16: shards of bf16."""
    from torch_tpu.estimate.models import GPT, GPT_PRESETS, GPTConfig, Llama
    from torch_tpu.estimate.parallel import Collectives, shard_model

    n = _chips()
    coll = Collectives(Parallelism(fsdp=n), n, DEV)
    cfg = LLAMA_PRESETS["llama-tiny"]
    with torch.device("meta"):
        model = Llama(cfg)
    units = shard_model(model, coll, torch.bfloat16, torch.bfloat16)
    assert [u.name for u in units] == [f"layers.{i}" for i in range(cfg.n_layers)] + ["embed", "head"]
    assert all(u.reshard for u in units)
    assert units[-1].total == cfg.d_model + cfg.vocab_size * cfg.d_model  # norm + output
    assert units[-2].total == cfg.vocab_size * cfg.d_model
    assert {u.shard().dtype for u in units} == {torch.bfloat16}
    assert sum(u.total for u in units) == cfg.num_params()
    with torch.device("meta"):
        gpt = GPT(GPTConfig(seq_len=64, **GPT_PRESETS["tiny"]))
    units = shard_model(gpt, coll)
    root = units[-1]
    assert root.name == "root" and not root.reshard and root.shard().dtype == torch.float32
    assert gpt.tok_emb in [m for m, _, _ in root.entries] and gpt.head in [m for m, _, _ in root.entries]


def test_weight_dtype_bf16_state_and_peak():
    """weight_dtype bf16 (MaxText's): the same parameter elements per chip, a lower HBM peak
    (the shards' bf16 dtype is checked in test_fsdp_units_embedding_and_head_their_own); a dtype
    other than fp32 / bf16 raises naming the argument."""
    n = _chips()
    spec = model_spec("llama", batch=n, vocab_size=1024, n_layers=2, d_model=512, n_heads=4, n_kv_heads=2,
                      ffn_dim=1024, seq_len=64)
    peaks = {w: run(spec, Parallelism(fsdp=n), weight_dtype=w, device=DEV) for w in ("fp32", "bf16")}
    assert peaks["bf16"]["per_chip_params"] == peaks["fp32"]["per_chip_params"]
    assert peaks["bf16"]["hbm_peak_bytes"] < peaks["fp32"]["hbm_peak_bytes"]
    assert peaks["bf16"]["weight_dtype"] == "bf16"
    with pytest.raises(ValueError, match="weight_dtype"):
        run(spec, Parallelism(fsdp=n), weight_dtype="fp16", device=DEV)


# --- AdamW's first moment in bf16 (MaxText's mu_dtype) --------------------------------------


def _adamw_oracle(p0, grads, lr, b1, b2, eps, wd, mu_round):
    """optax's scale_by_adam + decoupled weight decay, by hand in float64; ``mu_round`` rounds the
    stored first moment after each step (bf16: the value kept between steps)."""
    p, mu, nu = p0.double(), torch.zeros_like(p0, dtype=torch.float64), torch.zeros_like(p0, dtype=torch.float64)
    for t, g in enumerate(grads, 1):
        g = g.double()
        m = b1 * mu + (1 - b1) * g
        nu = b2 * nu + (1 - b2) * g * g
        p = p * (1 - lr * wd) - lr * (m / (1 - b1**t)) / ((nu / (1 - b2**t)).sqrt() + eps)
        mu = mu_round(m)
    return p, mu


def test_adamw_mu_bf16_values_and_state_bytes():
    """AdamWMu on the chip: three steps match the hand-written optax update (the unrounded new
    first moment drives the update, the stored one is bf16); its state is 2 + 4 bytes per float32
    element (256 x 512: exactly 256 * 512 * 2 bytes fewer than fp32 moments); with mu_dtype float32
    it is torch.optim.AdamW."""
    from torch_tpu.estimate.optim import AdamWMu

    dev = torch.device("tpu", DEV)
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(256, 512, generator=gen)
    grads = [torch.randn(256, 512, generator=gen) for _ in range(3)]
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    state_bytes = {}
    for mu_dtype in (torch.bfloat16, torch.float32):
        p = p0.to(dev).requires_grad_()
        opt = AdamWMu([p], mu_dtype=mu_dtype, **hp)
        for i, g in enumerate(grads):
            p.grad = g.to(dev)
            opt.step()
            if i == 0:
                st = opt.state[p]
                state_bytes[mu_dtype] = sum(t.numel() * t.element_size() for t in (st["exp_avg"], st["exp_avg_sq"]))
        assert opt.state[p]["exp_avg"].dtype == mu_dtype and opt.state[p]["exp_avg_sq"].dtype == torch.float32
        rnd = (lambda m: m.to(torch.bfloat16).double()) if mu_dtype == torch.bfloat16 else (lambda m: m)
        ref_p, ref_mu = _adamw_oracle(p0, grads, 1e-2, 0.9, 0.95, 1e-8, 0.1, rnd)
        torch.testing.assert_close(p.detach().cpu(), ref_p.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(opt.state[p]["exp_avg"].cpu().double(), ref_mu, rtol=1e-2, atol=1e-6)
    assert state_bytes[torch.float32] - state_bytes[torch.bfloat16] == 256 * 512 * 2
    # mu float32: torch.optim.AdamW's update (CPU).
    q, r = p0.clone().requires_grad_(), p0.clone().requires_grad_()
    oq, orr = AdamWMu([q], mu_dtype=torch.float32, **hp), torch.optim.AdamW([r], **hp)
    for g in grads:
        q.grad, r.grad = g.clone(), g.clone()
        oq.step()
        orr.step()
    torch.testing.assert_close(q, r)


def test_mu_dtype_bf16_lowers_the_peak_by_the_first_moment():
    """run(mu_dtype="bf16") on a Llama whose peak is in the backward (activations dominate): the
    peak drops by the first moment's 2 bytes per parameter element (it is alive through the step)."""
    raws = {m: _run("full", mu_dtype=m) for m in ("fp32", "bf16")}
    assert raws["bf16"]["mu_dtype"] == "bf16" and raws["fp32"]["mu_dtype"] == "fp32"
    saved = raws["fp32"]["hbm_peak_bytes"] - raws["bf16"]["hbm_peak_bytes"]
    # 2 bytes per element (the 1-D norm weights' moments occupy whole tiles either way: 0.2 % less)
    assert saved == pytest.approx(2 * raws["fp32"]["per_chip_params"], rel=0.005)


def test_mu_dtype_bad_input():
    """A mu_dtype other than fp32 / bf16 raises naming it, before any work (run, the CLI, AdamWMu)."""
    from torch_tpu.estimate.optim import AdamWMu

    spec = model_spec("llama-tiny", batch=_chips())
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="mu_dtype must be 'bf16' or 'fp32', got 'fp16'"):
        run(spec, Parallelism(fsdp=_chips()), mu_dtype="fp16", device=DEV)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(SystemExit) as e:
        cli_main(["--model", "llama-tiny", "--topology", "v6e-8", "--mu-dtype", "fp8"])
    assert e.value.code == 2
    with pytest.raises(ValueError, match="AdamWMu: mu_dtype must be a floating torch.dtype"):
        AdamWMu([torch.zeros(2, requires_grad=True)], mu_dtype=torch.int32)
    with pytest.raises(ValueError, match="AdamWMu: lr must be positive"):
        AdamWMu([torch.zeros(2, requires_grad=True)], lr=0.0)
