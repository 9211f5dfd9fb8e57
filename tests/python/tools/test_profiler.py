"""torch.profiler on tpu: device time per op, device tracks in the exported trace,
record_function ranges, the HBM counter, trace directories, and no recording when idle.

Oracles are computed here from the generations' public figures (the same numbers
csrc/vtpu/spec.cc cites), not read back from the cost model: a bf16 matmul whose
dimensions are multiples of the MXU size takes max(2MKN / peak, bytes / bandwidth)
plus the 2 µs per-op launch overhead (csrc/vtpu/cost_model.h).
"""

import glob
import json
import os
import re

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

import torch_tpu
import torch_tpu.profiler as tpu_profiler
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

# Public figures: cloud.google.com/tpu/docs/v5p ("459 TFLOPs", "2765 GBps") and
# cloud.google.com/tpu/docs/v6e ("918 TFLOPs", "1638 GBps").
PEAK_BF16 = {"v5p": 459e12, "v6e": 918e12}
HBM_BANDWIDTH = {"v5p": 2765e9, "v6e": 1638e9}
LAUNCH_OVERHEAD_S = 2e-6

N = 1024  # multiple of both MXU sizes (128 on v5p, 256 on v6e): no padding
# A bf16 [1024, 1024] array fills (16, 128) tiles exactly: physical = logical bytes.
MATMUL_BYTES = 3 * N * N * 2  # two operands read, one result written
MATMUL_FLOPS = 2 * N**3

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def matmul_us(gen):
    """Estimated µs of a [N,N] @ [N,N] bf16 product on `gen` (roofline + launch)."""
    return (max(MATMUL_FLOPS / PEAK_BF16[gen], MATMUL_BYTES / HBM_BANDWIDTH[gen]) + LAUNCH_OVERHEAD_S) * 1e6


@pytest.fixture(autouse=True)
def _restore_generation():
    tpu_profiler.set_generation(None)
    yield
    tpu_profiler.set_generation(None)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(N, N), nn.ReLU(), nn.Linear(N, N)).to(torch.bfloat16)


def _rows(prof):
    return {e.key: e for e in prof.key_averages()}


