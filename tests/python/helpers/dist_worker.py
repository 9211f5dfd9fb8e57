"""One rank of a tpu_dist test scenario: ``python dist_worker.py <scenario> <outdir>``.

Launched by tests/python/helpers/dist.py with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Each scenario writes ``<outdir>/rank<r>.json`` with its results:
for check batteries ``{"checks": {name: "ok" | error text}}``.
"""

import json
import os
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
OUT = sys.argv[2] if len(sys.argv) > 2 else "."


def write(result):
    path = os.path.join(OUT, f"rank{RANK}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def init(timeout=None, **kwargs):
    dev = torch.device("tpu", int(os.environ.get("LOCAL_RANK", RANK)))
    torch.tpu.set_device(dev)
    if timeout is not None:
        import datetime

        kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    dist.init_process_group(kwargs.pop("backend", "tpu_dist"), rank=RANK, world_size=WORLD, **kwargs)
    return dev


# ------------------------------------------------------------------ collectives

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
# Sizes: below the one-shot threshold, ring within one window, ring over several windows
# (the scenario runs with a 64 KiB buffer).
SIZES = {"small": 7, "ring": 3000, "windows": 70001}


def rank_data(r, numel, dtype, salt=0):
    """Small integers (exact in bfloat16 sums): deterministic per rank."""
    base = torch.arange(numel, dtype=torch.int64)
    return ((base * (r + 3) + salt + r) % 13 - 4).to(dtype)


def make(x, dev, layout):
    """`x` on `dev` as a contiguous tensor or as a non-contiguous view with the same values."""
    if layout == "contig":
        return x.to(dev)
    big = torch.zeros(x.numel(), 2, dtype=x.dtype)
    big[:, 0] = x
    return big.to(dev)[:, 0]  # stride 2


def checker(checks):
    """``check(name, fn)``: runs fn, records "ok" or its error under checks[name]."""
    def check(name, fn):
        try:
            fn()
            checks[name] = "ok"
        except Exception as e:  # noqa: BLE001
            checks[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"

    return check


def battery(dev):
    checks = {}
    check = checker(checks)

    def eq(got, want, name):
        got = got.cpu()
        if got.dtype.is_floating_point:
            torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
        else:
            assert torch.equal(got, want), f"{name}: got {got[:10].tolist()} want {want[:10].tolist()}"

    reduce_ops = {
        "sum": (dist.ReduceOp.SUM, lambda xs: torch.stack([x.double() for x in xs]).sum(0)),
        "max": (dist.ReduceOp.MAX, lambda xs: torch.stack([x.double() for x in xs]).amax(0)),
        "min": (dist.ReduceOp.MIN, lambda xs: torch.stack([x.double() for x in xs]).amin(0)),
        "product": (dist.ReduceOp.PRODUCT, lambda xs: torch.stack([x.double() for x in xs]).prod(0)),
        "avg": (dist.ReduceOp.AVG, lambda xs: torch.stack([x.double() for x in xs]).mean(0)),
    }
    for dname, dtype in DTYPES.items():
        for sname, numel in SIZES.items():
            for layout in ("contig", "strided"):
                for oname, (op, ref) in reduce_ops.items():
                    if oname == "avg" and not dtype.is_floating_point:
                        continue
                    if oname == "product" and sname != "small":
                        continue  # products of many ranks' values overflow bf16's integers
                    if layout == "strided" and sname == "windows" and oname != "sum":
                        continue

                    def run(dtype=dtype, numel=numel, layout=layout, op=op, ref=ref, name=None):
                        xs = [rank_data(r, numel, dtype) for r in range(WORLD)]
                        t = make(xs[RANK], dev, layout)
                        dist.all_reduce(t, op=op)
                        want = ref(xs)
                        if dtype == torch.bfloat16:
                            want = want.to(torch.bfloat16)
                        elif not dtype.is_floating_point:
                            want = want.to(dtype)
                        else:
                            want = want.float()
                        eq(t, want.to(dtype), "all_reduce")

                    check(f"all_reduce/{oname}/{dname}/{sname}/{layout}", run)

    def premul():
        xs = [rank_data(r, 100, torch.float32) for r in range(WORLD)]
        t = xs[RANK].to(dev)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        eq(t, torch.stack(xs).sum(0) * 0.5, "premul_sum")

    check("all_reduce/premul_sum/float32", premul)

    for dname, dtype in DTYPES.items():
        for layout in ("contig", "strided"):
            for sname, numel in (("small", 7), ("windows", 40001)):
                def bcast(dtype=dtype, layout=layout, numel=numel):
                    root = 1 % WORLD
                    xs = [rank_data(r, numel, dtype, salt=5) for r in range(WORLD)]
                    t = make(xs[RANK], dev, layout)
                    dist.broadcast(t, src=root)
                    eq(t, xs[root], "broadcast")

                check(f"broadcast/{dname}/{sname}/{layout}", bcast)

                def all_gather_list(dtype=dtype, layout=layout, numel=numel):
                    xs = [rank_data(r, numel, dtype, salt=1) for r in range(WORLD)]
                    outs = [make(torch.zeros(numel, dtype=dtype), dev, layout) for _ in range(WORLD)]
                    dist.all_gather(outs, make(xs[RANK], dev, layout))
                    for r in range(WORLD):
                        eq(outs[r], xs[r], f"all_gather[{r}]")

                check(f"all_gather/{dname}/{sname}/{layout}", all_gather_list)

                def all_gather_tensor(dtype=dtype, layout=layout, numel=numel):
                    xs = [rank_data(r, numel, dtype, salt=2) for r in range(WORLD)]
                    out = make(torch.zeros(WORLD * numel, dtype=dtype), dev, layout)
                    dist.all_gather_into_tensor(out, make(xs[RANK], dev, layout))
                    eq(out, torch.cat(xs), "all_gather_into_tensor")

                check(f"all_gather_into_tensor/{dname}/{sname}/{layout}", all_gather_tensor)

                def reduce_scatter_tensor(dtype=dtype, layout=layout, numel=numel):
                    xs = [rank_data(r, WORLD * numel, dtype, salt=3) for r in range(WORLD)]
                    out = make(torch.zeros(numel, dtype=dtype), dev, layout)
                    dist.reduce_scatter_tensor(out, make(xs[RANK], dev, layout))
                    want = torch.stack([x.double() for x in xs]).sum(0).to(dtype)
                    eq(out, want[RANK * numel:(RANK + 1) * numel], "reduce_scatter_tensor")

                check(f"reduce_scatter_tensor/{dname}/{sname}/{layout}", reduce_scatter_tensor)

                def reduce_scatter_list(dtype=dtype, layout=layout, numel=numel):
                    xs = [rank_data(r, WORLD * numel, dtype, salt=4) for r in range(WORLD)]
                    ins = [make(xs[RANK][q * numel:(q + 1) * numel].clone(), dev, layout) for q in range(WORLD)]
                    out = make(torch.zeros(numel, dtype=dtype), dev, layout)
                    dist.reduce_scatter(out, ins)
                    want = torch.stack([x.double() for x in xs]).sum(0).to(dtype)
                    eq(out, want[RANK * numel:(RANK + 1) * numel], "reduce_scatter")

                check(f"reduce_scatter/{dname}/{sname}/{layout}", reduce_scatter_list)

                def reduce_root(dtype=dtype, layout=layout, numel=numel):
                    root = (WORLD - 1)
                    xs = [rank_data(r, numel, dtype, salt=6) for r in range(WORLD)]
                    t = make(xs[RANK], dev, layout)
                    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
                    want = torch.stack([x.double() for x in xs]).amax(0).to(dtype) if RANK == root else xs[RANK]
                    eq(t, want, "reduce")

                check(f"reduce/{dname}/{sname}/{layout}", reduce_root)

                def gather_root(dtype=dtype, layout=layout, numel=numel):
                    root = 0
                    xs = [rank_data(r, numel, dtype, salt=7) for r in range(WORLD)]
                    outs = [make(torch.zeros(numel, dtype=dtype), dev, layout) for _ in range(WORLD)] \
                        if RANK == root else None
                    dist.gather(make(xs[RANK], dev, layout), outs, dst=root)
                    if RANK == root:
                        for r in range(WORLD):
                            eq(outs[r], xs[r], f"gather[{r}]")

                check(f"gather/{dname}/{sname}/{layout}", gather_root)

                def scatter_root(dtype=dtype, layout=layout, numel=numel):
                    root = 1 % WORLD
                    xs = [rank_data(r, numel, dtype, salt=8) for r in range(WORLD)]
                    out = make(torch.zeros(numel, dtype=dtype), dev, layout)
                    dist.scatter(out, [make(x, dev, layout) for x in xs] if RANK == root else None, src=root)
                    eq(out, xs[RANK], "scatter")

                check(f"scatter/{dname}/{sname}/{layout}", scatter_root)

        for split in ("even", "uneven"):
            def a2a_single(dtype=dtype, split=split):
                rows = 5
                if split == "even":
                    send = [rows] * WORLD
                    recv = [rows] * WORLD
                else:  # rank r sends (r + q + 1) rows to q (and 0 rows to itself when r == q == 0)
                    send = [(RANK + q) % 3 for q in range(WORLD)]
                    recv = [(r + RANK) % 3 for r in range(WORLD)]
                data = {}
                for r in range(WORLD):
                    s = [rows] * WORLD if split == "even" else [(r + q) % 3 for q in range(WORLD)]
                    data[r] = rank_data(r, sum(s) * 4, dtype, salt=9).reshape(sum(s), 4)
                inp = data[RANK].to(dev)
                out = torch.zeros(sum(recv), 4, dtype=dtype, device=dev)
                if split == "even":
                    dist.all_to_all_single(out, inp)
                else:
                    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
                want = []
                for r in range(WORLD):
                    s = [rows] * WORLD if split == "even" else [(r + q) % 3 for q in range(WORLD)]
                    off = sum(s[:RANK])
                    want.append(data[r][off:off + s[RANK]])
                eq(out, torch.cat(want), "all_to_all_single")

            check(f"all_to_all_single/{dname}/{split}", a2a_single)

        def a2a_list(dtype=dtype):
            ins = [rank_data(RANK, q + 2, dtype, salt=10 + q).to(dev) for q in range(WORLD)]
            outs = [torch.zeros(RANK + 2, dtype=dtype, device=dev) for _ in range(WORLD)]
            dist.all_to_all(outs, ins)
            for r in range(WORLD):
                eq(outs[r], rank_data(r, RANK + 2, dtype, salt=10 + RANK), f"all_to_all[{r}]")

        check(f"all_to_all/{dname}", a2a_list)

    def in_place_all_gather():
        numel = 33
        out = torch.zeros(WORLD * numel, device=dev)
        out[RANK * numel:(RANK + 1) * numel] = rank_data(RANK, numel, torch.float32).to(dev)
        dist.all_gather_into_tensor(out, out[RANK * numel:(RANK + 1) * numel])
        eq(out, torch.cat([rank_data(r, numel, torch.float32) for r in range(WORLD)]), "in-place all_gather")

    check("all_gather_into_tensor/in_place", in_place_all_gather)

    def coalesced():
        from torch.distributed.distributed_c10d import _coalescing_manager

        xs = [[rank_data(r, n, torch.float32, salt=n) for n in (3, 50, 700)] for r in range(WORLD)]
        ts = [x.to(dev) for x in xs[RANK]]
        with _coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        for i, t in enumerate(ts):
            eq(t, torch.stack([xs[r][i] for r in range(WORLD)]).sum(0), f"coalesced all_reduce[{i}]")
        outs = [torch.zeros(WORLD * x.numel(), device=dev) for x in xs[RANK]]
        with _coalescing_manager(async_ops=True) as cm:
            for o, t in zip(outs, ts):
                dist.all_gather_into_tensor(o, t)
        cm.wait()
        ins = [torch.ones(WORLD * 8, device=dev) * (RANK + 1), torch.ones(WORLD * 3, device=dev)]
        rs = [torch.zeros(8, device=dev), torch.zeros(3, device=dev)]
        with _coalescing_manager(async_ops=True) as cm:
            for o, i in zip(rs, ins):
                dist.reduce_scatter_tensor(o, i)
        cm.wait()
        eq(rs[0], torch.full((8,), float(sum(range(1, WORLD + 1)))), "coalesced reduce_scatter")
        eq(rs[1], torch.full((3,), float(WORLD)), "coalesced reduce_scatter[1]")

    check("coalesced", coalesced)

    def async_and_future():
        t = torch.ones(1000, device=dev) * (RANK + 1)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        work.wait()
        assert work.is_completed() and work.is_success()
        val = fut.wait()
        eq(val[0], torch.full((1000,), float(sum(range(1, WORLD + 1)))), "future value")
        eq(t, torch.full((1000,), float(sum(range(1, WORLD + 1)))), "async all_reduce")
        # then(): a callback chained on the future sees the reduced tensor
        t2 = torch.ones(10, device=dev)
        fut2 = dist.all_reduce(t2, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        eq(fut2.wait(), torch.full((10,), 2.0 * WORLD), "future then")

    check("async_op/future", async_and_future)

    def p2p():
        nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
        for numel in (5, 300000):  # the second exceeds the mailbox: streamed in pieces
            send = rank_data(RANK, numel, torch.float32, salt=11).to(dev)
            recv = torch.zeros(numel, device=dev)
            reqs = [dist.isend(send, nxt), dist.irecv(recv, prv)]
            for r in reqs:
                r.wait()
            eq(recv, rank_data(prv, numel, torch.float32, salt=11), f"isend/irecv {numel}")
        # blocking send/recv with a non-contiguous receive buffer
        if RANK == 0:
            dist.send(torch.arange(6, dtype=torch.int64, device=dev), 1 % WORLD)
        elif RANK == 1:
            buf = torch.zeros(6, 2, dtype=torch.int64, device=dev)[:, 1]
            dist.recv(buf, 0)
            eq(buf, torch.arange(6), "send/recv")
        # batch_isend_irecv
        ops = [dist.P2POp(dist.isend, torch.full((4,), float(RANK), device=dev), nxt),
               dist.P2POp(dist.irecv, recv4 := torch.zeros(4, device=dev), prv)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        eq(recv4, torch.full((4,), float(prv)), "batch_isend_irecv")

    check("send_recv", p2p)

    def subgroup():
        ranks = [r for r in range(WORLD) if r % 2 == 0]
        g = dist.new_group(ranks)
        other = dist.new_group([r for r in range(WORLD) if r % 2 == 1])
        t = torch.full((5,), float(RANK + 1), device=dev)
        if RANK in ranks:
            dist.all_reduce(t, group=g)
            eq(t, torch.full((5,), float(sum(r + 1 for r in ranks))), "subgroup all_reduce")
            assert dist.get_world_size(g) == len(ranks)
        elif WORLD > 1:
            dist.all_reduce(t, group=other)
        dist.barrier()

    check("new_group", subgroup)

    def objects():
        got = [None] * WORLD
        dist.all_gather_object(got, {"rank": RANK, "s": "x" * RANK})
        assert got == [{"rank": r, "s": "x" * r} for r in range(WORLD)], got
        objs = [f"from {RANK}", 7] if RANK == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)
        assert objs == ["from 0", 7], objs

    check("objects", objects)

    def cpu_tensors():
        t = torch.full((9,), float(RANK))
        dist.all_reduce(t)
        eq(t, torch.full((9,), float(sum(range(WORLD)))), "cpu all_reduce")

    check("cpu_tensors", cpu_tensors)

    def barrier_and_stats():
        import torch_tpu.runtime as rt

        rt.reset_stats(dev)
        before = rt.stats(dev)
        t = torch.ones(1 << 16, device=dev)
        dist.all_reduce(t)
        dist.barrier()
        s = rt.stats(dev)
        assert s["collectives"] == before["collectives"] + 2, (before, s)
        assert s["collective_bytes"] == before["collective_bytes"] + 4 * (1 << 16), s
        local = int(os.environ.get("LOCAL_WORLD_SIZE", WORLD))
        multi_host = "TORCH_TPU_HOST_ID" in os.environ
        uniform = WORLD % local == 0
        want_bytes = 2 * (local - 1) / local * 4 * (1 << 16) if (not multi_host or uniform) else 0
        assert abs(s["ici_bytes"] - want_bytes) <= 1e-6 * want_bytes, (s["ici_bytes"], want_bytes)
        assert (s["dcn_bytes"] > 0) == multi_host and (s["dcn_seconds"] > 0) == multi_host, s
        assert s["ici_seconds"] > 0 or want_bytes == 0, s
        assert set(s["ici_seconds_by_generation"]) >= {"v5e", "v6e"}, s
        assert s["generation"] in s["ici_seconds_by_generation"]
        assert s["ops"] >= 0 and "device_seconds" in s  # existing keys unchanged

    check("barrier/stats", barrier_and_stats)
    return checks


def scenario_collectives():
    dev = init()
    checks = battery(dev)
    torch.tpu.synchronize()
    dist.destroy_process_group()
    write({"checks": checks})


# ------------------------------------------------------------------ DDP

def scenario_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    model.to(dev)
    ref.to(dev)
    ddp = DDP(model, device_ids=None, bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    max_grad_diff = 0.0
    for _step in range(3):
        x = torch.randn(8 * WORLD, 16, generator=g)
        y = torch.randn(8 * WORLD, 4, generator=g)
        local = slice(RANK * 8, (RANK + 1) * 8)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[local].to(dev)), y[local].to(dev)).backward()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x.to(dev)), y.to(dev)).backward()
        for p, q in zip(ddp.parameters(), ref.parameters()):
            max_grad_diff = max(max_grad_diff, (p.grad.cpu() - q.grad.cpu()).abs().max().item())
        opt.step()
        ref_opt.step()
    max_param_diff = max((p.cpu() - q.cpu()).abs().max().item() for p, q in zip(ddp.parameters(), ref.parameters()))
    dist.destroy_process_group()
    write({"max_grad_diff": max_grad_diff, "max_param_diff": max_param_diff})


