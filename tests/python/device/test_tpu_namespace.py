"""The torch.tpu namespace: public names only, lazily resolved submodules, NotImplementedError
for TorchTPU names not built yet, import aliases; device_of, is_bf16_supported, the private
paths other projects import (torch_tpu._internal), torch_tpu.__version__."""

import importlib
import inspect
import pickle
import sys
import types

import pytest
import torch

import torch_tpu

# Private names PyTorch itself reaches through the device module (torch.random's fork check,
# torch.serialization's _utils._get_device_index, torch.cuda-style _lazy_init/_initialized),
# the private modules and the submodule table.
HOOKS = {"_is_in_bad_fork", "_lazy_init", "_initialized", "_utils"}
PRIVATE_MODULES = {"_device", "_modes", "_namespace"}
SUBMODULES = {"memory", "random"}  # those this build has


def _public(module) -> set[str]:
    return {n for n in vars(module) if not n.startswith("_")}


def test_torch_tpu_exposes_public_names_only():
    assert torch.tpu is torch_tpu.tpu and sys.modules["torch.tpu"] is torch.tpu
    assert _public(torch.tpu) == set(torch.tpu.__all__) | SUBMODULES
    for n in ("os", "sys", "Any", "torch", "dataclass", "atexit", "contextlib", "annotations"):
        assert not hasattr(torch.tpu, n), n
    private = {n for n in vars(torch.tpu) if n.startswith("_") and not n.startswith("__")}
    assert private <= HOOKS | PRIVATE_MODULES | {"_SUBMODULES"}, private - HOOKS - PRIVATE_MODULES
    for hook in HOOKS:
        assert hasattr(torch.tpu, hook), hook
    assert torch.tpu._is_in_bad_fork() is False and torch.tpu._initialized is True
    assert torch.tpu._utils._get_device_index("tpu:3", True) == 3


@pytest.mark.parametrize("name", sorted(SUBMODULES))
def test_submodules_expose_public_names_only(name):
    module = getattr(torch.tpu, name)
    assert _public(module) == set(module.__all__), _public(module) - set(module.__all__)
    for n in module.__all__:
        assert callable(getattr(module, n)) or n == "default_generators"


def test_every_public_function_has_a_docstring_or_is_torch_cuda_s():
    undocumented = [n for n in torch.tpu.__all__
                    if callable(getattr(torch.tpu, n)) and not inspect.getdoc(getattr(torch.tpu, n))
                    and not hasattr(torch.cuda, n)]
    assert undocumented == []


def test_dir_lists_properties_and_present_submodules_only():
    names = dir(torch.tpu)
    assert {"eager_mode", "allow_excess_precision", "memory", "random", "precision"} <= set(names)
    assert not {"ops", "pallas", "optimizers"} & set(names)
    inspect.getmembers(torch.tpu)  # touches every listed name: none raises


@pytest.mark.parametrize("name", ["ops", "optimizers", "pallas"])
def test_torchtpu_submodules_of_sibling_issues_raise_not_implemented(name):
    with pytest.raises(NotImplementedError, match=rf"torch\.tpu\.{name} \(.*\) is not available: .*sibling issue"):
        getattr(torch.tpu, name)
    with pytest.raises(NotImplementedError, match=rf"torch\.tpu\.{name}"):
        importlib.import_module(f"torch.tpu.{name}")
    with pytest.raises(NotImplementedError, match=rf"torch\.tpu\.{name}"):
        exec(f"from torch.tpu import {name}", {})
    assert not hasattr(torch.tpu, name) and getattr(torch.tpu, name, None) is None  # probing code
    assert torch.tpu.device_count() > 0  # the process keeps working


def test_a_name_torchtpu_lacks_raises_attribute_error():
    with pytest.raises(AttributeError, match="module 'torch.tpu' has no attribute 'cudnn'"):
        torch.tpu.cudnn  # noqa: B018
    assert not hasattr(torch.tpu, "Scheduling")  # Inductor probes this through getattr(..., None)


