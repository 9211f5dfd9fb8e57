"""FX graph of core ATen ops -> program description (plain data, see :mod:`.description`).

Partitioning into regions (greedy in topological order, a node joins a producer's region
unless that would create a cycle through a library call), then a topological order of the
steps; liveness (a slot is dropped after its last use, so intermediates are freed as early
as eager frees them) and the program's peak physical HBM bytes (inputs plus live
intermediates, tiled sizes), which :func:`.program.check_memory` compares with the chip.
"""

import bisect
import heapq
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .. import _C
from . import host_scalars
from .cache import FORMAT_VERSION, Uncacheable
from .description import encode, object_table, op_name, records_to_json, slots_in, step_reads, target_name, type_str
from .lowering import (
    TPU,
    data_inputs,
    dense_strides,
    fusible,
    is_tpu_tensor,
    lower,
    node_value,
    physical_bytes,
    returns_alias,
)

_RC = _C._compile
MAX_REGION_NODES = 512


def build_description(gm: torch.fx.GraphModule, example_inputs: Sequence, kind: str,
                      objects: list[Any] | None = None, *, fuse: bool = True,
                      single_op_regions: bool | None = None) -> dict[str, Any]:
    """See :func:`_build_description`; `objects`: a list that takes the Python objects
    plain data cannot name (then the description is for this process only); `fuse`: False
    makes every op a library call (no fused region); `single_op_regions`: compile regions of
    one op into kernels too (None: ``TORCH_TPU_COMPILE_SINGLE_OP_REGIONS``)."""
    if single_op_regions is None:
        single_op_regions = os.environ.get("TORCH_TPU_COMPILE_SINGLE_OP_REGIONS", "0") == "1"
    with object_table(objects):
        desc = _build_description(gm, example_inputs, kind, fuse, single_op_regions)
    if objects:
        desc["_objects"] = objects
    return desc


