"""The torch.tpu namespace: public names only, lazily resolved submodules, NotImplementedError
for TorchTPU names not built yet, import aliases; device_of, is_bf16_supported, the private
paths other projects import (torch_tpu._internal), torch_tpu.__version__."""

import importlib
import importlib.machinery
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
TABLE = torch.tpu._SUBMODULES
# The table's submodules this build has not got (TorchTPU's, from sibling issues or branches
# not merged yet); they shrink as the work lands.
MISSING = sorted(n for n in TABLE
                 if importlib.machinery.PathFinder.find_spec(f"torch_tpu.tpu.{n}", torch_tpu.tpu.__path__) is None)


def _public(module) -> set[str]:
    return {n for n in vars(module) if not n.startswith("_")}


def test_torch_tpu_exposes_public_names_only():
    assert torch.tpu is torch_tpu.tpu and sys.modules["torch.tpu"] is torch.tpu
    public = _public(torch.tpu)
    assert public - set(TABLE) == set(torch.tpu.__all__)  # and the submodules imported so far:
    assert {"memory", "random"} <= public <= set(torch.tpu.__all__) | (set(TABLE) - set(MISSING))
    for n in ("os", "sys", "Any", "torch", "dataclass", "atexit", "contextlib", "annotations"):
        assert not hasattr(torch.tpu, n), n
    private = {n for n in vars(torch.tpu) if n.startswith("_") and not n.startswith("__")}
    assert private <= HOOKS | PRIVATE_MODULES | {"_SUBMODULES"}, private - HOOKS - PRIVATE_MODULES
    for hook in HOOKS:
        assert hasattr(torch.tpu, hook), hook
    assert torch.tpu._is_in_bad_fork() is False and torch.tpu._initialized is True
    assert torch.tpu._utils._get_device_index("tpu:3", True) == 3


@pytest.mark.parametrize("name", ["memory", "random"])
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
    names = set(dir(torch.tpu))
    assert {"eager_mode", "allow_excess_precision", "precision"} <= names
    assert names & set(TABLE) == set(TABLE) - set(MISSING)
    inspect.getmembers(torch.tpu)  # touches every listed name: none raises


def test_pallas_is_a_sibling_issue():
    if "pallas" not in MISSING:
        pytest.skip("torch.tpu.pallas has landed")
    with pytest.raises(NotImplementedError, match=r"torch\.tpu\.pallas \(.*\) is not available: .*not built yet"):
        torch.tpu.pallas  # noqa: B018


@pytest.mark.parametrize("name", MISSING)
def test_missing_torchtpu_submodules_raise_not_implemented(name):
    with pytest.raises(NotImplementedError, match=rf"torch\.tpu\.{name} \(.*\) is not available: "):
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


def _plant(tmp_path, name, body):
    """A module file ``name``.py in a folder the subprocess adds to torch_tpu.tpu.__path__."""
    (tmp_path / f"{name}.py").write_text(body)
    return f"import torch, torch_tpu; torch_tpu.tpu.__path__.append({str(tmp_path)!r})\n"


@pytest.mark.skipif(not MISSING, reason="every submodule of the table has landed")
def test_a_submodule_lands_without_a_table_change(tmp_path, run_python):
    """A file added under torch_tpu/tpu/ resolves through its table entry, which changes nothing."""
    name = MISSING[0]
    code = f"""
import sys
import torch, torch_tpu
try:
    torch.tpu.{name}
except NotImplementedError as e:
    print("missing:", str(e).split(" (")[0])
""" + _plant(tmp_path, name, "LANDED = True\n") + f"""
print("landed:", torch.tpu.{name}.LANDED, "{name}" in dir(torch.tpu))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert f"missing: torch.tpu.{name}" in r.stdout and "landed: True True" in r.stdout


def test_a_submodule_that_aliases_itself_loads_once(tmp_path, run_python):
    """``import torch.tpu.X`` first, for a module that also registers itself as torch.tpu.X
    (as torch.tpu.profiler and torch.tpu.distributed do): one module object, run once."""
    body = "import sys\nimport builtins\nbuiltins.RUNS = getattr(builtins, 'RUNS', 0) + 1\n" \
           "sys.modules.setdefault('torch.tpu.selfalias', sys.modules[__name__])\n"
    code = _plant(tmp_path, "selfalias", body) + """
import sys, builtins
import torch.tpu.selfalias as m
from torch.tpu import selfalias
print(m is selfalias is sys.modules["torch_tpu.tpu.selfalias"] is sys.modules["torch.tpu.selfalias"],
      builtins.RUNS, m.__spec__.name)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "1", "torch_tpu.tpu.selfalias"]


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
