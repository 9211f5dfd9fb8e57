"""The environment chooses the slice and the chips a process sees (each case in a subprocess)."""

import pytest

VALID_GENERATIONS = "v4, v5e, v5p, v6e, tpu7x"

# Reports what the process sees, then proves an upload, a fill and a download work
# on its last chip (native ops only: the first fallback op of a process imports
# PyTorch's meta registrations, which costs seconds).
PROBE = """
    import json, torch
    tt = torch.tpu
    n = tt.device_count()
    props = [tt.get_device_properties(i) for i in range(n)]
    res = {
        "available": tt.is_available(), "count": n, "name": tt.get_device_name() if n else None,
        "generations": sorted({p.generation for p in props}), "global_ids": [p.global_id for p in props],
        "coords": [list(p.coords) for p in props], "hbm": [p.total_memory for p in props],
        "topology": tt.topology()["name"], "num_chips": tt.topology()["num_chips"],
        "num_hosts": tt.topology()["num_hosts"], "accel_count": torch.accelerator.device_count(),
    }
    if n:
        x = torch.arange(4.0).to(f"tpu:{n - 1}")
        x[1:3].fill_(7.0)
        res["last_chip"] = [str(x.device), x.cpu().tolist()]
        try:
            torch.empty(1, device=f"tpu:{n}")
        except IndexError as e:
            res["beyond"] = str(e)
    print(json.dumps(res))
"""


@pytest.mark.parametrize("var", ["TORCH_TPU_TOPOLOGY", "TPU_ACCELERATOR_TYPE"])
def test_v5p_16(run_python, var):
    out = run_python(PROBE, env={var: "v5p-16"}).json()
    # v5p-16 = 16 TensorCores = 8 chips (2x2x2) on 2 hosts of 4 chips; this process is host 0.
    assert out["count"] == 4 and out["accel_count"] == 4
    assert out["name"] == "TPU v5p" and out["generations"] == ["v5p"]
    assert out["topology"] == "v5p-16" and out["num_chips"] == 8 and out["num_hosts"] == 2
    assert out["global_ids"] == [0, 1, 2, 3]
    assert out["coords"] == [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]
    assert out["hbm"] == [95 * 2**30] * 4  # v5p: 95 GiB HBM per chip
    assert out["last_chip"] == ["tpu:3", [0.0, 7.0, 7.0, 3.0]]
    assert "tpu:4 is out of range" in out["beyond"] and "valid tpu:0..tpu:3" in out["beyond"]


def test_torch_tpu_topology_wins_over_accelerator_type(run_python):
    out = run_python(PROBE, env={"TORCH_TPU_TOPOLOGY": "v5e-4", "TPU_ACCELERATOR_TYPE": "v5p-16"}).json()
    assert out["topology"] == "v5e-4" and out["name"] == "TPU v5e" and out["count"] == 4


def test_tpu7x_name(run_python):
    out = run_python(PROBE, env={"TORCH_TPU_TOPOLOGY": "tpu7x-8"}).json()
    assert out["name"] == "TPU7x" and out["generations"] == ["tpu7x"] and out["count"] == 4


def test_visible_chips(run_python):
    out = run_python(PROBE, env={"TPU_VISIBLE_CHIPS": "2,3"}).json()
    assert out["count"] == 2 and out["accel_count"] == 2
    assert out["global_ids"] == [2, 3]          # tpu:0 is global chip 2
    assert out["coords"] == [[0, 1, 0], [1, 1, 0]]
    assert out["topology"] == "v6e-8" and out["name"] == "TPU v6e"
    assert out["last_chip"] == ["tpu:1", [0.0, 7.0, 7.0, 3.0]]
    assert "tpu:2 is out of range" in out["beyond"] and "valid tpu:0..tpu:1" in out["beyond"]


def test_visible_chips_empty_hides_all(run_python):
    out = run_python("""
        import json, torch
        res = {"available": torch.tpu.is_available(), "count": torch.tpu.device_count(),
               "cpu_ok": (torch.ones(2) * 2).tolist()}
        try:
            torch.empty(1, device="tpu")
        except IndexError as e:
            res["error"] = str(e)
        print(json.dumps(res))
    """, env={"TPU_VISIBLE_CHIPS": ""}).json()
    assert out["available"] is False and out["count"] == 0
    assert out["cpu_ok"] == [2.0, 2.0]
    assert "sees 0 chip(s)" in out["error"]


