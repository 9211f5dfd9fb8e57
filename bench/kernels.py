"""Pallas kernels through torch.tpu.pallas.jax_op on tpu vs the same JAX function on JAX CPU
arrays (the bridge's overhead) and vs the equivalent PyTorch op on tpu.

Rows: JAX's Pallas matmul (VMEM accumulator, 256-blocks) at 1 MiB and 4 MiB operands, JAX's
flash-attention kernel at 1 MiB and 4 MiB q/k/v, and a tiny (8, 128) add for the per-call
overhead. Both sides run the kernel in Pallas's TPU interpret mode; the bridge adds the queue,
DLPack and one copy of each output into HBM. Median of --repeats calls after a warm-up.

    python bench/kernels.py [--repeats 5] [--markdown]
"""

import argparse
import statistics
import time

import torch
from torch.tpu import pallas as tp
from torch.tpu.pallas import _jax, kernels

import torch_tpu  # noqa: F401

jax = _jax.jax()
jnp = jax.numpy
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash  # noqa: E402
from jax.experimental.pallas.ops.tpu import matmul as jax_matmul  # noqa: E402


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """JAX's own Pallas matmul (``ops.tpu.matmul``: a VMEM accumulator over the K blocks)."""
    return jax_matmul.matmul(a, b, block_shape=(256, 256), block_k=256)


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def tiny_add(x: jax.Array, y: jax.Array) -> jax.Array:
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def flash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    bs = jax_flash.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return jax_flash.flash_attention(q, k, v, sm_scale=q.shape[-1] ** -0.5, block_sizes=bs)


mm_op = tp.jax_op("bench_pallas::matmul", matmul)
add_op = tp.jax_op("bench_pallas::tiny_add", tiny_add)


def _median(fn, repeats):
    fn()  # warm-up: traces and compiles
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _row(name, mib, torch_args, jax_fn, tpu_fn, peer_fn, repeats):
    jax_args = [jnp.asarray(t.numpy()) for t in torch_args]
    tpu_args = [t.to("tpu") for t in torch_args]
    with _jax.interpret():
        direct = jax.jit(jax_fn)
        t_jax = _median(lambda: direct(*jax_args).block_until_ready(), repeats)

    def on_tpu():
        tpu_fn(*tpu_args)
        torch.tpu.synchronize()

    t_tpu = _median(on_tpu, repeats)
    t_peer = None
    if peer_fn is not None:
        def peer():
            peer_fn(*tpu_args)
            torch.tpu.synchronize()

        t_peer = _median(peer, repeats)
    return name, mib, t_tpu, t_jax, t_peer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (512, 1024):  # f32 [n, n]: 1 MiB, 4 MiB
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        rows.append(_row(f"pallas matmul {n}x{n} f32", n * n * 4 / 2**20, [a, b], matmul, mm_op, torch.mm,
                         args.repeats))
    for t in (256, 1024):  # f32 [1, 8, t, 128]: 1 MiB, 4 MiB each of q, k, v
        qkv = [torch.randn(1, 8, t, 128, generator=g) for _ in range(3)]

        def sdpa(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        rows.append(_row(f"flash attention [1,8,{t},128] f32", t * 8 * 128 * 4 / 2**20, qkv, flash,
                         lambda q, k, v: kernels.flash_attention(q, k, v, sm_scale=q.shape[-1] ** -0.5), sdpa,
                         args.repeats))
    x, y = torch.randn(8, 128, generator=g), torch.randn(8, 128, generator=g)
    rows.append(_row("tiny add (8,128) f32", 4 / 1024, [x, y], tiny_add, add_op, torch.add, max(args.repeats, 50)))

    if args.markdown:
        print("| kernel | MiB per operand | jax_op on tpu | JAX on CPU arrays | tpu / JAX | PyTorch op on tpu | "
              "tpu / PyTorch |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, mib, t_tpu, t_jax, t_peer in rows:
        peer = f"{t_peer * 1e3:.2f} ms" if t_peer is not None else "-"
        ratio = f"{t_tpu / t_peer:.1f}x" if t_peer else "-"
        if args.markdown:
            print(f"| {name} | {mib:g} | {t_tpu * 1e3:.2f} ms | {t_jax * 1e3:.2f} ms | {t_tpu / t_jax:.2f} | "
                  f"{peer} | {ratio} |")
        else:
            print(f"{name:36s} {mib:7.3g} MiB  tpu {t_tpu * 1e3:9.2f} ms  jax {t_jax * 1e3:9.2f} ms  "
                  f"tpu/jax {t_tpu / t_jax:5.2f}  torch-op {peer:>10s}  tpu/torch {ratio}")


if __name__ == "__main__":
    main()
