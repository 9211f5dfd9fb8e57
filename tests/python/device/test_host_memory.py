"""Pinned host memory and every ``torch.accelerator`` entry point with tpu as the accelerator.

All of it runs in ONE fresh interpreter (a segfault there must fail these tests, not kill
pytest): the script below runs named steps in order, printing ``START name`` before each
and one JSON line of observed values at the end. Each test asserts one step's values; if
the child died, every test names the step it died in.

Oracle: the host allocator caches pinned blocks as CUDA's does (ATen's
CachingHostAllocator): a request is rounded up to a power of two, a freed block stays
cached (``allocations``/``allocated_bytes`` keep it, ``active_*`` drop it) until
``torch.accelerator.empty_host_cache()`` returns it to the system.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

SCRIPT = r"""
import json, sys, warnings
import torch

A = torch.accelerator
out = {}


def step(name):
    def wrap(fn):
        print("START " + name, flush=True)
        try:
            out[name] = fn()
        except Exception as e:  # an exception is a result (type, message), a crash is not
            out[name] = {"raised": type(e).__name__, "message": str(e).splitlines()[0][:300]}
        return fn
    return wrap


def host():
    s = torch.tpu.host_memory_stats()
    keys = ("allocations", "allocated_bytes", "active_requests", "active_bytes")
    d = {k: s[k + ".current"] for k in keys}
    d.update(num_host_alloc=s["num_host_alloc"], num_host_free=s["num_host_free"])
    return d


live = {}


@step("fresh")
def _():
    # Before any tpu work: nothing cached, and emptying an empty cache returns.
    A.empty_host_cache()
    return {"stats": host(), "keys": sorted(torch.tpu.host_memory_stats())}


@step("pin")
def _():
    a = torch.arange(1000, dtype=torch.float32).pin_memory()  # 4000 B -> a 4096 B block
    b = torch.empty(1250, pin_memory=True)                    # 5000 B -> 8192 B
    b.fill_(2.5)
    live.update(a=a, b=b)
    return {"a": a.is_pinned(), "b": b.is_pinned(), "view": a[10:].is_pinned(),
            "pageable": torch.ones(3).is_pinned(), "a_ok": bool(torch.equal(a, torch.arange(1000.0))),
            "stats": host()}


@step("upload_after_init")
def _():
    # The crash vLLM hit: emptying the host cache once tpu work has run.
    t = live["a"].to("tpu", non_blocking=True)
    u = live["b"].to("tpu")
    A.synchronize()
    A.empty_host_cache()  # a and b are live: nothing is freed
    return {"t": t.cpu().tolist() == list(range(1000)), "u": bool((u.cpu() == 2.5).all()),
            "device": str(t.device), "stats": host()}


@step("download")
def _():
    src = torch.arange(6.0, device="tpu") * 3
    dst = torch.empty(6, pin_memory=True)  # 24 B -> 32 B block
    dst.copy_(src, non_blocking=True)
    A.synchronize()
    live["dst"] = dst
    return {"values": dst.tolist(), "pinned": dst.is_pinned(), "stats": host()}


@step("free_caches")
def _():
    del live["a"], live["dst"]
    s1 = host()
    c = torch.empty(1000, pin_memory=True)  # 4096 B again: the cached block is reused
    s2 = host()
    del c
    return {"after_free": s1, "reuse": s2}


@step("empty_host_cache")
def _():
    before = host()
    A.empty_host_cache()
    mid = host()  # b (8192 B) is still live
    del live["b"]
    A.empty_host_cache()
    return {"before": before, "mid": mid, "after": host()}


@step("reset_stats")
def _():
    p = torch.empty(16, pin_memory=True)
    del p
    A.empty_host_cache()
    peak_before = torch.tpu.host_memory_stats()["allocated_bytes.peak"]
    torch.tpu.reset_peak_host_memory_stats()
    peak_after = torch.tpu.host_memory_stats()["allocated_bytes.peak"]
    torch.tpu.reset_accumulated_host_memory_stats()
    s = torch.tpu.host_memory_stats()
    return {"peak_before": peak_before, "peak_after": peak_after,
            "allocated": s["allocations.allocated"], "freed": s["allocations.freed"]}


@step("pin_memory_device_arg")
def _():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the device argument is deprecated in torch
        p = torch.ones(4).pin_memory(device="tpu")
        q = torch.ones(4).pin_memory()
        return {"pinned": p.is_pinned(), "is_pinned_tpu": q.is_pinned("tpu")}


