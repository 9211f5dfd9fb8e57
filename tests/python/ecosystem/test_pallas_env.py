"""torch.tpu.pallas and its environment: JAX stays unimported until used, a clear ImportError
without it, one JAX device per chip, and a clear error when JAX started first with fewer."""

import pytest

pytest.importorskip("jax")


def test_import_torch_and_torch_tpu_do_not_import_jax(run_python):
    r = run_python("""
        import json, sys
        import torch, torch_tpu
        import torch_tpu._internal
        x = torch.ones(2, device="tpu") + 1
        print(json.dumps({"jax": "jax" in sys.modules, "stats": torch_tpu.runtime.stats()["pallas_calls"]}))
    """)
    assert r.json() == {"jax": False, "stats": 0}


def test_without_jax_the_error_names_the_extra(run_python):
    r = run_python("""
        import json, sys
        sys.modules["jax"] = None  # as if not installed
        import torch, torch_tpu
        out = {}
        for what in ("attr", "import", "internal"):
            try:
                if what == "attr":
                    torch.tpu.pallas.jax_op
                elif what == "import":
                    import torch.tpu.pallas  # noqa: F401
                else:
                    from torch_tpu._internal import pallas  # noqa: F401
            except ImportError as e:
                out[what] = str(e)
        print(json.dumps(out))
    """)
    out = r.json()
    assert set(out) == {"attr", "import", "internal"}
    for msg in out.values():
        assert "torch.tpu.pallas needs JAX" in msg and "torch_tpu[pallas]" in msg


def test_one_jax_device_per_chip(run_python):
    r = run_python("""
        import json
        import torch
        import torch.tpu.pallas as tp
        import jax
        print(json.dumps([torch.tpu.device_count(), len(jax.devices()), jax.devices()[0].platform]))
    """)
    chips, devices, platform = r.json()
    assert devices == chips and platform == "cpu"


def test_jax_started_first_with_one_device_gives_a_clear_error(run_python):
    r = run_python("""
        import json
        import jax
        jax.devices()  # JAX starts with one CPU device
        import torch
        import torch.tpu.pallas as tp
        out = {}
        try:
            tp.get_pallas_mesh("x", (4,))
        except RuntimeError as e:
            out["mesh"] = str(e)
        out["one"] = tp.get_pallas_mesh("x", (1,)).devices.size  # what fits still works
        print(json.dumps(out))
    """)
    out = r.json()
    assert "needs 4 JAX devices" in out["mesh"] and "JAX was initialised before torch.tpu.pallas" in out["mesh"]
    assert out["one"] == 1