def _build_description(gm: torch.fx.GraphModule, example_inputs: Sequence, kind: str, fuse: bool,
                       single_op_regions: bool) -> dict[str, Any]:
    """Lower `gm` to a program description (plain data), see the module docstring;
    its peak physical HBM bytes are in it (``check_memory`` compares them with the chip).

    Raises:
        Uncacheable: a node or argument plain data cannot describe (then the caller
            builds it again without caching; it still runs).
    """
    graph = gm.graph
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output_node = next(n for n in nodes if n.op == "output")
    all_body = [n for n in nodes if n.op not in ("placeholder", "output")]
    out_args = output_node.args[0]
    graph_outputs = set()
    torch.fx.node.map_arg(out_args, lambda x: graph_outputs.add(x))
    # 0-dim CPU chains that depend only on graph inputs (an optimizer's bias corrections):
    # one step of Python float arithmetic, run first (see host_scalars)
    host, host_writes = host_scalars.find(all_body, graph_outputs) if fuse else ([], [])
    on_host = set(host) | set(host_writes)
    body = [n for n in all_body if n not in on_host]

    # ---- partition into regions (cycle-free through library calls), steps in topological order
    fusible_nodes = {n for n in body if fusible(n)} if fuse else set()
    try:
        region_of, groups, ordered = _partition(body, fusible_nodes, single_op_regions, wait_roots=True)
    except _CyclicSteps:  # the roots' rule exposed the greedy's per-node dependency sets: without it
        region_of, groups, ordered = _partition(body, fusible_nodes, single_op_regions, wait_roots=False)

    # ---- slots
    slot_of: dict[torch.fx.Node, int] = {}
    for i, p in enumerate(placeholders):
        slot_of[p] = i
    next_slot = len(placeholders)
    for n in all_body:
        slot_of[n] = next_slot
        next_slot += 1

    steps: list[dict[str, Any]] = []
    step_nodes: list[list[torch.fx.Node]] = []
    if host:
        steps.append(host_scalars.step(host, host_writes, slot_of, graph_outputs))
        step_nodes.append(host + host_writes)
    region_members: dict[int, list[torch.fx.Node]] = {}
    device_index = 0
    for p in placeholders:
        v = node_value(p)
        if is_tpu_tensor(v):
            device_index = v.device.index or 0
            break
    for k in ordered:
        members = groups[k]
        if k[0] == "r":
            r = _RC.Region()
            vals: dict[torch.fx.Node, Any] = {}
            inputs: list[torch.fx.Node] = []
            member_set = set(members)
            ops = []
            for n in members:
                for a in data_inputs(n):
                    if a not in vals:
                        va = node_value(a)
                        vals[a] = _RC.Value(r.parameter(va.dtype, list(va.shape)))
                        inputs.append(a)
                res = lower(r, n, vals)
                if res is None:  # cannot happen: probed above
                    raise RuntimeError(f"torch.compile(backend='tpu'): {n.target} failed to lower in region")
                vals[n] = _RC.Value(res[0])
                ops.append(op_name(n.target))
            outs = [n for n in members if n in graph_outputs or any(u not in member_set for u in n.users)]
            if not outs:
                continue  # dead region (DCE ran, so only if nothing uses it)
            r.finish([vals[n].id for n in outs])
            dev = node_value(members[0]).device.index or 0
            steps.append({
                "kind": "region",
                "records": records_to_json(r.records()),
                "inputs": [slot_of[a] for a in inputs],
                "outputs": [slot_of[n] for n in outs],
                "device": dev,
                "ops": ops,
                "types": [[str(node_value(n).dtype).replace("torch.", ""), list(node_value(n).shape)] for n in outs],
                "strides": [dense_strides(node_value(n)) for n in outs],
            })
            step_nodes.append(outs)
            region_members[len(steps) - 1] = members
        else:
            n = members[0]
            if n.op == "get_attr":
                steps.append({"kind": "getattr", "name": n.target, "outputs": [slot_of[n]]})
            elif n.op == "call_function":
                name = target_name(n.target)
                steps.append({
                    "kind": "getitem" if name == "getitem" else "call",
                    "op": name,
                    "args": encode(list(n.args), slot_of),
                    "kwargs": encode(dict(n.kwargs), slot_of),
                    "outputs": [slot_of[n]],
                    "type": type_str(node_value(n)),
                })
            else:
                raise Uncacheable(f"FX node {n.op} {n.target}")
            step_nodes.append([n])

    steps, step_nodes = _write_in_place(steps, step_nodes, region_members, slot_of, graph_outputs)
    steps, step_nodes = _batch_copies(steps, step_nodes, slot_of)

    # ---- liveness: a slot is dropped after its last use; a view keeps its base alive
    last_use: dict[int, int] = {}
    for i, st in enumerate(steps):
        for s in step_reads(st):
            last_use[s] = i
    end = len(steps)
    out_enc = encode(out_args, slot_of)
    for s in slots_in(out_enc):
        last_use[s] = end
    free_after: list[list[int]] = [[] for _ in range(end + 1)]
    for s, i in last_use.items():
        if i < end:
            free_after[i].append(s)
    # slots written but never read: dropped at once
    for i, st in enumerate(steps):
        for s in st["outputs"]:
            if s not in last_use:
                free_after[i].append(s)

    # ---- peak physical HBM bytes
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in all_body:
        base = n
        if n.op == "call_function" and returns_alias(n.target) and n.args and isinstance(n.args[0], torch.fx.Node):
            base = root.get(n.args[0], n.args[0])
        root[n] = base
    node_of_slot = {s: n for n, s in slot_of.items()}
    root_last: dict[torch.fx.Node, int] = {}
    for s, i in last_use.items():
        n = node_of_slot[s]
        r0 = root.get(n, n)
        root_last[r0] = max(root_last.get(r0, -1), i)
    seen_storage = set()
    input_bytes = 0
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == TPU:
            try:
                key = x.untyped_storage()._cdata
            except Exception:  # noqa: BLE001 (fake tensors)
                key = id(x)
            if key in seen_storage:
                continue
            seen_storage.add(key)
            input_bytes += physical_bytes(x)
    live = 0
    peak = 0
    peak_step = -1
    frees_at: dict[int, int] = {}
    for i, nodes_i in enumerate(step_nodes):
        for n in nodes_i if steps[i]["kind"] == "region" else [nodes_i[0]]:
            if root.get(n, n) is not n:
                continue
            v = node_value(n)
            b = sum(physical_bytes(t) for t in (v if isinstance(v, (list, tuple)) else [v]))
            if b == 0:
                continue
            live += b
            last = root_last.get(n, i)
            frees_at[last] = frees_at.get(last, 0) + b
        if live > peak:
            peak, peak_step = live, i
        live -= frees_at.pop(i, 0)
    return {
        "format": FORMAT_VERSION,
        "kind": kind,
        "num_inputs": len(placeholders),
        "num_slots": next_slot,
        "device": device_index,
        "steps": steps,
        "free_after": free_after,
        "outputs": out_enc,
        "input_bytes": input_bytes,
        "peak_intermediate_bytes": peak,
        "peak_step": peak_step,
        "input_types": [type_str(node_value(p)) for p in placeholders],
        "output_types": _output_types(out_args),
    }


