"""``torch.tpu``: the tpu device module (mirrors ``torch.cuda`` where it makes sense, and
TorchTPU's ``torch.tpu`` names: ``EagerMode``, ``precision``, ...).

Each tpu device is one vTPU chip of this host. Memory figures are bytes; those
named ``physical`` count the TPU's tiled HBM layout (minor two dimensions
padded to (8,128) tiles for 32-bit types, (16,128) for 16-bit, (32,128) for
8-bit), ``logical`` the bytes tensors asked for.

This file is the namespace only: the names come from private modules (``_device``,
``_modes``), submodules resolve lazily from the table ``_SUBMODULES``, and the module object
is of a ``ModuleType`` subclass (``_namespace``) so that ``eager_mode`` and
``allow_excess_precision`` are properties. Public attributes are the names of ``__all__``,
the two properties and the submodules; the private ones are hooks PyTorch itself calls
(``_is_in_bad_fork``, ``_lazy_init``, ``_initialized``, ``_utils``), the private modules and
the table.
"""

from . import _utils  # noqa: F401  (torch.serialization calls torch.tpu._utils._get_device_index)
from ._device import (  # noqa: F401
    Event,
    Stream,
    _is_in_bad_fork,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    set_stream,
    stream,
    synchronize,
    topology,
    topology_aware_mesh,
)
from ._device import init as _lazy_init  # noqa: F401  (torch.cuda's name for init)
from ._modes import EagerMode, Precision, precision, set_eager_mode
from ._namespace import install as _install
from .memory import (  # noqa: F401
    empty_cache,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
)
from .random import (  # noqa: F401
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

# The submodules of torch.tpu, resolved at first use (``torch.tpu.compiler``, ``import
# torch.tpu.compiler``, ``from torch.tpu import compiler``): name -> (what it holds, why it
# is missing while it is). A missing one raises NotImplementedError naming it; it lands by
# adding torch_tpu/tpu/<name>.py, and this table needs no change then.
_SUBMODULES = {
    "memory": ("HBM memory statistics", None),
    "random": ("per-chip random number generators", None),
    "compiler": ("custom_compiler_options", None),
    "distributed": ("topology_aware_mesh over DCN slices, spmd_safe, set_tpu_launch_env", None),
    "profiler": ("TpuProfilerConfig, start_server, stop_server", None),
    "ops": ("TorchTPU's TPU-specific ops: ragged_dot, all_gather_dim, max_pool2d, ...", None),
    "optimizers": ("TorchTPU's optimizers: AdamW, Sgd, Muon, SingleTraceTrainer", None),
    "pallas": ("Pallas kernels: jax_op, get_pallas_mesh", None),
}

__all__ = [
    "EagerMode", "Event", "Precision", "Stream", "current_device", "current_stream", "default_generators",
    "default_stream", "device", "device_count", "device_of", "empty_cache", "get_amp_supported_dtype",
    "get_device_capability", "get_device_name", "get_device_properties", "get_rng_state", "get_rng_state_all",
    "host_memory_stats", "host_memory_stats_as_nested_dict", "init", "initial_seed", "is_available",
    "is_bf16_supported", "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "precision", "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "reset_peak_memory_stats",
    "seed", "seed_all", "set_device", "set_eager_mode", "set_rng_state", "set_rng_state_all", "set_stream",
    "stream", "synchronize", "topology", "topology_aware_mesh",
]

_install(__name__, _SUBMODULES)
del _install  # the namespace keeps public names, hooks, modules and the table only
