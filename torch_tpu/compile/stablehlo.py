"""A program description as StableHLO text (``TORCH_TPU_DUMP_IR``): one ``func.func`` per
fused region, a ``main`` calling them in order, library calls as ``stablehlo.custom_call``."""

import logging
import os
import re
from typing import Any

import torch

from .. import _C
from .description import library_ops, mlir_type, records_from_json, slots_in

log = logging.getLogger("torch_tpu.compile")

_RC = _C._compile


def to_stablehlo(desc: dict[str, Any], name: str = "program") -> str:
    """The program as StableHLO text: one func.func per fused region and a
    ``main`` that calls them in order, with library calls as
    ``stablehlo.custom_call @<ATen op>``."""
    lines = [f"// torch.compile(backend='tpu') {desc['kind']} program: {len(desc['steps'])} steps, "
             f"{sum(1 for s in desc['steps'] if s['kind'] == 'region')} fused regions, "
             f"{len(library_ops(desc))} library calls; peak {desc['input_bytes'] + desc['peak_intermediate_bytes']} "
             f"physical HBM bytes ({desc['input_bytes']} inputs)",
             f"module @{name} {{"]
    types: dict[int, str] = {}
    for i, t in enumerate(desc["input_types"]):
        types[i] = t
    body = []
    ridx = 0
    for st in desc["steps"]:
        if st["kind"] == "region":
            region = _RC.Region.from_records(records_from_json(st["records"]))
            fname = f"region_{ridx}"
            ridx += 1
            text = region.stablehlo(fname)
            lines.append("  // ATen ops: " + ", ".join(st["ops"]))
            lines += ["  " + ln for ln in text.splitlines()]
            out_types = []
            for s, (dt, shape) in zip(st["outputs"], st["types"]):
                types[s] = mlir_type(getattr(torch, dt), shape)
                out_types.append(types[s])
            ins = ", ".join(f"%{s}" for s in st["inputs"])
            in_t = ", ".join(types.get(s, "!torch.any") for s in st["inputs"])
            res = ", ".join(f"%{s}" for s in st["outputs"])
            body.append(f"    {res} = func.call @{fname}({ins}) : ({in_t}) -> ({', '.join(out_types)})")
            into = [(o, d) for o, d in zip(st["outputs"], st.get("into", ())) if d >= 0]
            if into:  # outputs written into graph inputs (their copy_ dropped)
                body.append("    // written in place: " + ", ".join(f"%{o} into %{d}" for o, d in into))
        elif st["kind"] == "copies":
            for (d, src), o in zip(st["pairs"], st["outputs"]):
                body.append(f"    %{o} = stablehlo.custom_call @\"aten::copy_.default\"(%{d}, %{src}) "
                            f"{{backend_config = \"batched\"}} : ({types.get(d, '!torch.any')}, "
                            f"{types.get(src, '!torch.any')}) -> !torch.any")
        elif st["kind"] == "getattr":
            body.append(f"    %{st['outputs'][0]} = \"torch.constant\"() {{name = \"{st['name']}\"}}"
                        " : () -> !torch.any")
        else:
            reads = slots_in(st["args"]) + slots_in(st["kwargs"])
            ins = ", ".join(f"%{s}" for s in reads)
            consts = _describe_args(st["args"]) + (" " + _describe_args(st["kwargs"]) if st["kwargs"].get("d") else "")
            op = "getitem" if st["kind"] == "getitem" else st["op"]
            out_t = st.get("type", "!torch.any")
            types[st["outputs"][0]] = out_t
            body.append(f"    %{st['outputs'][0]} = stablehlo.custom_call @\"{op}\"({ins}) "
                        f"{{backend_config = \"{consts}\"}} : ({', '.join(types.get(s, '!torch.any') for s in reads)})"
                        f" -> {out_t}")
    outs = slots_in(desc["outputs"])
    lines.append(f"  func.func @main({', '.join(f'%{i}: {t}' for i, t in enumerate(desc['input_types']))}) {{")
    lines += body
    lines.append(f"    return {', '.join(f'%{s}' for s in outs)}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _describe_args(enc) -> str:
    def fmt(a):
        if isinstance(a, dict):
            if "$" in a:
                return f"%{a['$']}"
            if "l" in a:
                return "[" + ", ".join(fmt(x) for x in a["l"]) + "]"
            if "d" in a:
                return "{" + ", ".join(f"{k}={fmt(v)}" for k, v in a["d"].items()) + "}"
            return next(iter(a.values()))
        return repr(a)

    return fmt(enc).replace('"', "'")


def module_name(key: str, kind: str, name: str | None = None) -> str:
    """The StableHLO module / dump file stem of a program: ``[<name>_]<kind>_<key[:16]>``
    (``name`` reduced to letters, digits and ``_``)."""
    stem = f"{kind}_{key[:16]}"
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{stem}" if name else stem


def dump_path(folder: str, key: str, kind: str, name: str | None = None) -> str:
    return os.path.join(folder, f"program_{module_name(key, kind, name)}.mlir")


def dump_program(folder: str, desc, key: str, kind: str, name: str | None = None, text: str | None = None) -> None:
    """Write the program as StableHLO text to :func:`dump_path` (``text``: already printed)."""
    try:
        os.makedirs(folder, exist_ok=True)
        path = dump_path(folder, key, kind, name)
        with open(path, "w") as f:
            f.write(text if text is not None else to_stablehlo(desc, module_name(key, kind, name)))
    except OSError as e:
        log.warning("TORCH_TPU_DUMP_IR / xla_dump_to: could not write %s: %s", folder, e)
