"""torch_tpu: PyTorch on TPUs, running on the vTPU (a software model of a Cloud TPU chip).

``import torch_tpu`` (or just ``import torch`` once installed, through the
``torch.backends`` autoload entry point) makes ``torch.device("tpu")`` a real
PyTorch device. See README.md and docs/design.md.
"""


def _autoload():
    """Entry point of the ``torch.backends`` group: importing this module did the work.

    Defined before ``import torch``: when ``torch_tpu`` is imported first (``python -m
    torch_tpu.demo``), ``import torch`` runs the autoload entry point while this module is
    still partially initialised, and the entry point must already resolve.
    """


import torch  # noqa: E402

from . import _C
from . import runtime  # noqa: F401,E402

# Registers the PrivateUse1 hooks (once per process: a second registration
# raises) and builds the runtime. A bad environment (unknown TORCH_TPU_TOPOLOGY,
# bad TPU_VISIBLE_CHIPS, ...) must not break `import torch` through the
# autoload entry point: the runtime then stays unbuilt and the error is raised
# at the first use of a tpu device (the runtime retries its construction).
try:
    _C._init()
    _runtime_ready = True
except Exception:  # noqa: BLE001
    _runtime_ready = False
torch.utils.rename_privateuse1_backend("tpu")

from . import tpu as _tpu_module  # noqa: E402

_tpu_module._initialized = _runtime_ready

torch._register_device_module("tpu", _tpu_module)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)

from . import _queued_state  # noqa: E402

_queued_state.install()  # queued work keeps the default dtype, matmul precision, ... of its call

from .eager import eager_mode, get_eager_mode, set_eager_mode  # noqa: E402
from . import debug  # noqa: E402,F401  (defer_and_fuse counters)
from . import distributed  # noqa: E402,F401  (registers the tpu_dist backend)
from . import profiler  # noqa: E402,F401  (torch.profiler device tracks)
from .compile import compile_stats, reset_compile_stats  # noqa: E402  (torch.compile(backend="tpu"))
from .compile import async_compile, resolve_compilations  # noqa: E402
from .compile import register as _register_compile  # noqa: E402

try:
    _register_compile()
except Exception as _e:  # noqa: BLE001  (a broken Dynamo must not break `import torch`)
    import warnings as _warnings

    _warnings.warn(f"torch_tpu: torch.compile backend 'tpu' not registered: {_e}", stacklevel=2)

from . import ecosystem as _ecosystem  # noqa: E402

_ecosystem.install()  # flex_attention on tpu (torch_tpu/ecosystem/)

from ._version import __version__  # noqa: E402


__all__ = ["__version__", "eager_mode", "get_eager_mode", "set_eager_mode", "compile_stats",
           "reset_compile_stats", "async_compile", "resolve_compilations"]
