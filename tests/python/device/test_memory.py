"""HBM accounting: physical bytes in the TPU's tiled layout, CUDA-style statistics, OOM.

Physical sizes (docs/design.md, "HBM"): the two minor dimensions are padded to tiles of
(8,128) for 32-bit types, (16,128) for 16-bit and (32,128) for 8-bit; 64-bit types
keep (8,128); rank-0/1 arrays fill 4 KiB tiles densely. Every tile is 4 KiB.

These tests own tpu:5 (see conftest.py) and assert absolute figures there.
"""

import re

import pytest
import torch

from helpers.devices import MEMORY_DEVICE, needs_v6e_8

pytestmark = needs_v6e_8

DEV = MEMORY_DEVICE
DEVICE = f"tpu:{DEV}"
KiB, MiB, GiB = 2**10, 2**20, 2**30


def allocated_delta(make):
    """Physical bytes that the tensor(s) built by `make` add to tpu:5."""
    torch.tpu.synchronize(DEV)
    before = torch.tpu.memory_allocated(DEV)
    t = make()
    torch.tpu.synchronize(DEV)
    delta = torch.tpu.memory_allocated(DEV) - before
    del t
    torch.tpu.synchronize(DEV)
    assert torch.tpu.memory_allocated(DEV) == before, "freeing the tensor did not return its bytes"
    return delta


# (shape, dtype, physical bytes) computed by hand from the tile rules.
PHYSICAL_TABLE = [
    ((3, 5), torch.float32, 4096),          # one (8,128) f32 tile
    ((8, 128), torch.float32, 4096),
    ((9, 128), torch.float32, 8192),        # 9 rows -> 16
    ((8, 129), torch.float32, 8192),        # 129 cols -> 256
    ((9, 129), torch.int32, 16384),         # 16 x 256 x 4
    ((16, 256), torch.float32, 16384),
    ((2, 3, 5), torch.float32, 8192),       # leading dims multiply whole tiles
    ((4, 8, 128), torch.float32, 16384),
    ((3, 5), torch.bfloat16, 4096),         # one (16,128) 16-bit tile
    ((8, 128), torch.bfloat16, 4096),
    ((16, 128), torch.bfloat16, 4096),
    ((17, 128), torch.bfloat16, 8192),
    ((4, 3, 5), torch.float16, 16384),
    ((3, 5), torch.int8, 4096),             # one (32,128) 8-bit tile
    ((32, 128), torch.int8, 4096),
    ((33, 128), torch.uint8, 8192),
    ((3, 5), torch.bool, 4096),
    ((3, 5), torch.float64, 8192),          # 64-bit keeps (8,128): 8 x 128 x 8
    ((), torch.float32, 4096),              # rank 0: one dense tile
    ((1,), torch.float32, 4096),
    ((1024,), torch.float32, 4096),         # rank 1: dense 4 KiB tiles
    ((1025,), torch.float32, 8192),
    ((2048,), torch.bfloat16, 4096),
    ((2049,), torch.bfloat16, 8192),
    ((4096,), torch.int8, 4096),
    ((4097,), torch.int8, 8192),
    ((1000,), torch.int64, 8192),
    ((0, 5), torch.float32, 0),
    ((0,), torch.float32, 0),
]


@pytest.mark.parametrize("shape,dtype,expected", PHYSICAL_TABLE,
                         ids=[f"{str(d).split('.')[1]}{list(s)}" for s, d, _ in PHYSICAL_TABLE])
def test_physical_bytes_of_empty(shape, dtype, expected):
    assert allocated_delta(lambda: torch.empty(shape, dtype=dtype, device=DEVICE)) == expected


@pytest.mark.parametrize("shape,dtype,expected", [((3, 5), torch.float32, 4096),
                                                  ((9, 129), torch.bfloat16, 8192),
                                                  ((1025,), torch.float32, 8192)])