def test_unknown_topology(run_python):
    out = run_python("""
        import json, torch
        res = {"cpu_ok": (torch.arange(3.0) * 2).tolist(),   # import torch still works
               "available": torch.tpu.is_available(), "initialized": torch.tpu.is_initialized()}
        try:
            torch.empty(1, device="tpu")
        except Exception as e:
            res["empty"] = [type(e).__name__, str(e)]
        try:
            torch.tpu.device_count()
        except Exception as e:
            res["count"] = [type(e).__name__, str(e)]
        print(json.dumps(res))
    """, env={"TORCH_TPU_TOPOLOGY": "v9z-8"}).json()
    assert out["cpu_ok"] == [0.0, 2.0, 4.0]
    assert out["available"] is False and out["initialized"] is False
    kind, msg = out["empty"]
    assert kind == "ValueError"
    assert "TORCH_TPU_TOPOLOGY" in msg and "'v9z-8'" in msg
    assert f"valid generations: {VALID_GENERATIONS}" in msg
    assert "v6e-N" in msg  # the valid forms are listed too
    kind, msg = out["count"]
    assert "'v9z-8'" in msg and VALID_GENERATIONS in msg


def test_unknown_topology_init_raises_value_error(run_python):
    out = run_python("""
        import json, torch
        try:
            torch.tpu.init()
            res = None
        except Exception as e:
            res = [type(e).__name__, str(e)]
        print(json.dumps(res))
    """, env={"TPU_ACCELERATOR_TYPE": "v9z-8"}).json()
    assert out is not None
    kind, msg = out
    assert kind == "ValueError", kind
    assert "TPU_ACCELERATOR_TYPE" in msg and VALID_GENERATIONS in msg
    assert "Exception raised from" not in msg


SLICE_PROBE = """
    import json, torch
    res = {}
    try:
        topo = torch.tpu.topology()
        res = {k: topo[k] for k in ("num_slices", "slice", "host", "num_hosts", "num_chips")}
        res["global_ids"] = [torch.tpu.get_device_properties(i).global_id for i in range(torch.tpu.device_count())]
        res["hosts"] = sorted({torch.tpu.get_device_properties(i).host for i in range(torch.tpu.device_count())})
    except Exception as e:
        res["error"] = [type(e).__name__, str(e)]
    print(json.dumps(res))
"""


def test_slices_number_hosts_over_all_slices(run_python):
    """Two v5p-16 slices (2 hosts of 4 chips each): host 3 is the second host of slice 1, with
    that slice's chips 4..7."""
    out = run_python(SLICE_PROBE, env={"TORCH_TPU_TOPOLOGY": "v5p-16", "TORCH_TPU_SLICES": "2",
                                       "TORCH_TPU_HOST_ID": "3"}).json()
    assert out == {"num_slices": 2, "slice": 1, "host": 3, "num_hosts": 2, "num_chips": 8,
                   "global_ids": [4, 5, 6, 7], "hosts": [3]}
    out = run_python(SLICE_PROBE, env={"TORCH_TPU_TOPOLOGY": "v5p-16"}).json()
    assert out["num_slices"] == 1 and out["slice"] == 0 and out["global_ids"] == [0, 1, 2, 3]


@pytest.mark.parametrize("env,words", [
    ({"TORCH_TPU_SLICES": "0"}, ["TORCH_TPU_SLICES='0'", "positive integer"]),
    ({"TORCH_TPU_SLICES": "two"}, ["TORCH_TPU_SLICES='two'"]),
    ({"TORCH_TPU_SLICES": "2", "TORCH_TPU_HOST_ID": "2"}, ["TORCH_TPU_HOST_ID='2'", "x 2 slices", "valid: 0..1"]),
])
def test_bad_slices_raise_at_first_use(run_python, env, words):
    out = run_python(SLICE_PROBE, env=env).json()
    kind, msg = out["error"]
    assert kind == "ValueError" and all(w in msg for w in words), msg