def _load(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def _device_processes(events):
    """pid -> process name of the tpu chips' processes in a trace."""
    return {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and str(e["args"].get("name", "")).startswith("tpu:")
    }


def test_key_averages_device_time_is_the_cost_model_estimate():
    # v5p: the 1024^3 bf16 products are compute-bound there (4.7 µs of MXU vs 2.3 µs of HBM).
    tpu_profiler.set_generation("v5p")
    assert tpu_profiler.get_generation() == "v5p"
    model_cpu = _mlp()
    x_cpu = torch.randn(N, N, dtype=torch.bfloat16)
    w_cpu = torch.randn(N, N, dtype=torch.bfloat16)
    model = _mlp().to("tpu")
    x, w = x_cpu.to("tpu"), w_cpu.to("tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        y = model(x)
        z = torch.mm(x, w)
        torch.tpu.synchronize()
    # Same values as PyTorch on the CPU.
    torch.testing.assert_close(y.cpu(), model_cpu(x_cpu))
    torch.testing.assert_close(z.cpu(), torch.mm(x_cpu, w_cpu))

    rows = _rows(prof)
    expected = matmul_us("v5p")
    assert expected == pytest.approx(MATMUL_FLOPS / 459e12 * 1e6 + 2)  # compute-bound indeed
    # Two Linear layers: two addmm on the device, each its estimate (Kineto keeps ns).
    assert rows["aten::addmm"].self_device_time_total == pytest.approx(2 * expected, abs=2e-3)
    assert rows["aten::mm"].self_device_time_total == pytest.approx(expected, abs=1e-3)
    # The device rows of the same ops, and nothing for ops that move no data (views).
    assert rows["tpu::addmm"].count == 2
    assert rows["tpu::addmm"].self_device_time_total == pytest.approx(2 * expected, abs=2e-3)
    assert rows["aten::t"].self_device_time_total == 0
    assert rows["aten::relu"].self_device_time_total > 0

    # The CPU profile of the same model calls the same ATen ops as many times.
    with profile(activities=[ProfilerActivity.CPU]) as cpu_prof:
        model_cpu(x_cpu)
        torch.mm(x_cpu, w_cpu)
    cpu_rows = _rows(cpu_prof)
    for op in ("aten::linear", "aten::relu", "aten::mm"):
        assert rows[op].count >= cpu_rows[op].count, op  # tpu kernels may re-enter the op
    assert rows["aten::linear"].count == cpu_rows["aten::linear"].count
    # One device op per product the CPU computed.
    assert rows["tpu::addmm"].count == cpu_rows["aten::addmm"].count
    assert rows["tpu::mm"].count == cpu_rows["aten::mm"].count


def test_generation_changes_the_estimate():
    x = torch.randn(N, N, dtype=torch.bfloat16, device="tpu")
    times = {}
    for gen in ("v6e", "v5p"):
        tpu_profiler.set_generation(gen)
        with profile(activities=ACTIVITIES) as prof:
            torch.mm(x, x)
            torch.tpu.synchronize()
        times[gen] = _rows(prof)["aten::mm"].self_device_time_total
    # v6e: HBM-bound (3.8 µs of traffic vs 2.3 µs of MXU work).
    assert matmul_us("v6e") == pytest.approx(MATMUL_BYTES / 1638e9 * 1e6 + 2)
    assert times["v6e"] == pytest.approx(matmul_us("v6e"), abs=1e-3)
    assert times["v5p"] == pytest.approx(matmul_us("v5p"), abs=1e-3)


def test_trace_has_one_labelled_device_track_per_chip(tmp_path):
    tpu_profiler.set_generation("v5p")
    a = torch.randn(N, N, dtype=torch.bfloat16, device="tpu:0")
    b = torch.randn(N, N, dtype=torch.bfloat16, device="tpu:1")
    torch.tpu.synchronize(0)
    torch.tpu.synchronize(1)
    with profile(activities=ACTIVITIES) as prof:
        torch.mm(a, a)
        torch.mm(b, b)
        torch.tpu.synchronize(0)
        torch.tpu.synchronize(1)
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    events = _load(path)
    processes = _device_processes(events)
    assert sorted(processes.values()) == ["tpu:0 (estimated v5p time)", "tpu:1 (estimated v5p time)"]
    by_name = {name: pid for pid, name in processes.items()}
    kernels = [e for e in events if e.get("cat") == "kernel" and e["name"] == "tpu::mm"]
    assert sorted(e["pid"] for e in kernels) == sorted(by_name.values())
    for e in kernels:
        assert e["dur"] == pytest.approx(matmul_us("v5p"), abs=1e-3)
        assert e["args"]["estimated for"] == "v5p"
        assert e["args"]["flops"] == MATMUL_FLOPS
        assert e["args"]["HBM bytes"] == MATMUL_BYTES
        assert e["args"]["vTPU measured us"] > 0  # the host run, kept apart from the estimate
    # Each kernel is linked to the host op that issued it.
    host_mm = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"}
    assert {e["args"]["External id"] for e in kernels} <= host_mm


def test_record_function_range_spans_its_device_ops(tmp_path):
    tpu_profiler.set_generation("v5p")
    x = torch.randn(N, N, dtype=torch.bfloat16, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        with record_function("my_block"):
            y = torch.mm(x, x)
            y = torch.mm(y, x)
        torch.mm(x, y)  # outside the range
        torch.tpu.synchronize()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    events = _load(path)
    pid = {v: k for k, v in _device_processes(events).items()}["tpu:0 (estimated v5p time)"]
    ranges = [e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"] == "my_block"]
    assert len(ranges) == 1 and ranges[0]["pid"] == pid
    r = ranges[0]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e["pid"] == pid), key=lambda e: e["ts"])
    assert [k["name"] for k in kernels] == ["tpu::mm"] * 3
    inside, outside = kernels[:2], kernels[2]
    tol = 2e-3
    assert r["ts"] == pytest.approx(inside[0]["ts"], abs=tol)
    # It lasts the estimated time of the ops inside it (host gaps between them are not device time).
    assert r["dur"] == pytest.approx(inside[0]["dur"] + inside[1]["dur"], abs=tol)
    assert outside["ts"] >= r["ts"] + r["dur"] - tol
    # key_averages: the range's device time is its span on the device track.
    assert _rows(prof)["my_block"].device_time_total >= 2 * matmul_us("v5p") - tol


def test_hbm_counter_follows_memory_allocated(tmp_path):
    dev = 7  # no other test file uses tpu:7
    torch.tpu.synchronize(dev)
    points = [torch.tpu.memory_allocated(dev)]
    with profile(activities=ACTIVITIES) as prof:
        a = torch.empty(1 << 20, device=f"tpu:{dev}")
        points.append(torch.tpu.memory_allocated(dev))
        b = torch.empty(3, 5, device=f"tpu:{dev}")  # one 4 KiB tile
        points.append(torch.tpu.memory_allocated(dev))
        del a
        points.append(torch.tpu.memory_allocated(dev))
        del b
        points.append(torch.tpu.memory_allocated(dev))
    assert points[1] - points[0] == 4 << 20 and points[2] - points[1] == 4096
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    events = _load(path)
    pid = {v: k for k, v in _device_processes(events).items()}[f"tpu:{dev} (estimated v6e time)"]
    counter = [
        e["args"]["bytes"]
        for e in sorted((e for e in events if e.get("ph") == "C" and e["pid"] == pid), key=lambda e: e["ts"])
    ]
    assert counter == points


def test_trace_directory_layout(tmp_path):
    x = torch.randn(64, 64, device="tpu")
    with tpu_profiler.trace(str(tmp_path), worker_name="worker0", generation="tpu7x") as prof:
        (x @ x).relu().sum().item()
    assert tpu_profiler.get_generation() == "v6e"  # restored
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 1 and re.fullmatch(r"worker0\.\d+\.pt\.trace\.json", files[0]), files
    events = _load(glob.glob(str(tmp_path / "*.pt.trace.json"))[0])
    assert "tpu:0 (estimated tpu7x time)" in _device_processes(events).values()
    assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::mm" for e in events)
    assert _rows(prof)["aten::mm"].self_device_time_total > 0


def test_nothing_is_recorded_without_a_device_profiler():
    x = torch.randn(64, 64, device="tpu")
    assert not tpu_profiler.recorder_stats()["recording"]
    with profile(activities=ACTIVITIES):
        assert tpu_profiler.recorder_stats()["recording"]
        torch.mm(x, x)
        torch.tpu.synchronize()
    after = tpu_profiler.recorder_stats()
    assert not after["recording"] and after["ops"] == 1
    torch.mm(x, x).relu()
    torch.tpu.synchronize()
    assert tpu_profiler.recorder_stats() == after  # hooks off: nothing recorded
    # A CPU-only profiler starts no device session either.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(x, x)
        torch.tpu.synchronize()
    assert tpu_profiler.recorder_stats() == after
    assert all(e.device_type == torch.autograd.DeviceType.CPU for e in prof.events())


def test_generation_errors(monkeypatch):
    assert tpu_profiler.GENERATIONS == ("v4", "v5e", "v5p", "v6e", "tpu7x")
    with pytest.raises(ValueError, match=r"unknown TPU generation 'v9'.*v4, v5e, v5p, v6e, tpu7x"):
        tpu_profiler.set_generation("v9")
    with pytest.raises(TypeError):
        tpu_profiler.set_generation(5)
    with pytest.raises(ValueError):
        with tpu_profiler.trace("unused", generation="h100"):
            pass
    monkeypatch.setenv("TORCH_TPU_PROFILER_GENERATION", "v5e")
    assert tpu_profiler.get_generation() == "v5e"
    tpu_profiler.set_generation("v4")  # an explicit choice wins over the environment
    assert tpu_profiler.get_generation() == "v4"
    tpu_profiler.set_generation(None)
    monkeypatch.setenv("TORCH_TPU_PROFILER_GENERATION", "v7")
    with pytest.raises(ValueError, match="TORCH_TPU_PROFILER_GENERATION"):
        tpu_profiler.get_generation()


def test_collectives_have_their_own_track(tmp_path):
    # A collective as tpu_dist records it (here through the cost-model binding): 1 MiB over
    # 2 ICI links in 2 ring steps. v5p links: 1200 GB/s bidirectional per chip over 6 links
    # (cloud.google.com/tpu/docs/v5p) = 100 GB/s per link and direction; 1 µs per ring step
    # (the model's hop latency, csrc/vtpu/counters.h).
    tpu_profiler.set_generation("v5p")
    payload = 1 << 20
    with profile(activities=ACTIVITIES) as prof:
        torch_tpu._C._record_collective(1, payload, payload, 2, 2, 0)
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    events = _load(path)
    pid = {v: k for k, v in _device_processes(events).items()}["tpu:1 (estimated v5p time)"]
    tracks = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] == pid
    }
    coll = [e for e in events if e.get("cat") == "kernel" and e["pid"] == pid]
    assert len(coll) == 1 and tracks[coll[0]["tid"]] == "collectives (estimated ICI/DCN time)"
    assert coll[0]["name"] == "tpu_dist::collective"
    assert coll[0]["dur"] == pytest.approx((payload / (2 * 1200e9 / 6 / 2) + 2 * 1e-6) * 1e6, abs=1e-3)
    assert coll[0]["args"]["ICI bytes"] == payload