@step("dataloader")
def _():
    from torch.utils.data import DataLoader, TensorDataset
    xs = torch.arange(8.0).reshape(4, 2)
    batches = list(DataLoader(TensorDataset(xs), batch_size=2, pin_memory=True))
    return {"pinned": [b[0].is_pinned() for b in batches],
            "values": [b[0].to("tpu", non_blocking=True).cpu().tolist() for b in batches]}


@step("device_memory")
def _():
    dev = torch.device("tpu", 0)
    x = torch.ones(1024, 1024, device=dev)
    A.synchronize()
    s = A.memory_stats(0)
    r = {"allocated": A.memory_allocated(0), "tpu_allocated": torch.tpu.memory_allocated(0),
         "max_allocated": A.max_memory_allocated(0), "reserved": A.memory_reserved(0),
         "max_reserved": A.max_memory_reserved(0), "stats_allocated": s["allocated_bytes.all.current"],
         "info": list(A.get_memory_info(0)), "tpu_info": list(torch.tpu.mem_get_info(0))}
    del x
    A.synchronize()
    A.empty_cache()
    r["reserved_after_empty"] = A.memory_reserved(0)
    A.reset_peak_memory_stats(0)
    r["max_allocated_after_reset"] = A.max_memory_allocated(0)
    A.reset_accumulated_memory_stats(0)
    return r


@step("device_control")
def _():
    r = {"count": A.device_count(), "available": A.is_available(),
         "accelerator": str(A.current_accelerator(check_available=True))}
    A.set_device_index(2)
    r["index_after_set"] = A.current_device_index()
    with A.device_index(1):
        r["inside"] = A.current_device_index()
    r["after"] = A.current_device_index()
    A.set_device_index(0)
    s = torch.Stream(device="tpu:0")
    A.set_stream(s)
    r["stream_set"] = A.current_stream(0) == s
    A.set_stream(A.current_stream(0))
    y = torch.ones(4, device="tpu") * 2
    A.synchronize(0)
    A.synchronize()
    r["after_sync"] = y.cpu().tolist()
    torch.tpu.set_stream(torch.tpu.default_stream(0))
    return r


@step("capability")
def _():
    return {"dtypes": sorted(str(d) for d in A.get_device_capability(0)["supported_dtypes"])}


@step("graph")
def _():
    return A.Graph()


@step("bad_inputs")
def _():
    r = {}
    for name, fn in [
        ("pin_tpu_tensor", lambda: torch.ones(3, device="tpu").pin_memory()),
        ("empty_tpu_pinned", lambda: torch.empty(3, device="tpu", pin_memory=True)),
        ("host_stats_arg", lambda: torch.tpu.host_memory_stats(0)),
    ]:
        try:
            fn()
            r[name] = None
        except Exception as e:
            r[name] = [type(e).__name__, str(e).splitlines()[0]]
    return r


@step("after_errors")
def _():
    A.empty_host_cache()
    return (torch.ones(3, device="tpu") + 1).cpu().tolist()


