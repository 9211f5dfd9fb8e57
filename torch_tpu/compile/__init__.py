"""``torch.compile(model, backend="tpu")``: whole-graph compilation for the tpu device.

Importing :mod:`torch_tpu` registers the Dynamo backend ``"tpu"`` (also reachable
through the ``torch_dynamo_backends`` entry point) and a Dynamo device interface
for ``tpu``. Dynamo captures FX graphs, AOTAutograd turns them into forward and
backward graphs of core ATen ops, and the graph compiler (:mod:`.graph_compiler`)
turns each into a *program*: fused IR regions (compiled into tile kernels) and
library calls (ATen ops run on tpu tensors), queued on the chip's stream.

Public API:

* :func:`tpu_backend` -- the backend callable (``torch.compile(m, backend=tpu_backend)``
  equals ``backend="tpu"``).
* :func:`compile_static` -- the static-shape pipeline (AOTAutograd included);
  the seam used by :mod:`torch_tpu.compile.bucketing` for dynamic shapes.
* :func:`compile_stats` / :func:`reset_compile_stats` -- counters.
"""

from .backend import compile_static, register, tpu_backend
from .stats import compile_stats, reset_compile_stats

__all__ = ["tpu_backend", "compile_static", "compile_stats", "reset_compile_stats"]
