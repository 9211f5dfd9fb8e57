"""The Dynamo backend ``"tpu"``: AOTAutograd with core ATen decompositions, each
forward / backward / inference graph compiled by :mod:`.graph_compiler`."""

import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._decomp.decompositions import native_batch_norm_helper

from . import attention, device_interface, graph_compiler, routing, stats
from .dynamic import compile_bucketed
from .errors import passthrough
from .options import CompileOptions, effective, parse_compile_options
from .xla_executor import executor_setting

log = logging.getLogger("torch_tpu.compile")

_registered = False


def _decompositions():
    """Core ATen decompositions, plus: batch norm forward as reductions and
    elementwise work the IR lowers, var/var_mean in ATen ops;
    minus layer norm's backward (ATen's kernel runs)."""
    table = dict(core_aten_decompositions())
    aten = torch.ops.aten
    table.update(get_decompositions([
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    ]))
    # PyTorch's own no-training decomposition calls the mutating _native_batch_norm_legit,
    # which AOTAutograd rejects in an inference graph; this one is functional.
    table[aten._native_batch_norm_legit_no_training.default] = _batch_norm_no_training
    # Layer norm stays one ATen op forward and backward: its fused CPU kernels beat the
    # executor's reductions (a row mean, a row variance, a normalize pass) here.
    table.pop(aten.native_layer_norm_backward.default, None)
    # PyTorch's own var/var_mean decompositions go through prims; these stay in ATen ops the IR lowers
    table[aten.var_mean.correction] = _var_mean
    table[aten.var.correction] = _var
    # _foreach_* ops stay whole in the trace: the graph compiler splits them per tensor (foreach.expand)
    return table


def _batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return native_batch_norm_helper(input, weight, bias, running_mean, running_var, False, momentum, eps,
                                    functional=True)[:3]


def _reduced(x, dim):
    dims = list(range(x.dim())) if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else (
        [dim] if isinstance(dim, int) else list(dim))
    dims = [d % max(x.dim(), 1) for d in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    return dims, n


def _var_impl(x, dim, correction, keepdim):
    aten = torch.ops.aten
    dims, n = _reduced(x, dim)
    c = 1 if correction is None else correction
    mean_k = aten.mean.dim(x, dims, True)
    diff = aten.sub.Tensor(x, mean_k)
    var = aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(diff, diff), dims, keepdim), max(n - c, 0))
    return var, dims, mean_k


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    var, dims, mean_k = _var_impl(x, dim, correction, keepdim)
    mean = mean_k if keepdim else torch.ops.aten.mean.dim(x, dims, False)
    return var, mean


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_impl(x, dim, correction, keepdim)[0]


def _has_symbolic_inputs(example_inputs: Sequence) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in x.shape):
                return True
    return False


def _compile_graph(kind: str, opts: CompileOptions | None, source_graph: torch.fx.GraphModule):
    """The fw / bw / inference compiler for AOTAutograd."""

    def compiler(gm: torch.fx.GraphModule, example_inputs: list):
        return graph_compiler.compile_fx_graph(gm, example_inputs, kind, opts, source_graph)

    return compiler


def compile_static(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions | None = None) -> Callable:
    """Compile a Dynamo FX graph with static shapes: AOTAutograd (core ATen
    decompositions) splits it into forward and backward graphs, and each becomes a
    program of fused kernels and library calls on the tpu device.

    Args:
        gm: the graph Dynamo captured (torch-level ops).
        example_inputs: its example inputs (tensors with concrete shapes).
        options: what the compilation is told (``torch.compile``'s options and the
            ``custom_compiler_options`` in force, see :mod:`.options`); None: defaults.

    Returns:
        A callable taking the graph's inputs and returning its outputs.

    Raises:
        torch.OutOfMemoryError: a program's peak physical HBM bytes exceed the chip's capacity.
    """
    from torch._dynamo.backends.common import aot_autograd  # not at module level: importing Dynamo costs ~1.5 s

    backend = aot_autograd(
        fw_compiler=_compile_graph("forward", options, gm),
        bw_compiler=_compile_graph("backward", options, gm),
        inference_compiler=_compile_graph("inference", options, gm),
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,
    )
    return backend(gm, example_inputs)