# ------------------------------------------------------------------ FSDP2

class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, idx):
        h = self.embed(idx) + self.pos[: idx.shape[1]]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        for b in self.blocks:
            h = b(h, src_mask=mask, is_causal=True)
        return self.head(h)


def scenario_fsdp():
    from torch.distributed.fsdp import fully_shard

    dev = init()
    steps = int(os.environ.get("FSDP_STEPS", "5"))
    torch.manual_seed(0)
    model = TinyGPT()
    ref = TinyGPT()
    ref.load_state_dict(model.state_dict())
    model.to(dev)
    ref.to(dev)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    losses, ref_losses = [], []
    for _step in range(steps):
        idx = torch.randint(0, 64, (4 * WORLD, 17), generator=g)
        x, y = idx[:, :-1], idx[:, 1:]
        local = slice(RANK * 4, (RANK + 1) * 4)
        logits = model(x[local].to(dev))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), y[local].reshape(-1).to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        full = loss.detach().clone()
        dist.all_reduce(full, op=dist.ReduceOp.AVG)
        losses.append(full.item())
        ref_logits = ref(x.to(dev))
        ref_loss = torch.nn.functional.cross_entropy(ref_logits.reshape(-1, 64), y.reshape(-1).to(dev))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())
    # Checkpoint with torch.distributed.checkpoint and reload into a fresh sharded model.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    ckpt = os.path.join(OUT, "ckpt")
    dcp.save(get_model_state_dict(model), checkpoint_id=ckpt)
    fresh = TinyGPT().to(dev)
    for block in fresh.blocks:
        fully_shard(block)
    fully_shard(fresh)
    sd = get_model_state_dict(fresh)
    dcp.load(sd, checkpoint_id=ckpt)
    set_model_state_dict(fresh, sd)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3)).to(dev)
    with torch.no_grad():
        a = model(idx).cpu()
        b = fresh(idx).cpu()
    reload_diff = (a - b).abs().max().item()
    dist.destroy_process_group()
    write({"losses": losses, "ref_losses": ref_losses, "reload_diff": reload_diff})


