"""``torch.compile`` without ``backend=`` (or with ``backend="inductor"``) on tpu tensors.

PyTorch 2.13 hands the device name ``"tpu"`` to Inductor's Pallas code generator, which needs
JAX and cannot run here. Registering an Inductor *scheduling* for ``"tpu"`` first would not
help: Inductor would still lower the graph with its own decompositions and ask that scheduling
for kernels, a second compiler to write. So the decision is taken one level up, per graph, from
the devices it holds: :func:`install` wraps the two entry points of the Inductor backend,

* ``torch._TorchCompileInductorWrapper`` (what ``torch.compile`` builds for its default backend
  and for ``backend="inductor"``): its ``options`` are split into the tpu backend's keys
  (:data:`.options.COMPILE_OPTIONS`, checked at ``torch.compile`` time) and Inductor's (checked
  by Inductor as before);
* the Dynamo registry's ``"inductor"`` entry (``torch._dynamo.optimize("inductor")``).

A graph with any tpu tensor (an input, or a value it creates) goes to the tpu backend, CPU
parts included (they run as library calls on the CPU); a graph without one (CPU only, CUDA,
...) goes to Inductor unchanged. Counted in ``compile_stats()``: ``routed_from_inductor``,
``left_to_inductor``; Inductor options of a routed graph in ``ignored_compiler_options``.

Paths that reach Inductor's code generation for ``tpu`` some other way
(``torch._inductor.compile_fx`` called directly, AOTInductor) meet
:func:`guard_inductor_codegen`'s scheduling instead of Pallas: an error naming ``backend="tpu"``.
"""

import logging
from collections.abc import Callable

import torch

from . import stats
from .options import COMPILE_OPTIONS, parse_compile_options

log = logging.getLogger("torch_tpu.compile")


def _holds_tpu(v) -> bool:
    if isinstance(v, torch.Tensor):
        return v.device.type == "tpu"
    if isinstance(v, (list, tuple)):
        return any(_holds_tpu(x) for x in v)
    return False


def on_tpu(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether the graph holds a tpu tensor: an example input, or the example value Dynamo
    recorded for one of its nodes (``torch.ones(3, device="tpu")`` inside the graph)."""
    if any(_holds_tpu(x) for x in example_inputs):
        return True
    return any(_holds_tpu(n.meta.get("example_value", n.meta.get("val"))) for n in gm.graph.nodes)


def install(tpu_backend: Callable) -> None:
    """Route tpu graphs of the Inductor backend to ``tpu_backend`` (once; after Dynamo is imported)."""
    _wrap_torch_compile_wrapper(tpu_backend)
    _wrap_registry_entry(tpu_backend)


def _route(tpu_backend, gm, example_inputs, options: dict, inductor_options) -> Callable:
    stats.add("routed_from_inductor")
    for k in inductor_options:
        stats.note_ignored_option(k, "an Inductor option; this graph holds tpu tensors and is compiled by the "
                                     "tpu backend")
    log.info("torch.compile: graph on tpu, compiled by backend 'tpu' instead of Inductor")
    return tpu_backend(gm, example_inputs, options=options or None)


def _wrap_torch_compile_wrapper(tpu_backend: Callable) -> None:
    cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if cls is None or getattr(cls, "_torch_tpu_routed", False):
        return
    orig_init, orig_call, orig_eq = cls.__init__, cls.__call__, cls.__eq__

    def __init__(self, mode, options, dynamic, name=None):
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"torch.compile: options must be a dict, got {type(options).__name__}")
        ours = {k: v for k, v in (options or {}).items() if k in COMPILE_OPTIONS}
        theirs = {k: v for k, v in (options or {}).items() if k not in COMPILE_OPTIONS}
        parse_compile_options(ours, "torch.compile")  # bad values fail here, not at the first call
        self._torch_tpu_options = ours
        self._torch_tpu_inductor_options = sorted(theirs)
        orig_init(self, mode, theirs or None, dynamic, name)

    def __call__(self, model_, inputs_, *, config_patches=None):
        if on_tpu(model_, inputs_):
            self._torch_tpu_routed_graphs = True  # Dynamo's recompile reasons for it are recorded
            opts = dict(getattr(self, "_torch_tpu_options", {}))
            if self.name and "name" not in opts:
                opts["name"] = self.name
            return _route(tpu_backend, model_, inputs_, opts, getattr(self, "_torch_tpu_inductor_options", ()))
        stats.add("left_to_inductor")
        return orig_call(self, model_, inputs_, config_patches=config_patches)

    def __eq__(self, other):
        return orig_eq(self, other) and (getattr(self, "_torch_tpu_options", None)
                                         == getattr(other, "_torch_tpu_options", None))

    cls.__init__, cls.__call__, cls.__eq__ = __init__, __call__, __eq__
    cls._torch_tpu_routed = True


def _wrap_registry_entry(tpu_backend: Callable) -> None:
    from torch._dynamo.backends import inductor as _inductor_backend  # noqa: F401  (registers "inductor")
    from torch._dynamo.backends import registry

    orig = registry._COMPILER_FNS.get("inductor")
    if orig is None or getattr(orig, "_torch_tpu_routed", False):
        return

    def inductor(gm, example_inputs, **kwargs):
        if on_tpu(gm, example_inputs):
            options = kwargs.get("options") or {}
            ours = {k: v for k, v in options.items() if k in COMPILE_OPTIONS}
            return _route(tpu_backend, gm, example_inputs, ours, sorted(k for k in options if k not in ours))
        stats.add("left_to_inductor")
        return orig(gm, example_inputs, **kwargs)

    inductor._tags = getattr(orig, "_tags", ())
    inductor._torch_tpu_routed = True
    inductor.__doc__ = orig.__doc__
    registry._COMPILER_FNS["inductor"] = inductor


INDUCTOR_TPU_ERROR = ("Inductor cannot generate code for tpu tensors in torch_tpu (its tpu code generator is "
                      "Pallas, which needs JAX and a real TPU); compile with torch.compile(model, backend='tpu') "
                      "-- torch.compile without backend= and backend='inductor' send tpu graphs there already")


class _NoInductorForTpu:
    """Inductor's scheduling and wrapper codegen for tpu: building either raises."""

    supports_caching = False  # read off the wrapper class before any is built

    def __init__(self, *args, **kwargs):
        raise RuntimeError(INDUCTOR_TPU_ERROR)

    @classmethod
    def create(cls, *args, **kwargs):
        raise RuntimeError(INDUCTOR_TPU_ERROR)


def guard_inductor_codegen() -> None:
    """Register, for device ``tpu``, an Inductor scheduling and wrapper whose construction raises
    :data:`INDUCTOR_TPU_ERROR` (Inductor registers its Pallas one only where none is registered)."""
    from torch._inductor.codegen.common import register_backend_for_device

    register_backend_for_device("tpu", _NoInductorForTpu, _NoInductorForTpu)