_DIST_SCRIPT = r"""
import json, sys, torch, torch.distributed as dist, torch_tpu
from torch.profiler import profile, ProfilerActivity
rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.tpu.set_device(rank)
dist.init_process_group("tpu_dist", init_method="file://" + store, rank=rank, world_size=2)
x = torch.ones(1 << 18, device=f"tpu:{rank}")
dist.all_reduce(x)
torch.tpu.synchronize()
torch_tpu.runtime.reset_stats(rank)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    dist.all_reduce(x)
    torch.tpu.synchronize()
prof.export_chrome_trace(out)
stats = torch_tpu.runtime.stats(rank)
print(json.dumps({"value": x[0].item(), "ici_us": stats["ici_seconds"] * 1e6, "collectives": stats["collectives"]}))
dist.destroy_process_group()
"""


def test_tpu_dist_all_reduce_in_each_ranks_trace(tmp_path):
    import subprocess
    import sys

    from helpers.dist import clean_env

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DIST_SCRIPT, str(r), str(tmp_path / "store"), str(tmp_path / f"rank{r}.json")],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    for r, (out, _) in enumerate(outs):
        result = json.loads(out.strip().splitlines()[-1])
        assert result["value"] == 4.0 and result["collectives"] == 1  # 1 -> 2 -> 4, as gloo would
        events = _load(str(tmp_path / f"rank{r}.json"))
        pid = {v: k for k, v in _device_processes(events).items()}[f"tpu:{r} (estimated v6e time)"]
        coll = [
            e for e in events if e.get("cat") == "kernel" and e["pid"] == pid and e["name"].startswith("tpu_dist::")
        ]
        assert [e["name"] for e in coll] == ["tpu_dist::all_reduce"]
        # The same estimate as the runtime's ICI counter (v6e, the topology's generation).
        assert coll[0]["dur"] == pytest.approx(result["ici_us"], abs=1e-3)


