"""``torch.compile(model, backend="tpu")``: whole-graph compilation for the tpu device.

Importing :mod:`torch_tpu` registers the Dynamo backend ``"tpu"`` (also reachable
through the ``torch_dynamo_backends`` entry point) and a Dynamo device interface
for ``tpu``. Dynamo captures FX graphs, AOTAutograd turns them into forward and
backward graphs of core ATen ops, and the graph compiler (:mod:`.graph_compiler`)
turns each into a *program*: fused IR regions (compiled into tile kernels) and
library calls (ATen ops run on tpu tensors), queued on the chip's stream.

Modules, each importing only those above it:

* :mod:`.errors` -- exceptions Dynamo hands to the caller unwrapped;
* :mod:`.stats` -- the counters, and the Dynamo-event hooks that feed them;
* :mod:`.cache` -- program keys, the in-memory and disk caches;
* :mod:`.description` -- the plain-data program format the cache stores;
* :mod:`.lowering`, :mod:`.builder` -- FX nodes to IR, an FX graph to a description;
  :mod:`.program` -- the runtime of a description; :mod:`.stablehlo` -- its printer;
* :mod:`.dynamic` -- dynamic shapes padded to buckets (a package);
* :mod:`.options` -- ``torch.compile``'s ``options`` and ``torch.tpu.compiler.custom_compiler_options``;
* :mod:`.background` -- compiling on background threads (``async_compile``);
* :mod:`.graph_compiler` -- one AOTAutograd graph to a program, through the cache;
* :mod:`.routing` -- tpu graphs of the default / ``"inductor"`` backend sent to ``"tpu"``;
* :mod:`.backend` -- the Dynamo backend; :mod:`.device_interface` -- Dynamo's view of ``tpu``.

Public API:

* :func:`tpu_backend` -- the backend callable (``torch.compile(m, backend=tpu_backend)``
  equals ``backend="tpu"``).
* :func:`compile_static` -- the static-shape pipeline (AOTAutograd included);
  the seam used by :mod:`torch_tpu.compile.dynamic` for dynamic shapes.
* :func:`compile_stats` / :func:`reset_compile_stats` -- counters.
* :func:`async_compile` / :func:`resolve_compilations` -- compile shapes ahead, in the background.
"""

import sys

from . import dynamic
from .backend import compile_static, register, tpu_backend  # noqa: F401  (register: called by torch_tpu)
from .background import async_compile, resolve_compilations
from .stats import compile_stats, reset_compile_stats

# The dynamic-shape package's former name, which user code and older docs use.
bucketing = dynamic
sys.modules[__name__ + ".bucketing"] = dynamic

__all__ = ["tpu_backend", "compile_static", "compile_stats", "reset_compile_stats", "async_compile",
           "resolve_compilations"]