# torch.compile's modes: the tpu backend has no CUDA graphs or autotuning, so each
# compiles the same program (a graph's program is already replayed without re-dispatch).
_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list, *, mode=None, options=None) -> Callable:
    """The ``"tpu"`` Dynamo backend (``torch.compile(model, backend="tpu")``).

    ``mode`` (one of ``default``, ``reduce-overhead``, ``max-autotune``,
    ``max-autotune-no-cudagraphs``) is accepted and compiles the same program. ``options``:
    ``num_dynamic_buckets``, ``bucket_size``, ``async_compile``, ``serializable``,
    ``debug_callback``, ``name`` (see :data:`torch_tpu.compile.options.COMPILE_OPTIONS` and
    docs/compile.md); the ``torch.tpu.compiler.custom_compiler_options`` in force when the
    graph is compiled apply too.

    Raises:
        ValueError: an unknown ``mode`` or option (naming it), or an option value out of range.
        TypeError: ``options`` not a dict, or an option value of the wrong type.

    Static graphs go through :func:`compile_static`. A graph with symbolic sizes
    (dynamic shapes) goes to :func:`torch_tpu.compile.dynamic.compile_bucketed`,
    which pads dynamic dimensions to buckets (or compiles exact shapes where padding
    cannot be made safe).
    """
    if mode is not None and mode not in _MODES:
        raise passthrough(ValueError, f"torch.compile(backend='tpu'): unknown mode {mode!r}; valid modes: "
                                      f"{', '.join(_MODES)}")
    opts = effective(parse_compile_options(options))
    stats.note_dynamo_events()
    if _has_symbolic_inputs(example_inputs):
        return compile_bucketed(gm, example_inputs, functools.partial(compile_static, options=opts),
                                buckets=opts.bucket_config())
    # static shapes: SDPA as one custom op each way (bucketing masks the composite's softmax instead);
    # not for XLA, which gets the composite in standard StableHLO ops rather than a custom call
    if executor_setting() == "tile":
        attention.route(gm)
    return compile_static(gm, example_inputs, opts)


def register() -> None:
    """Register the backend and the tpu device interface with Dynamo once
    ``torch._dynamo`` is imported (importing it here would add ~1.5 s to
    ``import torch``), at once if it already is; and Inductor's code generator for
    ``tpu`` (:func:`.routing.guard_inductor_codegen`) once Inductor's codegen is imported."""
    _after_import("torch._dynamo", _register_now, "torch.compile backend 'tpu' not registered")
    _after_import("torch._inductor.codegen.common", routing.guard_inductor_codegen,
                  "Inductor's code generator for tpu not replaced")


def _after_import(name: str, callback: Callable[[], None], failure: str) -> None:
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _ImportHook) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportHook(name, callback, failure))


class _ImportHook(importlib.abc.MetaPathFinder):
    """Runs ``callback`` right after module ``name`` finishes importing (logs ``failure`` and
    the error if it raises: a broken Dynamo or Inductor must not break their import)."""

    def __init__(self, name: str, callback: Callable[[], None], failure: str):
        self.name, self.callback, self.failure = name, callback, failure

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                self.callback()
            except Exception as e:  # noqa: BLE001
                log.warning("%s: %s", self.failure, e)

        spec.loader.exec_module = exec_then_register
        return spec


def _register_now() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from torch._dynamo import register_backend
    from torch._dynamo.backends import registry

    if "tpu" not in registry._COMPILER_FNS:
        register_backend(name="tpu")(tpu_backend)
    device_interface.register()
    routing.install(tpu_backend)
    try:
        stats.hook_recompile_reasons(tpu_backend)
    except Exception as e:  # noqa: BLE001 (a Dynamo without that function: no reasons, still compiles)
        log.debug("recompile reasons not recorded: %s", e)
