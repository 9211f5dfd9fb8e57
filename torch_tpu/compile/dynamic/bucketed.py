"""A Dynamo graph with symbolic sizes compiled once per bucket: :func:`compile_bucketed`
and the callable it returns, which picks a call's bucket, compiles its program (re-trace,
masking, the static pipeline) or falls back to the exact shape, and runs it padded."""

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .. import stats
from .analysis import analyze
from .config import BucketConfig, get_buckets
from .mask import simple
from .masking import mask_padded_graph
from .padding import input_device, length_tensor, pad_inputs, unpad_outputs
from .retrace import fold_item_inputs, trace_static
from .unsupported import Unsupported

log = logging.getLogger("torch_tpu.compile")


class _BucketedFunction:
    """What :func:`compile_bucketed` returns: picks, compiles and runs a bucket's program."""

    def __init__(self, gm, example_inputs, compile_static, buckets=None):
        self.gm = gm
        self.compile_static = compile_static
        self.buckets = buckets  # a BucketConfig, or None: the configuration in force at each call
        self.analysis = analyze(gm)
        self.programs: dict[Any, Callable] = {}
        self.exact_syms = set()  # dynamic sizes whose padding the masking cannot make safe
        self.lock = threading.RLock()  # a bucket found unsupported falls back to _run_exact under it
        self.unsupported = self.analysis.unsupported
        if self.unsupported:
            log.info("bucketing off for this graph: %s", self.unsupported)

    # sizes -------------------------------------------------------------
    def _true_sizes(self, args) -> dict[Any, int]:
        vals = {}
        for s, (i, d) in self.analysis.sources.items():
            a = args[i]
            vals[s] = int(a) if d is None else int(a.shape[d])
        return vals

    def __call__(self, *args):
        a = self.analysis
        stats.add("calls")
        true = self._true_sizes(args)
        items = tuple(float(args[i].item()) for i in a.item_inputs)
        if a.grad_cut and torch.is_grad_enabled() and any(
                args[i].requires_grad for i in a.tensor_inputs):
            # the gradient would flow through the cut: compile Dynamo's graph as it is
            return self._run_exact(args, true, {}, items,
                                   f"the graph controls its gradients ({a.grad_cut}) and "
                                   f"gradients are needed")
        while True:
            # sizes found unsafe to pad stay exact (part of the key); the others are bucketed
            bsyms = [s for s in a.symbols if s not in self.exact_syms]
            value_syms = {s: v for s, v in true.items() if s not in bsyms}
            cfg = self.buckets or get_buckets()
            buckets = {}
            why_exact = self.unsupported
            if why_exact is None:
                for s in bsyms:
                    b = cfg.bucket(true[s])
                    if b is None:
                        why_exact = ("bucketing is off" if not cfg.enabled else
                                     f"{s}={true[s]} is past the largest bucket {cfg.sizes[-1]}" if cfg.sizes
                                     else f"{s}={true[s]} has no bucket")
                        break
                    buckets[s] = b
            if why_exact is not None:
                return self._run_exact(args, true, value_syms, items, why_exact)
            key = ("bucket", tuple(buckets[s] for s in bsyms),
                   tuple(sorted((str(k), v) for k, v in value_syms.items())), items)
            prog = self.programs.get(key)
            if prog is not None:
                break
            with self.lock:
                prog = self.programs.get(key)
                if prog is not None:
                    break
                try:
                    prog = self._compile_bucket(args, buckets, value_syms, true, bsyms)
                except Unsupported as e:
                    syms = e.syms
                    if syms and set(syms) < set(bsyms):
                        self.exact_syms |= set(syms)
                        names = ", ".join(sorted(str(x) for x in syms))
                        stats.note_bucketing(None, f"bucketing: {names} kept exact because {e}")
                        continue
                    self.unsupported = str(e)
                    return self._run_exact(args, true, value_syms, items, str(e))
                self.programs[key] = prog
                break
        padded, any_pad, dev = pad_inputs(self.analysis, args, buckets)
        if any_pad:
            stats.add("padded_calls")
        outs = prog(*padded, *[length_tensor(true[s], dev) for s in bsyms])
        return unpad_outputs(self.analysis, outs, true)

    # compile -------------------------------------------------------------
    def _compile_bucket(self, args, buckets, value_syms, true, bsyms):
        a = self.analysis
        traced = trace_static(self.gm, a, args, buckets, value_syms, bsyms)
        ph_map = {}  # traced placeholder index -> {dim: sym}, bucketed sizes only
        for j, i in enumerate(a.tensor_inputs):
            dims = {d: s for d, s in a.dyn_dims.get(i, {}).items() if s in buckets}
            if dims:
                ph_map[j] = dims
        device = input_device(self.analysis, args)
        self._check_outputs(mask_padded_graph(traced, ph_map, bsyms, device))
        padded, _, dev = pad_inputs(self.analysis, args, buckets)
        lens = [length_tensor(true[s], dev) for s in bsyms]
        sizes = ", ".join([f"{s}={true[s]}->{buckets[s]}" for s in bsyms] +
                          [f"{s}={v} exact" for s, v in sorted(value_syms.items(), key=lambda t: str(t[0]))
                           if s in self.exact_syms])
        stats.note_bucketing("bucket_compilations", f"bucketing: new bucket ({sizes})")
        return self.compile_static(traced, list(padded) + lens)

    def _check_outputs(self, out_masks):
        """Outputs are sliced back with ``narrow``: each dynamic dim must hold its real
        entries as a prefix of the padded dim, of the length Dynamo's size says."""
        for k, (exprs, m) in enumerate(zip(self.analysis.out_exprs, out_masks)):
            if exprs is None or m is None:
                continue
            for d, e in enumerate(exprs):
                if e.is_number or m.shape[d] == 1:
                    continue
                p = m.prefix.get(d)
                if not simple(p) or (e - (p[0] + p[1])) != 0:
                    err = Unsupported(f"output {k} dim {d} (size {e}) is not a prefix of its "
                                      f"padded dim")
                    err.syms = frozenset(e.free_symbols)
                    raise err

    def _run_exact(self, args, true, value_syms, items, why):
        """Compile Dynamo's graph itself at these exact sizes (AOTAutograd traces it with
        the concrete inputs, keeping every detach / no_grad and mutation as Dynamo saw it)."""
        key = ("exact", tuple(sorted((str(k), v) for k, v in true.items())), items)
        prog = self.programs.get(key)
        if prog is None:
            with self.lock:
                prog = self.programs.get(key)
                if prog is None:
                    shape = ", ".join(f"{k}={v}" for k, v in sorted(true.items(), key=lambda t: str(t[0])))
                    stats.note_bucketing("exact_compilations",
                                         f"bucketing: exact shape ({shape}) compiled because {why}")
                    gm = self.gm
                    if self.analysis.item_inputs:
                        # .item() of lifted scalars (dropout p, momentum) as constants: the
                        # values are part of the key, and AOTAutograd outside Dynamo has no
                        # shape environment for data-dependent scalars
                        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
                        gm = fold_item_inputs(gm, {phs[i]: args[i].item()
                                                    for i in self.analysis.item_inputs})
                    prog = self.compile_static(gm, list(args))
                    self.programs[key] = prog
        outs = prog(*args)
        return list(outs) if not isinstance(outs, (list, tuple)) else outs


