"""Checks of torch.tpu.ops' collectives for one rank (run by dist_worker.py's ``tpu_ops`` scenario).

Every rank builds all ranks' inputs deterministically, so each check compares its result
with a CPU computation over the whole group.
"""

import torch
import torch.distributed as dist

import torch_tpu.runtime as rt
import torch_tpu.tpu.ops as ops


def data(r, shape, dtype=torch.float32, salt=0):
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.int64)
    return ((base * (r + 3) + salt + 7 * r) % 11 - 5).to(dtype).reshape(shape)


def ragged_plan(world):
    """Sizes and offsets of a ragged all-to-all with internal gaps on both sides.

    send[i][j]: rows rank i sends to j; rank i's rows for j start at in_off[i][j] (a gap of one
    row between pieces); rank j puts rows from i at out_off[i][j] (a gap of two rows).
    """
    send = [[(i + 2 * j) % 3 + (1 if i == j else 0) for j in range(world)] for i in range(world)]
    in_off = [[sum(send[i][:j]) + j for j in range(world)] for i in range(world)]
    out_off = [[sum(send[q][j] for q in range(i)) + 2 * i for j in range(world)] for i in range(world)]
    in_rows = [in_off[i][-1] + send[i][-1] + 1 for i in range(world)]
    out_rows = max(out_off[world - 1][j] + send[world - 1][j] for j in range(world)) + 3
    return send, in_off, out_off, in_rows, out_rows