def test_physical_bytes_of_computed_results(shape, dtype, expected):
    src = torch.ones(shape, dtype=dtype, device=DEVICE)
    # An op's result is allocated in the tiled layout too.
    assert allocated_delta(lambda: src * 2) == expected
    assert allocated_delta(lambda: torch.zeros(shape, dtype=dtype).to(DEVICE)) == expected


def test_logical_and_physical_keys():
    torch.tpu.synchronize(DEV)
    s0 = torch.tpu.memory_stats(DEV)
    x = torch.empty(3, 5, device=DEVICE)
    s1 = torch.tpu.memory_stats(DEV)
    assert s1["physical_bytes.all.current"] - s0["physical_bytes.all.current"] == 4096
    assert s1["allocated_bytes.all.current"] - s0["allocated_bytes.all.current"] == 4096
    assert s1["logical_bytes.all.current"] - s0["logical_bytes.all.current"] == 60
    assert s1["requested_bytes.all.current"] - s0["requested_bytes.all.current"] == 60
    assert s1["allocation.all.current"] - s0["allocation.all.current"] == 1
    assert s1["allocation.all.allocated"] - s0["allocation.all.allocated"] == 1
    del x
    s2 = torch.tpu.memory_stats(DEV)
    assert s2["allocation.all.freed"] - s0["allocation.all.freed"] == 1
    assert s2["logical_bytes.all.current"] == s0["logical_bytes.all.current"]


def test_memory_stats_cuda_key_names():
    s = torch.tpu.memory_stats(DEV)
    for key in ["allocated_bytes.all.current", "allocated_bytes.all.peak", "active_bytes.all.current",
                "active_bytes.all.peak", "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "requested_bytes.all.current", "requested_bytes.all.peak", "num_alloc_retries", "num_ooms",
                "physical_bytes.all.current", "physical_bytes.all.peak", "logical_bytes.all.current",
                "logical_bytes.all.peak", "capacity_bytes", "largest_free_block"]:
        assert key in s, key
        assert isinstance(s[key], int), key
    assert s["capacity_bytes"] == 32 * GiB
    assert s["allocated_bytes.all.current"] == torch.tpu.memory_allocated(DEV)
    assert s["reserved_bytes.all.current"] == torch.tpu.memory_reserved(DEV)
    assert s["allocated_bytes.all.peak"] == torch.tpu.max_memory_allocated(DEV)
    assert s["num_ooms"] == 0 and s["num_alloc_retries"] == 0
    assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]


def test_peak_and_reset():
    torch.tpu.synchronize(DEV)
    base = torch.tpu.memory_allocated(DEV)
    torch.tpu.reset_peak_memory_stats(DEV)
    assert torch.tpu.max_memory_allocated(DEV) == base
    a = torch.empty(256, 1024, device=DEVICE)  # 1 MiB, tile-aligned
    b = torch.empty(256, 1024, device=DEVICE)
    del a, b
    assert torch.tpu.memory_allocated(DEV) == base
    assert torch.tpu.max_memory_allocated(DEV) == base + 2 * MiB
    assert torch.tpu.memory_stats(DEV)["active_bytes.all.peak"] == base + 2 * MiB
    assert torch.tpu.memory_stats(DEV)["reserved_bytes.all.peak"] >= base + 2 * MiB
    torch.tpu.reset_peak_memory_stats(DEV)
    assert torch.tpu.max_memory_allocated(DEV) == base


def test_reserved_and_empty_cache():
    torch.tpu.synchronize(DEV)
    assert torch.tpu.memory_allocated(DEV) == 0, "tpu:5 must be free for this test (see conftest.py)"
    x = torch.empty(3 * MiB, dtype=torch.uint8, device=DEVICE)
    assert torch.tpu.memory_reserved(DEV) >= 3 * MiB
    del x
    assert torch.tpu.memory_allocated(DEV) == 0
    assert torch.tpu.memory_reserved(DEV) >= 3 * MiB  # cached, not returned
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved(DEV) == 0
    assert torch.tpu.mem_get_info(DEV) == (32 * GiB, 32 * GiB)
    assert torch.tpu.memory_stats(DEV)["largest_free_block"] == 32 * GiB
    # The cache serves the next allocation again.
    y = torch.full((1024,), 2.0, device=DEVICE)
    assert y.sum().item() == 2048.0
    assert torch.tpu.memory_allocated(DEV) == 4096