def test_record_function_range_device_time_is_the_estimate_of_its_ops():
    # A range around a forward/backward: its device time is the sum of the estimated times of the
    # device ops issued inside it, not the host wall time between the first and the last of them.
    tpu_profiler.set_generation("v5p")
    model = _mlp().to("tpu")
    x = torch.randn(N, N, dtype=torch.bfloat16, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        with record_function("step"):
            model(x).float().sum().backward()
            torch.tpu.synchronize()
    events = list(prof.events())
    device_ops = [
        e for e in events if e.device_type == torch.autograd.DeviceType.PrivateUse1 and not e.is_user_annotation
    ]
    ops_us = sum(e.self_device_time_total for e in device_ops)
    assert ops_us >= 6 * matmul_us("v5p") - 1e-2  # 2 forward, 4 backward products at least
    ranges = [
        e
        for e in events
        if e.is_user_annotation and e.name == "step" and e.device_type == torch.autograd.DeviceType.PrivateUse1
    ]
    assert len(ranges) == 1
    assert ranges[0].self_device_time_total == pytest.approx(ops_us, abs=1e-2)
    row = _rows(prof)["step"]
    assert row.self_device_time_total == pytest.approx(ops_us, abs=1e-2)
    assert row.device_time_total == pytest.approx(ops_us, abs=1e-2)
    # The table's percentages: the range's share of all device time is at most 100 %.
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=-1)
    line = next(ln for ln in table.splitlines() if ln.split() and ln.split()[0] == "step")
    percents = [float(p[:-1]) for p in line.split() if p.endswith("%")]
    assert percents and max(percents) <= 100.0 + 1e-6, line
