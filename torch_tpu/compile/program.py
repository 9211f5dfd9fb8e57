"""The compiled-program runtime: a program description instantiated (compiled regions,
resolved ops) and run step by step over its slots; and the check of its peak HBM bytes
against the chip's capacity."""

from typing import Any

import torch
import torch.fx

from .. import _C
from . import host_scalars, stats
from .description import decode, object_table, records_from_json, resolve_op, step_reads
from .errors import passthrough

_RC = _C._compile


class Program:
    """A program description instantiated: compiled regions and resolved ops.

    Calling it (boxed: one list of inputs, which it empties) runs the steps and
    returns the graph's outputs as a list.
    """

    _boxed_call = True

    def __init__(self, desc: dict[str, Any], gm: torch.fx.GraphModule | None = None, name: str = "program"):
        self.desc = desc
        self.name = name
        self.regions = []
        self.num_kernels = 0
        runners = []
        with object_table(desc.get("_objects")):
            for i, st in enumerate(desc["steps"]):
                runners.append(self._make_step(i, st, gm))
            self._out, _ = decode(desc["outputs"])
        frees = desc["free_after"]
        self._plan = [(run, tuple(frees[i])) for i, run in enumerate(runners)]
        self._num_slots = desc["num_slots"]
        self._num_inputs = desc["num_inputs"]

    def _make_step(self, i, st, gm):
        outs = st["outputs"]
        if st["kind"] == "region":
            region = _RC.Region.from_records(records_from_json(st["records"]))
            region.compile()
            self.regions.append(region)
            self.num_kernels += region.num_kernels
            ins = tuple(st["inputs"])
            dev = st["device"]
            label = f"{self.name} region {len(self.regions) - 1} ({len(st['ops'])} ATen ops)"
            strides = st.get("strides") or []
            into = tuple(st.get("into") or ())
            aliases = tuple(tuple(a) for a in st.get("aliases") or ())
            if not into:
                def run_region(env, region=region, ins=ins, outs=outs, dev=dev, label=label, strides=strides):
                    res = region.run([env[s] for s in ins], dev, label, strides)
                    for s, t in zip(outs, res):
                        env[s] = t

                return run_region

            # outputs written into graph inputs (their copy_ removed), see builder._write_in_place
            def run_region_into(env, region=region, ins=ins, outs=outs, dev=dev, label=label, strides=strides,
                                into=into, aliases=aliases):
                res = region.run([env[s] for s in ins], dev, label, strides, [env[s] if s >= 0 else None for s in into])
                for s, t in zip(outs, res):
                    env[s] = t
                for s, src in aliases:
                    env[s] = env[src]

            return run_region_into
        if st["kind"] == "copies":
            dsts = tuple(p[0] for p in st["pairs"])
            srcs = tuple(p[1] for p in st["pairs"])
            dev = st["device"]

            def run_copies(env, dsts=dsts, srcs=srcs, outs=tuple(outs), dev=dev):
                d = [env[s] for s in dsts]
                _RC.copy_many(d, [env[s] for s in srcs], dev)
                for o, t in zip(outs, d):
                    env[o] = t

            return run_copies
        if st["kind"] == "scalars":
            return host_scalars.make_runner(st)
        if st["kind"] == "getattr":
            if gm is None:
                raise RuntimeError("program with graph constants needs its GraphModule")
            obj = gm
            for part in st["name"].split("."):
                obj = getattr(obj, part)
            out = outs[0]

            def run_getattr(env, obj=obj, out=out):
                env[out] = obj

            return run_getattr
        fn = resolve_op(st["op"])
        args, _ = decode(st["args"])
        kwargs, _ = decode(st["kwargs"])
        out = outs[0]
        if st["kind"] == "getitem":
            def run_getitem(env, args=args, out=out):
                a = args(env)
                env[out] = a[0][a[1]]

            return run_getitem

        def run_call(env, fn=fn, args=args, kwargs=kwargs, out=out):
            env[out] = fn(*args(env), **kwargs(env))

        return run_call

    def _error(self, i: int, env: list, e: Exception) -> Exception:
        """`e` re-raised with the step that failed: its op and its inputs' shapes, dtypes, devices."""
        st = self.desc["steps"][i]
        what = "fused region of " + ", ".join(st["ops"]) if st["kind"] == "region" else st.get("op", st["kind"])

        def show(s):
            v = env[s]
            if isinstance(v, torch.Tensor):
                return f"%{s}: {v.dtype} {list(v.shape)} strides {list(v.stride())} on {v.device}"
            return f"%{s}: {type(v).__name__}"

        ins = "; ".join(show(s) for s in step_reads(st))
        msg = f"{self.name}, step {i} ({what}) with inputs [{ins}]: {e}"
        try:
            return type(e)(msg)
        except Exception:  # noqa: BLE001 (exception types with other constructors)
            return RuntimeError(msg)

    def __call__(self, args: list) -> list:
        env = [None] * self._num_slots
        n = self._num_inputs
        env[:n] = args[:n]
        args.clear()
        try:
            for i, (run, frees) in enumerate(self._plan):  # noqa: B007  (i names the failing step)
                run(env)
                for s in frees:
                    env[s] = None
        except Exception as e:  # noqa: BLE001
            raise self._error(i, env, e) from e
        out = self._out(env)
        stats.add("programs_run")
        return list(out) if isinstance(out, (list, tuple)) else [out]


def check_memory(desc: dict[str, Any], kind: str) -> None:
    """Raise torch.OutOfMemoryError when the program's peak exceeds the chip's HBM."""
    peak = desc["input_bytes"] + desc["peak_intermediate_bytes"]
    dev = desc["device"]
    cap = torch.tpu.get_device_properties(dev).total_memory
    if peak > cap:
        st = desc["steps"][desc["peak_step"]] if desc["peak_step"] >= 0 else None
        where = ""
        if st is not None:
            where = f" (peak at step {desc['peak_step']}: " + (
                f"fused region of {len(st['ops'])} ops" if st["kind"] == "region" else st.get("op", st["kind"])) + ")"
        raise passthrough(
            torch.OutOfMemoryError,
            f"torch.compile(backend='tpu'): the {kind} program needs {peak} physical HBM bytes at its peak "
            f"({desc['input_bytes']} in inputs + {desc['peak_intermediate_bytes']} in intermediates{where}), "
            f"more than the capacity of tpu:{dev}, {cap} bytes (TORCH_TPU_HBM_BYTES sets it)")