def test_memory_summary():
    torch.tpu.synchronize(DEV)
    assert torch.tpu.memory_allocated(DEV) == 0, "tpu:5 must be free for this test (see conftest.py)"
    x = torch.empty(256, 1024, device=DEVICE)  # 1 MiB physical, 1 MiB logical
    y = torch.empty(3, 5, device=DEVICE)       # 4 KiB physical, 60 B logical
    text = torch.tpu.memory_summary(DEV)
    assert text.startswith("tpu:5 HBM memory summary (capacity 32.00 GiB)")
    assert re.search(r"Allocated \(physical\)\s+1\.00 MiB", text), text
    assert re.search(r"Requested \(logical\)\s+1\.00 MiB", text), text
    assert "OOMs 0" in text
    del x, y


def test_resize_grows_accounting():
    torch.tpu.synchronize(DEV)
    before = torch.tpu.memory_allocated(DEV)
    x = torch.empty(0, device=DEVICE)
    x.resize_(2000)  # 8000 bytes -> two 4 KiB tiles
    assert torch.tpu.memory_allocated(DEV) - before == 8192
    del x
    assert torch.tpu.memory_allocated(DEV) == before


def test_out_of_memory_then_recover(run_python):
    out = run_python("""
        import json, torch
        MiB = 2**20
        res = {"capacity": torch.tpu.get_device_properties(0).total_memory}
        a = torch.full((40 * MiB,), 7, dtype=torch.uint8, device="tpu")
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="tpu")
        except torch.OutOfMemoryError as e:
            res["oom1"] = str(e)
        res["a_intact"] = [a[0].item(), a[-1].item(), a.sum().item()]
        # 16 MiB logical, but a [1, N] f32 array pads its rows to 8: 128 MiB physical.
        try:
            torch.empty(1, 4 * MiB, dtype=torch.float32, device="tpu")
        except torch.OutOfMemoryError as e:
            res["oom2"] = str(e)
        res["num_ooms"] = torch.tpu.memory_stats()["num_ooms"]
        del a
        b = torch.full((40 * MiB,), 3, dtype=torch.uint8, device="tpu")
        res["b_sum"] = b.sum().item()
        del b
        torch.tpu.empty_cache()
        c = torch.ones(4 * MiB, dtype=torch.float32, device="tpu")  # dense rank 1: 16 MiB
        res["c_sum"] = c.sum().item()
        res["allocated"] = torch.tpu.memory_allocated()
        print(json.dumps(res))
    """, env={"TORCH_TPU_HBM_BYTES": "64MiB"}).json()
    MiB_ = 2**20
    assert out["capacity"] == 64 * MiB_
    assert "tried to allocate 40.00 MiB" in out["oom1"]
    assert "capacity 64.00 MiB" in out["oom1"]
    assert "tpu:0" in out["oom1"]
    assert out["a_intact"] == [7, 7, 7 * 40 * MiB_]
    assert "tried to allocate 128.00 MiB" in out["oom2"] and "16.00 MiB logical" in out["oom2"]
    assert out["num_ooms"] == 2
    assert out["b_sum"] == 3 * 40 * MiB_
    assert out["c_sum"] == 4 * MiB_
    assert out["allocated"] == 16 * MiB_


@pytest.mark.parametrize(
    "make",
    [lambda d: torch.empty(-1, 2, device=d), lambda d: torch.empty_strided((-1, 2), (2, 1), device=d)],
    ids=["empty", "empty_strided"],
)
def test_a_negative_size_raises_naming_it_as_on_cpu(make):
    with pytest.raises(RuntimeError, match="negative dimension -1") as cpu:
        make("cpu")
    with pytest.raises(type(cpu.value), match="negative dimension -1.*\\[-1, 2\\]"):
        make("tpu")