# ------------------------------------------------------------------ DTensor / tensor parallel

def scenario_dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dev = init()
    results = {}
    mesh = init_device_mesh("tpu", (WORLD,))
    torch.manual_seed(0)
    full = torch.randn(8, 6)
    d = distribute_tensor(full.to(dev), mesh, [Shard(0)])
    results["local_shape"] = list(d.to_local().shape)
    results["shard_ok"] = torch.equal(d.to_local().cpu(), full.chunk(WORLD)[RANK])
    r = d.redistribute(mesh, [Replicate()])
    results["replicate_ok"] = torch.equal(r.to_local().cpu(), full)
    s1 = r.redistribute(mesh, [Shard(1)])
    results["shard1_ok"] = torch.allclose(s1.full_tensor().cpu(), full)
    results["sum_ok"] = abs((d * 2).sum().full_tensor().item() - 2 * full.sum().item()) < 1e-4

    # Tensor-parallel MLP equals the dense one.
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(8, 16)
            self.down = torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(1)
    dense = MLP().to(dev)
    tp = MLP().to(dev)
    tp.load_state_dict(dense.state_dict())
    parallelize_module(tp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(4, 8).to(dev)
    out_tp = tp(x)
    out_dense = dense(x)
    results["tp_diff"] = (out_tp.cpu() - out_dense.cpu()).abs().max().item()
    out_tp.sum().backward()
    out_dense.sum().backward()
    g = tp.up.weight.grad
    g = g.full_tensor() if isinstance(g, DTensor) else g
    results["tp_grad_diff"] = (g.cpu() - dense.up.weight.grad.cpu()).abs().max().item()

    # A 2-D mesh from topology_aware_mesh.
    if WORLD == 4:
        from torch.distributed.device_mesh import DeviceMesh

        layout = torch.tpu.topology_aware_mesh((2, 2))
        mesh2 = DeviceMesh("tpu", layout, mesh_dim_names=("dp", "tp"))
        t = torch.full((3,), float(RANK), device=dev)
        dist.all_reduce(t, group=mesh2.get_group("tp"))
        row = [int(v) for v in layout[(layout == RANK).nonzero()[0][0]].tolist()]
        results["mesh2_ok"] = torch.equal(t.cpu(), torch.full((3,), float(sum(row))))
        results["layout"] = layout.tolist()
    dist.destroy_process_group()
    write(results)


def scenario_dtensor_random():
    """DTensor random ops on shards equal the same ops drawn whole on one chip (philox)."""
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor import rand as drand
    from torch.distributed.tensor import randn as drandn

    dev = init()
    mesh = init_device_mesh("tpu", (WORLD,))
    results = {}

    def whole(seed, draw):
        # The reference: the same op on a plain tensor of the whole shape, and the state after it.
        torch.manual_seed(seed)
        out = draw().cpu()
        return out, torch.tpu.get_rng_state()

    def same(name, seed, sharded, reference):
        torch.manual_seed(seed)
        got = sharded().full_tensor().cpu()
        state = torch.tpu.get_rng_state()
        want, want_state = whole(seed, reference)
        results[name] = bool(torch.equal(got, want)) and bool(torch.equal(state, want_state))

    for placement in (Shard(0), Replicate()):
        tag = type(placement).__name__
        same(
            f"randn_{tag}",
            1,
            lambda p=placement: drandn(8, 12, device_mesh=mesh, placements=[p]),
            lambda: torch.randn(8, 12, device=dev),
        )
        same(
            f"rand_{tag}",
            2,
            lambda p=placement: drand(16, 4, device_mesh=mesh, placements=[p]),
            lambda: torch.rand(16, 4, device=dev),
        )
        zeros = torch.zeros(8, 12)
        same(
            f"uniform_{tag}",
            3,
            lambda p=placement, z=zeros: distribute_tensor(z.to(dev), mesh, [p]).uniform_(-2, 2),
            lambda: torch.zeros(8, 12, device=dev).uniform_(-2, 2),
        )
        same(
            f"normal_{tag}",
            4,
            lambda p=placement, z=zeros: distribute_tensor(z.to(dev), mesh, [p]).normal_(1, 3),
            lambda: torch.zeros(8, 12, device=dev).normal_(1, 3),
        )
        same(
            f"rand_like_{tag}",
            5,
            lambda p=placement, z=zeros: torch.rand_like(distribute_tensor(z.to(dev), mesh, [p])),
            lambda z=zeros: torch.rand_like(z.to(dev)),
        )
        same(
            f"bernoulli_{tag}",
            6,
            lambda p=placement, z=zeros: distribute_tensor(z.to(dev), mesh, [p]).bernoulli_(0.4),
            lambda: torch.zeros(8, 12, device=dev).bernoulli_(0.4),
        )

    # nn.init on a DTensor parameter (the FSDP / TorchTitan initialisation path), then one
    # more draw: the offsets of both paths stay in step.
    def init_param(w):
        nn.init.trunc_normal_(w, std=0.02)
        nn.init.normal_(w.data[:0])  # an empty draw moves nothing
        return w

    torch.manual_seed(7)
    w = nn.Parameter(distribute_tensor(torch.empty(16, 8, device=dev), mesh, [Shard(0)]))
    with torch.no_grad():
        init_param(w)
    after = torch.rand(4, device=dev).cpu()
    got = w.full_tensor().detach().cpu()
    torch.manual_seed(7)
    ref = torch.empty(16, 8, device=dev)
    with torch.no_grad():
        init_param(ref)
    results["nn_init"] = bool(torch.equal(got, ref.cpu()))
    results["after_init"] = bool(torch.equal(after, torch.rand(4, device=dev).cpu()))
    # Shards differ from each other (each rank draws its own slice).
    local = drandn(4 * WORLD, 4, device_mesh=mesh, placements=[Shard(0)]).to_local().cpu()
    gathered = [torch.empty_like(local) for _ in range(WORLD)]
    dist.all_gather_object(gathered, local)
    results["shards_differ"] = WORLD == 1 or not torch.equal(gathered[0], gathered[1])
    dist.destroy_process_group()
    write(results)


# ------------------------------------------------------------------ failures

def scenario_kill():
    """Rank WORLD-1 SIGKILLs itself in the middle of a large all_reduce; the others must raise."""
    dev = init(timeout=float(os.environ.get("DIST_TIMEOUT", "30")))
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)
    torch.tpu.synchronize()
    victim = WORLD - 1
    big = torch.ones(4 << 20, device=dev)
    if RANK == victim:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        if os.environ.get("KILL_BEFORE") == "1":
            time.sleep(5)
    start = time.time()
    result = {}
    try:
        for _ in range(50):
            dist.all_reduce(big)
        torch.tpu.synchronize()
        result["error"] = None
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__module__}.{type(e).__name__}: {e}"
    result["elapsed"] = time.time() - start
    # The group stays failed: the next collective raises at once.
    try:
        dist.all_reduce(t)
        result["after"] = None
    except Exception as e:  # noqa: BLE001
        result["after"] = f"{type(e).__name__}: {e}"
    write(result)
    time.sleep(1.5)  # rank 0 hosts the store, where ranks on other hosts look up the cause
    os._exit(0)


