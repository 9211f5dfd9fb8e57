"""Export: an FX graph or a ``torch.export.ExportedProgram`` as a StableHLO module (the program
``torch.compile(backend="tpu")`` would build, lowered as :mod:`torch_tpu.compile.stablehlo`
lowers it), serialized as text, MLIR bytecode or StableHLO's versioned portable artifact.

Serialization to bytecode / portable artifact needs jaxlib (the ``[pallas]`` extra); the text
does not. See docs/export.md (running an exported module with JAX on a TPU).
"""

from typing import Any

import torch

__all__ = ["StableHLOModule", "exported_to_mlir", "fx_to_mlir"]


class StableHLOModule:
    """A lowered program: ``@main(*inputs) -> results``.

    Attributes:
        input_names: one name per ``@main`` argument (placeholder names; for an ExportedProgram the
            parameters and buffers first, then the user inputs, as its graph signature orders them).
        custom_calls: (op, reason) of ops that stayed ``stablehlo.custom_call`` (XLA rejects them).
        lowered: the :class:`torch_tpu.compile.stablehlo.Lowered` (output structure, mutations).
    """

    def __init__(self, lowered, input_names: list[str]):
        self.lowered = lowered
        self.input_names = input_names
        self.custom_calls = list(lowered.custom_calls)

    def serialize_text(self) -> str:
        """The module as MLIR text (StableHLO, CHLO and func dialects)."""
        return self.lowered.text

    def _module(self):
        from torch_tpu.compile import xla

        return xla.parse(self.lowered.text)

    def serialize_bytecode(self) -> bytes:
        """The module as MLIR bytecode (needs jaxlib)."""
        from torch_tpu.compile import xla

        xla._jax()
        from jax._src.interpreters import mlir as jmlir

        return jmlir.module_to_bytecode(self._module())

    def serialize_portable_artifact(self, target_version: str | None = None) -> bytes:
        """The module as a StableHLO portable artifact (VHLO bytecode, readable by any StableHLO
        consumer of `target_version` or newer; default jaxlib's current StableHLO version).

        Raises:
            ValueError: the module holds a custom call or does not verify.
        """
        if self.custom_calls:
            raise ValueError("serialize_portable_artifact: the module holds custom calls for "
                             + ", ".join(c for c, _ in self.custom_calls))
        from torch_tpu.compile import xla

        j = xla._jax()
        sh = j["stablehlo"]
        target = target_version or sh.get_current_version()
        m = self._module()
        # CHLO ops (erf) have no VHLO form: kept as CHLO, which XLA and JAX read back
        return sh.serialize_portable_artifact(m, target, allow_other_dialects="chlo." in self.lowered.text)


def _to_tpu(a):
    return a.to("tpu") if isinstance(a, torch.Tensor) and a.device.type != "tpu" else a


def _lower_gm(gm: torch.fx.GraphModule, example_args: list, name: str) -> StableHLOModule:
    from torch_tpu.compile.builder import build_description
    from torch_tpu.compile.stablehlo import lower

    desc = build_description(gm, [_to_tpu(a) for a in example_args], "inference", objects=[])
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    low = lower(desc, name)
    return StableHLOModule(low, [names[i] for i in low.params])


def fx_to_mlir(gm: torch.fx.GraphModule, example_args, name: str = "exported") -> StableHLOModule:
    """`gm` (any FX graph of torch ops; traced to ATen with `example_args`) as StableHLO.

    Module parameters and buffers become ``@main`` arguments ahead of `example_args`
    (``input_names`` names them). Raises TypeError when `gm` is not a ``torch.nn.Module``.
    """
    if not isinstance(gm, torch.nn.Module):
        raise TypeError(f"fx_to_mlir: gm must be a torch.fx.GraphModule (or nn.Module), got {type(gm).__name__}")
    ep = torch.export.export(gm, tuple(example_args))
    return exported_to_mlir(ep, name)


def exported_to_mlir(ep: "torch.export.ExportedProgram", name: str = "exported") -> StableHLOModule:
    """`ep` (decomposed to core ATen first) as StableHLO; its parameters, buffers and
    constants are ``@main``'s leading arguments, in graph-signature order.

    Raises:
        TypeError: `ep` is not an ExportedProgram.
    """
    if not isinstance(ep, torch.export.ExportedProgram):
        raise TypeError(f"exported_to_mlir: expected a torch.export.ExportedProgram, got {type(ep).__name__}")
    ep = ep.run_decompositions()
    gm = ep.graph_module
    state: dict[str, Any] = {**ep.state_dict, **ep.constants}
    args = []
    for spec in ep.graph_signature.input_specs:
        if spec.target is not None:
            args.append(state[spec.target])
        else:
            args.append(None)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(ph):
        if args[i] is None:
            v = n.meta.get("val")
            args[i] = torch.zeros(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
    return _lower_gm(gm, args, name)
