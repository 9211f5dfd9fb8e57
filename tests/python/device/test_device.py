"""torch.tpu device module, torch.accelerator, tensor/module helpers and backend autoload."""

import pytest
import torch

import torch_tpu
import torch_tpu._loader
import torch_tpu.api
from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8


def test_available_and_count():
    assert torch.tpu.is_available() is True
    assert torch.tpu.device_count() == 8
    assert torch.tpu.is_initialized() is True
    assert torch._utils._get_available_device_type() == "tpu"


def test_current_and_set_device():
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(3)
    assert torch.tpu.current_device() == 3
    assert torch.empty(2, device="tpu").device == torch.device("tpu", 3)
    torch.tpu.set_device("tpu:1")
    assert torch.tpu.current_device() == 1
    torch.tpu.set_device(torch.device("tpu", 2))
    assert torch.tpu.current_device() == 2


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="expected a tpu device"):
        torch.tpu.set_device("cpu")
    assert torch.tpu.current_device() == 0


def test_device_context_manager_restores():
    with torch.tpu.device(4):
        assert torch.tpu.current_device() == 4
        x = torch.arange(3.0, device="tpu")
        with torch.tpu.device("tpu:6"):
            assert torch.tpu.current_device() == 6
        assert torch.tpu.current_device() == 4
    assert torch.tpu.current_device() == 0
    assert x.device == torch.device("tpu", 4)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0]


def test_device_context_manager_restores_after_exception():
    with pytest.raises(KeyError):
        with torch.tpu.device(5):
            raise KeyError("x")
    assert torch.tpu.current_device() == 0


def test_device_name_and_properties():
    assert torch.tpu.get_device_name() == "TPU v6e"
    assert torch.tpu.get_device_name(7) == "TPU v6e"
    for i in range(8):
        p = torch.tpu.get_device_properties(i)
        assert p.name == "TPU v6e"
        assert p.generation == "v6e"
        assert p.total_memory == 32 * 2**30  # v6e: 32 GB HBM per chip
        assert p.global_id == i
        # v6e-8 is a 2x4 slice; chip ids run along x first.
        assert p.coords == (i % 2, i // 2, 0)
        assert p.topology == "v6e-8"
        assert p.host == 0
    assert torch.tpu.get_device_properties("tpu:3").coords == (1, 1, 0)
    assert torch.tpu.get_device_capability() == {"generation": "v6e"}
    topo = torch.tpu.topology()
    assert topo["name"] == "v6e-8"
    assert topo["shape"] == (2, 4, 1)
    assert topo["num_chips"] == 8 and topo["num_hosts"] == 1


def test_amp_supported_dtypes():
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.tpu.is_bf16_supported() is True


def test_autocast_matmul_matches_cpu():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = a @ b
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = a.tpu() @ b.tpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), expected)


def test_accelerator_api():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == 8
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(2)
    assert torch.tpu.current_device() == 2
    assert torch.accelerator.current_device_index() == 2
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("tpu", 2)
    assert s == torch.tpu.current_stream()
    torch.accelerator.set_device_index(0)


def test_accelerator_memory_matches_device_module():
    dev = 3
    torch.tpu.synchronize(dev)
    before = torch.accelerator.memory_allocated(dev)
    assert before == torch.tpu.memory_allocated(dev)
    x = torch.empty(3, 5, device=f"tpu:{dev}")
    assert torch.accelerator.memory_allocated(dev) - before == 4096
    assert torch.accelerator.memory_allocated(dev) == torch.tpu.memory_allocated(dev)
    assert torch.accelerator.max_memory_allocated(dev) == torch.tpu.max_memory_allocated(dev)
    assert torch.accelerator.memory_reserved(dev) == torch.tpu.memory_reserved(dev)
    stats = torch.accelerator.memory_stats(dev)
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated(dev)
    assert stats["requested_bytes.all.current"] == torch.tpu.memory_stats(dev)["logical_bytes.all.current"]
    del x


def test_accelerator_synchronize_waits(gate):
    x = torch.arange(4.0, device="tpu")
    y = gate(x)
    assert gate.log == []  # queued, not run
    gate.open_after(0.2)
    torch.accelerator.synchronize()
    assert gate.log == [True]
    assert y.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_tensor_and_module_helpers():
    c = torch.arange(6.0).reshape(2, 3)
    t = c.tpu()
    assert t.is_tpu and not c.is_tpu
    assert t.device == torch.device("tpu", 0)
    assert c.tpu(2).device == torch.device("tpu", 2)
    assert torch.equal(t.cpu(), c)
    m = torch.nn.Linear(3, 2)
    w = m.weight.detach().clone()
    assert m.tpu() is m
    assert m.weight.device == torch.device("tpu", 0) and m.bias.device == torch.device("tpu", 0)
    assert torch.equal(m.weight.detach().cpu(), w)
    storage = c.untyped_storage().tpu()
    assert storage.device == torch.device("tpu", 0) and storage.is_tpu


def test_loader_and_api_helpers():
    assert torch_tpu._loader.load() is torch_tpu
    assert torch_tpu._loader.load() is torch_tpu  # idempotent
    assert torch_tpu.api.tpu_device() == torch.device("tpu", 0)
    torch.tpu.set_device(3)
    assert torch_tpu.api.tpu_device() == torch.device("tpu", 3)
    torch.tpu.init()
    assert torch.tpu.is_initialized()


def test_import_torch_autoloads_backend(run_python):
    out = run_python("""
        import json, sys, torch
        x = torch.arange(3.0, device="tpu")
        print(json.dumps({"loaded": "torch_tpu" in sys.modules, "count": torch.tpu.device_count(),
                          "values": (x * 2).cpu().tolist(), "device": str(x.device)}))
    """).json()
    assert out == {"loaded": True, "count": 8, "values": [0.0, 2.0, 4.0], "device": "tpu:0"}


def test_autoload_disabled_by_env(run_python):
    out = run_python("""
        import json, sys, torch
        res = {"loaded": "torch_tpu" in sys.modules, "has_tpu": hasattr(torch, "tpu")}
        try:
            torch.empty(1, device="tpu")
            res["error"] = None
        except RuntimeError as e:
            res["error"] = str(e)
        import torch_tpu
        res["after_import"] = torch.ones(2, device="tpu").sum().item()
        print(json.dumps(res))
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}).json()
    assert out["loaded"] is False
    assert out["has_tpu"] is False
    assert out["error"] is not None and "tpu" in out["error"]
    assert out["after_import"] == 2.0
