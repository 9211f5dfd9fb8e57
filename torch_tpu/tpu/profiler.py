"""``torch.tpu.profiler``: TorchTPU's profiler names (the implementation: :mod:`torch_tpu.profiler`).

- :class:`TpuProfilerConfig`: ``experimental_config`` of ``torch.profiler.profile`` (tracer
  levels, ``run_dir`` in the TensorBoard layout); see docs/profiler.md.
- :func:`start_server` / :func:`stop_server`: on-demand capture of this job by
  ``python -m torch_tpu.profiler capture --port P --duration-ms N --out DIR``.
"""

import sys as _sys

from ..profiler.config import TpuProfilerConfig
from ..profiler.server import start_server, stop_server

__all__ = ["TpuProfilerConfig", "start_server", "stop_server"]

# `torch.tpu` is this package under a second name (torch._register_device_module): without the
# alias, `import torch.tpu.profiler` would load this file again as a distinct module.
_sys.modules.setdefault("torch.tpu.profiler", _sys.modules[__name__])

del _sys