def test_import_torch_tpu_submodule_is_the_same_module():
    import torch.tpu.memory as memory
    from torch.tpu import random

    assert memory is sys.modules["torch_tpu.tpu.memory"] is sys.modules["torch.tpu.memory"]
    assert random is torch_tpu.tpu.random
    assert importlib.import_module("torch.tpu.random") is random
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torch.tpu.no_such_module")


def test_lazy_submodule_lands_without_a_table_change(tmp_path, run_python):
    """A submodule file added under torch_tpu/tpu/ resolves through the same table entry."""
    code = """
import sys, types, importlib.util, importlib.machinery
import torch, torch_tpu
try:
    torch.tpu.profiler
except NotImplementedError as e:
    print("missing:", str(e)[:40])
# stand in for a landed torch_tpu/tpu/profiler.py
m = types.ModuleType("torch_tpu.tpu.profiler"); m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
m.TpuProfilerConfig = object
sys.modules["torch_tpu.tpu.profiler"] = m
print("landed:", torch.tpu.profiler.TpuProfilerConfig is object, "profiler" in dir(torch.tpu))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "missing: torch.tpu.profiler (TpuProfilerConfig" in r.stdout
    assert "landed: True True" in r.stdout


def test_the_module_type_survives_as_a_module():
    assert isinstance(torch.tpu, types.ModuleType)
    assert type(torch.tpu).__name__ == "TPUModule"
    with pytest.raises(TypeError):
        pickle.dumps(torch.tpu)  # like any module


def test_device_of_selects_the_tensor_device():
    x = torch.ones(2, device="tpu:2")
    assert torch.tpu.current_device() == 0
    with torch.tpu.device_of(x):
        assert torch.tpu.current_device() == 2
        y = torch.zeros(1, device="tpu")
    assert y.device == torch.device("tpu", 2)
    assert torch.tpu.current_device() == 0
    with torch.tpu.device_of(torch.ones(1)):  # a CPU tensor changes nothing
        assert torch.tpu.current_device() == 0
    with pytest.raises(TypeError, match=r"torch\.tpu\.device_of: obj must be a tensor"):
        torch.tpu.device_of(3)
    assert torch.tpu.current_device() == 0


def test_is_bf16_supported():
    assert torch.tpu.is_bf16_supported() is True
    assert torch.tpu.is_bf16_supported(including_emulation=False) is True


def test_event_and_stream_take_torch_cuda_s_arguments():
    e = torch.tpu.Event(enable_timing=True, external=False)
    assert isinstance(e, torch.Event)
    with pytest.raises(ValueError, match="external=True"):
        torch.tpu.Event(external=True)
    s = torch.tpu.Stream()
    same = torch.tpu.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
    assert same == s


def test_hardware_name_for_helion_and_version():
    from torch_tpu._internal.utils.hardware import get_tpu_device_name

    assert get_tpu_device_name() == torch.tpu.get_device_name() == "TPU v6e"
    assert isinstance(torch_tpu.__version__, str) and torch_tpu.__version__.count(".") == 2


def test_hardware_name_follows_the_topology(run_python):
    r = run_python("from torch_tpu._internal.utils.hardware import get_tpu_device_name as g; "
                   "import torch; print(g(), torch.tpu.get_device_name())", env={"TORCH_TPU_TOPOLOGY": "v5p-8"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["TPU", "v5p", "TPU", "v5p"], r.stdout


def test_lazy_init_is_init():
    torch.tpu._lazy_init()
    assert torch.tpu.is_initialized()


def test_import_order_torch_tpu_first_in_a_fresh_process(run_python):
    r = run_python("import torch_tpu.tpu as t, torch; print(type(torch.tpu).__name__, t.eager_mode.name)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["TPUModule", "DEFER_NEVER"]
