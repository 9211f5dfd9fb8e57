"""FX graph of core ATen ops -> a compiled program, through the program cache.

A *program* is a sequence of steps over slots (one slot per FX value):

* ``region``: a maximal fusible subgraph (elementwise, broadcast, reductions,
  softmax, casts: whatever ``defer_and_fuse``'s lowerings map to the IR) built
  into an IR region, compiled into fused tile kernels and queued on the chip's
  stream over tpu tensors (``torch_tpu._C._compile.Region``);
* ``call``: a *library call*, the ATen op run on its (tpu) tensors through the
  PrivateUse1 fallback, queued on the chip's stream like any eager op;
* ``getitem`` / ``getattr``: tuple element / graph constant.

:func:`compile_fx_graph` runs FX dead-code elimination and CSE, then looks the program
up in memory and on disk (:mod:`.cache`) or builds its description (:mod:`.builder`,
over :mod:`.lowering`), checks its peak HBM bytes and instantiates it
(:mod:`.program`); ``TORCH_TPU_DUMP_IR`` writes it as StableHLO (:mod:`.stablehlo`).
"""

import logging
import operator
import os
import time
from typing import Any, Optional

import torch
import torch.fx

from . import background, cache, foreach, stats, xla_executor
from .builder import build_description
from .description import library_ops, op_name
from .errors import passthrough
from .options import CompileOptions
from .program import Program, check_memory
from .stablehlo import dump_path, dump_program, lower, module_name, to_stablehlo

log = logging.getLogger("torch_tpu.compile")


def _cse(gm: torch.fx.GraphModule) -> int:
    """Merges call_function nodes with the same target and arguments (pure ops only)."""
    seen: dict[Any, torch.fx.Node] = {}
    removed = 0

    def key_of(a):
        if isinstance(a, torch.fx.Node):
            return ("n", id(a))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(key_of(x) for x in a))
        if isinstance(a, dict):
            return ("d", tuple(sorted((k, key_of(v)) for k, v in a.items())))
        if isinstance(a, float):
            return ("f", repr(a))
        return (type(a).__name__, a)

    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            if t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags:
                continue
        elif t is not operator.getitem:
            continue
        try:
            k = (t, key_of(n.args), key_of(n.kwargs))
            hash(k)
        except TypeError:
            continue
        prev = seen.get(k)
        if prev is None:
            seen[k] = n
        else:
            n.replace_all_uses_with(prev)
            gm.graph.erase_node(n)
            removed += 1
    return removed


_VIEWS = ("view.default", "_unsafe_view.default", "reshape.default", "squeeze.dims", "squeeze.dim",
          "unsqueeze.default", "alias.default")


def _only_cast_back(n: torch.fx.Node, dtype: torch.dtype) -> bool:
    """Every use of `n` (through views) is a plain cast to `dtype`."""
    for u in n.users:
        name = op_name(u.target) or ""
        if name.startswith("aten::") and name[6:] in _VIEWS and u.args[0] is n:
            if not _only_cast_back(u, dtype):
                return False
        elif not (u.target is torch.ops.aten._to_copy.default and u.args[0] is n
                  and set(u.kwargs) <= {"dtype", "layout", "device"} and u.kwargs.get("dtype") == dtype
                  and u.kwargs.get("layout", torch.strided) == torch.strided):
            return False
    return bool(n.users)


def _low_precision_sums(gm: torch.fx.GraphModule) -> int:
    """``sum(x, dims, dtype=float32)`` of a bf16 / fp16 ``x`` whose value is only ever cast back to
    x's dtype (autocast's bias gradients: ``sum`` of the bf16 output gradient, then bf16) becomes
    ``sum(x, dims)`` in x's dtype, cast to float32: ATen's reduced-precision sum accumulates in
    float32 and rounds once, which is what the cast back did, and its vectorized kernel is 3-4x
    cheaper on the host than the mixed-dtype one (bf16 [2048, 1024] over dim 0, one thread: 0.32 vs
    0.91 ms). Returns how many were rewritten."""
    aten = torch.ops.aten
    done = 0
    for n in list(gm.graph.nodes):
        if n.target is not aten.sum.dim_IntList or n.kwargs.get("dtype") != torch.float32 or len(n.args) < 2:
            continue
        x = n.args[0]
        xv, val = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None), n.meta.get("val")
        if not isinstance(xv, torch.Tensor) or xv.dtype not in (torch.bfloat16, torch.float16):
            continue
        if not isinstance(val, torch.Tensor) or not _only_cast_back(n, xv.dtype):
            continue
        with gm.graph.inserting_before(n):
            low = gm.graph.call_function(aten.sum.dim_IntList, tuple(n.args), {})
            low.meta["val"] = val.to(xv.dtype)
            up = gm.graph.call_function(aten._to_copy.default, (low,), {"dtype": torch.float32})
            up.meta["val"] = val
        n.replace_all_uses_with(up)
        gm.graph.erase_node(n)
        done += 1
    return done