class _CyclicSteps(RuntimeError):
    pass


def _partition(body, fusible_nodes, single_op_regions: bool, wait_roots: bool):
    """Regions (greedy in topological order) and the steps in topological order:
    (region of each fused node, the nodes of each step, the steps in order). Raises
    _CyclicSteps when the condensed step graph has a cycle."""
    region_of: dict[torch.fx.Node, int] = {}
    # regions each node depends on (itself included): n may join region R unless
    # an input outside R depends on R, which would make R wait for itself
    anc: dict[torch.fx.Node, frozenset] = {}
    region_size: list[int] = []
    empty = frozenset()
    # A fusible node none of whose inputs is in a region (a root: `addmm * 0.5` in gelu's
    # backward) waits for its first reader and joins that reader's region, instead of starting
    # one of its own that the later ops would then be split across (the tanh-gelu backward was
    # two regions, three [N, H] intermediates through memory). Nothing reads a pending node
    # before its first reader, so no dependency recorded so far goes through it.
    pending: dict[torch.fx.Node, None] = {}  # insertion-ordered: region numbers stay deterministic

    def new_region() -> int:
        region_size.append(0)
        return len(region_size) - 1

    def place(n: torch.fx.Node, r: int) -> None:
        region_of[n] = r
        region_size[r] += 1
        anc[n] = anc[n] | {r}

    for n in body:
        ins = n.all_input_nodes
        waiting = [a for a in dict.fromkeys(ins) if a in pending]
        for a in waiting:
            del pending[a]
        if n in fusible_nodes:
            chosen = None
            cands = sorted({region_of[a] for a in ins if a in region_of}, reverse=True)
            room = len(waiting) + 1
            for r in cands:
                if region_size[r] + room > MAX_REGION_NODES:
                    continue
                if all(region_of.get(a) == r or r not in anc.get(a, empty) for a in ins):
                    chosen = r
                    break
            if wait_roots and chosen is None and not cands and not waiting:
                pending[n] = None
            else:
                if chosen is None:
                    chosen = new_region()
                for a in waiting:
                    place(a, chosen)
                region_of[n] = chosen
                region_size[chosen] += 1
        else:
            for a in waiting:  # read by a library call first: a region of its own
                place(a, new_region())
        d = set()
        for a in ins:
            d |= anc.get(a, empty)
        if n in region_of:
            d.add(region_of[n])
        anc[n] = frozenset(d)
    for n in list(pending):  # read by no later node (graph outputs)
        place(n, new_region())

    # A region of one op runs ATen's kernel instead (a library call): fusion gains
    # nothing there, and ATen's kernel (vectorized, on the intra-op threads) is faster
    # than the executor's for a lone softmax, gelu or cast (defer_and_fuse does the same).
    # A one-op region whose every user is in one larger region joins it instead (an AdamW
    # parameter's weight-decay multiply joining its update): no cycle can arise, since every
    # path out of the op already led into that region.
    if not single_op_regions:
        for n in [n for n in region_of if region_size[region_of[n]] == 1]:
            users = {region_of.get(u, -1) for u in n.users}
            r = next(iter(users)) if len(users) == 1 else -1
            if r >= 0 and r != region_of[n] and 1 < region_size[r] < MAX_REGION_NODES:
                region_size[region_of[n]] -= 1
                region_of[n] = r
                region_size[r] += 1
            else:
                del region_of[n]

    # ---- steps: condensed DAG in topological order (stable by first node)
    step_of: dict[torch.fx.Node, tuple[str, int]] = {}
    groups: dict[tuple[str, int], list[torch.fx.Node]] = {}
    order_key: dict[tuple[str, int], int] = {}
    for i, n in enumerate(body):
        k = ("r", region_of[n]) if n in region_of else ("n", i)
        step_of[n] = k
        groups.setdefault(k, []).append(n)
        order_key.setdefault(k, i)
    preds: dict[Any, set] = {k: set() for k in groups}
    succs: dict[Any, set] = {k: set() for k in groups}
    for n in body:
        for a in n.all_input_nodes:
            if a in step_of and step_of[a] != step_of[n]:
                preds[step_of[n]].add(step_of[a])
                succs[step_of[a]].add(step_of[n])
    ready = [(order_key[k], k) for k in groups if not preds[k]]
    heapq.heapify(ready)
    ordered = []
    indeg = {k: len(v) for k, v in preds.items()}
    while ready:
        _, k = heapq.heappop(ready)
        ordered.append(k)
        for s in succs[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (order_key[s], s))
    if len(ordered) != len(groups):
        raise _CyclicSteps("torch.compile(backend='tpu'): internal error, cyclic step graph")
    return region_of, groups, ordered