def run_checks(dev, rank, world, check):
    """Runs every check through ``check(name, fn)`` (dist_worker.checker)."""

    def eq(got, want, what):
        got = got.cpu()
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.equal(got.float(), want.float()), f"{what}: got {got.flatten()[:12].tolist()} " \
                                                       f"want {want.flatten()[:12].tolist()}"

    def raises(exc, text, fn):
        try:
            fn()
        except exc as e:
            assert text in str(e), f"{exc.__name__} without {text!r}: {e}"
            return str(e)
        raise AssertionError(f"no {exc.__name__} ({text!r})")

    for dtype in (torch.float32, torch.bfloat16):
        for dim in (0, 1, -1):
            def gather(dtype=dtype, dim=dim):
                xs = [data(r, (3, 4, 2), dtype, salt=1) for r in range(world)]
                eq(ops.all_gather_dim(xs[rank].to(dev), dim), torch.cat(xs, dim), f"all_gather_dim({dim})")

            check(f"all_gather_dim/{dtype}/{dim}", gather)

            def scatter(dtype=dtype, dim=dim):
                shape = [2, 3, 2]
                shape[dim] *= world
                xs = [data(r, tuple(shape), dtype, salt=2) for r in range(world)]
                for op_name, fn in (("sum", lambda s: s.sum(0)), ("max", lambda s: s.amax(0)),
                                    ("min", lambda s: s.amin(0)), ("avg", lambda s: s.mean(0))):
                    got = ops.reduce_scatter_dim(xs[rank].to(dev), dim, reduce_op=op_name.upper()
                                                 if op_name == "max" else op_name)
                    want = fn(torch.stack([x.double() for x in xs])).to(dtype).chunk(world, dim)[rank]
                    eq(got, want, f"reduce_scatter_dim({dim}, {op_name})")

            check(f"reduce_scatter_dim/{dtype}/{dim}", scatter)

    def autograd():
        xs = [data(r, (2, 3), salt=3) for r in range(world)]
        ws = [data(r, (2, 3 * world), salt=4) for r in range(world)]
        x = xs[rank].to(dev).requires_grad_()
        (ops.all_gather_dim(x, 1) * ws[rank].to(dev)).sum().backward()
        want = torch.stack([w.chunk(world, 1)[rank] for w in ws]).sum(0)
        eq(x.grad, want, "all_gather_dim grad")
        ys = [data(r, (2 * world, 3), salt=5) for r in range(world)]
        gos = [data(r, (2, 3), salt=6) for r in range(world)]
        y = ys[rank].to(dev).requires_grad_()
        ops.reduce_scatter_dim(y, 0).backward(gos[rank].to(dev))
        eq(y.grad, torch.cat(gos, 0), "reduce_scatter_dim grad")

    check("autograd", autograd)

    def compiled():
        torch._dynamo.reset()

        def f(x):
            return ops.reduce_scatter_dim(ops.all_gather_dim(x.sin(), 1) * 2, 0)

        xs = [data(r, (2 * world, 3), salt=11) for r in range(world)]
        got = torch.compile(f, backend="tpu", fullgraph=True)(xs[rank].to(dev))
        gathered = [torch.cat([x.sin() for x in xs], 1) * 2 for _ in range(world)]
        want = torch.stack(gathered).sum(0).chunk(world, 0)[rank]
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)

    check("compiled", compiled)

    def subgroup():
        ranks = list(range(0, world, 2))
        groups = [dist.new_group(ranks), dist.new_group(list(range(1, world, 2)))]
        mine = [g for g, rs in zip(groups, (ranks, list(range(1, world, 2)))) if rank in rs][0]
        members = ranks if rank in ranks else list(range(1, world, 2))
        got = ops.all_gather_dim(data(rank, (2, 2)).to(dev), 0, group=mine)
        eq(got, torch.cat([data(r, (2, 2)) for r in members]), "all_gather_dim subgroup")

    check("subgroup", subgroup)

    def send_recv():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        big = 200000  # past the p2p mailbox: streamed

        def mine(r):
            return [data(r, (5,), salt=7), data(r, (2, 3), torch.int64, salt=8), data(r, (big,), salt=9)]

        bufs = [torch.zeros(5, device=dev), torch.zeros(3, 2, dtype=torch.int64, device=dev)[:, 0:2].t(),
                torch.zeros(big, device=dev)]
        bufs[1] = torch.zeros(2, 3, dtype=torch.int64, device=dev)
        out = [t.to(dev) for t in mine(rank)]
        if rank % 2 == 0:
            assert ops.send(out, nxt, 5) is None
            got = ops.recv(bufs, prv, 5)
        else:
            got = ops.recv(bufs, prv, 5)
            ops.send(out, nxt, 5)
        assert isinstance(got, list) and all(a is b for a, b in zip(got, bufs))
        for g, w in zip(got, mine(prv)):
            eq(g, w, "recv")

    check("send_recv", send_recv)

    send, in_off, out_off, in_rows, out_rows = ragged_plan(world)
    operands = [data(r, (in_rows[r], 3), salt=10) for r in range(world)]
    init = [torch.full((out_rows, 3), -100.0 - r) for r in range(world)]

    def expected(r):
        want = init[r].clone()
        for i in range(world):
            piece = operands[i][in_off[i][r]:in_off[i][r] + send[i][r]]
            want[out_off[i][r]:out_off[i][r] + send[i][r]] = piece
        return want

    def args(r):
        return (torch.tensor(in_off[r]), torch.tensor(send[r]), torch.tensor(out_off[r]),
                torch.tensor([send[i][r] for i in range(world)]))

    name = dist.group.WORLD.group_name

    def ragged():
        output = init[rank].to(dev)
        idx = [t.to(dev) for t in args(rank)]
        got = ops.ragged_all_to_all(operands[rank].to(dev), output, *idx, name)
        eq(got, expected(rank), "ragged_all_to_all")
        eq(output, init[rank], "ragged_all_to_all leaves output")
        out = torch.zeros(out_rows, 3, device=dev)
        assert ops.ragged_all_to_all(operands[rank].to(dev), output, *args(rank), name, out=out) is out
        eq(out, expected(rank), "ragged_all_to_all out=")
        assert ops.ragged_all_to_all(operands[rank].to(dev), output, *args(rank), None, out=output) is output
        eq(output, expected(rank), "ragged_all_to_all out=output")

    check("ragged_all_to_all", ragged)

    def stats():
        rt.reset_stats(dev)
        ops.all_gather_dim(torch.ones(4096, device=dev), 0)
        s1 = rt.stats(dev)
        assert s1["collectives"] >= 1 and s1["ici_bytes"] > 0 and s1["ici_seconds"] > 0, s1
        ops.reduce_scatter_dim(torch.ones(4096 * world, device=dev), 0)
        s2 = rt.stats(dev)
        assert s2["collectives"] > s1["collectives"] and s2["ici_bytes"] > s1["ici_bytes"], (s1, s2)
        ops.ragged_all_to_all(operands[rank].to(dev), init[rank].to(dev), *args(rank), name)
        s3 = rt.stats(dev)
        assert s3["collectives"] >= s2["collectives"] + 2 and s3["collective_bytes"] > s2["collective_bytes"], (s2, s3)
        assert s3["ici_seconds"] > s2["ici_seconds"], (s2, s3)

    check("stats", stats)

    def bad_inputs():
        x = torch.ones(2, 3, device=dev)
        raises(IndexError, "all_gather_dim: dim=2 is out of range for a 2-d input", lambda: ops.all_gather_dim(x, 2))
        raises(IndexError, "reduce_scatter_dim: dim=-3 is out of range", lambda: ops.reduce_scatter_dim(x, -3))
        raises(ValueError, "reduce_op must be one of", lambda: ops.reduce_scatter_dim(
            torch.ones(2 * world, device=dev), 0, reduce_op="mean"))
        if world > 1:
            raises(ValueError, "is not divisible by the group size", lambda: ops.reduce_scatter_dim(
                torch.ones(2 * world + 1, device=dev), 0))
        raises(ValueError, "send: dst must be a rank in", lambda: ops.send([x], world, 0))
        raises(ValueError, "is this rank", lambda: ops.recv([x], rank, 0))
        raises(TypeError, "tensors must be a sequence of Tensors", lambda: ops.send(x, (rank + 1) % world, 0))
        raises(ValueError, "process_group_name='nope' names no process group", lambda: ops.ragged_all_to_all(
            operands[rank].to(dev), init[rank].to(dev), *args(rank), "nope"))
        raises(ValueError, "send_sizes must be 1-D with one entry per rank", lambda: ops.ragged_all_to_all(
            operands[rank].to(dev), init[rank].to(dev), args(rank)[0], torch.ones(world + 1, dtype=torch.int64),
            *args(rank)[2:], name))
        raises(TypeError, "input_offsets must have an integer dtype", lambda: ops.ragged_all_to_all(
            operands[rank].to(dev), init[rank].to(dev), args(rank)[0].float(), *args(rank)[1:], name))
        # offsets past the buffer on rank 0 only: every rank raises, before data moves
        io = args(rank)[0].clone()
        j = max(range(world), key=lambda q: send[0][q])  # a peer rank 0 sends rows to
        if rank == 0:
            io[j] = in_rows[0]
        msg = raises(ValueError, "ragged_all_to_all", lambda: ops.ragged_all_to_all(
            operands[rank].to(dev), init[rank].to(dev), io, *args(rank)[1:], name))
        want = f"input_offsets[{j}] + send_sizes[{j}]" if rank == 0 else "rank 0 of the group got"
        assert want in msg, msg
        oo = args(rank)[2].clone()
        oo[0] = out_rows  # past rank 0's output
        msg = raises(ValueError, "output_offsets[0] + send_sizes[0]", lambda: ops.ragged_all_to_all(
            operands[rank].to(dev), init[rank].to(dev), args(rank)[0], args(rank)[1], oo, args(rank)[3], name))
        assert "past rank 0's output rows" in msg, msg
        rs = args(rank)[3].clone()
        rs[0] += 1
        raises(ValueError, "expects", lambda: ops.ragged_all_to_all(
            operands[rank].to(dev), init[rank].to(dev), *args(rank)[:3], rs, name))
        # the group still works afterwards
        t = torch.full((3,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        eq(t, torch.full((3,), float(sum(range(1, world + 1)))), "all_reduce after errors")
        eq(ops.all_gather_dim(torch.full((1,), float(rank), device=dev), 0), torch.arange(world).float(),
           "all_gather_dim after errors")

    check("bad_inputs", bad_inputs)
