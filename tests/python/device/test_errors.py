"""Bad input: each error is a PyTorch exception type with a clear message, and the
process stays usable afterwards (checked by computing something and comparing it
with CPU)."""

import re

import pytest
import torch

from helpers.devices import OOM_DEVICE, needs_v6e_8

pytestmark = needs_v6e_8

GiB = 2**30


def assert_usable(device="tpu:0"):
    a = torch.randn(6, 4)
    torch.testing.assert_close((a.to(device) @ a.t().to(device)).cpu(), a @ a.t())


@pytest.mark.parametrize("make", [
    lambda: torch.empty(3, device="tpu:99"),
    lambda: torch.zeros(2, 2, device=torch.device("tpu", 8)),
    lambda: torch.ones(3).to("tpu:99"),
    lambda: torch.ones(3).tpu(42),
], ids=["empty", "zeros", "to", "tensor.tpu"])
def test_device_index_out_of_range(make):
    with pytest.raises(IndexError, match=r"tpu:\d+ is out of range: this process sees 8 chip\(s\) "
                                         r"\(valid tpu:0\.\.tpu:7\)"):
        make()
    assert_usable("tpu:7")


@pytest.mark.parametrize("index", [8, 99])
def test_set_device_out_of_range(index):
    with pytest.raises((IndexError, RuntimeError), match=rf"tpu:{index} is out of range.*tpu:0\.\.tpu:7"):
        torch.tpu.set_device(index)
    assert torch.tpu.current_device() == 0
    with pytest.raises((IndexError, RuntimeError), match="out of range"):
        with torch.tpu.device(index):
            pass
    assert torch.tpu.current_device() == 0
    assert_usable()


def test_set_device_out_of_range_is_index_error_without_backtrace():
    with pytest.raises(IndexError) as info:
        torch.tpu.set_device(99)
    assert "Exception raised from" not in str(info.value)