def _reads_only_elementwise(members: list[torch.fx.Node], dst: torch.fx.Node, out: torch.fx.Node) -> bool:
    """Whether a region may write `out` into `dst`'s memory while it reads `dst`: every member
    that reads the old value of `dst` (directly, or through members other than `out`) is a
    pointwise op of `dst`'s shape whose value flows only into `out` (so element i of `out` is
    computed from element i of `dst` alone, after it was read, in any kernel split or tile order
    the executor picks; members reading `out` read what `dst` then holds)."""
    member_set = set(members)
    shape = node_value(dst).shape
    depends = set()  # members reading the old value of dst (not through out, which dst then holds)
    for m in members:
        if dst in m.all_input_nodes or any(a in depends and a is not out for a in m.all_input_nodes):
            depends.add(m)
    if not depends:
        return True
    if out not in depends:
        return False
    for m in depends:
        if not isinstance(m.target, torch._ops.OpOverload) or torch.Tag.pointwise not in m.target.tags:
            return False
        if node_value(m).shape != shape:
            return False
        if m is not out and any(u not in member_set or u not in depends for u in m.users):
            return False
    return True


def _write_in_place(steps, step_nodes, region_members, slot_of, graph_outputs):
    """A region's output ``out`` copied into a graph input by ``copy_(dst, out)`` (an optimizer's
    parameter and state updates, input mutations) is written into ``dst`` by the region itself,
    and the copy goes: one pass over the memory fewer, and no new tensor. Only when ``out`` is
    read by nothing else outside its region, is not a graph output, nothing between the region
    and the copy reads ``dst`` (or a view of it), and the region reads ``dst`` element by element
    (:func:`_reads_only_elementwise`)."""
    produced_by = {}
    for i, st in enumerate(steps):
        if st["kind"] == "region":
            for j, n in enumerate(step_nodes[i]):
                produced_by[n] = (i, j)
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    node_of_slot = {s: n for n, s in slot_of.items()}
    for n in node_of_slot.values():
        base = n
        while (base.op == "call_function" and returns_alias(base.target) and base.args
               and isinstance(base.args[0], torch.fx.Node)):
            base = base.args[0]
        root[n] = base
    readers: dict[torch.fx.Node, list[int]] = {}  # root -> steps reading it or a view of it, in order
    for k, st in enumerate(steps):
        for s in step_reads(st):
            lst = readers.setdefault(root[node_of_slot[s]], [])
            if not lst or lst[-1] != k:
                lst.append(k)
    drop = set()
    for c, st in enumerate(steps):
        if st["kind"] != "call" or st["op"] != "aten::copy_.default":
            continue
        n = step_nodes[c][0]
        if len(n.args) != 2 or n.kwargs or not all(isinstance(a, torch.fx.Node) for a in n.args):
            continue
        dst, out = n.args
        if dst.op != "placeholder" or out not in produced_by or out in graph_outputs:
            continue
        r, j = produced_by[out]
        members = region_members[r]
        if any(u is not n and u not in set(members) for u in out.users):  # read only by the copy and its region
            continue
        d, o = node_value(dst), node_value(out)
        if not (is_tpu_tensor(d) and is_tpu_tensor(o) and d.dtype == o.dtype and d.shape == o.shape
                and d.device == o.device and d.is_contiguous() and o.is_contiguous()):
            continue
        into = steps[r].setdefault("into", [-1] * len(steps[r]["outputs"]))
        if into[j] != -1 or slot_of[dst] in into:
            continue
        lst = readers.get(dst, [])
        i = bisect.bisect_right(lst, r)
        if i < len(lst) and lst[i] < c:  # read between the region and the copy (a dropped copy counts: safe side)
            continue
        if not _reads_only_elementwise(members, dst, out):
            continue
        into[j] = slot_of[dst]
        steps[r].setdefault("aliases", []).append([slot_of[n], slot_of[dst]])
        drop.add(c)
    for st in steps:
        if "into" in st and all(s == -1 for s in st["into"]):
            del st["into"]
    keep = [i for i in range(len(steps)) if i not in drop]
    return [steps[i] for i in keep], [step_nodes[i] for i in keep]