def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs: list, kind: str,
                     options: CompileOptions | None = None, source_graph: torch.fx.GraphModule | None = None):
    """AOTAutograd's compiler for one graph: the program for `gm` (boxed callable).

    Looks the program up in memory, then on disk (``TORCH_TPU_CACHE_DIR``), and
    builds it otherwise (on the compile thread with ``options.async_compile``: until it is
    ready, calls run `gm` op by op). `source_graph`: the graph handed to the pipeline
    (Dynamo's, or a bucket's re-trace), for ``options.debug_callback``.

    Raises:
        torch.OutOfMemoryError: the program's peak physical HBM bytes exceed the chip's capacity.
        RuntimeError: ``options.serializable`` and the program cannot be plain data.
    """
    opts = options or CompileOptions()
    t0 = time.perf_counter()
    if _symbolic(gm, example_inputs):
        # Dynamic shapes reach here only without the bucketing pass: the graph runs as it
        # is, op by op (each a library call on the chip), for every size.
        log.info("%s graph with symbolic sizes: runs op by op (no program built)", kind)
        stats.add("graphs")
        stats.count_library_ops(op_name(n.target) for n in gm.graph.nodes
                                if n.op == "call_function" and op_name(n.target))
        return _op_by_op(gm)
    foreach.expand(gm)
    _low_precision_sums(gm)
    gm.graph.eliminate_dead_code()
    _cse(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    stats.add("graphs")
    key = None
    try:
        key = cache.program_key(gm, example_inputs, opts.variant())
    except cache.Uncacheable as e:
        _not_serializable(opts, kind, e)
        log.info("program not cached (%s)", e)
    name = f"{opts.name + ' ' if opts.name else ''}{kind} program {key[:12] if key else 'uncached'}"
    desc, prog, source = None, None, "built"
    if key is not None:
        desc = cache.memory_get(key)
        if desc is not None:
            source = "memory"
        else:
            desc = cache.disk_get(key)
            if desc is not None:
                source = "disk"
                prog = _instantiate_disk_entry(key, desc, gm, kind, name)
                if prog is None:
                    desc, source = None, "built"
    if desc is None and opts.async_compile:
        return _build_in_background(gm, example_inputs, kind, key, opts, name, source_graph)
    if desc is None:
        desc, prog = _build(gm, example_inputs, kind, key, opts, name)
    else:
        check_memory(desc, kind)
        stats.add("cache_hits_memory" if source == "memory" else "cache_hits_disk")
        cache.memory_put(key, desc)
        if prog is None:
            prog = Program(desc, gm, name)
    _report(prog, desc, gm, kind, key, opts, name, source, source_graph, t0)
    return _runner(xla_executor.wrap(prog, desc, key, name))


def _op_by_op(gm: torch.fx.GraphModule):
    """`gm` run as it is (each op dispatched on its own), as a boxed callable."""
    run_gm = gm.forward

    def run_op_by_op(args: list) -> list:
        a = list(args)
        args.clear()
        out = run_gm(*a)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    run_op_by_op._boxed_call = True
    return run_op_by_op


def _runner(prog: Program):
    def run(args: list) -> list:
        return prog(args)

    run._boxed_call = True  # AOTAutograd passes one list, which the program empties
    run.program = prog
    return run


def _not_serializable(opts: CompileOptions, kind: str, e: Exception) -> None:
    if opts.serializable:
        raise passthrough(RuntimeError, f"torch.compile(backend='tpu', options={{'serializable': True}}): the {kind} "
                                        f"program cannot be serialized: {e}")


def _build(gm, example_inputs, kind: str, key: str | None, opts: CompileOptions, name: str):
    """Build, check and cache the program of `gm`: (description, Program)."""
    settings = {"fuse": opts.fuse, "single_op_regions": opts.single_op_regions_on()}
    try:
        desc = build_description(gm, example_inputs, kind, **settings)
    except cache.Uncacheable as e:
        _not_serializable(opts, kind, e)
        log.info("program not cached (%s)", e)
        key = None
        desc = build_description(gm, example_inputs, kind, objects=[], **settings)
    check_memory(desc, kind)
    if key is not None:
        cache.disk_put(key, desc)
        cache.memory_put(key, desc)
    stats.add("compilations")
    return desc, Program(desc, gm, name)


def _build_in_background(gm, example_inputs, kind, key, opts: CompileOptions, name: str, source_graph):
    """The ``async_compile`` option: the program is built on the compile thread; calls before
    it is ready run `gm` op by op; a failed build raises its error at every later call."""
    eager = _op_by_op(gm)
    ready: list = []

    def build() -> None:
        t0 = time.perf_counter()
        desc, prog = _build(gm, example_inputs, kind, key, opts, name)
        stats.add("async_builds")
        _report(prog, desc, gm, kind, key, opts, name, "built", source_graph, t0)
        ready.append(xla_executor.wrap(prog, desc, key, name))

    handle = background.submit(build, name)

    def run(args: list) -> list:
        if ready:
            return ready[0](args)
        if handle.done():
            handle.wait()  # raises the build's error
            return ready[0](args)
        return eager(args)

    run._boxed_call = True
    run.artifact = handle
    return run


def _report(prog: Program, desc, gm, kind: str, key: str | None, opts: CompileOptions, name: str, source: str,
            source_graph, t0: float) -> None:
    """Counters, the StableHLO dump and ``debug_callback`` of a program just built or loaded."""
    stats.add("regions", len(prog.regions))
    stats.count_library_ops(library_ops(desc))
    stats.count("host_scalar_ops", [o["op"] for st in desc["steps"] if st["kind"] == "scalars" for o in st["ops"]])
    stats.add("compile_seconds", time.perf_counter() - t0)
    k = key or "uncached"
    text = None
    if source != "memory":  # the ops that stay custom calls in the program's StableHLO
        try:
            low = lower(desc, module_name(k, kind, opts.name))
            text = low.text
            stats.count("custom_calls", [c for c, _ in low.custom_calls])
        except Exception as e:  # noqa: BLE001 (a printer bug never fails the compile)
            log.warning("%s: StableHLO lowering failed: %s", name, e)
    folder = opts.dump_folder()
    if folder and (source != "memory" or not os.path.exists(dump_path(folder, k, kind, opts.name))):
        text = text or to_stablehlo(desc, module_name(k, kind, opts.name))
        dump_program(folder, desc, k, kind, opts.name, text)
    if opts.debug_callback is not None:
        if text is None:
            text = to_stablehlo(desc, module_name(k, kind, opts.name))
        opts.debug_callback([g for g in (source_graph, gm) if g is not None], text)
    log.debug("%s: %d steps, %d regions (%d kernels), %d library calls, from %s", name, len(desc["steps"]),
              len(prog.regions), prog.num_kernels, len(library_ops(desc)), source)


def _instantiate_disk_entry(key: str, desc, gm, kind: str, name: str) -> Optional["Program"]:
    """The program of a disk entry, or None when the entry (checksum intact) does not
    describe a valid program: another format, or a body this code cannot instantiate.
    Such an entry is reported as corrupted, removed and rebuilt."""
    try:
        if not isinstance(desc, dict) or desc.get("format") != cache.FORMAT_VERSION:
            raise ValueError(f"format {desc.get('format') if isinstance(desc, dict) else type(desc).__name__}, "
                             f"expected {cache.FORMAT_VERSION}")
        for k in ("steps", "free_after", "outputs", "num_slots", "num_inputs", "device", "input_bytes",
                  "peak_intermediate_bytes", "peak_step"):
            if k not in desc:
                raise ValueError(f"missing {k!r}")
        return Program(desc, gm, name)
    except Exception as e:  # noqa: BLE001 (any malformed body: rebuild rather than fail the user's compile)
        cache.report_corrupt_entry(key, e)
        return None


def _symbolic(gm, example_inputs) -> bool:
    def sym(v):
        if isinstance(v, torch.SymInt):
            return True
        return isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)

    if any(sym(x) for x in example_inputs):
        return True
    return any(n.op == "placeholder" and sym(n.meta.get("val")) for n in gm.graph.nodes)