def scenario_stall():
    """Rank 1 never calls the collective: rank 0 raises after the group's timeout."""
    dev = init(timeout=float(os.environ.get("DIST_TIMEOUT", "3")))
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)
    result = {}
    if RANK == 1:
        time.sleep(float(os.environ.get("STALL", "8")))
        write(result)
        os._exit(0)
    start = time.time()
    try:
        dist.all_reduce(t)
        result["error"] = None
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__module__}.{type(e).__name__}: {e}"
    result["elapsed"] = time.time() - start
    write(result)
    os._exit(0)


def attempt_into(result, name, fn):
    """result[name] = None if fn() returns, else "ExceptionType: message"."""
    try:
        fn()
        result[name] = None
    except Exception as e:  # noqa: BLE001
        result[name] = f"{type(e).__name__}: {e}"


def scenario_mismatch():
    dev = init(timeout=20)
    result = {}

    def attempt(name, fn):
        attempt_into(result, name, fn)

    attempt("numel", lambda: dist.all_reduce(torch.ones(10 + 2 * RANK, device=dev)))
    attempt("dtype", lambda: dist.all_reduce(
        torch.ones(10, device=dev, dtype=torch.float32 if RANK == 0 else torch.int64)))
    attempt("op", lambda: dist.all_reduce(torch.ones(4, device=dev)) if RANK == 0
            else dist.broadcast(torch.ones(4, device=dev), src=0))
    attempt("redop", lambda: dist.all_reduce(torch.ones(4, device=dev),
                                             op=dist.ReduceOp.SUM if RANK == 0 else dist.ReduceOp.MAX))
    attempt("root", lambda: dist.broadcast(torch.ones(4, device=dev), src=RANK))
    t = torch.full((6,), float(RANK + 1), device=dev)
    attempt("after", lambda: dist.all_reduce(t))
    result["after_value"] = t.cpu().tolist()
    dist.destroy_process_group()
    write(result)