def _batch_copies(steps, step_nodes, slot_of):
    """Consecutive ``copy_(dst, src)`` calls between tpu tensors of one dtype and shape
    (the write-back of parameters and optimizer state) become one ``copies`` step: one
    queued item instead of one dispatch per tensor."""
    out_steps, out_nodes = [], []
    for st, nodes in zip(steps, step_nodes):
        n = nodes[0]
        ok = (st["kind"] == "call" and st["op"] == "aten::copy_.default" and len(n.args) == 2 and not n.kwargs
              and all(isinstance(a, torch.fx.Node) for a in n.args))
        if ok:
            d, s_ = node_value(n.args[0]), node_value(n.args[1])
            ok = (is_tpu_tensor(d) and is_tpu_tensor(s_) and d.dtype == s_.dtype and d.shape == s_.shape
                  and d.device == s_.device)
        if ok and out_steps and out_steps[-1]["kind"] == "copies" and out_steps[-1]["device"] == (d.device.index or 0):
            out_steps[-1]["pairs"].append([slot_of[n.args[0]], slot_of[n.args[1]]])
            out_steps[-1]["outputs"].append(slot_of[n])
            out_nodes[-1].append(n)
            continue
        if ok:
            out_steps.append({"kind": "copies", "pairs": [[slot_of[n.args[0]], slot_of[n.args[1]]]],
                              "outputs": [slot_of[n]], "device": d.device.index or 0})
            out_nodes.append([n])
            continue
        out_steps.append(st)
        out_nodes.append(nodes)
    return out_steps, out_nodes


def _output_types(out_args) -> list[str]:
    types = []
    torch.fx.node.map_arg(out_args, lambda n: types.append(type_str(node_value(n))))
    return types