print(json.dumps(out, default=repr))
"""


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return env


@pytest.fixture(scope="module")
def child():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=_env(), capture_output=True, text=True, timeout=180)
    started = [line[6:] for line in proc.stdout.splitlines() if line.startswith("START ")]
    result = None
    if proc.returncode == 0 and proc.stdout.strip():
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc, started, result


def values(child, name):
    proc, started, result = child
    assert result is not None, (
        f"the child exited {proc.returncode} in step {started[-1] if started else None!r} "
        f"(-11 is a segfault); stderr:\n{proc.stderr[-3000:]}"
    )
    return result[name]


def stats(allocations, allocated_bytes, active_requests, active_bytes, num_host_alloc, num_host_free):
    return dict(
        allocations=allocations,
        allocated_bytes=allocated_bytes,
        active_requests=active_requests,
        active_bytes=active_bytes,
        num_host_alloc=num_host_alloc,
        num_host_free=num_host_free,
    )


def test_fresh_process_has_no_host_blocks_and_cuda_keys(child):
    r = values(child, "fresh")
    assert r["stats"] == stats(0, 0, 0, 0, 0, 0)
    for k in ("allocations", "allocated_bytes", "active_requests", "active_bytes"):
        for m in ("current", "peak", "allocated", "freed"):
            assert f"{k}.{m}" in r["keys"]
    for k in ("host_alloc_time", "host_free_time"):
        for m in ("total", "max", "min", "count", "avg"):
            assert f"{k}.{m}" in r["keys"]
    assert "num_host_alloc" in r["keys"] and "num_host_free" in r["keys"]


def test_pin_memory_and_empty_pin_memory_are_pinned_blocks(child):
    r = values(child, "pin")
    assert r["a"] and r["b"] and r["view"] and not r["pageable"] and r["a_ok"]
    assert r["stats"] == stats(2, 4096 + 8192, 2, 4096 + 8192, 2, 0)


def test_empty_host_cache_after_tpu_work_and_uploads(child):
    r = values(child, "upload_after_init")
    assert r == {"t": True, "u": True, "device": "tpu:0", "stats": stats(2, 4096 + 8192, 2, 4096 + 8192, 2, 0)}


def test_non_blocking_download_into_pinned(child):
    r = values(child, "download")
    assert r["values"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0] and r["pinned"]
    assert r["stats"] == stats(3, 4096 + 8192 + 32, 3, 4096 + 8192 + 32, 3, 0)


def test_freed_blocks_stay_cached_and_are_reused(child):
    r = values(child, "free_caches")
    assert r["after_free"] == stats(3, 4096 + 8192 + 32, 1, 8192, 3, 0)
    assert r["reuse"] == stats(3, 4096 + 8192 + 32, 2, 4096 + 8192, 3, 0)  # no new block


def test_empty_host_cache_frees_only_cached_blocks(child):
    r = values(child, "empty_host_cache")
    assert r["before"] == stats(3, 4096 + 8192 + 32, 1, 8192, 3, 0)
    assert r["mid"] == stats(1, 8192, 1, 8192, 3, 2)
    assert r["after"] == stats(0, 0, 0, 0, 3, 3)


def test_reset_host_memory_stats(child):
    r = values(child, "reset_stats")
    assert r["peak_before"] >= 4096 + 8192 + 32
    assert r["peak_after"] == 0  # nothing is held after empty_host_cache
    assert r["allocated"] == 0 and r["freed"] == 0


def test_pin_memory_device_argument_and_is_pinned_tpu(child):
    assert values(child, "pin_memory_device_arg") == {"pinned": True, "is_pinned_tpu": True}


def test_dataloader_pin_memory(child):
    r = values(child, "dataloader")
    assert r == {"pinned": [True, True], "values": [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]]]}


def test_accelerator_device_memory_matches_tpu_memory(child):
    r = values(child, "device_memory")
    mib4 = 4 * 2**20  # 1024x1024 f32 tiles exactly
    assert r["allocated"] == r["tpu_allocated"] == r["stats_allocated"] == mib4
    assert r["max_allocated"] >= mib4 and r["reserved"] >= mib4 and r["max_reserved"] >= r["reserved"]
    assert r["info"] == r["tpu_info"] and r["info"][1] > 0
    assert r["reserved_after_empty"] == 0
    assert r["max_allocated_after_reset"] == 0


def test_accelerator_device_and_stream_control(child):
    r = values(child, "device_control")
    assert r == {
        "count": torch.tpu.device_count(),
        "available": True,
        "accelerator": "tpu",
        "index_after_set": 2,
        "inside": 1,
        "after": 2,
        "stream_set": True,
        "after_sync": [2.0, 2.0, 2.0, 2.0],
    }


def test_accelerator_device_capability_lists_tpu_dtypes(child):
    dtypes = values(child, "capability")["dtypes"]
    for d in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int8, torch.bool, torch.float64):
        assert str(d) in dtypes


def test_accelerator_graph_raises_clearly(child):
    r = values(child, "graph")
    assert r["raised"] == "RuntimeError" and "tpu" in r["message"] and "Graph" in r["message"]


def test_bad_inputs_raise_clearly(child):
    r = values(child, "bad_inputs")
    assert r["pin_tpu_tensor"][0] == "RuntimeError" and "pin" in r["pin_tpu_tensor"][1]
    assert r["empty_tpu_pinned"][0] == "RuntimeError" and "pin_memory=True" in r["empty_tpu_pinned"][1]
    assert "tpu" in r["empty_tpu_pinned"][1]
    assert r["host_stats_arg"][0] == "TypeError" and "host_memory_stats" in r["host_stats_arg"][1]


def test_process_keeps_working_after_errors(child):
    assert values(child, "after_errors") == [2.0, 2.0, 2.0]