def scenario_multislice():
    """Two slices joined over DCN, 2 ranks per slice: a (dcn, ici) DeviceMesh from
    torch.tpu.distributed.topology_aware_mesh, and spmd_safe's checks within and across hosts."""
    from torch.distributed.device_mesh import DeviceMesh

    import torch_tpu
    import torch_tpu.runtime as rt

    dev = init(timeout=30)
    result = {"slice": torch_tpu._C._topology()["slice"], "chip": torch.tpu.get_device_properties(dev).global_id}
    layout = torch.tpu.distributed.topology_aware_mesh((2, 2), dcn_mesh_shape=(2, 1))
    result["layout"] = layout.tolist()
    mesh = DeviceMesh("tpu", mesh=layout, mesh_dim_names=("dcn", "ici"))
    for name in ("dcn", "ici"):
        rt.reset_stats(dev)
        t = torch.full((1024,), float(RANK + 1), device=dev)
        dist.all_reduce(t, group=mesh.get_group(name))
        s = rt.stats(dev)
        result[name] = {"value": t.cpu().unique().tolist(), "dcn_bytes": s["dcn_bytes"], "ici_bytes": s["ici_bytes"],
                        "ranks": dist.get_process_group_ranks(mesh.get_group(name))}

    @torch.tpu.distributed.spmd_safe
    def spmd(fn):
        result.setdefault("inside", torch_tpu._C._tpu_dist_spmd_check())
        return fn()

    def attempt(name, fn):
        attempt_into(result, name, fn)

    ici = mesh.get_group("ici")
    shape = (2, 3) if RANK % 2 == 0 else (3, 2)  # same element count
    attempt("shape_outside", lambda: dist.all_reduce(torch.ones(shape, device=dev), group=ici))
    attempt("shape_inside", lambda: spmd(lambda: dist.all_reduce(torch.ones(shape, device=dev), group=ici)))
    # Host-local parts agree (both ranks of a host pass the same); only the check across hosts sees it.
    n = 10 if result["slice"] == 0 else 12
    attempt("numel_across_hosts", lambda: spmd(lambda: dist.all_reduce(torch.ones(n, device=dev))))
    attempt("op_across_hosts", lambda: spmd(lambda: dist.all_reduce(torch.ones(4, device=dev)) if result["slice"] == 0
                                            else dist.broadcast(torch.ones(4, device=dev), src=0)))
    t = torch.full((6,), float(RANK + 1), device=dev)
    attempt("after", lambda: spmd(lambda: dist.all_reduce(t)))
    result["after_value"] = t.cpu().tolist()
    result["outside_after"] = torch_tpu._C._tpu_dist_spmd_check()
    dist.destroy_process_group()
    write(result)


def scenario_launch():
    """Run by torch_tpu.run / torchrun: each rank on tpu:LOCAL_RANK, default backend from device_id."""
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("tpu", local)
    torch.tpu.set_device(dev)
    dist.init_process_group(device_id=dev)
    t = torch.full((4,), float(dist.get_rank() + 1), device=dev)
    dist.all_reduce(t)
    write({"backend": str(dist.get_backend()), "value": t.cpu().tolist(), "local_rank": local,
           "device_map": dict(dist.Backend.default_device_backend_map),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")})
    dist.destroy_process_group()


def scenario_tpu_ops():
    """torch.tpu.ops' collectives (tests/python/helpers/dist_ops_worker.py) against CPU values."""
    from dist_ops_worker import run_checks

    dev = init()
    checks = {}
    run_checks(dev, RANK, WORLD, checker(checks))
    torch.tpu.synchronize()
    dist.destroy_process_group()
    write({"checks": checks})

if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ and "RANK" in os.environ:
        RANK = int(os.environ["RANK"])
    globals()["scenario_" + sys.argv[1]]()