def compile_bucketed(gm: torch.fx.GraphModule, example_inputs: Sequence,
                     compile_static: Callable, buckets: BucketConfig | None = None) -> Callable:
    """Compile a Dynamo graph with symbolic sizes so that each bucket of sizes compiles once.

    Args:
        gm: the graph Dynamo captured; its placeholders' ``example_value`` carry symbolic
            shapes (``s0``, ``s1``, ...). Dims whose size is a single symbol are padded.
        example_inputs: the example inputs Dynamo passed (tensors and ``SymInt``); unused
            beyond validation: programs are compiled lazily, per bucket, at the first call
            that needs them.
        compile_static: ``(gm, example_inputs) -> callable``, the static pipeline
            (AOTAutograd included) each bucket's rewritten graph goes through. It receives
            an ATen-level graph whose inputs are the tensor inputs padded to the bucket
            followed by one 0-dim ``int64`` tensor per dynamic size (its true value).

    Returns:
        A callable taking the graph's inputs (as Dynamo calls it) and returning the list of
        outputs with their true (unpadded) sizes. Differentiable when the static pipeline is.
        A graph whose only symbolic values are ints (no tensor size) goes to
        ``compile_static`` as it is.

    Raises:
        ValueError: ``TORCH_TPU_COMPILE_BUCKETS`` does not parse (at the first call).
    """
    get_buckets()  # a bad environment variable fails at compile time, with its name
    fn = _BucketedFunction(gm, example_inputs, compile_static, buckets)
    if not fn.analysis.symbols:
        # only ints are symbolic (no tensor size to pad): one program serves every value
        return compile_static(gm, example_inputs)
    return fn