def test_out_of_memory_names_request_and_capacity():
    dev = OOM_DEVICE
    before = torch.tpu.memory_stats(dev)["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(64 * GiB, dtype=torch.uint8, device=f"tpu:{dev}")
    msg = str(info.value)
    assert f"tpu:{dev}" in msg
    assert "tried to allocate 64.00 GiB" in msg
    assert "capacity 32.00 GiB" in msg
    assert "largest free block" in msg
    assert torch.tpu.memory_stats(dev)["num_ooms"] == before + 1
    # Physical bytes decide: f32[1, 2^31] is 8 GiB logical but 64 GiB in (8,128) tiles.
    with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate 64\.00 GiB.*8\.00 GiB logical"):
        torch.empty(1, 2**31, device=f"tpu:{dev}")
    x = torch.full((1000,), 2.0, device=f"tpu:{dev}")
    assert x.sum().item() == 2000.0
    assert_usable(f"tpu:{dev}")


@pytest.mark.parametrize("direction", ["cpu->tpu", "tpu->tpu", "tpu->cpu", "tpu0->tpu1"])
def test_copy_between_mismatched_shapes(direction):
    src_dev, dst_dev = {"cpu->tpu": ("cpu", "tpu"), "tpu->tpu": ("tpu", "tpu"), "tpu->cpu": ("tpu", "cpu"),
                        "tpu0->tpu1": ("tpu:0", "tpu:1")}[direction]
    dst = torch.arange(3.0).to(dst_dev)
    src = torch.ones(4).to(src_dev)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.arange(3.0).copy_(torch.ones(4))
    with pytest.raises(RuntimeError) as error:
        dst.copy_(src)
    assert str(error.value) == str(cpu_error.value)  # CPU's message: the size of tensor a (3) must match ...
    assert dst.cpu().tolist() == [0.0, 1.0, 2.0]  # untouched
    with pytest.raises(RuntimeError):
        torch.empty(2, 3).to(dst_dev).copy_(torch.ones(3, 2).to(src_dev))
    assert_usable()


@pytest.mark.parametrize("op", ["add", "mul_", "copysign", "cat", "mm", "where", "index_select", "stack"])
def test_mixing_chips_raises(op):
    a = torch.ones(3, 3, device="tpu:0")
    b = torch.ones(3, 3, device="tpu:1")
    fn = {
        "add": lambda: a + b,
        "mul_": lambda: a.mul_(b),
        "cat": lambda: torch.cat([a, b]),
        "mm": lambda: a @ b,
        "where": lambda: torch.where(a > 0, a, b),
        "index_select": lambda: torch.index_select(a, 0, torch.tensor([0], device="tpu:1")),
        "stack": lambda: torch.stack([a, b]),
        "copysign": lambda: torch.copysign(a, b),
    }[op]
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    assert "tpu:0" in msg and "tpu:1" in msg, msg
    assert a.cpu().tolist() == [[1.0] * 3] * 3  # in-place op did not write
    assert_usable("tpu:0")
    assert_usable("tpu:1")


@pytest.mark.parametrize("op", ["add", "add_", "cat", "mm", "where", "maximum"])
def test_mixing_tpu_with_cpu_tensor_raises(op):
    a = torch.ones(2, 3, device="tpu")
    c = torch.ones(2, 3)
    fn = {
        "add": lambda: a + c,
        "add_": lambda: a.add_(c),
        "cat": lambda: torch.cat([a, c]),
        "mm": lambda: a @ c.t(),
        "where": lambda: torch.where(a > 0, a, c),
        "maximum": lambda: torch.maximum(c, a),
    }[op]
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    assert "tpu" in msg and "cpu" in msg, msg
    assert a.cpu().tolist() == [[1.0] * 3] * 2
    assert_usable()


def test_cpu_scalar_tensor_mixes_with_tpu():
    a = torch.arange(6.0).reshape(2, 3)
    s = torch.tensor(2.5)  # 0-dim host tensors act as scalars, as with CUDA
    for got, expected in [((a.tpu() * s).cpu(), a * s), ((s - a.tpu()).cpu(), s - a),
                          (torch.where(a.tpu() > 2, a.tpu(), s).cpu(), torch.where(a > 2, a, s))]:
        assert torch.equal(got, expected)


def test_index_with_cpu_index_tensor():
    a = torch.arange(12.0).reshape(4, 3)
    idx = torch.tensor([3, 0, 3])
    assert torch.equal(a.tpu()[idx].cpu(), a[idx])


def test_load_checkpoint_from_missing_chip(run_python, tmp_path):
    path = tmp_path / "ckpt_tpu7.pt"
    torch.save({"w": torch.arange(6.0).to("tpu:7")}, path)
    out = run_python(f"""
        import json, torch
        res = {{"count": torch.tpu.device_count()}}
        try:
            torch.load({str(path)!r})
            res["error"] = None
        except RuntimeError as e:
            res["error"] = str(e)
        w = torch.load({str(path)!r}, map_location="tpu:3")["w"]
        res["mapped"] = [str(w.device), (w * 2).cpu().tolist()]
        res["cpu"] = torch.load({str(path)!r}, map_location="cpu")["w"].tolist()
        print(json.dumps(res))
    """, env={"TORCH_TPU_TOPOLOGY": "v6e-4"}).json()
    assert out["count"] == 4
    assert out["error"] is not None
    assert re.search(r"TPU device 7 but torch\.tpu\.device_count\(\) is 4", out["error"]), out["error"]
    assert "map_location" in out["error"]
    assert out["mapped"] == ["tpu:3", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]]
    assert out["cpu"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_wrong_device_type_arguments():
    with pytest.raises(ValueError, match="expected a tpu device"):
        torch.tpu.synchronize("cpu")
    with pytest.raises(ValueError, match="expected a tpu device"):
        torch.tpu.memory_allocated(torch.device("cpu"))
    with pytest.raises(ValueError):
        torch.tpu.get_device_properties(1.5)


def test_sparse_layout_not_supported():
    with pytest.raises(NotImplementedError):
        torch.empty(2, 2, device="tpu", layout=torch.sparse_coo)
    assert_usable()
